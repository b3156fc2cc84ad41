"""Hybrid models' Mamba state (SGLang's state_indices) through kvfence's
SGLang classes in the scheduler's order (sglang_harness.py, decode TP1,
prefill TP1): the state row lands in decode's state slot with the pages and
the aux row, every byte verified; an abort at each point leaves decode's
state slot untouched and nothing held; bad state indices fail the request
(classified) instead of raising; what kvfence cannot carry is refused at
start-up."""
import ctypes
import hashlib
import json
import os
import time
import types

import pytest

from kvfence import errors, staging
from kvfence.sglang import KVFenceBackendProvider, refuse_unsupported

from sglang_harness import Cluster, Engine, check_decode

STATE_SLOTS = 6
STATE_ITEMS = [40, 24, 72]  # e.g. conv and temporal state of two layers: bytes per slot
SENTINEL = b"\xee"


class MambaEngine(Engine):
    """An engine with Mamba state buffers (host memory), main-2606's
    list-of-lists KVArgs form."""

    def __init__(self, heads):
        super().__init__(heads)
        self.state = [(ctypes.c_char * (STATE_SLOTS * n))(*(SENTINEL * (STATE_SLOTS * n))) for n in STATE_ITEMS]

    def kv_args(self, cls, rank):
        a = super().kv_args(cls, rank)
        a.state_types = [types.SimpleNamespace(value="mamba")]
        a.state_data_ptrs = [[ctypes.addressof(b) for b in self.state]]
        a.state_data_lens = [[len(b) for b in self.state]]
        a.state_item_lens = [list(STATE_ITEMS)]
        return a

    def slot(self, b, idx):
        n = STATE_ITEMS[b]
        return bytes(self.state[b][idx * n:(idx + 1) * n])

    def set_slot(self, b, idx, data):
        n = STATE_ITEMS[b]
        self.state[b][idx * n:(idx + 1) * n] = data


def state_bytes(room, gen, b):
    n = STATE_ITEMS[b]
    return hashlib.shake_128(b"state/%d/%d/%d" % (room, gen, b)).digest(n)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(KVFenceBackendProvider(), tp=1, engine=MambaEngine)
    base = staging.handles_live()
    yield c
    for room in c.dec.held_rooms():
        settle(c, room)
    c.close()
    assert staging.handles_live() <= base, "handles leaked"


def start(c, room, d_idx, aux, d_state):
    rv = c.Receiver(c.dec, c.boot_addr, room)
    rv.init(0)
    end = time.monotonic() + 30
    while rv.poll() != 2:
        assert time.monotonic() < end, "decode never resolved the prefill instance"
        time.sleep(0.01)
    rv.send_metadata(d_idx, aux, d_state, decode_prefix_len=0)
    snd = c.Sender(c.pre[0], c.boot_addr, room, [0], 0)
    c.wait_bootstrapped([snd], timeout=30)
    assert snd.pop_decode_prefix_len() == 0
    snd.init(len(d_idx), aux)
    return rv, snd


def send_last(c, snd, room, gen, p_idx, p_slot, aux, state=None):
    from sglang_harness import fill_prefill
    fill_prefill(c.p_eng[0], 0, 4, room, gen, p_idx)
    for b in range(len(STATE_ITEMS)):
        c.p_eng[0].set_slot(b, p_slot, state_bytes(room, gen, b))
    c.p_eng[0].set_aux(aux, room, 9)
    snd.send(p_idx, [[p_slot]] if state is None else state)  # SGLang: one payload per state type

    def reuse():  # prefill reuses the slot once its poll was terminal (release_kv_cache)
        for b in range(len(STATE_ITEMS)):
            c.p_eng[0].set_slot(b, p_slot, SENTINEL * STATE_ITEMS[b])
    c.reuse_once_released(snd, reuse)


def settle(c, room, end_s=30):
    end = time.monotonic() + end_s
    while room in c.dec.held_rooms():
        c.dec.sweep(force=True)
        assert time.monotonic() < end, "room %d never released" % room
        time.sleep(0.02)


def untouched(c, slot):
    return all(c.d_eng.slot(b, slot) == SENTINEL * n for b, n in enumerate(STATE_ITEMS))


def test_state_row_delivered_with_pages_and_aux(cluster):
    c = cluster
    for room, d_slot, p_slot in ((31, 2, 5), (32, 4, 1)):
        rv, snd = start(c, room, [3, 6], room % 8, [[d_slot]])
        send_last(c, snd, room, 1, [1, 7], p_slot, room % 8)
        d, p = c.run_until_final(rv, [snd], room % 8, room, timeout=30)
        assert (d, p) == (4, 4)
        assert check_decode(c.d_eng, room, 1, [3, 6]) == 0
        for b in range(len(STATE_ITEMS)):
            assert c.d_eng.slot(b, d_slot) == state_bytes(room, 1, b), "state buffer %d" % b
        rv.clear()
        snd.clear()
    assert untouched(c, 0) and untouched(c, 3)  # no other slot written


def test_numpy_payload_as_sglang_sends_it(cluster):
    np = pytest.importorskip("numpy")
    c, room = cluster, 33
    rv, snd = start(c, room, [8], 1, [np.array([5], dtype=np.int64)])
    send_last(c, snd, room, 1, [2], 0, 1, state=[np.array([0], dtype=np.int64)])
    assert c.run_until_final(rv, [snd], 1, room, timeout=30) == (4, 4)
    assert all(c.d_eng.slot(b, 5) == state_bytes(room, 1, b) for b in range(len(STATE_ITEMS)))
    rv.clear()
    snd.clear()


@pytest.mark.parametrize("point", ["before_metadata", "after_metadata", "after_last_send", "after_handoff"])
def test_abort_at_each_point_never_writes_state(cluster, point):
    c, room, d_slot = cluster, {"before_metadata": 41, "after_metadata": 42, "after_last_send": 43,
                                "after_handoff": 44}[point], 1
    for b, n in enumerate(STATE_ITEMS):
        c.d_eng.set_slot(b, d_slot, SENTINEL * n)
    if not c.abort_at(point, room, [[d_slot]], lambda snd: send_last(c, snd, room, 1, [4], 3, 2)):
        return
    settle(c, room)
    assert untouched(c, d_slot), "an aborted request's state reached decode"


@pytest.mark.parametrize("bad", ["count", "range", "missing"])
def test_bad_state_indices_fail_the_request_classified(cluster, bad):
    c, room = cluster, {"count": 51, "range": 52, "missing": 53}[bad]
    state = {"count": [[1, 2]], "range": [[STATE_SLOTS]], "missing": []}[bad]
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


def test_prefill_without_state_on_the_last_chunk_fails(cluster):
    c, room = cluster, 54
    rv, snd = start(c, room, [9], 3, [[0]])
    snd.send([0], None)  # the last chunk without the state payload
    assert snd.poll() == 0
    with pytest.raises(errors.InvalidArgument):
        snd.failure_exception()
    snd.clear()
    assert c.run_until_final(rv, [snd], 3, room, timeout=60)[0] == 0
    rv.clear()
    settle(c, room, 60)


def test_refused_at_start_up():
    for t in ("swa", "dsa"):  # carried with a state_items bound (test_sglang_swa), refused without one
        a = types.SimpleNamespace(state_types=[types.SimpleNamespace(value=t)], state_data_ptrs=[[0]],
                                  state_data_lens=[[8]], state_item_lens=[[8]])
        with pytest.raises(errors.Unimplemented, match="%s state buffers without a bound" % t.upper()):
            refuse_unsupported(None, a)
    a = types.SimpleNamespace(state_type="mamba", state_data_ptrs=[16], state_data_lens=[8], state_item_lens=[8])
    refuse_unsupported(None, a)  # older SGLang's flat form: accepted
    refuse_unsupported(types.SimpleNamespace(disaggregation_decode_enable_radix_cache=True),
                       types.SimpleNamespace(state_types=[]))  # decode radix cache: carried (test_sglang_links)
    # (PP is carried with M:N pairing and equal sizes: test_sglang_topologies)
    with pytest.raises(errors.Unimplemented):
        refuse_unsupported(types.SimpleNamespace(enable_dp_attention=True), types.SimpleNamespace(state_types=[]))


def test_mamba_with_tp_mismatch_refused_at_start_up():
    eng = MambaEngine(2)
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(decode_addrs=["127.0.0.1:1"], log_level="error",
                                                          source_pages=4))
    try:
        p = KVFenceBackendProvider()
        with pytest.raises(errors.Unimplemented, match="Mamba"):
            p.get_kv_class("manager")(eng.kv_args(p.get_kv_class("kvargs"), 0), "prefill",
                                      types.SimpleNamespace(tp_size=2), False)
    finally:
        del os.environ["KVFENCE_SGLANG_CONFIG"]
