// Command minimal-plugin is the example of docs/writing-a-plugin.md: the
// smallest honest kvfence transport plugin we could write, certified by the
// conformance suite in its test (so the guide cannot rot).
//
// Its data path is one TCP connection per peer. Each write is a frame
// (header, then payload) that the target applies into the granted window
// and acknowledges; the initiator sends a batch's writes one at a time and
// waits for each acknowledgement. Every frame carries a deadline; the
// target refuses a frame past it, which is what bounds the tail (MaxTail).
// Revoke takes the key's lock, which every apply holds: once Revoke
// returns, nothing applies under the key.
//
// It owns only itself. It must never report Succeeded before every write
// of the batch was acknowledged, FailedDefinite unless the target refused
// (and so applied nothing more of the batch), or Quiesce evidence it does
// not have. Settings: KVFENCE_EXAMPLE_LISTEN (default 127.0.0.1:0),
// KVFENCE_EXAMPLE_TTL (a frame's life, default 2s).
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

func main() {
	log := sdk.NewPluginLogger("minimal-plugin")
	listen := os.Getenv("KVFENCE_EXAMPLE_LISTEN")
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ttl := 2 * time.Second
	if v := os.Getenv("KVFENCE_EXAMPLE_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "invalid-argument: KVFENCE_EXAMPLE_TTL=%q: want a positive duration\n", v)
			os.Exit(2)
		}
		ttl = d
	}
	t, err := newTransport(listen, ttl, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sdk.Serve(t, sdk.ServeOptions{Logger: log})
}
