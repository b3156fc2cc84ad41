"""Direct mode for SGLang's decode (gpu_mode "direct", docs/gpu-direct.md):
the transport writes a request's KV straight into SGLang's own KV pages,
no staging pool and no scatter.

What this module owns: the start-up checks that decide whether a decode
rank may run direct, and the library config built from SGLang's KVArgs
(kv_data_ptrs, kv_data_lens, kv_item_lens: one engine buffer per layer's
K and V, or per MLA layer; engine page p is kv_item_lens[i] bytes at
p * kv_item_lens[i] in buffer i, and SGLang's kv_indices at
send_metadata are such page indices already, kv_to_page_indices applied).

Why the checks: with direct writes, kvfence's hold moves into SGLang. An
aborted or failed request's pages may still be written until kvfence says
released (drained, fenced or timed out), so SGLang must not reuse them
before. SGLang's deferred decode-KV release (DecodeTransferQueue holds a
failed request's pages while its receiver's abort_notified is true, until
the manager's is_abort_release_safe(room, len(bootstrap_infos))) is the
only way SGLang offers a backend to keep pages out of its allocator; an
SGLang without it frees them as soon as a poll says Failed (and TP ranks
MIN-reduce their polls, so one rank's Failed frees every rank's pages).
Such an SGLang is refused, as is one with the release turned off.

What stays staged, and why refused in direct mode instead: a request's
aux row and Mamba state row travel as extra pages after its KV pages.
In direct mode every page of the request lands in an engine page, and
SGLang has no engine page to spare for them (its allocator owns every
page but the padding page 0, which CUDA-graph padding writes). Landing
them needs host pages next to the engine buffers in the decode agent,
which the library does not have; until it does, a decode rank whose
model has aux or state buffers is refused (Unimplemented) rather than
silently dropping the row that opens SGLang's metadata gate.

Must never: hand SGLang a page kvfence still holds, or write engine
memory from host code (the transport does, through the dma-buf)."""
from . import api, errors

try:  # the deferred decode-KV release's declaration in SGLang's base classes
    from sglang.srt.disaggregation.base.conn import BaseKVManager as _SGLangManager
except ImportError:
    _SGLangManager = None


def _release_off():
    """Whether SGLang's own switch turned the deferred release off (its
    default differs between versions: read through SGLang where it is)."""
    try:
        from sglang.srt.environ import envs
        return not envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.get()
    except (ImportError, AttributeError):
        import os
        return os.environ.get("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "").lower() in ("0", "false", "no")


def sglang_defers(manager_base=None):
    """Whether the SGLang in this process keeps a failed request's decode
    pages until the manager says released. Without SGLang's base classes
    (kvfence's own harness drives the classes) the caller plays SGLang and
    is held to the same contract."""
    base = _SGLangManager if manager_base is None else manager_base
    if base is None:
        return not _release_off()
    return hasattr(base, "supports_deferred_decode_kv_release") and not _release_off()


def start_up_refusal(args, aux_bytes, state_bytes, manager_base=None):
    """The reasons a decode rank cannot run direct, known at start-up
    (empty: it may)."""
    why = []
    if not sglang_defers(manager_base):
        why.append("this SGLang has no deferred decode-KV release (or it is off: "
                   "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE), so an aborted request's pages would be "
                   "reused while writes may still land")
    if aux_bytes or state_bytes:
        why.append("the aux row (%d bytes) and state row (%d bytes) need host landing pages the direct decode "
                   "agent does not have" % (aux_bytes, state_bytes))
    if not list(getattr(args, "kv_data_ptrs", []) or []):
        why.append("no KV buffers")
    return why


def refuse_at_start(args, aux_bytes, state_bytes, manager_base=None):
    why = start_up_refusal(args, aux_bytes, state_bytes, manager_base)
    if why:
        raise errors.Unimplemented("kvfence: gpu_mode \"direct\" on decode: %s (docs/gpu-direct.md; use gpu_mode "
                                   "\"staged\")" % "; ".join(why))


def config(args, shards, mla):
    """The library's decode config keys for SGLang's KV buffers. Several
    writers per page (prefill TP > decode TP) each write the pos-th part
    of every buffer's page, which is their heads only when a page is one
    token ([heads, head_dim]); with page_size > 1 a page is token-major and
    a writer's heads are strided, and MLA's writers each send the whole
    latent: both refused (Unimplemented)."""
    page_size = int(getattr(args, "page_size", 1) or 1)
    if shards > 1 and (mla or page_size > 1):
        raise errors.Unimplemented(
            "kvfence: gpu_mode \"direct\" with %d prefill ranks per decode rank needs page_size 1 and no MLA "
            "(page_size %d%s): use gpu_mode \"staged\"" % (shards, page_size, ", MLA" if mla else ""))
    return api.direct_layers(args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens)
