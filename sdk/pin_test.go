package sdk_test

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

const tcpPluginPkg = "github.com/kvfence/kvfence/plugins/tcp/cmd/kvfence-plugin-tcp"

// plugin builds the TCP plugin into a fresh directory and returns its
// path and sha256.
func plugin(t *testing.T) (string, []byte) {
	t.Helper()
	bin, err := sdktest.BuildPlugin(t.TempDir(), tcpPluginPkg)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := sdk.FileSHA256(bin)
	if err != nil {
		t.Fatal(err)
	}
	return bin, sum
}

// The pinned binary that runs is the sealed copy that was hashed, and a
// binary that differs from the pin by one byte is refused.
func TestPinnedOpenRunsTheHashedCopy(t *testing.T) {
	bin, sum := plugin(t)
	p := sdktest.Subprocess(t, bin, sdk.OpenOptions{SHA256: sum})
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(exe, "/memfd:kvfence-plugin:") {
		t.Fatalf("the plugin runs %q, not the sealed copy", exe)
	}
	appendByte(t, bin)
	_, err = sdk.Open(bin, sdk.OpenOptions{SHA256: sum})
	if !errdefs.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("modified binary: %v, want a failed-precondition checksum refusal", err)
	}
}

func appendByte(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
}

// certFor is a certificate file for sha256 sum, signed by key (nil:
// unsigned), profile full, valid from a day ago for 180 days.
func certFor(t *testing.T, sum []byte, key ed25519.PrivateKey, certified bool) []byte {
	t.Helper()
	from := time.Now().Add(-24 * time.Hour)
	return certWith(t, sum, key, certified, "full", `"valid_from":"`+from.Format(time.RFC3339)+`","valid_until":"`+from.Add(sdk.CertificateValidity).Format(time.RFC3339)+`"`)
}

// certWith is certFor with a profile and validity fields of its own
// (validity: JSON members, or "" for none).
func certWith(t *testing.T, sum []byte, key ed25519.PrivateKey, certified bool, profile, validity string) []byte {
	t.Helper()
	if validity != "" {
		validity = "," + validity
	}
	cert := fmt.Sprintf(`{"certified":%v,"profile":%q,"plugin":{"name":"kvfence-tcp","sha256":%q},"suite_version":"test"%s}`, certified, profile, hex.EncodeToString(sum), validity)
	f := sdk.CertificateFile{Certificate: json.RawMessage(cert)}
	if key != nil {
		f = sdk.SignCertificate([]byte(cert), key)
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// validIn is a validity period starting d from now, 180 days long.
func validIn(d time.Duration) string {
	from := time.Now().Add(d)
	return `"valid_from":"` + from.Format(time.RFC3339) + `","valid_until":"` + from.Add(sdk.CertificateValidity).Format(time.RFC3339) + `"`
}

// A host that requires a certificate loads only a binary with a valid,
// signed certificate for its exact sha256, and says why otherwise.
func TestRequireCertificate(t *testing.T) {
	bin, sum := plugin(t)
	pub, key, _ := ed25519.GenerateKey(nil)
	_, stranger, _ := ed25519.GenerateKey(nil)
	policy := &sdk.CertificatePolicy{TrustedKeys: []ed25519.PublicKey{pub}, SuiteVersions: []string{"test"}}
	good := certFor(t, sum, key, true)
	sdktest.Subprocess(t, bin, sdk.OpenOptions{CertificatePolicy: policy, Certificate: good})

	tampered := []byte(strings.Replace(string(good), `\"profile\":\"full\"`, `\"profile\":\"fulL\"`, 1))
	if string(tampered) == string(good) {
		tampered = []byte(strings.Replace(string(good), "kvfence-tcp", "kvfence-tcP", 1))
	}
	other := sdk.CertificatePolicy{TrustedKeys: []ed25519.PublicKey{pub}, SuiteVersions: []string{"another"}}
	cases := []struct {
		name, want string
		cert       []byte
		policy     *sdk.CertificatePolicy
	}{
		{"no certificate", "none was given", nil, policy},
		{"unsigned", "not signed", certFor(t, sum, nil, true), policy},
		{"signed by an untrusted key", "not trusted", certFor(t, sum, stranger, true), policy},
		{"altered after signing", "does not verify", tampered, policy},
		{"not certified", "not certified", certFor(t, sum, key, false), policy},
		{"another binary's certificate", "it is for sha256", certFor(t, make([]byte, 32), key, true), policy},
		{"suite version not accepted", "suite version", good, &other},
		{"dated 1999", "expired", certWith(t, sum, key, true, "full", `"valid_from":"1999-01-01T00:00:00Z","valid_until":"1999-07-01T00:00:00Z"`), policy},
		{"not yet valid", "not valid before", certWith(t, sum, key, true, "full", validIn(24*time.Hour)), policy},
		{"no validity period", "no validity period", certWith(t, sum, key, true, "full", ""), policy},
		{"validity ends before it starts", "ends", certWith(t, sum, key, true, "full", `"valid_from":"2030-01-01T00:00:00Z","valid_until":"2029-01-01T00:00:00Z"`), policy},
		{"profile never certifiable", "never certifiable", certWith(t, sum, key, true, "initiator-only", validIn(-time.Hour)), policy},
		{"profile unknown", "never certifiable", certWith(t, sum, key, true, "everything", validIn(-time.Hour)), policy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := sdk.Open(bin, sdk.OpenOptions{CertificatePolicy: c.policy, Certificate: c.cert})
			if !errdefs.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open: %v, want failed-precondition saying %q", err, c.want)
			}
		})
	}
	t.Run("modified binary", func(t *testing.T) {
		appendByte(t, bin)
		_, err := sdk.Open(bin, sdk.OpenOptions{CertificatePolicy: policy, Certificate: good})
		if !errdefs.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), "it is for sha256") {
			t.Fatalf("Open of a modified binary: %v", err)
		}
	})
}

// A plugin that never handshakes while a child it started (in a session
// of its own, out of reach of a process-group kill) keeps its stdout open:
// Open still fails when StartTimeout is up, not when that child exits.
func TestStartTimeoutWithChildHoldingStdout(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	script := filepath.Join(dir, "stubborn-plugin")
	body := "#!/bin/sh\nsetsid sleep 120 &\necho $! > " + pidFile + "\nsleep 120\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := sdk.Open(script, sdk.OpenOptions{StartTimeout: time.Second})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("Open: %v, want a start timeout", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Open still waiting 60 s after a 1 s start timeout: the child holding stdout defeats it")
	}
}

// Through a wrapper that execs in place (env here; ip netns exec in the
// conformance suite), the sealed copy still is what runs.
func TestPinnedOpenThroughWrapper(t *testing.T) {
	bin, sum := plugin(t)
	p := sdktest.Subprocess(t, bin, sdk.OpenOptions{SHA256: sum, ExecVia: []string{"env"}})
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(exe, "/memfd:kvfence-plugin:") {
		t.Fatalf("the plugin runs %q, not the sealed copy", exe)
	}
	if _, err := sdk.Open(bin, sdk.OpenOptions{ExecVia: []string{"env"}}); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("ExecVia without a pin: %v, want invalid-argument", err)
	}
}

// Every host that opens a plugin gets the asynchronous Post unless it asks
// for the synchronous one (OpenOptions.SyncPost, or KVFENCE_ASYNC_POST=off
// for every plugin the host opens); over the gRPC data path the contract
// stays synchronous whatever was asked.
func TestOpenDefaultsToAsyncPost(t *testing.T) {
	bin, _ := plugin(t)
	for _, c := range []struct {
		name, env, rings string
		opts             sdk.OpenOptions
		want             bool
	}{
		{"default", "", "", sdk.OpenOptions{}, true},
		{"SyncPost", "", "", sdk.OpenOptions{SyncPost: true}, false},
		{"KVFENCE_ASYNC_POST=off", "off", "", sdk.OpenOptions{}, false},
		{"KVFENCE_ASYNC_POST=on beats SyncPost", "on", "", sdk.OpenOptions{SyncPost: true}, true},
		{"gRPC data path", "", "off", sdk.OpenOptions{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KVFENCE_ASYNC_POST", c.env)
			t.Setenv("KVFENCE_RINGS", c.rings)
			p := sdktest.Subprocess(t, bin, c.opts)
			if got := p.AsyncPost(); got != c.want {
				t.Fatalf("AsyncPost() = %v, want %v (data path %s)", got, c.want, p.DataPath())
			}
		})
	}
}
