// Package sdktest lets a plugin author test a kvfence transport: in process
// over a real gRPC connection (InProcess), as a real subprocess loaded the
// way a host loads it (BuildPlugin, Subprocess), and against the contract
// checks (Checks, RunContract) that every plugin must pass.
//
// It owns the contract checks. A check is a plain function that returns an
// error, so a test can also assert that a known-unsafe plugin FAILS a check:
// a check that cannot fail proves nothing. It must never weaken a check to
// fit a plugin, and never assert on speed.
package sdktest
