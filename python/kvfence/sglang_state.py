"""Hybrid models' per-request state buffers (SGLang's state_indices) as
kvfence carries them: the Mamba state of a request, one row per state index
(every state buffer's item at that index, concatenated), sent as extra pages
of the same request after the aux row, so the same fencing as the KV pages
covers it and decode writes it before the aux row opens SGLang's metadata
gate.

Supported: StateType MAMBA (main-2606's state_types / older state_type
"mamba") in host memory, with equal prefill and decode TP (SGLang splits a
Mamba state's heads by state_dim_per_tensor across a TP mismatch; kvfence
does not), a fixed number of state indices per request (state_items,
default 1, what SGLang's decode sends: the request's Mamba slot). SWA, DSA
and the newer state types are refused at start-up with one Unimplemented
error. Pure helpers: no I/O besides the host copies of one row.
"""
import ctypes

from . import checks, errors

SUPPORTED = ("mamba",)


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


def refusal(kv_args):
    """The reason kvfence cannot carry these state buffers, or None."""
    s = spec(kv_args)
    bad = sorted({t for t, _, _, _ in s if t not in SUPPORTED})
    if bad:
        return "hybrid-model state buffers of type %s (only Mamba)" % ", ".join(bad)
    for t, ptrs, _, _ in s:
        for p, _ in ptrs:
            if checks.is_device(p):
                return "%s state buffer at 0x%x in CUDA device memory (state rows are copied on the host)" % (t, p)
    return None


def row_bytes(kv_args, items_per_type=1):
    """Bytes of one request's state row."""
    return sum(sum(items) * int(items_per_type) for _, _, items, _ in spec(kv_args))


def _indices(payload, want, t):
    """The state indices of one type: a sequence (numpy array, list) or one
    int, exactly want of them (both sides sized their pages for that)."""
    if payload is None:
        raise errors.InvalidArgument("kvfence: no %s state indices for a model with %s state" % (t, t))
    try:
        idx = [int(i) for i in payload]
    except TypeError:
        idx = [int(payload)]
    if len(idx) != want:
        raise errors.InvalidArgument("kvfence: %d %s state indices, kvfence was configured for %d (state_items)"
                                     % (len(idx), t, want))
    return idx


def _walk(kv_args, state_indices, want):
    """(engine address, bytes, offset in the row) of every item of the row."""
    off = 0
    for t, ptrs, items, pos in spec(kv_args):
        if pos is None:
            payload = state_indices
        else:
            payload = state_indices[pos] if state_indices is not None and pos < len(state_indices) else None
        for i in _indices(payload, want, t):
            for (p, size), item in zip(ptrs, items):
                if i < 0 or (i + 1) * item > size:
                    raise errors.InvalidArgument("kvfence: %s state index %d outside its %d-byte buffer" % (t, i, size))
                yield p + i * item, item, off
                off += item


def read_row(kv_args, state_indices, want, size):
    """The request's state row (prefill's buffers), padded to size."""
    buf = (ctypes.c_char * size)()
    base = ctypes.addressof(buf)
    for addr, n, off in _walk(kv_args, state_indices, want):
        ctypes.memmove(base + off, addr, n)
    return buf


def check(kv_args, state_indices, want):
    """Raises InvalidArgument when state_indices do not fit the declared
    state buffers (so send() and send_metadata() fail the request early)."""
    for _ in _walk(kv_args, state_indices, want):
        pass


def write_row(kv_args, state_indices, want, row):
    """Writes a received state row into decode's state buffers."""
    base = ctypes.addressof(row)
    for addr, n, off in _walk(kv_args, state_indices, want):
        ctypes.memmove(addr, base + off, n)


def copy(state_indices):
    """A private copy of state_indices (entries: None, one index, or a
    sequence of indices)."""
    def one(x):
        if x is None:
            return None
        try:
            return [int(i) for i in x]
        except TypeError:
            return int(x)
    return [one(x) for x in state_indices]


def given(state_indices):
    """True when SGLang passed any state index (it passes [] or Nones for
    models without state)."""
    return bool(state_indices) and any(s is not None for s in state_indices)
