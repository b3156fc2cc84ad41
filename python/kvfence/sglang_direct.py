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
max_declared_tail_ms + clock_margin_ms after admission: hold_budget, which
also picks the keys the operator left unset to fit).

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
import logging
import math
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
# (cmd/libkvfence/config.go: lease_ms 2000, max_hold_ms 30000,
# clock_margin_ms 100; max_declared_tail_ms: core.DefaultMaxDeclaredTail).
_LEASE_MS, _MAX_HOLD_MS, _CLOCK_MARGIN_MS, _MAX_DECLARED_TAIL_MS = 2000, 30000, 100, 300000
# Direct mode's default max_declared_tail_ms under an SGLang timeout of T
# seconds: min(5000, T*1000/6). Honest transports declare seconds (verbs:
# its QP retry tail + 1 s, about 1.5 s by default).
_DIRECT_TAIL_MS = 5000

_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"

_log = logging.getLogger("kvfence.sglang_direct")


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


def _explicit(passthrough, key):
    """The operator's value for a decode key, None where unset (0 is the
    library's "default", so unset too)."""
    v = (passthrough or {}).get(key)
    return int(v) if v else None


def hold_budget(timeout_s, passthrough):
    """Fit kvfence's hold into SGLang's deferred-release timeout (pure).

    A timeout hold ends at most max_hold_ms (no lease reaches past
    admission + max_hold_ms) + the writers' transport tail (at most
    max_declared_tail_ms: a longer one is refused when the rank links, and
    decode's own transport's is refused at open) + clock_margin_ms after
    admission. SGLang frees a deferred request's pages timeout_s after
    deferring it (later than admission), so
    max_hold_ms + max_declared_tail_ms + clock_margin_ms <= timeout_s*1000
    keeps every page until kvfence released it.

    Keys the operator left unset are chosen to fit: max_declared_tail_ms
    min(5000, T*1000/6), max_hold_ms the rest (at most 30000), lease_ms
    lowered to max_hold_ms where that is shorter than 2000.

    Returns (values, chosen, refusal): values, every key of the bound
    (and lease_ms); chosen, the keys this function picked; refusal, None
    or why the bound does not fit, naming every value and the fixes.
    timeout_s None (SGLang declares no timeout): nothing to fit."""
    hold, tail = _explicit(passthrough, "max_hold_ms"), _explicit(passthrough, "max_declared_tail_ms")
    margin, lease = _explicit(passthrough, "clock_margin_ms"), _explicit(passthrough, "lease_ms")
    chosen = []
    if timeout_s is None:
        return ({"max_hold_ms": hold or _MAX_HOLD_MS, "max_declared_tail_ms": tail or _MAX_DECLARED_TAIL_MS,
                 "clock_margin_ms": margin or _CLOCK_MARGIN_MS, "lease_ms": lease or _LEASE_MS}, chosen, None)
    budget = int(math.floor(timeout_s * 1000 + 1e-6))
    if margin is None:
        margin = _CLOCK_MARGIN_MS
    if tail is None:
        tail = max(min(_DIRECT_TAIL_MS, budget // 6), 1)  # never 0: the library's 5 min
        chosen.append("max_declared_tail_ms")
    hold_given = hold is not None
    if not hold_given:
        hold = min(_MAX_HOLD_MS, budget - tail - margin)
        chosen.append("max_hold_ms")
    if lease is None and 0 < hold < _LEASE_MS:
        lease = hold
        chosen.append("lease_ms")
    values = {"max_hold_ms": hold, "max_declared_tail_ms": tail, "clock_margin_ms": margin,
              "lease_ms": lease or _LEASE_MS}
    total = hold + tail + margin
    why = None
    if hold <= 0:
        why = ("leaves no time for a hold: %s=%gs (%d ms) - max_declared_tail_ms %d%s - clock_margin_ms %d = "
               "max_hold_ms %d" % (_TIMEOUT_ENV, timeout_s, budget, tail,
                                    " (direct mode's default)" if "max_declared_tail_ms" in chosen else "", margin, hold))
    elif total > budget:
        why = ("SGLang frees a deferred request's pages after %s=%gs (%d ms), before kvfence's hold can end "
               "(max_hold_ms %d + max_declared_tail_ms %d + clock_margin_ms %d = %d ms after admission)"
               % (_TIMEOUT_ENV, timeout_s, budget, hold, tail, margin, total))
    elif values["lease_ms"] > hold:
        why = ("lease_ms %d is longer than max_hold_ms %d%s, which SGLang's %s=%gs leaves"
               % (values["lease_ms"], hold, " (chosen)" if not hold_given else "", _TIMEOUT_ENV, timeout_s))
    if why:
        floor = max(values["lease_ms"], 1)  # the shortest hold that leaves room for a lease
        fixes = ["set %s to at least %g" % (_TIMEOUT_ENV, (max(hold, floor) + tail + margin) / 1000.0)]
        if hold_given and budget - tail - margin >= floor:
            fixes.append("lower max_hold_ms to at most %d" % (budget - tail - margin))
        elif not hold_given and hold > 0:
            fixes.append("lower lease_ms to at most %d" % hold)
        room = budget - (hold if hold_given else floor) - margin
        if room > 0 and room < tail:
            fixes.append("lower max_declared_tail_ms to at most %d (no prefill rank's transport may then declare a "
                         "longer tail)" % room)
        why += "; a late write could land in pages SGLang reused. Fix: %s" % "; or ".join(fixes)
    return values, chosen, why


def hold_bound_ms(passthrough, timeout_s=None):
    """The longest kvfence holds an aborted request's pages counted from
    its admission: max_hold_ms (no lease reaches past admission +
    max_hold_ms) + the writers' transport tail (at most
    max_declared_tail_ms) + clock_margin_ms, with the values direct mode
    uses under SGLang's timeout timeout_s (hold_budget)."""
    v = hold_budget(timeout_s, passthrough)[0]
    return v["max_hold_ms"] + v["max_declared_tail_ms"] + v["clock_margin_ms"]


def release_timeout_refusal(passthrough):
    """Why SGLang's deferred-release timeout is too short for kvfence's
    hold (None when it is not, or SGLang has none): SGLang would free an
    aborted request's pages while a late write may still land in them."""
    return hold_budget(_release_timeout_s(), passthrough)[2]


def direct_hold_keys(passthrough):
    """passthrough with the decode keys direct mode chose to fit SGLang's
    deferred-release timeout (hold_budget), logged once; the caller ran
    refuse_at_start first. Unchanged where SGLang declares no timeout."""
    timeout = _release_timeout_s()
    values, chosen, why = hold_budget(timeout, passthrough)
    if why:
        raise errors.InvalidArgument("kvfence: gpu_mode \"direct\" on decode: %s" % why)
    if timeout is None:
        return passthrough
    out = dict(passthrough)
    for k in chosen:
        out[k] = values[k]
    _log.info("kvfence direct mode: hold fits SGLang's %s=%gs: max_hold_ms %d + max_declared_tail_ms %d + "
              "clock_margin_ms %d = %d ms (lease_ms %d; chosen: %s)", _TIMEOUT_ENV, timeout, values["max_hold_ms"],
              values["max_declared_tail_ms"], values["clock_margin_ms"],
              values["max_hold_ms"] + values["max_declared_tail_ms"] + values["clock_margin_ms"],
              values["lease_ms"], ", ".join(chosen) or "none")
    return out


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
    (max_hold_ms, max_declared_tail_ms, clock_margin_ms, lease_ms: the
    hold must fit SGLang's deferred-release timeout, hold_budget)."""
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
