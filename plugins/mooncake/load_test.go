package mooncake_test

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/mooncake"
	"github.com/kvfence/kvfence/sdk"
)

// Without a usable library the plugin exits before the handshake with one
// classified line that names KVFENCE_MOONCAKE_LIB.
func TestHandshakeRefusals(t *testing.T) {
	needFakes(t)
	cases := []struct{ name, lib, want string }{
		{"library missing", "", "KVFENCE_MOONCAKE_LIB is not set"},
		{"library path wrong", "/nonexistent/libtransfer_engine.so", "cannot be loaded"},
		{"required symbol missing", brokeLib, "lacks the required symbol submitTransfer"},
		{"unsupported version", oldLib, "unsupported version"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(pluginBin)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/nonexistent"}
			if c.lib != "" {
				cmd.Env = append(cmd.Env, mooncake.EnvLib+"="+c.lib)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			line := strings.TrimRight(stderr.String(), "\n")
			if err == nil || strings.Contains(line, "\n") || !strings.Contains(line, c.want) ||
				!strings.Contains(line, mooncake.EnvLib) || !strings.HasPrefix(line, errdefs.FailedPrecondition.String()+":") {
				t.Fatalf("exit %v, stderr %q: want one failed-precondition line with %q naming %s", err, stderr.String(), c.want, mooncake.EnvLib)
			}
			t.Log(line)
		})
	}
	// Through a host: Open fails (the handshake never happens).
	var stderr bytes.Buffer
	if p, err := sdk.Open(pluginBin, sdk.OpenOptions{Env: []string{mooncake.EnvLib + "="}, Stderr: &stderr}); err == nil {
		_ = p.Close()
		t.Fatal("Open succeeded without the library")
	} else if !strings.Contains(stderr.String(), mooncake.EnvLib) {
		t.Fatalf("Open: %v; plugin stderr %q does not name %s", err, stderr.String(), mooncake.EnvLib)
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := mooncake.ConfigFromEnv(env())
	if err != nil || c.Metadata != "P2PHANDSHAKE" || c.Protocol != "tcp" || c.Framing != "v2" {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	if c.Host != "127.0.0.1" || c.DirListen != "127.0.0.1:0" {
		t.Errorf("default addresses: host %q dir %q", c.Host, c.DirListen)
	}
	// Under conformance --netns each process gets its namespace's address:
	// the engine and the key directory must not stay on 127.0.0.1 there.
	if c, _ := mooncake.ConfigFromEnv(env("KVFENCE_TCP_LISTEN", "10.213.213.2:0")); c.Host != "10.213.213.2" || c.DirListen != "10.213.213.2:0" {
		t.Errorf("KVFENCE_TCP_LISTEN: host %q dir %q", c.Host, c.DirListen)
	}
	if c, _ := mooncake.ConfigFromEnv(env("KVFENCE_TCP_LISTEN", "10.213.213.2:0", mooncake.EnvHost, "10.0.0.7")); c.Host != "10.0.0.7" || c.DirListen != "10.0.0.7:0" {
		t.Errorf("%s must win: host %q dir %q", mooncake.EnvHost, c.Host, c.DirListen)
	}
	if c, _ := mooncake.ConfigFromEnv(env("MC_TCP_PROTO", "1")); c.Framing != "legacy" {
		t.Errorf("MC_TCP_PROTO=1 must force legacy framing, got %q", c.Framing)
	}
	for _, bad := range [][]string{{mooncake.EnvProtocol, "udp"}, {mooncake.EnvFraming, "v3"}, {mooncake.EnvReportAfter, "-1s"}} {
		if _, err := mooncake.ConfigFromEnv(env(bad...)); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%v: %v, want invalid-argument", bad, err)
		}
	}
}
