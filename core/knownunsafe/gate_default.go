//go:build !kvfenceunsafe

package knownunsafe

// Compiled reports whether agents may run known-unsafe variants: not in a
// default build.
const Compiled = false
