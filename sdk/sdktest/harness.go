package sdktest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/kvfence/kvfence/sdk"
	"google.golang.org/grpc"
)

// InProcess serves impl over go-plugin's in-process gRPC test connection and
// returns the host's view of it, exactly as Open would (Granter iff the
// plugin declares Revoke). Everything is closed at the end of the test.
func InProcess(t testing.TB, impl sdk.Transport) sdk.Transport {
	t.Helper()
	shortTempDir(t)
	client, _ := plugin.TestPluginGRPCConn(t, false, sdk.PluginSet(impl))
	raw, err := client.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatalf("sdktest: dispense: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, _, err := sdk.NewRemote(ctx, raw.(*grpc.ClientConn))
	if err != nil {
		t.Fatalf("sdktest: connect: %v", err)
	}
	t.Cleanup(func() {
		_ = tr.Close()
		// Closing the client stops the server (go-plugin's Shutdown RPC);
		// stopping it here as well would race inside go-plugin.
		_ = client.Close()
	})
	return tr
}

// shortTempDir points TMPDIR at /tmp when it is too long for a unix socket
// path (go-plugin's test connection listens on a socket in TMPDIR).
func shortTempDir(t testing.TB) {
	if len(os.TempDir()) > 40 {
		t.Setenv("TMPDIR", "/tmp")
	}
}

// BuildPlugin builds the main package pkg (an import path or a directory)
// into dir and returns the binary's path. Use it from TestMain so a test run
// always loads a binary built from the current source.
func BuildPlugin(dir, pkg string, tags ...string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	if len(tags) > 0 {
		out += "-" + tags[0]
	}
	args := []string{"build", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", joinTags(tags))
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", err
	}
	return out, nil
}

func joinTags(tags []string) string {
	s := ""
	for i, t := range tags {
		if i > 0 {
			s += ","
		}
		s += t
	}
	return s
}

// Subprocess loads the plugin binary at path as a host would (sdk.Open) and
// closes it (killing and reaping the process) at the end of the test.
func Subprocess(t testing.TB, path string, opts sdk.OpenOptions) *sdk.Plugin {
	t.Helper()
	p, err := sdk.Open(path, opts)
	if err != nil {
		t.Fatalf("sdktest: open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
