// Command kvfence is the project's CLI. Today it runs the deterministic
// simulation (`kvfence sim`); the demo, conformance and bench commands join
// it as their issues land.
//
// It owns flag parsing and presentation only: every decision lives in the
// packages it calls. It must never select a known-unsafe variant unless the
// user asked for it by name.
package main
