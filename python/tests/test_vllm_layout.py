"""kvfence.vllm's layouts and rendezvous, in one process (no library)."""
import json
import socket
from types import SimpleNamespace

import numpy as np
import pytest

from kvfence import errors
from kvfence.vllm import layout, rendezvous
from vllm_harness import cell, make_cache, pattern

BS, H = 4, 4


def filled(kind, hnd, blocks, heads, rank, tp, total, tag):
    c = make_cache(kind, hnd, blocks, BS, heads)
    gh = [0] if kind == "mla" else layout.heads_of(rank, tp, total)
    for b in range(blocks):
        for kv in range(1 if kind == "mla" else 2):
            for h, g in enumerate(gh):
                for t in range(BS):
                    x = cell(c, kind, b, kv, t, h)
                    x[...] = pattern(tag, 0, kv, g, b * BS + t, x.size)
    return c


@pytest.mark.parametrize("p_tp,d_tp,total", [(1, 1, 4), (2, 1, 4), (4, 2, 4), (1, 2, 4), (1, 4, 4), (4, 1, 2), (8, 2, 2), (2, 4, 2)])
@pytest.mark.parametrize("kind,p_hnd,d_hnd", [("flash", False, True), ("flashinfer", True, False), ("flash", True, True)])
def test_plan_gather_scatter_every_tp_ratio(p_tp, d_tp, total, kind, p_hnd, d_hnd):
    """Every decode rank's heads arrive whole, from the prefill ranks the
    plan names, whatever the TP ratio (GQA replication included) and layout."""
    pre = [layout.Caches({"l": filled(kind, p_hnd, 3, len(layout.heads_of(r, p_tp, total)), r, p_tp, total, 7)}, kind)
           for r in range(p_tp)]
    for d in range(d_tp):
        dheads = layout.heads_of(d, d_tp, total)
        dc_raw = make_cache(kind, d_hnd, 3, BS, len(dheads))
        dc = layout.Caches({"l": dc_raw}, kind)
        writers = layout.plan(d, d_tp, p_tp, total, False)
        n = len(writers[0][1])
        for k, (p, hs) in enumerate(writers):
            buf = np.zeros(pre[p].shard_bytes(len(hs)), np.uint8)
            assert buf.size == dc.shard_bytes(n)
            for b in range(3):
                pre[p].gather(b, hs, buf)
                dc.scatter(b, list(range(k * n, (k + 1) * n)), buf)
        for b in range(3):
            for kv in range(2):
                for h, g in enumerate(dheads):
                    for t in range(BS):
                        x = cell(dc_raw, kind, b, kv, t, h)
                        assert np.array_equal(x, pattern(7, 0, kv, g, b * BS + t, x.size)), (d, b, kv, h, t)


def test_mla_every_rank_gets_the_latent():
    src = filled("mla", False, 2, 1, 0, 1, 1, 3)
    pc = layout.Caches({"l": src}, "auto")
    assert pc.mla and layout.plan(1, 2, 1, 1, True) == [(0, [0])]
    dst = make_cache("mla", False, 2, BS, 1)
    dc = layout.Caches({"l": dst}, "mla")
    buf = np.zeros(pc.shard_bytes(1), np.uint8)
    pc.gather(1, [0], buf)
    dc.scatter(0, [0], buf)
    assert np.array_equal(dst[0], src[1])


def test_refusals_are_classified():
    with pytest.raises(errors.InvalidArgument, match="ambiguous"):
        layout.Caches({"l": np.zeros((2, 2, BS, 2, 8), np.float16)})
    with pytest.raises(errors.Unimplemented, match="do not split evenly"):
        layout.heads_of(0, 3, 4)
    # A "GPU" tensor at an address no CUDA driver calls device memory (no
    # driver here; a real one says host): refused before anything reads it.
    gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"), shape=(2, 3, BS, 2, 8), stride=lambda: (3 * BS * 16, BS * 16, 16, 8, 1),
                          element_size=lambda: 2, data_ptr=lambda: 4096)
    with pytest.raises((errors.FailedPrecondition, errors.InvalidArgument), match="CUDA driver"):
        layout.open_caches({"l": gpu})
    with pytest.raises(errors.InvalidArgument, match="no host view"):
        layout.Caches({"l": gpu})
    c = layout.Caches({"l": make_cache("flash", False, 3, BS, 2)})
    with pytest.raises(errors.InvalidArgument, match="outside"):
        c.gather(3, [0], np.zeros(c.shard_bytes(1), np.uint8))
    with pytest.raises(errors.Unimplemented, match="one KV cache group"):
        layout.Caches({"a": make_cache("flash", False, 3, BS, 2), "b": make_cache("flash", False, 3, BS, 1)})


def _raw(port, line):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(line.encode())
        return json.loads(s.makefile("rb").readline())


def test_rendezvous_authenticates():
    got = []
    srv = rendezvous.Server(lambda m: got.append(m) or {"x": 1}, secret=b"k1")
    try:
        assert rendezvous.call(srv.host, srv.port, {"op": "pull"}, b"k1")["x"] == 1
        with pytest.raises(errors.FailedPrecondition, match="not authenticated"):
            rendezvous.call(srv.host, srv.port, {"op": "pull"}, b"wrong")
        with pytest.raises(errors.FailedPrecondition, match="not authenticated"):
            rendezvous.call(srv.host, srv.port, {"op": "pull"}, b"")
        # A replayed message (valid MAC, old timestamp) is refused too.
        body = json.dumps({"op": "pull", "ts": 1.0}, sort_keys=True)
        old = json.dumps({"body": body, "mac": rendezvous._mac(b"k1", body)}) + "\n"
        assert "expired" in _raw(srv.port, old)["error"]
        assert _raw(srv.port, "not json\n")["ok"] is False
        assert len(got) == 1
    finally:
        srv.close()


def test_rendezvous_refuses_open_address_without_secret():
    with pytest.raises(errors.FailedPrecondition, match="needs a secret"):
        rendezvous.Server(lambda m: {}, host="0.0.0.0")
    srv = rendezvous.Server(lambda m: {})
    try:
        assert srv.host == "127.0.0.1"  # loopback by default
    finally:
        srv.close()


class _RacedReceiver:
    """A receiver whose hand-off won (or lost) the race with vLLM's abort:
    abort is a no-op on a handed-off one (as kvfence's agent makes it once
    the state is Success)."""

    def __init__(self, handed):
        self.calls, self.handed = [], handed

    def abort(self):
        self.calls.append("abort")

    def poll(self):
        from kvfence.api import KVPoll
        return KVPoll.Success if self.handed else KVPoll.Failed

    def finish(self):
        self.calls.append("finish")


def test_an_abort_that_loses_the_race_with_the_hand_off_gives_the_slots_back():
    # The connector lets a load go with Receiver.abandon. Without the finish
    # the slots stay held for good, so the load is never reported and vLLM
    # never gets its blocks back; an abort that won needs no finish.
    import inspect
    from kvfence import api
    from kvfence.vllm import connector
    rv = _RacedReceiver(handed=True)
    api.Receiver.abandon(rv)
    assert rv.calls == ["abort", "finish"]
    rv = _RacedReceiver(handed=False)
    api.Receiver.abandon(rv)
    assert rv.calls == ["abort"]
    src = inspect.getsource(connector._Load)
    assert "rv.abandon()" in src and "rv.abort()" not in src, "the load must let go with abandon, never a bare abort"
