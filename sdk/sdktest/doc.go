// Package sdktest lets a plugin author test a kvfence transport: in process
// over a real gRPC connection (InProcess), as a real subprocess loaded the
// way a host loads it (BuildPlugin, Subprocess), and against the contract
// checks (Checks, RunContract) that every plugin must pass.
//
// Layer 1 of the three plugin suites (contract → fault judge →
// certification; docs/writing-a-plugin.md §6): the contract checks, one
// function each, on one healthy plugin pair and without faults — fast
// enough for a plugin's own unit tests. The certification suite
// (package conformance, layer 3) runs these same checks as its
// sdk-contract group; the vendor kit's fault judge (layer 2,
// plugins/kit/nocancel/nocanceltest) builds its plugins with BuildPlugin.
// Passing them certifies nothing on its own.
//
// It owns the contract checks. A check is a plain function that returns an
// error, so a test can also assert that a known-unsafe plugin FAILS a check:
// a check that cannot fail proves nothing. It must never weaken a check to
// fit a plugin, and never assert on speed.
package sdktest
