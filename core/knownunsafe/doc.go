// Package knownunsafe names the deliberately broken variants of the kvfence
// core. They exist so that the simulation, the tests and the demo can prove
// that the checker catches each known way of getting writer lifetime wrong.
//
// It holds the names (Variant), the Policy the core asks at every decision a
// variant changes, and the agents' gate; never the unsafe behaviour itself.
// The policies are in internal/unsafecore, which only core/sim, the tests
// and -tags kvfenceunsafe agents link: outside this module a Variant names a
// behaviour but carries none, and the core refuses a variant whose policy is
// not linked. Agents (package agent) take their variant from AgentVariant, which is the
// safe core in every binary not built with -tags kvfenceunsafe, so no flag,
// file or environment of a default build reaches an unsafe core. The
// in-process simulation keeps every variant in every build: it moves no real
// memory.
package knownunsafe
