package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

func newTCP(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// The contract directly on the Go value (no gRPC).
func TestContractDirect(t *testing.T) {
	sdktest.RunContract(t, sdktest.Pair{Sender: newTCP(t, Config{}), Receiver: newTCP(t, Config{})})
}

// The contract through the plugin protocol, in process.
func TestContractInProcess(t *testing.T) {
	sdktest.RunContract(t, sdktest.Pair{
		Sender:   sdktest.InProcess(t, newTCP(t, Config{})),
		Receiver: sdktest.InProcess(t, newTCP(t, Config{})),
	})
}

// The contract against two real plugin processes loaded by sdk.Open.
func TestContractOutOfProcess(t *testing.T) {
	sum, err := sdk.FileSHA256(pluginBin)
	if err != nil {
		t.Fatal(err)
	}
	opts := sdk.OpenOptions{SHA256: sum}
	s := sdktest.Subprocess(t, pluginBin, opts)
	r := sdktest.Subprocess(t, pluginBin, opts)
	if v := s.NegotiatedVersion(); v != sdk.ProtocolVersion {
		t.Fatalf("negotiated version %d", v)
	}
	if _, ok := s.Transport().(sdk.Granter); !ok {
		t.Fatal("plugin declares Revoke but the host transport is not a Granter")
	}
	sdktest.RunContract(t, sdktest.Pair{Sender: s.Transport(), Receiver: r.Transport()})
}

func TestOpenRefusesWrongChecksum(t *testing.T) {
	_, err := sdk.Open(pluginBin, sdk.OpenOptions{SHA256: make([]byte, 32)})
	if !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("Open with a wrong sha256: %v, want failed-precondition", err)
	}
}

// A test that cannot fail is a defect: each known-unsafe variant must fail
// the contract check aimed at it, in process and out of process.
func TestContractCatchesUnsafeVariants(t *testing.T) {
	variants := []struct {
		mode  unsafeMode
		name  string
		check string
	}{
		{unsafeSucceedBeforeAck, "succeed-before-ack", "unknown-key-is-not-success"},
		{unsafeSucceedBeforeAck, "succeed-before-ack", "out-of-window-is-refused"},
		{unsafeApplyAfterRevoke, "apply-after-revoke", "revoke-stops-writes"},
		{unsafeApplyAfterRevoke, "apply-after-revoke", "batch-keys-answer-each-item"},
		{unsafeBatchRevokeAllOK, "batch-revoke-all-ok", "batch-keys-answer-each-item"},
		{unsafeRefusalCutsSession, "refusal-cuts-session", "refused-write-fails-alone"},
	}
	for _, v := range variants {
		t.Run(v.name+"/"+v.check+"/in-process", func(t *testing.T) {
			cfg := Config{unsafe: v.mode}
			pair := sdktest.Pair{Sender: sdktest.InProcess(t, newTCP(t, cfg)), Receiver: sdktest.InProcess(t, newTCP(t, cfg))}
			expectCheckFails(t, pair, v.check)
		})
		t.Run(v.name+"/"+v.check+"/out-of-process", func(t *testing.T) {
			opts := sdk.OpenOptions{Env: []string{"KVFENCE_TCP_UNSAFE=" + v.name}}
			s := sdktest.Subprocess(t, unsafePluginBin, opts)
			r := sdktest.Subprocess(t, unsafePluginBin, opts)
			expectCheckFails(t, sdktest.Pair{Sender: s.Transport(), Receiver: r.Transport()}, v.check)
		})
	}
	// And the safe transport passes those very checks (in the contract tests).
}

func expectCheckFails(t *testing.T, pair sdktest.Pair, check string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, pair)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := sdktest.CheckNamed(check).Run(ctx, e); err == nil {
		t.Fatalf("check %s passed a known-unsafe transport", check)
	} else {
		t.Logf("caught as expected: %v", err)
	}
}
