"""Hybrid models' SWA and DSA state (SGLang's StateType.SWA / DSA
state_indices: a page-indexed list per request whose length varies with the
request) through kvfence's SGLang classes in the scheduler's order
(sglang_harness.py, decode TP1, prefill TP1), for an SWA model, a DSA model
and a model with Mamba and SWA state: every state page lands at decode's
index for its position in the list, byte for byte, and no other page of
decode's state buffers changes; lists of different lengths on the two sides
fail the request FailedPrecondition before any byte (state or aux) is
written; lists longer than the configured bound, indices outside a buffer
and SGLang's -1 fail the request InvalidArgument; an abort at each point
writes nothing and leaves nothing held; what stays unsupported is refused
at start-up."""
import ctypes
import hashlib
import json
import os
import time
import types

import pytest

from kvfence import errors, sglang_state, staging
from kvfence.sglang import KVFenceBackendProvider, refuse_unsupported

from sglang_harness import Cluster, Engine, check_decode, fill_prefill

# bytes per item (SWA: one page of each SWA layer's K and V buffer; DSA: one
# page of each layer's indexer buffer; Mamba: one slot) and items per buffer
STATE = {"mamba": ([40, 24], 6), "swa": ([32, 32, 48, 48], 12), "dsa": ([20, 20], 16)}
BOUND = {"mamba": 1, "swa": 4, "dsa": 6}
SENTINEL = b"\xee"
MODELS = {"swa": ("swa",), "dsa": ("dsa",), "mamba+swa": ("mamba", "swa")}


def engine_for(model):
    kinds = MODELS[model]

    class StateEngine(Engine):
        """An engine with state buffers of the model's types (host memory),
        main-2606's list-of-lists KVArgs form, in SGLang's order."""

        def __init__(self, heads):
            super().__init__(heads)
            self.state = {t: [(ctypes.c_char * (STATE[t][1] * n))(*(SENTINEL * (STATE[t][1] * n)))
                              for n in STATE[t][0]] for t in kinds}

        def kv_args(self, cls, rank):
            a = super().kv_args(cls, rank)
            a.state_types = [types.SimpleNamespace(value=t) for t in kinds]
            a.state_data_ptrs = [[ctypes.addressof(b) for b in self.state[t]] for t in kinds]
            a.state_data_lens = [[len(b) for b in self.state[t]] for t in kinds]
            a.state_item_lens = [list(STATE[t][0]) for t in kinds]
            return a

        def get_item(self, t, b, idx):
            n = STATE[t][0][b]
            return bytes(self.state[t][b][idx * n:(idx + 1) * n])

        def set_item(self, t, b, idx, data):
            n = STATE[t][0][b]
            self.state[t][b][idx * n:(idx + 1) * n] = data

    return StateEngine


def state_bytes(room, gen, t, b, k):
    """What the k-th index of the request's type-t list holds in buffer b."""
    return hashlib.shake_128(b"state/%d/%d/%s/%d/%d" % (room, gen, t.encode(), b, k)).digest(STATE[t][0][b])


@pytest.fixture(scope="module", params=sorted(MODELS))
def cluster(request):
    model = request.param
    c = Cluster(KVFenceBackendProvider(), tp=1, engine=engine_for(model),
                extra=dict(state_items={t: BOUND[t] for t in MODELS[model]}))
    c.kinds = MODELS[model]
    base = staging.handles_live()
    yield c
    for room in c.dec.held_rooms():
        settle(c, room)
    c.close()
    assert staging.handles_live() <= base, "handles leaked"


def payload(c, lists):
    """state_indices as SGLang passes them: one entry per state type (Mamba:
    [array of the slot], SWA/DSA: the page indices)."""
    return [[lists[t]] if t == "mamba" else list(lists[t]) for t in c.kinds]


def start(c, room, d_idx, aux, d_lists):
    rv = c.Receiver(c.dec, c.boot_addr, room)
    rv.init(0)
    end = time.monotonic() + 30
    while rv.poll() != 2:
        assert time.monotonic() < end, "decode never resolved the prefill instance"
        time.sleep(0.01)
    rv.send_metadata(d_idx, aux, payload(c, d_lists), decode_prefix_len=0)
    snd = c.Sender(c.pre[0], c.boot_addr, room, [0], 0)
    c.wait_bootstrapped([snd], timeout=30)
    assert snd.pop_decode_prefix_len() == 0
    snd.init(len(d_idx), aux)
    return rv, snd


def as_list(x):
    return [x] if isinstance(x, int) else list(x)


def send_last(c, snd, room, gen, p_idx, p_lists, aux, state=None):
    eng = c.p_eng[0]
    fill_prefill(eng, 0, 4, room, gen, p_idx)
    for t in c.kinds:
        for k, i in enumerate(as_list(p_lists[t])):
            for b in range(len(STATE[t][0])):
                eng.set_item(t, b, i, state_bytes(room, gen, t, b, k))
    eng.set_aux(aux, room, 9)
    snd.send(p_idx, payload(c, p_lists) if state is None else state)

    def reuse():  # prefill reuses the pages once its poll was terminal
        for t in c.kinds:
            for i in as_list(p_lists[t]):
                for b, n in enumerate(STATE[t][0]):
                    eng.set_item(t, b, i, SENTINEL * n)
    c.reuse_once_released(snd, reuse)


def settle(c, room, end_s=30):
    end = time.monotonic() + end_s
    while room in c.dec.held_rooms():
        c.dec.sweep(force=True)
        assert time.monotonic() < end, "room %d never released" % room
        time.sleep(0.02)


def reset(c):
    for t in c.kinds:
        for b, n in enumerate(STATE[t][0]):
            for i in range(STATE[t][1]):
                c.d_eng.set_item(t, b, i, SENTINEL * n)


def untouched(c, except_lists=None):
    """Every decode state item is the sentinel, except the listed ones."""
    skip = except_lists or {}
    for t in c.kinds:
        for b, n in enumerate(STATE[t][0]):
            for i in range(STATE[t][1]):
                if i not in as_list(skip.get(t, [])) and c.d_eng.get_item(t, b, i) != SENTINEL * n:
                    return False
    return True


def landed(c, room, gen, d_lists):
    for t in c.kinds:
        for k, i in enumerate(as_list(d_lists[t])):
            for b in range(len(STATE[t][0])):
                assert c.d_eng.get_item(t, b, i) == state_bytes(room, gen, t, b, k), \
                    "%s buffer %d, list position %d (decode index %d)" % (t, b, k, i)
    assert untouched(c, d_lists), "a state item outside decode's lists was written"


# decode and prefill lists of each request: lengths 1 to the bound, other
# indices on each side, reversed and scattered orders
CASES = [
    (61, {"mamba": 2, "swa": [5, 1, 9], "dsa": [3, 0, 15, 7, 2]}, {"mamba": 4, "swa": [0, 7, 3], "dsa": [1, 2, 3, 4, 5]}),
    (62, {"mamba": 0, "swa": [11], "dsa": [8]}, {"mamba": 1, "swa": [2], "dsa": [13]}),
    (63, {"mamba": 5, "swa": [10, 8, 6, 4], "dsa": [14, 12, 10, 9, 6, 1]}, {"mamba": 3, "swa": [1, 2, 3, 11],
                                                                          "dsa": [0, 6, 11, 12, 5, 4]}),
]


def test_state_pages_land_at_decode_indices(cluster):
    c = cluster
    for room, d_lists, p_lists in CASES:
        reset(c)
        rv, snd = start(c, room, [3, 6], room % 8, d_lists)
        send_last(c, snd, room, 1, [1, 7], p_lists, room % 8)
        assert c.run_until_final(rv, [snd], room % 8, room, timeout=30) == (4, 4)
        assert check_decode(c.d_eng, room, 1, [3, 6]) == 0
        landed(c, room, 1, d_lists)
        rv.clear()
        snd.clear()


def test_numpy_payload_as_sglang_sends_it(cluster):
    np = pytest.importorskip("numpy")
    c, room = cluster, 64
    reset(c)
    d_lists, p_lists = {"mamba": 1, "swa": [4, 5], "dsa": [9, 10, 11]}, {"mamba": 2, "swa": [6, 0], "dsa": [1, 0, 2]}

    def np_payload(lists):
        return [[np.array([lists[t]], dtype=np.int64)] if t == "mamba" else np.array(lists[t], dtype=np.int32)
                for t in c.kinds]
    rv = c.Receiver(c.dec, c.boot_addr, room)
    rv.init(0)
    end = time.monotonic() + 30
    while rv.poll() != 2:
        assert time.monotonic() < end
        time.sleep(0.01)
    rv.send_metadata(np.array([8], dtype=np.int32), 1, np_payload(d_lists), decode_prefix_len=0)
    snd = c.Sender(c.pre[0], c.boot_addr, room, [0], 0)
    c.wait_bootstrapped([snd], timeout=30)
    snd.init(1, 1)
    send_last(c, snd, room, 1, [2], p_lists, 1, state=np_payload(p_lists))
    assert c.run_until_final(rv, [snd], 1, room, timeout=30) == (4, 4)
    landed(c, room, 1, d_lists)
    rv.clear()
    snd.clear()


@pytest.mark.parametrize("side", ["prefill_longer", "prefill_shorter"])
def test_unequal_lists_fail_before_any_byte_lands(cluster, side):
    c = cluster
    paged = [t for t in c.kinds if t in sglang_state.PAGED][0]
    room = {"prefill_longer": 71, "prefill_shorter": 72}[side]
    reset(c)
    d_lists = {"mamba": 1, "swa": [2, 3], "dsa": [4, 5]}
    p_lists = dict(d_lists)
    p_lists[paged] = [6, 7, 8] if side == "prefill_longer" else [9]
    aux = 5
    c.d_eng.set_aux(aux, 0, 0)
    rv, snd = start(c, room, [2], aux, d_lists)
    send_last(c, snd, room, 1, [4], p_lists, aux)
    d, _ = c.run_until_final(rv, [snd], aux, room, timeout=30)
    assert d == 0
    with pytest.raises(errors.FailedPrecondition, match="state indices"):
        rv.failure_exception()
    assert untouched(c), "a state row of unequal lists was written"
    assert c.d_eng.room_row(aux) != room, "the aux row opened SGLang's metadata gate"
    rv.clear()
    snd.clear()
    settle(c, room)


@pytest.mark.parametrize("bad", ["over_bound", "range", "minus_one", "missing"])
def test_bad_state_indices_fail_the_request_classified(cluster, bad):
    c = cluster
    paged = [t for t in c.kinds if t in sglang_state.PAGED][0]
    room = {"over_bound": 81, "range": 82, "minus_one": 83, "missing": 84}[bad]
    lists = {"mamba": 1, "swa": [0], "dsa": [0]}
    lists[paged] = {"over_bound": list(range(BOUND[paged] + 1)), "range": [0, STATE[paged][1]], "minus_one": [3, -1],
                    "missing": None}[bad]
    state = [None if t == paged and bad == "missing" else x for t, x in zip(c.kinds, payload(c, dict(
        lists, **{paged: lists[paged] or []})))]
    rv = c.Receiver(c.dec, c.boot_addr, room)
    rv.init(0)
    end = time.monotonic() + 30
    while rv.poll() != 2:
        assert time.monotonic() < end
        time.sleep(0.01)
    rv.send_metadata([0], 3, state, decode_prefix_len=0)  # never raises into the scheduler
    assert rv.poll() == 0
    with pytest.raises(errors.InvalidArgument):
        rv.failure_exception()
    rv.clear()
    settle(c, room)
    # prefill's side: the same list on the last send() fails its request
    room += 10
    rv, snd = start(c, room, [1], 3, {"mamba": 1, "swa": [0], "dsa": [0]})
    snd.send([0], state)
    assert snd.poll() == 0
    with pytest.raises(errors.InvalidArgument):
        snd.failure_exception()
    snd.clear()
    assert c.run_until_final(rv, [snd], 3, room, timeout=60)[0] == 0
    rv.clear()
    settle(c, room, 60)


@pytest.mark.parametrize("point", ["before_metadata", "after_metadata", "after_last_send", "after_handoff"])
def test_abort_at_each_point_never_writes_state(cluster, point):
    c = cluster
    room = {"before_metadata": 91, "after_metadata": 92, "after_last_send": 93, "after_handoff": 94}[point]
    reset(c)
    d_lists, p_lists = {"mamba": 1, "swa": [1, 2], "dsa": [3, 4]}, {"mamba": 0, "swa": [5, 6], "dsa": [7, 8]}
    if not c.abort_at(point, room, payload(c, d_lists), lambda snd: send_last(c, snd, room, 1, [4], p_lists, 2)):
        return
    settle(c, room)
    assert untouched(c), "an aborted request's state reached decode"
    assert not c.dec.held_rooms()


def _args(t, ptr=16, items=(8,)):
    return types.SimpleNamespace(state_types=[types.SimpleNamespace(value=t)], state_data_ptrs=[[ptr] * len(items)],
                                 state_data_lens=[[64] * len(items)], state_item_lens=[list(items)])


def test_refused_at_start_up():
    for t in ("swa", "dsa"):
        with pytest.raises(errors.Unimplemented, match="without a bound"):
            refuse_unsupported(None, _args(t), cfg={})  # no state_items bound: the rows cannot be sized
        with pytest.raises(errors.Unimplemented, match="without a bound"):
            refuse_unsupported(None, _args(t), cfg={"state_items": {"mamba": 1}})
        refuse_unsupported(None, _args(t), cfg={"state_items": {t: 3}})  # carried
        refuse_unsupported(None, _args(t), cfg={"state_items": 3})
    with pytest.raises(errors.Unimplemented, match="swa_ring"):  # a state type kvfence does not know
        refuse_unsupported(None, _args("swa_ring"), cfg={"state_items": 3})
    with pytest.raises(errors.InvalidArgument):
        refuse_unsupported(None, _args("swa"), cfg={"state_items": {"swa": -1}})


def test_row_layout_is_fixed_by_the_bound():
    a = _args("swa", items=(8, 4))
    assert sglang_state.row_bytes(a, {"swa": 3}) == sglang_state.HEADER.size + 3 * 12
    m = types.SimpleNamespace(state_types=[types.SimpleNamespace(value="mamba"), types.SimpleNamespace(value="dsa")],
                              state_data_ptrs=[[16], [16, 16]], state_data_lens=[[64], [64, 64]],
                              state_item_lens=[[10], [8, 4]])
    assert sglang_state.row_bytes(m, {"dsa": 2}) == 10 + sglang_state.HEADER.size + 2 * 12


@pytest.mark.parametrize("t", ["swa", "dsa"])
def test_tp_mismatch_refused_at_start_up(t):
    eng = engine_for(t)(2)
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(decode_addrs=["127.0.0.1:1"], log_level="error",
                                                          source_pages=4, state_items={t: BOUND[t]}))
    try:
        p = KVFenceBackendProvider()
        with pytest.raises(errors.Unimplemented, match=t.upper()):
            p.get_kv_class("manager")(eng.kv_args(p.get_kv_class("kvargs"), 0), "prefill",
                                      types.SimpleNamespace(tp_size=2), False)
    finally:
        del os.environ["KVFENCE_SGLANG_CONFIG"]


def test_state_row_never_copied_on_the_scheduler_thread(cluster, monkeypatch):
    """Issue 20 item 6: no copy of a request's state runs inside send() or
    poll(). Every host copy Python could make (ctypes.memmove, memset,
    string_at, a kvfence Sender.write) is watched while the scheduler calls
    run; none may touch prefill's or decode's state buffers. The row still
    lands (it went through the queued state copies, counted)."""
    from kvfence import api
    c = cluster
    spans = [(ctypes.addressof(b), len(b)) for e in (c.p_eng[0], c.d_eng) for t in c.kinds for b in e.state[t]]
    touched, queued = [], []

    def hits(addr, n):
        addr = int(addr or 0)
        return any(addr < lo + size and lo < addr + max(int(n), 1) for lo, size in spans)

    memmove, memset, string_at = ctypes.memmove, ctypes.memset, ctypes.string_at

    def mv(dst, src, n):
        if hits(dst, n) or hits(src, n):
            touched.append(("memmove", n))
        return memmove(dst, src, n)

    def ms(dst, v, n):
        if hits(dst, n):
            touched.append(("memset", n))
        return memset(dst, v, n)

    def sa(addr, n=-1):
        if hits(addr, n):
            touched.append(("string_at", n))
        return string_at(addr, n)

    def write(self, *args, **kwargs):
        touched.append(("Sender.write", args[0] if args else None))
        return sender_write(self, *args, **kwargs)

    sender_write = api.Sender.write
    for name in ("gather_state_queued", "scatter_state"):
        real = getattr(staging, name)
        monkeypatch.setattr(staging, name, lambda *a, _real=real, _name=name: (queued.append(_name), _real(*a))[1])
    handoff = staging.handoff  # decode's state copy, queued with the KV scatter in one call

    def handoff_spy(*a, **kw):
        if kw.get("state") is not None:
            queued.append("scatter_state")
        return handoff(*a, **kw)
    monkeypatch.setattr(staging, "handoff", handoff_spy)

    def watched(fn):
        def call(*args, **kwargs):
            with monkeypatch.context() as m:
                m.setattr(ctypes, "memmove", mv)
                m.setattr(ctypes, "memset", ms)
                m.setattr(ctypes, "string_at", sa)
                m.setattr(api.Sender, "write", write)
                return fn(*args, **kwargs)
        return call

    for room, d_lists, p_lists in CASES:
        reset(c)
        rv, snd = start(c, room + 40, [3, 6], room % 8, d_lists)
        rv.poll, snd.send = watched(rv.poll), watched(snd.send)
        send_last(c, snd, room + 40, 1, [1, 7], p_lists, room % 8)
        snd.poll = watched(snd.poll)  # over send_last's reuse hook (slice assignments: not watched)
        assert c.run_until_final(rv, [snd], room % 8, room + 40, timeout=30) == (4, 4)
        landed(c, room + 40, 1, d_lists)
        rv.clear()
        snd.clear()
    assert not touched, "state bytes copied on the scheduler thread: %s" % touched[:5]
    assert queued.count("gather_state_queued") == len(CASES) and queued.count("scatter_state") == len(CASES)


@pytest.mark.parametrize("numpy_lists", [True, False])
def test_go_expansion_gives_read_rows_bytes(cluster, numpy_lists, monkeypatch):
    """Go expands the state row from the buffers the manager registered and
    the request's index arrays: the row decode's slots hold is, byte for
    byte, the row read_row (the host copy the row format was defined by)
    reads from prefill's buffers, headers and zero room included, with
    numpy index arrays (int32, as SGLang's) and with plain lists."""
    from kvfence import sglang as ks
    c = cluster
    np = pytest.importorskip("numpy") if numpy_lists else None
    if not numpy_lists:
        monkeypatch.setattr(sglang_state, "_np", None)
    rows = []
    state_args = ks.KVFenceKVReceiver._state_row_args

    def spy(self):  # the row as it landed, before its items are scattered
        m = self.mgr
        rows.append(bytes(staging.read_row(self.rv, len(self.kv_indices) + m.aux_pages, m.state_pages,
                                           m.shard_bytes, m.state_bytes)))
        return state_args(self)
    monkeypatch.setattr(ks.KVFenceKVReceiver, "_state_row_args", spy)
    m = c.pre[0]
    for room, d_lists, p_lists in CASES:
        reset(c)
        rv, snd = start(c, room + 80, [3, 6], room % 8, d_lists)
        state = [(np.array([p_lists[t]]) if np else [p_lists[t]]) if t == "mamba" else
                 (np.array(p_lists[t], dtype=np.int32) if np else list(p_lists[t])) for t in c.kinds]
        send_last(c, snd, room + 80, 2, [1, 7], p_lists, room % 8, state=state)
        want = bytes(sglang_state.read_row(m.kv_args, state, m.state_items, m.state_bytes))
        assert c.run_until_final(rv, [snd], room % 8, room + 80, timeout=30) == (4, 4)
        assert rows[-1] == want, "the row Go expanded differs from read_row's"
        landed(c, room + 80, 2, d_lists)
        rv.clear()
        snd.clear()
    assert len(rows) == len(CASES)
