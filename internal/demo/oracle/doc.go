// Package oracle is the demo's content oracle: every shard a prefill rank
// writes for a request is a pure function of (room, gen, page, rank).
// Decode recomputes it at handoff and again when the decode loop finishes,
// so a page that holds another request's bytes (a late write that landed
// after reuse) is detected, and its header says whose bytes they are.
//
// It owns the content and its check only. It must never be needed by an
// engine: a real engine's bytes are its own, and the runtime calls the
// oracle only through the optional agent.ContentCheck hook.
package oracle
