// Package demo is the harness around the runtime that `kvfence demo`,
// `kvfence bench` and the tests drive: a router that admits, opens and
// cancels requests over the control plane (agent.CommandLink), the
// simulated engines behind each rank that obey it (decode keeps a
// handed-off request for a while and finishes it; prefill fills pages with
// the content oracle's bytes at a set pace), a throwaway PKI for mutual TLS
// on loopback, and the hold-log checker. The content oracle and the
// delaying proxy are its subpackages.
//
// It owns the router protocol (Command, Event) and everything that exists
// only to show and test the runtime. It must never be imported by the
// runtime (package agent) or by an engine, and its certificates must never
// leave a demo run.
package demo
