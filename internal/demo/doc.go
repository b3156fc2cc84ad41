// Package demo is the harness around the runtime that `kvfence demo`,
// `kvfence bench` and the tests drive. It runs the demo (Run: one decode
// and two prefill rank processes, requests admitted, opened and cancelled
// mid-transfer by a router in this process, decode's counters at the end,
// the CPU its processes used while requests ran, read from /proc)
// and the decode-restart run (RunDecodeRestart: a first wave cut by a
// kill -9 of decode, a new instance on its address, a second wave), each as
// small steps: argument lists, request plans, a worker pool, one request's
// transfer, waits on decode and prefill, the summary. It is also the body
// of each rank process (RunAgent, `kvfence __agent`): the agent with the
// simulated engine behind it (decode keeps a handed-off request for a while
// and finishes it; prefill fills pages with the content oracle's bytes at a
// set pace), delaying proxies on decode's data path. Around them: the
// router (over internal/routerlink), a throwaway PKI for mutual TLS on
// loopback, and the hold-log checker. The content oracle and the delaying
// proxy are its subpackages.
//
// It owns the router protocol (Command, Event) and everything that exists
// only to show and test the runtime. Its callers have checked the options
// (cmd/kvfence owns flags and their refusals); it decides nothing about
// memory, which is the runtime's. It must never be imported by the runtime
// (package agent) or by an engine, and its certificates must never leave a
// demo run.
package demo
