// Package knownunsafe names the deliberately broken variants of the kvfence
// core. They exist so that the simulation, the tests and the demo can prove
// that the checker catches each known way of getting writer lifetime wrong.
//
// The package is internal: engines that load kvfence cannot import it, and the
// zero Variant (Safe) is the only value a Variant outside this module can hold.
// It must never be reachable from a production configuration (flags, files or
// environment of the agent).
package knownunsafe
