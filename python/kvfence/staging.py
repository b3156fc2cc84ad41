"""Staging of an engine's KV pages on Go threads (the C ABI's gather and
scatter), so an engine's scheduler thread only queues copies and polls them.

Layout describes the engine's KV buffers once (addresses, sizes, bytes per
page index, page size); gather() queues the copy of a chunk's pages into a
sender's source pages followed by its send/finish, and scatter() the copy of
a handed-off request's slots into the engine's pages. Each copy is a list of
contiguous runs (one memmove each), done in Go in 256 KiB pieces. No Python
loop runs per token or per page.
"""
import ctypes

from . import _lib, errors

try:  # SGLang passes numpy arrays; imported once here, never inside a call
    import numpy as _np
except ImportError:  # numpy-less callers pass sequences
    _np = None

_H, _I, _I64 = ctypes.c_uint64, ctypes.c_int, ctypes.c_int64
_E = ctypes.POINTER(_lib.Error)
_I32P = ctypes.c_void_p  # int32 page indices: an address is passed as is, no ctypes.cast per call
_SIGNATURES = {
    "kvfence_layout_new": (_I, [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_I64), ctypes.POINTER(_I64), _I, _I,
                                ctypes.POINTER(_H), _E]),
    "kvfence_sender_gather": (_I, [_H, _H, _I32P, _I, _I, _I, _I, _I, _I, _E]),
    "kvfence_sender_gather_wait": (_I, [_H, _I64, _E]),
    "kvfence_sender_write_queued": (_I, [_H, _I, _I, ctypes.c_void_p, ctypes.c_size_t, _E]),
    "kvfence_receiver_scatter": (_I, [_H, _H, _I32P, _I, _I, _I, _E]),
    "kvfence_receiver_scatter_done": (_I, [_H, _I64, _E]),
    "kvfence_receiver_init_at": (_I, [_H, _I32P, _I, ctypes.POINTER(ctypes.c_uint32), _I, _E]),
    "kvfence_receiver_read_row": (_I, [_H, _I, _I, _I, ctypes.c_void_p, ctypes.c_size_t, _E]),
    "kvfence_state_layout_new": (_I, [_I] + [ctypes.c_void_p] * 6 + [ctypes.POINTER(_H), _E]),
    "kvfence_sender_gather_state_queued": (_I, [_H, _I, _I, _H, ctypes.c_void_p, ctypes.c_void_p, _I, _E]),
    "kvfence_receiver_scatter_state": (_I, [_H, _I, _I, _I, _H, ctypes.c_void_p, ctypes.c_void_p, _I, _E]),
    "kvfence_receiver_handoff": (_I, [_H, _H, _I32P, _I, _I, _I, _I, _I, _I, _H, ctypes.c_void_p, ctypes.c_void_p, _I,
                                      _I, _I, _I, ctypes.c_void_p, ctypes.c_size_t, _E]),
    "kvfence_handles_live": (_I64, []),
}
_declared = False


def lib():
    """The library with the staging functions declared."""
    global _declared
    so = _lib.lib()
    if not _declared:
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(so, name)
            fn.restype, fn.argtypes = res, args
        _declared = True
    return so


def _call(name, *args):
    err = _lib.Error()
    code = getattr(lib(), name)(*args, ctypes.byref(err))
    if code < 0 or code > 1:
        raise errors.from_code(abs(code), err.message.decode("utf-8", "replace"))
    return code


def handles_live():
    """Open handles of this process (agents, requests, layouts)."""
    return int(lib().kvfence_handles_live())


def as_indices(idx):
    """A private copy of page indices in the form the calls take without
    converting again (contiguous int32 when numpy is there)."""
    if _np is not None:
        return _np.array(idx, dtype=_np.int32, copy=True)
    return [int(i) for i in idx]


class Pinned:
    """Index arrays' addresses and counts taken once (pin, pin_state), with
    what keeps the arrays alive: a later call passes them without touching
    numpy. Decode pins its private copies in send_metadata, where it makes
    them: taking them on the handoff poll cost it ~45 µs of CPU after the
    scheduler thread slept (issue 20 item 6)."""
    __slots__ = ("ptr", "n", "keep")

    def __len__(self):
        return self.n


def pin(idx):
    """Page indices pinned (as _indices passes them)."""
    p = Pinned()
    p.ptr, p.n, p.keep = _indices(idx)
    return p


def pin_state(arrays):
    """Per-type state index arrays pinned (as _state_args passes them)."""
    p = Pinned()
    ptrs, counts, p.keep = _state_args(arrays)
    p.ptr, p.n = (ptrs, counts), len(arrays)
    return p


def _indices(idx):
    """(int32 pointer, count, keepalive) of page indices: a numpy array is
    passed in place when it already is contiguous int32."""
    if type(idx) is Pinned:
        return idx.ptr, idx.n, idx.keep
    if _np is not None:
        arr = _np.ascontiguousarray(idx, dtype=_np.int32)
        return _address(arr, ctypes.c_int32), int(arr.size), arr
    arr = (ctypes.c_int32 * len(idx))(*[int(i) for i in idx])
    return arr, len(idx), arr


def _address(arr, ctype):
    """The address of a contiguous numpy array's data. ctype.from_buffer
    is C code; numpy's arr.ctypes runs Python code that cost decode's
    handoff poll 25–50 µs of CPU after the scheduler thread slept (issue
    20 item 6). arr.ctypes still for what cannot lend its buffer so: an
    empty array (its address, as before) or a read-only one."""
    if not arr.size:
        return arr.ctypes.data
    try:
        return ctypes.addressof(ctype.from_buffer(arr))
    except (TypeError, ValueError, BufferError):
        return arr.ctypes.data


class Layout:
    """An engine's KV buffers: ptrs[i] holds lens[i] bytes, items[i] per page
    index, page_size tokens per page."""

    def __init__(self, ptrs, lens, items, page_size):
        n = len(ptrs)
        if not (n == len(lens) == len(items)):
            raise errors.InvalidArgument("%d pointers, %d lengths, %d item sizes" % (n, len(lens), len(items)))
        p = (ctypes.c_void_p * n)(*[int(x) for x in ptrs])
        ls = (_I64 * n)(*[int(x) for x in lens])
        it = (_I64 * n)(*[int(x) for x in items])
        h = _H(0)
        _call("kvfence_layout_new", p, ls, it, n, int(page_size), ctypes.byref(h))
        self._h = h.value

    def close(self):
        if self._h:
            _lib.call("kvfence_close", self._h)
            self._h = 0

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def gather(sender, layout, kv_indices, first, upto=0, total=0, part=0, parts=1):
    """Queues the copy of the engine pages kv_indices into sender's source
    pages from first on, then send(upto) (upto > 0) and finish(total)
    (total > 0). Returns at once."""
    ptr, n, keep = _indices(kv_indices)
    _call("kvfence_sender_gather", sender._handle(), layout._h, ptr, n, part, parts, first, upto, total)
    del keep  # Go copied the indices before returning


def write_queued(sender, first, addr, size, count=1):
    """Queues the write of size bytes at addr, zero-padded to count pages,
    into sender's source pages from first on, after its queued gathers (the
    bytes are copied before this returns). gather_wait reports it."""
    _call("kvfence_sender_write_queued", sender._handle(), first, count, addr, size)


def gather_wait(sender, timeout=0.0):
    """True once every queued gather ended well; False while one runs;
    raises the first failure's classified error."""
    return _call("kvfence_sender_gather_wait", sender._handle(), int(timeout * 1000)) == 0


def init_at(receiver, kv_indices, ranks):
    """Receiver.init_at without its per-page Python check: SGLang's page
    indices (as_indices' int32 array) passed in place, as the gathers and
    scatters take them (direct mode, kvfence.sglang_direct)."""
    ptr, n, keep = _indices(kv_indices)
    rs = (ctypes.c_uint32 * max(1, len(ranks)))(*[int(r) for r in ranks])
    err = _lib.Error()
    code = lib().kvfence_receiver_init_at(receiver._handle(), ptr, n, rs, len(ranks), ctypes.byref(err))
    del keep
    if code != 0:  # every code is an error here (UNKNOWN is 1: not _call's "not done yet")
        raise errors.from_code(abs(code), err.message.decode("utf-8", "replace"))


def scatter(receiver, layout, kv_indices, shards=1, mla=False):
    """Queues the copy of a handed-off request's first len(kv_indices)
    slots into the engine pages kv_indices. Returns at once."""
    ptr, n, keep = _indices(kv_indices)
    _call("kvfence_receiver_scatter", receiver._handle(), layout._h, ptr, n, int(shards), 1 if mla else 0)
    del keep


def read_row(receiver, first, count, shard, size):
    """The first size bytes of the row that shard 0 (shard bytes) of a
    handed-off request's slots [first, first+count) hold, as a ctypes
    buffer; only those bytes are read."""
    row = (ctypes.c_char * size)()
    _call("kvfence_receiver_read_row", receiver._handle(), first, count, shard, ctypes.addressof(row), size)
    return row


class StateLayout:
    """An engine's hybrid-model state buffers, described once: types is a
    list of (paged, bound, buffers), buffers a list of (address, bytes,
    bytes per index) (kvfence.sglang_state.layout_spec). Requests then pass
    only their index arrays (gather_state_queued, scatter_state)."""

    def __init__(self, types):
        bufs = [b for _, _, bs in types for b in bs]
        n, k = len(types), max(1, len(bufs))
        paged = (ctypes.c_int32 * n)(*[1 if p else 0 for p, _, _ in types])
        bounds = (_I64 * n)(*[int(b) for _, b, _ in types])
        nbufs = (ctypes.c_int32 * n)(*[len(bs) for _, _, bs in types])
        ptrs = (ctypes.c_void_p * k)(*[int(p) for p, _, _ in bufs])
        lens = (_I64 * k)(*[int(x) for _, x, _ in bufs])
        items = (_I64 * k)(*[int(i) for _, _, i in bufs])
        h = _H(0)
        _call("kvfence_state_layout_new", n, ctypes.addressof(paged), ctypes.addressof(bounds),
              ctypes.addressof(nbufs), ctypes.addressof(ptrs), ctypes.addressof(lens), ctypes.addressof(items),
              ctypes.byref(h))
        self._h, self.types = h.value, n

    close = Layout.close
    __del__ = Layout.__del__


def _state_args(arrays):
    """(pointer array, count array, keepalive) of per-type int64 index
    arrays (numpy or array.array("q"), or pin_state's): O(types), nothing
    per index."""
    if type(arrays) is Pinned:
        return arrays.ptr + (arrays.keep,)
    n = max(1, len(arrays))
    ptrs = _fixed_array(ctypes.c_void_p, n)(*[_addr(a) for a in arrays])
    counts = _fixed_array(_I64, n)(*[len(a) for a in arrays])
    return ctypes.addressof(ptrs), ctypes.addressof(counts), (ptrs, counts, arrays)


def _fixed_array(ctype, n):
    """ctype * n, kept alive here: ctypes keeps array types only weakly, so
    one dropped after a call went with the next garbage collection and was
    built again (with the collections its allocations brought on, ~60 µs
    of CPU in decode's handoff poll with a state row, issue 20 item 6).
    Only for counts a model fixes (its state types, its aux row's bytes):
    the dict stays small."""
    t = _ARRAY_TYPES.get((ctype, n))
    if t is None:
        t = _ARRAY_TYPES[(ctype, n)] = ctype * n
    return t


_ARRAY_TYPES = {}


def _addr(a):
    if not len(a):
        return None
    return _address(a, _I64) if _np is not None and isinstance(a, _np.ndarray) else a.buffer_info()[0]


def gather_state_queued(sender, first, count, layout, arrays):
    """Queues the copy of a request's state row (layout: StateLayout;
    arrays: one contiguous int64 index array per state type) into
    sender's source pages [first, first+count), zero-padded, after its
    queued gathers and writes; Go expands the items and checks every index
    against the registered buffers at the call (InvalidArgument, nothing
    queued). The state buffers must keep the items until gather_wait
    reported the copy."""
    ptrs, counts, keep = _state_args(arrays)
    _call("kvfence_sender_gather_state_queued", sender._handle(), first, count, layout._h, ptrs, counts, len(arrays))
    del keep  # Go copied the index arrays before returning


def scatter_state(receiver, first, count, shard, layout, arrays):
    """Queues the copy of the state row that shard 0 (shard bytes) of a
    handed-off request's slots [first, first+count) hold into the engine's
    state buffers at arrays' indices, after its queued scatters (headers
    and unused room skipped); at the call the indices are checked
    (InvalidArgument) and the SWA/DSA headers against them
    (FailedPrecondition). scatter_done reports it."""
    ptrs, counts, keep = _state_args(arrays)
    _call("kvfence_receiver_scatter_state", receiver._handle(), first, count, shard, layout._h, ptrs, counts,
          len(arrays))
    del keep


def handoff(receiver, layout, kv_indices, shards=1, mla=False, state=None, aux=None):
    """Decode's handoff in one call: checks the state row's copy (state:
    (first, count, shard, StateLayout, index arrays) as scatter_state's, or
    None) and the KV scatter (as scatter's), reads the aux row (aux:
    (first, count, shard, size) as read_row's, or None) and returns it
    (None without aux), then queues the state row's copy and the KV
    scatter as one job. Nothing is read or queued when a check fails.
    scatter_done reports the job."""
    ptr, n, keep = _indices(kv_indices)
    sfirst = scount = sshard = sn = 0
    slayout, sptrs, scounts, skeep = 0, None, None, None
    if state is not None:
        sfirst, scount, sshard, sl, arrays = state
        sptrs, scounts, skeep = _state_args(arrays)
        slayout, sn = sl._h, len(arrays)
    afirst = acount = ashard = asize = 0
    row, addr = None, None
    if aux is not None:
        afirst, acount, ashard, asize = aux
        row = _fixed_array(ctypes.c_char, asize)()
        addr = ctypes.addressof(row)
    _call("kvfence_receiver_handoff", receiver._handle(), layout._h, ptr, n, int(shards), 1 if mla else 0,
          sfirst, scount, sshard, slayout, sptrs, scounts, sn, afirst, acount, ashard, addr, asize)
    del keep, skeep
    return row


def scatter_done(receiver, timeout=0.0):
    """True once the receiver's scatters ended well; False while one runs."""
    return _call("kvfence_receiver_scatter_done", receiver._handle(), int(timeout * 1000)) == 0
