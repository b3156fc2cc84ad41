// Command kvfence is the project's CLI: demo (prefill and decode ranks as
// processes, requests aborted mid-transfer, every page checked), sim (the
// core in deterministic simulation), bench (the cost of safety: safe core
// vs known-unsafe release-on-abort, with aborts; HTML reports drawn with
// gonum/plot), conformance (plugin certification) and topo, plus the
// hidden commands the demo runs as its rank processes (__agent,
// __plugin-tcp) and __holds-check.
//
// It owns flag parsing and presentation only: every decision lives in the
// packages it calls (agent, the runtime; internal/demo, the harness). A bad
// command line is refused before any work starts, in one line, with exit
// status 2. It must never select a known-unsafe variant unless the user
// asked for it by name, and in a build without -tags kvfenceunsafe it
// must refuse to (the in-process simulation excepted, docs/design.md §9).
package main
