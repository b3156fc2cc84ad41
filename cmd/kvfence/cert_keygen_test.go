package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// keygen keeps an existing key unless --force, and never writes both keys
// to one path (that left only the public key, with exit 0).
func TestCertKeygenRefusesToOverwrite(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	if code, stderr := runCLI(t, agentExe, "cert", "keygen", "--private", priv, "--public", pub); code != 0 {
		t.Fatalf("first keygen: exit %d: %s", code, stderr)
	}
	first, _ := os.ReadFile(priv)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--private", priv, "--public", filepath.Join(dir, "other.pub")}, "exists"},
		{[]string{"--private", filepath.Join(dir, "other"), "--public", pub}, "exists"},
		{[]string{"--private", priv, "--public", priv}, "same file"},
		{[]string{"--private", filepath.Join(dir, "x"), "--public", filepath.Join(dir, ".", "x"), "--force"}, "same file"},
	} {
		code, stderr := runCLI(t, agentExe, append([]string{"cert", "keygen"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("keygen %v: exit %d, %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
	if now, _ := os.ReadFile(priv); !bytes.Equal(now, first) {
		t.Fatal("the private key changed")
	}
	if code, stderr := runCLI(t, agentExe, "cert", "keygen", "--private", priv, "--public", pub, "--force"); code != 0 {
		t.Fatalf("keygen --force: exit %d: %s", code, stderr)
	}
	if now, _ := os.ReadFile(priv); bytes.Equal(now, first) || !strings.Contains(string(now), "PRIVATE KEY") {
		t.Fatal("--force did not write a new private key")
	}
	if st, err := os.Stat(priv); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode %v, %v", st.Mode().Perm(), err)
	}
}
