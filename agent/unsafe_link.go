//go:build kvfenceunsafe

package agent

// A -tags kvfenceunsafe binary runs known-unsafe cores in its agents
// (knownunsafe.AgentVariant): it links their policies. A default build
// never compiles this file.
import _ "github.com/kvfence/kvfence/internal/unsafecore"
