"""Hybrid models' per-request state buffers (SGLang's state_indices) as
kvfence carries them: one row per request (every state buffer's item at each
of the request's state indices, concatenated), sent as extra pages of the
same request after the aux row, so the same fencing as the KV pages covers
it and decode writes it before the aux row opens SGLang's metadata gate.

State types (SGLang's StateType, main-2606's state_types / older
state_type), each in host memory, with equal prefill and decode TP:

- MAMBA: a fixed number of state indices per request (state_items, default
  1, what SGLang sends: the request's Mamba slot). SGLang splits a Mamba
  state's heads by state_dim_per_tensor across a TP mismatch; kvfence does
  not.
- SWA and DSA: page-indexed lists whose length varies per request (SWA:
  the SWA pool's pages of the sliding-window tail; DSA: the indexer's pages
  of the whole sequence; docs/sglang.md "Hybrid-model state" cites SGLang).
  The row reserves room for at most state_items[type] indices (a bound the
  operator configures: no default), and each such type's block starts with
  a header (count of indices prefill sent, bytes per index), so decode
  writes only when prefill's list has exactly as many indices as its own,
  each item as long as its own; otherwise the request fails
  FailedPrecondition and nothing of the row is written (SGLang's Mooncake
  backend truncates both lists to the shorter one instead).

Layout of a row: the types in SGLang's order; a type's block is [header
(SWA/DSA only)] then bound x (sum of its buffers' item bytes), index k's
items at k x that sum, buffer after buffer; unused room is zero.

SGLang's classes do not copy a row on the scheduler thread: the manager
registers the state buffers once (layout_spec, kvfence.staging.StateLayout)
and each request passes only its index arrays (index_arrays: one int64
array per type); Go checks every index against the buffers, expands the
row in this layout and copies it on a Go thread
(kvfence.staging.gather_state_queued, scatter_state). read_row and
write_row, the host copies of one row, define the layout and stay for
tools and tests.
"""
import array
import ctypes
import struct

from . import checks, errors

try:  # SGLang passes numpy arrays; imported once here, never inside a call
    import numpy as _np
except ImportError:  # numpy-less callers pass sequences
    _np = None

SUPPORTED = ("mamba", "swa", "dsa")
PAGED = ("swa", "dsa")  # variable-length page lists, bounded by state_items
HEADER = struct.Struct("<II")  # per paged type: indices prefill sent, bytes per index
NAMES = {"mamba": "Mamba", "swa": "SWA", "dsa": "DSA"}


def _name(t):
    return str(getattr(t, "value", t)).lower()


def spec(kv_args):
    """[(type name, ptrs, items, pos)] per state type SGLang declared (lists
    of lists from main-2606 on, pos: its entry in state_indices; older
    SGLang: one state_type, flat lists, pos None: state_indices is the one
    type's index list)."""
    types = list(getattr(kv_args, "state_types", None) or [])
    ptrs = list(getattr(kv_args, "state_data_ptrs", None) or [])
    items = list(getattr(kv_args, "state_item_lens", None) or [])
    lens = list(getattr(kv_args, "state_data_lens", None) or [])
    if not types:
        old = getattr(kv_args, "state_type", "none")
        if old in (None, "none") or not ptrs:
            return []
        return [(_name(old), [(int(p), int(n)) for p, n in zip(ptrs, lens)], [int(i) for i in items], None)]
    out = []
    for n, t in enumerate(types):
        if _name(t) == "none":
            continue
        p = ptrs[n] if n < len(ptrs) else []
        i = items[n] if n < len(items) else []
        ln = lens[n] if n < len(lens) else []
        out.append((_name(t), [(int(x), int(y)) for x, y in zip(p, ln)], [int(x) for x in i], n))
    return out


def names(kv_args):
    """The declared state types as docs and errors spell them."""
    return ", ".join(NAMES.get(t, t) for t, _, _, _ in spec(kv_args))


def bound(state_items, t):
    """The number of state indices of type t a request carries (Mamba:
    exactly, default 1) or at most (SWA, DSA: no default, None). state_items
    is the config value: None, one int for every type, or an object per
    type name."""
    if isinstance(state_items, dict):
        v = {_name(k): v for k, v in state_items.items()}.get(t)
    else:
        v = state_items
    if v is None:
        return 1 if t not in PAGED else None
    v = int(v)
    if v < (0 if t in PAGED else 1):
        raise errors.InvalidArgument("kvfence: state_items %d for %s state" % (v, NAMES.get(t, t)))
    return v


def refusal(kv_args, state_items=None):
    """The reason kvfence cannot carry these state buffers, or None."""
    s = spec(kv_args)
    bad = sorted({t for t, _, _, _ in s if t not in SUPPORTED})
    if bad:
        return "hybrid-model state buffers of type %s (only Mamba, SWA, DSA)" % ", ".join(bad)
    for t, ptrs, _, _ in s:
        for p, _ in ptrs:
            if checks.is_device(p):
                return "%s state buffer at 0x%x in CUDA device memory (state rows are copied on the host)" % (t, p)
    for t, _, _, _ in s:
        if t in PAGED and bound(state_items, t) is None:
            return ("%s state buffers without a bound on a request's %s state indices (config state_items "
                    "{\"%s\": N}, docs/sglang.md)" % (NAMES[t], NAMES[t], t))
    return None


def _blocks(kv_args, state_items):
    """(type, ptrs, items, pos, bound, block offset, block bytes) per type."""
    off = 0
    for t, ptrs, items, pos in spec(kv_args):
        want = bound(state_items, t)
        if want is None:
            raise errors.Unimplemented("kvfence: %s state without state_items bound (docs/sglang.md)" % NAMES[t])
        size = (HEADER.size if t in PAGED else 0) + want * sum(items)
        yield t, ptrs, items, pos, want, off, size
        off += size


def row_bytes(kv_args, state_items=None):
    """Bytes of one request's state row."""
    return sum(b[-1] for b in _blocks(kv_args, state_items))


def _indices(payload, want, t):
    """The state indices of one type: a sequence (numpy array, list) or one
    int; Mamba: exactly want of them, SWA/DSA: at most want (both sides
    sized their pages for that). A one-dimensional numpy array stays one
    (int64), without a Python loop over it."""
    if payload is None:
        raise errors.InvalidArgument("kvfence: no %s state indices for a model with %s state" % (t, t))
    if _np is not None and isinstance(payload, _np.ndarray) and payload.ndim == 1:
        if payload.dtype.kind not in "iu":
            raise errors.InvalidArgument("kvfence: %s state indices of type %s" % (t, payload.dtype))
        idx = payload.astype(_np.int64)
    else:
        try:
            idx = [int(i) for i in payload]
        except TypeError:
            idx = [int(payload)]
    if t in PAGED:
        if len(idx) > want:
            raise errors.InvalidArgument("kvfence: %d %s state indices, kvfence was configured for at most %d "
                                         "(state_items)" % (len(idx), t, want))
    elif len(idx) != want:
        raise errors.InvalidArgument("kvfence: %d %s state indices, kvfence was configured for %d (state_items)"
                                     % (len(idx), t, want))
    return idx


def _payload(state_indices, pos):
    if pos is None:
        return state_indices
    return state_indices[pos] if state_indices is not None and pos < len(state_indices) else None


def _walk(kv_args, state_indices, state_items, headers=None):
    """(engine address, bytes, offset in the row) of every item of the row;
    headers, a list, gets (type, header offset, count, bytes per index) of
    each SWA/DSA block."""
    for t, ptrs, items, pos, want, off, _ in _blocks(kv_args, state_items):
        idx = _indices(_payload(state_indices, pos), want, t)
        if t in PAGED:
            if headers is not None:
                headers.append((t, off, len(idx), sum(items)))
            off += HEADER.size
        for i in (idx.tolist() if hasattr(idx, "tolist") else idx):
            for (p, size), item in zip(ptrs, items):
                if i < 0 or (i + 1) * item > size:
                    raise errors.InvalidArgument("kvfence: %s state index %d outside its %d-byte buffer" % (t, i, size))
                yield p + i * item, item, off
                off += item


def _in_range(t, idx, ptrs, items):
    """Raises InvalidArgument unless every index fits every buffer (the
    smallest and largest index checked per buffer; the first bad one named
    as a check item by item would)."""
    if len(idx) == 0:
        return
    lo, hi = (int(idx.min()), int(idx.max())) if hasattr(idx, "min") else (min(idx), max(idx))
    if all(lo >= 0 and (hi + 1) * item <= size for (_, size), item in zip(ptrs, items)):
        return
    for i in idx:
        for (_, size), item in zip(ptrs, items):
            if i < 0 or (i + 1) * item > size:
                raise errors.InvalidArgument("kvfence: %s state index %d outside its %d-byte buffer" % (t, i, size))


def layout_spec(kv_args, state_items):
    """[(paged, bound, [(address, bytes, bytes per index)])] per state type,
    what kvfence.staging.StateLayout registers."""
    return [(t in PAGED, want, [(p, size, item) for (p, size), item in zip(ptrs, items)])
            for t, ptrs, items, _, want, _, _ in _blocks(kv_args, state_items)]


def index_plan(kv_args, state_items):
    """[(type, entry in state_indices, bound)] per state type: what
    index_arrays needs, worked out once (by the manager)."""
    return [(t, pos, want) for t, _, _, pos, want, _, _ in _blocks(kv_args, state_items)]


def index_arrays(plan, state_indices):
    """The request's state indices (plan: index_plan's) as one private,
    contiguous int64 array per type (numpy, or array.array("q") without
    numpy; SGLang may reuse its arrays), their counts checked against the
    bounds; the indices themselves are checked by Go against the registered
    buffers. No Python loop per index for numpy arrays, none per buffer."""
    out = []
    for t, pos, want in plan:
        idx = _indices(_payload(state_indices, pos), want, t)
        if _np is not None:
            out.append(_np.ascontiguousarray(idx, dtype=_np.int64))
        else:
            out.append(array.array("q", idx))
    return out


def headers(kv_args, state_indices, state_items):
    """(type, row offset, count, bytes per index) of each SWA/DSA block's
    header decode expects, from its own state_indices."""
    out = []
    for t, ptrs, items, pos, want, off, _ in _blocks(kv_args, state_items):
        if t in PAGED:
            idx = _indices(_payload(state_indices, pos), want, t)
            out.append((t, off, len(idx), sum(items)))
    return out


def verify_with(kv_args, state_indices, state_items, read):
    """verify() with read(offset, size) giving the row's bytes there: only
    the headers are read."""
    for t, off, count, per in headers(kv_args, state_indices, state_items):
        got, got_per = HEADER.unpack(bytes(read(off, HEADER.size)))
        if (got, got_per) != (count, per):
            raise errors.FailedPrecondition(
                "kvfence: prefill sent %d %s state indices of %d bytes each, decode expects %d of %d bytes"
                % (got, NAMES[t], got_per, count, per))


def read_row(kv_args, state_indices, state_items, size):
    """The request's state row (prefill's buffers), padded to size."""
    buf = (ctypes.c_char * size)()
    base = ctypes.addressof(buf)
    heads = []
    for addr, n, off in _walk(kv_args, state_indices, state_items, heads):
        ctypes.memmove(base + off, addr, n)
    for _, off, count, per in heads:
        HEADER.pack_into(buf, off, count, per)
    return buf


def check(kv_args, state_indices, state_items):
    """Raises InvalidArgument when state_indices do not fit the declared
    state buffers (so send() and send_metadata() fail the request early)."""
    for t, ptrs, items, pos, want, _, _ in _blocks(kv_args, state_items):
        _in_range(t, _indices(_payload(state_indices, pos), want, t), ptrs, items)


def verify(kv_args, state_indices, state_items, row):
    """Raises FailedPrecondition unless prefill's row carries, for every
    SWA/DSA type, as many indices as decode's state_indices, each of as many
    bytes (a shorter or longer list would land prefill's pages at the wrong
    window positions)."""
    check(kv_args, state_indices, state_items)
    verify_with(kv_args, state_indices, state_items, lambda off, n: row[off:off + n])


def write_row(kv_args, state_indices, state_items, row):
    """Writes a received state row into decode's state buffers (verified
    first: nothing is written when it does not match)."""
    verify(kv_args, state_indices, state_items, row)
    base = ctypes.addressof(row)
    for addr, n, off in _walk(kv_args, state_indices, state_items):
        ctypes.memmove(addr, base + off, n)


def given(state_indices):
    """True when SGLang passed any state index (it passes [] or Nones for
    models without state)."""
    return bool(state_indices) and any(s is not None for s in state_indices)
