// Package gpumem moves KV pages between an engine's GPU memory and host
// memory kvfence holds: the staged mode of GPU KV caches. The CUDA driver
// is reached through dlopen("libcuda.so.1") (or $KVFENCE_CUDA_LIB), with
// prototypes this package declares itself from the public driver API
// reference: no CUDA toolkit or header at build time, and on a machine
// without a driver every use is refused with FailedPrecondition naming the
// library.
//
// API:
//   - Open(Options) → *Device (one context, a stream per direction, pinned
//     staging); Shared() is the process's Device, opened on first use.
//   - Device.Gather / Device.Scatter ([]Piece: a device range and its host
//     bytes) → *Op with Done, Wait, Err, Cancel. Mover is the interface
//     engine-binding staging code routes device buffers to.
//   - StagedSender / StagedReceiver (staged.go) put an agent KVSender or
//     KVReceiver in front of device pages: prefill gathers the request's
//     GPU pages into its source pages before Send; decode scatters landed
//     pages into the engine's GPU pages only after the request succeeded,
//     and reports Transferring until that copy is done.
//   - Direct mode, opt-in (direct.go; docs/gpu-direct.md): Device.ExportBuffer
//     exports an engine buffer as a dma-buf (cuMemGetHandleForAddressRange)
//     offered over SCM_RIGHTS (sdk.ShareDMABuf); PageOffset addresses it by
//     engine page index; CheckDirect / RegisterDirect refuse a transport
//     without the dmabuf memory kind; EngineMemory is what the decode
//     agent runs on (agent.DecodeConfig.Engine: writes land at engine page
//     offsets), EngineBuffers the same over one buffer per layer (a page
//     split across them); DirectReceiver lends engine pages by index (InitAt) and
//     holds them until the agent released the exposure. The C ABI exports
//     decode's engine buffers for gpu_mode "direct"; never run on a real
//     GPU or NIC (the TCP plugin carries it where the dma-buf maps).
//
// Binding code (the C ABI's gather/scatter of an engine's buffer list)
// routes a device buffer like this; the host destination is the agent's
// page memory, the copy completes off the caller's thread:
//
//	if dev, ok := gpumem.DeviceOf(bufPtr); ok {
//		op, err := dev.Gather(pieces) // or Scatter, after the request succeeded
//		...                           // poll op.Ready(); op.Cancel() on abort
//	} else if engineSaysGPU {
//		_, err := gpumem.Shared() // FailedPrecondition naming the library
//	}
//
// It owns: the driver binding (driver.go), pinned staging (one mmap
// registered once with cuMemHostRegister, cut in chunks), asynchronous
// copies (one per run of consecutive device addresses within a chunk),
// their completion (events, waited in stream order), and cancellation.
//
// It must never: touch device memory from host code (all access goes
// through the driver); reuse a staging chunk whose copy may still be in
// flight (one whose event could not be waited on is leaked for ever); let
// a cancelled gather write host bytes after Cancel returns; copy into an
// engine's GPU pages before the request's transfer succeeded (so a late
// network write can land only in host memory the agent holds); or run a
// copy on the caller's thread (Gather and Scatter return at once); in
// direct mode, give an engine page back while an exposure of it is open
// (the NIC may still write it), or hand a dma-buf to a transport that did
// not declare the dmabuf memory kind.
// It does not order copies after the engine's compute stream: like
// SGLang's own backends, the engine's KV must be computed before it hands
// a request to kvfence.
package gpumem
