// Command kvfence-plugin-tcp is the TCP reference transport as a kvfence
// plugin binary. A host starts it with sdk.Open; run by hand it refuses
// (go-plugin's handshake cookie).
//
// Settings come from the environment so a host can pass them with
// OpenOptions.Env: KVFENCE_TCP_LISTEN (default 127.0.0.1:0),
// KVFENCE_TCP_ACK_TIMEOUT, KVFENCE_TCP_WRITE_TTL, KVFENCE_TCP_CLOCK_SKEW,
// KVFENCE_TCP_HANDSHAKE_TIMEOUT, KVFENCE_TCP_IDLE_TIMEOUT,
// KVFENCE_TCP_FIRST_WRITE_TIMEOUT (Go durations),
// KVFENCE_TCP_MAX_CONNS (data-port connection cap), KVFENCE_LOG_LEVEL.
//
// It owns only wiring (environment to tcp.Config, sdk.Serve). It must never
// be able to select a known-unsafe variant unless built with -tags
// kvfenceunsafe (tests only).
package main
