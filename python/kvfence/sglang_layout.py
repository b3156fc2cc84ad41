"""Who writes what between SGLang's prefill and decode TP groups.

SGLang splits KV heads contiguously over attention TP ranks, and pairs ranks
as its CommonKVManager._resolve_rank_mapping does:
- prefill TP P >= decode TP D: decode rank d reads prefill ranks
  [d*P/D, (d+1)*P/D); each writes its whole pages, one shard of decode's
  slot, shard k holding heads k of P/D (MLA: every rank writes the whole
  latent, decode takes shard 0 and still waits for all).
- decode TP D > prefill TP P: prefill rank r serves decode ranks
  [r*D/P, (r+1)*D/P); it sends decode rank d part d % (D/P) of each token's
  heads (MLA: the whole latent).
Pure functions, no I/O: the classes in kvfence.sglang and the tests use them.
"""
from . import errors


def check_sizes(prefill_tp, decode_tp):
    """Refuses TP sizes that do not divide (SGLang requires the same)."""
    p, d = int(prefill_tp), int(decode_tp)
    if p <= 0 or d <= 0 or (max(p, d) % min(p, d)) != 0:
        raise errors.InvalidArgument("kvfence: prefill TP %d and decode TP %d: one must divide the other" % (p, d))
    return p, d


def decode_writers(decode_rank, prefill_tp, decode_tp):
    """The prefill TP ranks that write decode_rank's slots, in shard order."""
    p, d = check_sizes(prefill_tp, decode_tp)
    r = int(decode_rank) % d
    if p >= d:
        k = p // d
        return list(range(r * k, (r + 1) * k))
    return [r // (d // p)]


def prefill_targets(prefill_rank, prefill_tp, decode_tp, mla=False):
    """[(decode rank, part, parts)] prefill_rank sends to: the slice of
    every token (part of parts) each decode rank takes."""
    p, d = check_sizes(prefill_tp, decode_tp)
    r = int(prefill_rank) % p
    if p >= d:
        return [(r // (p // d), 0, 1)]
    k = d // p
    return [(dr, 0 if mla else dr % k, 1 if mla else k) for dr in range(r * k, (r + 1) * k)]


def shard_bytes(page_bytes, prefill_tp, decode_tp, mla=False, side="decode"):
    """Bytes of one page in kvfence's pages. decode: page_bytes is decode's
    page (all its heads), split over its writers; prefill: page_bytes is
    prefill's page, split over the decode ranks it serves."""
    p, d = check_sizes(prefill_tp, decode_tp)
    if mla:
        return page_bytes
    if side == "decode":
        n = p // d if p >= d else 1
    else:
        n = d // p if d > p else 1
    if page_bytes % n:
        raise errors.InvalidArgument("kvfence: %d-byte pages do not split in %d head groups" % (page_bytes, n))
    return page_bytes // n


def aux_pages(aux_bytes, shard):
    """Pages the aux row takes (any size: it spans as many shards as it needs)."""
    return -(-int(aux_bytes) // int(shard)) if aux_bytes else 0
