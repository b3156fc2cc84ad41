//go:build kvfenceunsafe

package knownunsafe

// Compiled reports whether agents may run known-unsafe variants: yes, this
// binary was built with -tags kvfenceunsafe (tests and demos only).
const Compiled = true
