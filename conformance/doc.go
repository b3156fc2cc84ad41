// Package conformance will hold the certification suite that every transport
// plugin runs: it checks that a plugin tells the truth about when its writes
// stop. It drives plugins only through the sdk contract and must never import
// the core.
//
// Not built yet: a later issue fills this package.
package conformance
