// Package knownunsafe names the deliberately broken variants of the kvfence
// core. They exist so that the simulation, the tests and the demo can prove
// that the checker catches each known way of getting writer lifetime wrong.
//
// The package is internal: engines that load kvfence cannot import it, and the
// zero Variant (Safe) is the only value a Variant outside this module can hold.
// Agents (package agent) take their variant from AgentVariant, which is the
// safe core in every binary not built with -tags kvfenceunsafe, so no flag,
// file or environment of a default build reaches an unsafe core. The
// in-process simulation keeps every variant in every build: it moves no real
// memory.
package knownunsafe
