// Package stage copies one request's pages between an engine's KV buffers
// and kvfence's pages: SGLang's layout (one buffer per layer and K/V, one
// item of page_size tokens per page index) on one side, kvfence's shards
// (every buffer's bytes of one page, concatenated) on the other.
//
// It owns the address arithmetic (Gather and Scatter plans, contiguous runs
// merged so each is one copy; GatherPages plans a whole request buffer by
// buffer, copied span by span with Host.CopySpan) and the Copier interface
// that performs them:
// Host copies host memory (long runs with non-temporal stores, in amd64
// assembly: a gather's destination is in no cache); a layout with device buffers (Buffer.Device) is
// copied by the C ABI's gpumem-backed Copier (cmd/libkvfence/stage_gpu.go)
// with the same plans.
//
// It must never decide when memory may be touched: callers (the agent's
// KVSender.Fill and FillRange, the C ABI) hold the request's pages for the copy's whole
// duration. It never allocates per token and never retains an address after
// a call returns.
package stage
