package tcp

import (
	"testing"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The receiver holds a pieced key to its pieces (pieces.go): the contract
// check key-bounds-confine-writes passes the safe transport (in the
// contract tests) and catches ignore-pieces, which checks a write against
// the key's whole span only, in process and out of process.
func TestKeyBoundsCatchIgnorePieces(t *testing.T) {
	const check = "key-bounds-confine-writes"
	t.Run("in-process", func(t *testing.T) {
		cfg := Config{unsafe: unsafeIgnorePieces}
		pair := sdktest.Pair{Sender: sdktest.InProcess(t, newTCP(t, cfg)), Receiver: sdktest.InProcess(t, newTCP(t, cfg))}
		expectCheckFails(t, pair, check)
	})
	t.Run("out-of-process", func(t *testing.T) {
		opts := sdk.OpenOptions{Env: []string{"KVFENCE_TCP_UNSAFE=ignore-pieces"}}
		s := sdktest.Subprocess(t, unsafePluginBin, opts)
		r := sdktest.Subprocess(t, unsafePluginBin, opts)
		expectCheckFails(t, sdktest.Pair{Sender: s.Transport(), Receiver: r.Transport()}, check)
	})
}
