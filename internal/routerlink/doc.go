// Package routerlink is the router protocol's link between a router and an
// agent, kept out of package agent's public API: only packages of this
// module (the runtime, the demo's router and engines) can import it. An
// engine embedding the runtime takes no router commands; the router
// protocol is the demo's (internal/demo owns its Command and Event
// payloads, which the runtime never reads).
//
// It owns the Link interface and the two hooks package agent fills in at
// init: the dialer (a router's side of a link) and ServeCommands (an
// agent configuration's handler for router links, an unexported field) (the link itself is the agent's control link: Hello first, mutual
// TLS identity, sequence numbers, admission limits). It must never carry a
// link implementation of its own, and never be imported by anything
// outside this module's runtime and demo.
package routerlink
