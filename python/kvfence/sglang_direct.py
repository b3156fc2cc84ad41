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
Such an SGLang is refused, as is one with the release turned off, and
one whose deferred release gives up
(SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT: SGLang then
frees the pages unacked) before kvfence's hold can end (max_hold_ms +
clock_margin_ms after admission).

Aux and state rows: a request's aux row and Mamba state row travel as
extra pages after its KV pages. SGLang has no engine page to spare for
them (its allocator owns every page but the padding page 0, which
CUDA-graph padding writes), so they land in host landing pages the decode
agent maps next to the engine buffers (direct_host_pages: indices
direct_pages.. ; one set of extra pages per aux row, at direct_pages +
aux_index * extra_pages, so SGLang's metadata slot names them and its
deferred release keeps them with the request's pages). kvfence lends,
holds and releases them like the engine's pages; on Success the receiver
reads them (kvfence_receiver_read) and copies the rows into SGLang's
buffers, the aux row last (it opens SGLang's metadata gate), as staged
mode does.

Must never: hand SGLang a page kvfence still holds, or write engine
memory from host code (the transport does, through the dma-buf)."""
import os

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


# kvfence's defaults for the decode keys the hold bound is made of
# (cmd/libkvfence/config.go: max_hold_ms 30000, clock_margin_ms 100).
_MAX_HOLD_MS, _CLOCK_MARGIN_MS = 30000, 100

_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"


def _release_timeout_s():
    """SGLang's own bound on a deferred release, in seconds: after it,
    DecodeTransferQueue.resolve_deferred_releases frees a held request's
    pages without the manager's is_abort_release_safe (sgl-project/sglang
    @ f1bb745d, test/registered/unit/disaggregation/
    test_deferred_decode_kv_release.py: test_releases_on_timeout_without_ack).
    Read through SGLang where it declares it (its default applies), else
    from the environment; None where neither knows one."""
    try:
        from sglang.srt.environ import envs
        return float(getattr(envs, _TIMEOUT_ENV).get())
    except (ImportError, AttributeError, TypeError, ValueError):
        v = os.environ.get(_TIMEOUT_ENV)
        try:
            return float(v) if v not in (None, "") else None
        except ValueError:
            return None


def _hold_keys(passthrough):
    p = passthrough or {}
    return int(p.get("max_hold_ms") or _MAX_HOLD_MS), int(p.get("clock_margin_ms") or _CLOCK_MARGIN_MS)


def hold_bound_ms(passthrough):
    """The longest kvfence holds an aborted request's pages counted from
    its admission, as far as it is known at start-up: max_hold_ms (no
    lease reaches past admission + max_hold_ms) + clock_margin_ms. A
    writer's transport tail (its MaxTail, at most 5 min) comes on top and
    is known only when the writer links."""
    hold, margin = _hold_keys(passthrough)
    return hold + margin


def release_timeout_refusal(passthrough):
    """Why SGLang's deferred-release timeout is too short for kvfence's
    hold (None when it is not, or SGLang has none): SGLang would free an
    aborted request's pages while a late write may still land in them."""
    timeout = _release_timeout_s()
    if timeout is None:
        return None
    hold, margin = _hold_keys(passthrough)
    if timeout * 1000 >= hold + margin:
        return None
    return ("SGLang frees a deferred request's pages after %s=%gs, before kvfence's hold ends (up to %d ms: "
            "max_hold_ms %d + clock_margin_ms %d, and a writer's transport tail on top), so a late write could "
            "land in pages SGLang reused: set %s to at least %g or lower max_hold_ms to at most %d"
            % (_TIMEOUT_ENV, timeout, hold + margin, hold, margin, _TIMEOUT_ENV, (hold + margin) / 1000.0,
               int(timeout * 1000) - margin))


def sglang_defers(manager_base=None):
    """Whether the SGLang in this process keeps a failed request's decode
    pages until the manager says released. Without SGLang's base classes
    (kvfence's own harness drives the classes) the caller plays SGLang and
    is held to the same contract."""
    base = _SGLangManager if manager_base is None else manager_base
    if base is None:
        return not _release_off()
    return hasattr(base, "supports_deferred_decode_kv_release") and not _release_off()


def start_up_refusal(args, manager_base=None, passthrough=None):
    """The reasons a decode rank cannot run direct, known at start-up
    (empty: it may). passthrough: the decode keys of the library config
    (max_hold_ms, clock_margin_ms)."""
    why = []
    if not sglang_defers(manager_base):
        why.append("this SGLang has no deferred decode-KV release (or it is off: "
                   "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE), so an aborted request's pages would be "
                   "reused while writes may still land")
    else:
        short = release_timeout_refusal(passthrough)
        if short:
            why.append(short)
    if not list(getattr(args, "kv_data_ptrs", []) or []):
        why.append("no KV buffers")
    return why


def refuse_at_start(args, manager_base=None, passthrough=None):
    why = start_up_refusal(args, manager_base, passthrough)
    if why:
        raise errors.Unimplemented("kvfence: gpu_mode \"direct\" on decode: %s (docs/gpu-direct.md; use gpu_mode "
                                   "\"staged\")" % "; ".join(why))


def aux_rows(args):
    """How many aux rows (metadata slots) SGLang has: the fewest any of
    its aux buffers holds."""
    rows = [int(n) // int(i) for n, i in zip(getattr(args, "aux_data_lens", []) or [],
                                            getattr(args, "aux_item_lens", []) or []) if int(i) > 0]
    return min(rows) if rows else 0


def config(args, shards, mla, extra_pages=0):
    """The library's decode config keys for SGLang's KV buffers, with
    extra_pages host landing pages per aux row (its aux and state rows).
    Several
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
    out = api.direct_layers(args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens)
    if extra_pages:
        rows = aux_rows(args)
        if not rows:
            raise errors.Unimplemented("kvfence: gpu_mode \"direct\": %d extra pages a request (state rows) and no aux "
                                       "buffer to name their landing pages: use gpu_mode \"staged\"" % extra_pages)
        out["direct_host_pages"] = rows * extra_pages
    return out


def landing_indices(kv_indices, aux_index, direct_pages, extra_pages):
    """The page indices a request lands at: SGLang's KV pages, then its
    extra pages' host landing pages (those of its aux row). Without extra
    pages, kv_indices itself (passed in place)."""
    if not extra_pages:
        return kv_indices
    if aux_index is None:
        raise errors.InvalidArgument("kvfence: direct mode: a request without aux_index has no landing pages for "
                                     "its %d extra pages" % extra_pages)
    first = direct_pages + int(aux_index) * extra_pages
    try:
        import numpy as np
        return np.concatenate([np.asarray(kv_indices, dtype=np.int32),
                               np.arange(first, first + extra_pages, dtype=np.int32)])
    except ImportError:
        return [int(i) for i in kv_indices] + list(range(first, first + extra_pages))
