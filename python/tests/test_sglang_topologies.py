"""kvfence's SGLang classes across SGLang's topologies and abort paths, in
SGLang's scheduler order (sglang_topo.py): every head of every page, the
aux row, and at the end no slot, hold or handle left."""
import json
import os
import time

import pytest

from kvfence import errors, staging
from kvfence.sglang import KVFenceBackendProvider

from sglang_topo import HEADS, Deployment, Engine

P = KVFenceBackendProvider()


def settle(dep, handles_before, timeout=90):
    """Every hold released, every slot back, every handle closed: a hold ends
    by drain, fence or max_hold (10 s here), so the bound is max_hold plus
    a loaded machine's margin."""
    dep.until(lambda: not dep.held() and not dep.slots_in_use(), "holds released and slots back", timeout,
              show=dep.describe)
    assert staging.handles_live() == handles_before, "handles leaked"


def finish(rvs, snds):
    for x in list(rvs) + list(snds):
        x.clear()


@pytest.mark.parametrize("ptp,dtp,mla", [(1, 1, False), (2, 1, False), (4, 1, False), (2, 2, False), (4, 2, False),
                                         (1, 2, False), (2, 4, False), (2, 1, True), (1, 2, True)])
def test_topology_delivers_every_head(ptp, dtp, mla):
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, mla=mla)
    try:
        base = staging.handles_live()
        for room, d_idx, p_idx in ((21, [5, 2, 9], [0, 1, 2]), (22, [7, 8, 10, 11], [3, 4, 6, 12])):
            rvs, snds, d, p = dep.request(room, len(d_idx), d_idx, p_idx, aux_index=room % 8)
            assert (d, p) == (4, 4)
            assert dep.corrupt(room, 1, d_idx) == 0, "heads misplaced"
            for e in dep.d_eng:
                assert e.aux_row(room % 8) == dep.instances[0]["engs"][0].aux_row(room % 8)
            finish(rvs, snds)
        settle(dep, base)
    finally:
        dep.close()


def test_aux_row_larger_than_a_shard_with_prefill_tp_over_decode_tp():
    """Llama-3.2-1B at prefill TP8 has such rows: shards of a few hundred
    bytes, an aux row of several KiB spanning many of them."""
    dep = Deployment(P, prefill_tp=(4,), decode_tp=1, aux_items=(700, 300, 8))
    try:
        assert dep.dec[0].aux_pages > 1
        rvs, snds, d, p = dep.request(31, 2, [1, 2], [3, 4], aux_index=3)
        assert (d, p) == (4, 4) and dep.corrupt(31, 1, [1, 2]) == 0
        assert dep.d_eng[0].aux_row(3) == dep.instances[0]["engs"][0].aux_row(3)
        finish(rvs, snds)
    finally:
        dep.close()


def test_two_prefill_instances_into_one_decode():
    dep = Deployment(P, prefill_tp=(2, 2), decode_tp=1)
    try:
        base = staging.handles_live()
        a = dep.request(41, 2, [1, 2], [3, 4], aux_index=1, inst=0)
        b = dep.request(42, 2, [5, 6], [3, 4], aux_index=2, inst=1)
        for (rvs, snds, d, p), room, idx in ((a, 41, [1, 2]), (b, 42, [5, 6])):
            assert (d, p) == (4, 4) and dep.corrupt(room, 1, idx) == 0
            finish(rvs, snds)
        settle(dep, base)
    finally:
        dep.close()


@pytest.fixture(scope="module")
def dep():
    d = Deployment(P, prefill_tp=(2,), decode_tp=1, extra=dict(slots=24, source_pages=24))
    yield d
    d.close()


def test_abort_after_handoff_before_next_poll_gives_slots_back(dep):
    """The issue's case: 24 slots, 12 requests aborted after kvfence handed
    them off and before SGLang polled again; all settle, the next runs."""
    base = staging.handles_live()
    rvs, snds = [], []
    try:
        for i in range(12):
            room = 100 + i
            rvs = dep.receivers(0, room)
            rvs[0].send_metadata([1, 2, 3], 1, None, decode_prefix_len=0)
            snds = dep.senders(0, room)
            dep.prefill(0, snds, room, 1, [4, 5, 6], 1)
            dep.until(lambda: all(s.poll() == 4 for s in snds), "prefill success", show=lambda: dep.describe(snds, rvs))
            rvs[0].abort()  # SGLang aborts; it never polls this receiver again
            assert rvs[0].poll() == 0
            with pytest.raises(errors.KVFenceError):
                rvs[0].failure_exception()
            finish(rvs, snds)
    finally:
        finish(rvs, snds)  # a failed step leaves nothing open for the next test (clear is idempotent)
    settle(dep, base)
    rvs, snds, d, p = dep.request(200, 3, [1, 2, 3], [4, 5, 6], aux_index=2)
    assert (d, p) == (4, 4) and dep.corrupt(200, 1, [1, 2, 3]) == 0
    finish(rvs, snds)
    settle(dep, base)


@pytest.mark.parametrize("where", ["before_init", "prealloc", "after_metadata", "mid_transfer", "prefill_side"])
def test_every_abort_point_settles(dep, where):
    base = staging.handles_live()
    room = {"before_init": 301, "prealloc": 302, "after_metadata": 303, "mid_transfer": 304, "prefill_side": 305}[where]
    rvs = [dep.Receiver(m, dep.instances[0]["addr"], room) for m in dep.dec]
    snds = []
    in_use = dep.slots_in_use()
    if where == "before_init":
        rvs[0].abort()
    else:
        rvs[0].init(0)
        dep.until(lambda: rvs[0].poll() >= 2, "handshake")
        if where == "prealloc":
            rvs[0].abort()
            rvs[0].send_metadata([1, 2], 1, None, decode_prefix_len=0)  # SGLang may still call it: never exposed
            assert dep.slots_in_use() == in_use, "an aborted receiver was exposed"
        else:
            rvs[0].send_metadata([1, 2], 1, None, decode_prefix_len=0)
            snds = dep.senders(0, room)
            if where == "after_metadata":
                rvs[0].abort()
            for s in snds:
                s.init(2, 1)
            if where == "mid_transfer":
                for s, e in zip(snds, dep.instances[0]["engs"]):
                    e.fill(room, 1, [3, 4], False)
                    s.send([3], None)
                rvs[0].abort()
            if where == "prefill_side":
                for s in snds:
                    s.abort()
                assert min(s.poll() for s in snds) == 0
                dep.until(lambda: rvs[0].poll() == 0, "decode learns of prefill's abort")  # over the control plane
    assert rvs[0].poll() == 0 and rvs[0].conclude_state == 0
    with pytest.raises(errors.KVFenceError):
        rvs[0].failure_exception()
    if snds:
        dep.until(lambda: min(s.poll() for s in snds) == 0 or where != "prefill_side", "prefill fails")
    finish(rvs, snds)
    settle(dep, base)


def test_full_pool_is_backpressure_then_a_classified_failure():
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, extra=dict(source_pages=4, pool_wait_s=0.5))
    try:
        base = staging.handles_live()
        rvs = dep.receivers(0, 51)
        rvs[0].send_metadata([1, 2, 3, 4, 5], 1, None, decode_prefix_len=0)
        snds = dep.senders(0, 51)
        dep.prefill(0, snds, 51, 1, [1, 2, 3, 4, 5], 1)  # 5 pages + aux into a 4-page pool: send() must not raise
        assert snds[0].poll() == 2  # waiting for pages, not failed
        dep.until(lambda: snds[0].poll() == 0, "pool wait bound")
        with pytest.raises(errors.ResourceExhausted):
            snds[0].failure_exception()
        for rv in rvs:
            rv.abort()
        finish(rvs, snds)
        settle(dep, base)
    finally:
        dep.close()


def test_never_linked_prefill_fails_after_the_bound():
    """Decode waits for prefill ranks that never link: Failed after
    link_timeout_s, classified, its slots never exposed."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, extra=dict(link_timeout_s=1))
    try:
        base = staging.handles_live()
        mgr = dep.dec[0]
        info = mgr.prefill_info_table
        rvs = dep.receivers(0, 61)
        info[dep.instances[0]["addr"]].kvfence_ranks = [4242]  # a writer that never links
        rvs[0].ranks = [4242]
        rvs[0].send_metadata([1], 1, None, decode_prefix_len=0)
        dep.until(lambda: rvs[0].poll() == 0, "link bound")
        with pytest.raises(errors.Unavailable):
            rvs[0].failure_exception()
        finish(rvs, [])
        settle(dep, base)
    finally:
        dep.close()


def test_unsupported_features_fail_one_request_not_the_engine(dep):
    base = staging.handles_live()
    rvs = dep.receivers(0, 71)
    rvs[0].send_metadata([1], 1, [[3]], decode_prefix_len=0)  # state indices for a model without state
    assert rvs[0].poll() == 0
    with pytest.raises(errors.InvalidArgument):
        rvs[0].failure_exception()
    rvs2 = dep.receivers(0, 72)
    rvs2[0].send_metadata([1], 1, None, decode_prefix_len=4)  # a prefix without decode's radix cache configured
    assert rvs2[0].poll() == 0
    with pytest.raises(errors.InvalidArgument, match="radix"):
        rvs2[0].failure_exception()
    finish(rvs + rvs2, [])
    settle(dep, base)


@pytest.mark.parametrize("ptp,dtp", [(2, 1), (1, 2)])
def test_token_position_offset_moves_no_page(ptp, dtp):
    """Newest SGLang passes each chunk's first token position; its in-tree
    backends place pages by chunk order alone. Three chunks whose offsets
    start past a 6-token prefix deliver every head of every page where
    decode asked (the previous code failed every such request)."""
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp)
    try:
        base = staging.handles_live()
        d_idx, p_idx = [9, 3, 12, 4, 7], [1, 2, 5, 6, 8]
        rvs, snds, d, p = dep.request(74, 5, d_idx, p_idx, aux_index=2, chunks=3, position=6)
        assert [s.position for s in snds] == [6 + 4 * 2] * ptp  # the last chunk's: 6 + 4 pages of 2 tokens
        assert (d, p) == (4, 4) and dep.corrupt(74, 1, d_idx) == 0
        assert dep.d_eng[0].aux_row(2) == dep.instances[0]["engs"][0].aux_row(2)
        finish(rvs, snds)
        settle(dep, base)
    finally:
        dep.close()


@pytest.mark.parametrize("offsets", [(-1,), (8, 4), (2.0,)])
def test_token_position_offset_out_of_order_fails_the_request(dep, offsets):
    """A negative, decreasing or non-integer offset means chunks out of
    order: the request fails InvalidArgument, the engine stays up, nothing
    is held afterwards."""
    base = staging.handles_live()
    rvs = dep.receivers(0, 75)
    rvs[0].send_metadata([1, 2], 1, None, decode_prefix_len=0)
    snds = dep.senders(0, 75)
    for s in snds:
        s.init(2, 1)
        for i, off in enumerate(offsets):
            s.send([3 + i] if len(offsets) > 1 else [3, 4], [] if i == len(offsets) - 1 else None,
                   token_position_offset=off)
        assert s.poll() == 0
        with pytest.raises(errors.InvalidArgument, match="token_position_offset"):
            s.failure_exception()
    finish(rvs, snds)
    settle(dep, base)


@pytest.mark.parametrize("ptp,dtp,on_demand", [(1, 1, False), (2, 1, False), (1, 2, False), (2, 2, True)])
def test_prefill_dp_attention_groups(ptp, dtp, on_demand):
    """SGLang's DP attention on prefill: two DP groups of ptp ranks. A
    request on either group (follow_bootstrap_room: room % 2) reaches
    decode from that group's writers only (init(prefill_dp_rank)), every
    head of every page; a request on the group the room does not follow
    fails FailedPrecondition at once; a DP rank outside the instance fails
    the receiver InvalidArgument."""
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, prefill_dp=2, on_demand=on_demand,
                     extra=dict(idle_close_s=0.5))
    try:
        base = staging.handles_live() + sum(m.agent is None for m in dep.dec)  # M:N: decode's agents come lazily
        for room in (40, 41):
            rvs, snds, d, p = dep.request(room, 2, [3, 8], [5, 1], aux_index=room % 8, dp=room % 2)
            assert (d, p) == (4, 4) and dep.corrupt(room, 1, [3, 8]) == 0
            group = {m.kv_rank for m in dep.group(0, room % 2)[1]}
            assert set().union(*(rv.ranks for rv in rvs)) == group and len(group) == ptp
            finish(rvs, snds)
        addr = dep.instances[0]["addr"]
        wrong = [dep.Sender(m, addr, 42, [r], 0) for r, m in enumerate(dep.group(0, 1)[1])]
        for s in wrong:
            assert s.poll() == 0
            with pytest.raises(errors.FailedPrecondition, match="follow_bootstrap_room"):
                s.failure_exception()
        rv = dep.Receiver(dep.dec[0], addr, 43)
        rv.init(2)
        dep.until(lambda: rv.poll() == 0, "receiver of DP rank 2 refused")
        with pytest.raises(errors.InvalidArgument, match="prefill_dp_rank"):
            rv.failure_exception()
        finish([rv], wrong)
        dep.until(lambda: not any(m.links.count() for m in dep.instances[0]["mgrs"] if m.links is not None),
                  "idle links closed", 60)
        settle(dep, base)
    finally:
        dep.close()


def test_prefill_dp_attention_rooms_registered_for_decode():
    """load_balance_method other than follow_bootstrap_room: a request on
    DP group 1 whose room (44) would follow group 0 registers itself at
    the bootstrap server; SGLang's query (POST /query_dp_ranks) names
    group 1 and decode, initialised with it, gets every head."""
    from kvfence import sglang_bootstrap
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, prefill_dp=2, balance="round_robin")
    try:
        base = staging.handles_live()
        addr = dep.instances[0]["addr"]
        snds = dep.senders(0, 44, dp=1)
        got = {}
        dep.until(lambda: got.update(sglang_bootstrap.request("POST", "http://%s/query_dp_ranks" % addr,
                                                              {"bootstrap_rooms": [44]})[1]) or got == {"44": 1},
                  "room 44 registered on DP group 1")
        rvs = dep.receivers(0, 44, dp=got["44"])
        for rv in rvs:
            rv.send_metadata([2, 6], 3, None, decode_prefix_len=0)
        dep.prefill(0, snds, 44, 1, [7, 9], 3, dp=1)
        assert dep.run(rvs, snds, 3, 44) == (4, 4) and dep.corrupt(44, 1, [2, 6]) == 0
        finish(rvs, snds)
        settle(dep, base)
    finally:
        dep.close()


@pytest.mark.parametrize("ptp,dtp,pdp", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 2)])
def test_decode_dp_attention_groups(ptp, dtp, pdp):
    """DP attention on decode: two DP groups of dtp ranks, each with its own
    KV pool and kvfence agent (decode_addrs[global TP rank]). Requests
    alternate between the groups at the same page indices: each lands in
    its group's pool only, every head in place, and the other group's
    pages still hold its last request (never crossed)."""
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, prefill_dp=pdp, decode_dp=2, on_demand=True,
                     extra=dict(idle_close_s=0.5))
    try:
        base = staging.handles_live() + sum(m.agent is None for _, ms in dep.decodes for m in ms)
        d_idx, last = [3, 8], {}
        for g, room in ((0, 50), (1, 51), (0, 52), (1, 53)):
            dep.use(0, g)
            rvs, snds, d, p = dep.request(room, 2, d_idx, [5, 1], aux_index=room % 8, dp=room % pdp)
            assert (d, p) == (4, 4) and dep.corrupt(room, 1, d_idx) == 0
            finish(rvs, snds)
            last[g] = room
            for h, r in last.items():
                dep.use(0, h)
                assert dep.corrupt(r, 1, d_idx) == 0, "group %d's pages changed by a request of group %d" % (h, g)
        assert len({m.agent.addr for _, ms in dep.decodes for m in ms}) == 2 * dtp
        # SGLang's decode gives the attention TP rank and the group apart: each scheduler takes its own address
        assert [m.listen for m in dep.decodes[0][1]] == list(range(2 * dtp))
        dep.until(lambda: not any(m.links.count() for m in dep.instances[0]["mgrs"]), "idle links closed", 60)
        settle(dep, base)
    finally:
        dep.close()


@pytest.mark.parametrize("ptp,dtp,pdp,ddp,on_demand", [(1, 1, 2, 1, False), (2, 1, 2, 1, False),
                                                      (1, 2, 1, 2, True), (2, 2, 2, 2, True)])
def test_dp_replicas_without_dp_attention(ptp, dtp, pdp, ddp, on_demand):
    """dp-size > 1 without DP attention: SGLang runs dp-size replicas, each
    a whole TP group (engine_rank its own TP rank, so replicas repeat TP
    ranks; system_dp_rank tells them apart) with its own KV pool. Each
    replica's ranks get their own kvfence rank ids (prefill) and address
    and pool (decode); the bootstrap server sees SGLang's system_dp_*
    registration. Requests alternate replicas on both sides at the same
    page indices: every head in place, written by the right replica's
    writers only, the other decode replica's pages untouched."""
    from kvfence import sglang_bootstrap
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, prefill_dp=pdp, decode_dp=ddp, on_demand=on_demand,
                     replicas=True, extra=dict(idle_close_s=0.5))
    try:
        base = staging.handles_live() + sum(m.agent is None for _, ms in dep.decodes for m in ms)
        ids = [m.kv_rank for m in dep.instances[0]["mgrs"]]
        assert len(set(ids)) == ptp * pdp, "replicas share kvfence rank ids: %s" % ids
        st, info = sglang_bootstrap.request("GET", "http://%s/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                                            "&target_tp_rank=-1&target_pp_rank=-1" % dep.instances[0]["addr"])
        assert st == 200 and (info["dp_size"], info["attn_tp_size"]) == (pdp, ptp), info
        d_idx, last = [3, 8], {}
        for g, room in ((0, 70), (ddp - 1, 71), (0, 72), (ddp - 1, 73)):
            dep.use(0, g)
            rvs, snds, d, p = dep.request(room, 2, d_idx, [5, 1], aux_index=room % 8, dp=room % pdp)
            assert (d, p) == (4, 4) and dep.corrupt(room, 1, d_idx) == 0
            group = {m.kv_rank for m in dep.group(0, room % pdp)[1]}
            assert set().union(*(rv.ranks for rv in rvs)) == group
            finish(rvs, snds)
            last[g] = room
            for h, r in last.items():
                dep.use(0, h)
                assert dep.corrupt(r, 1, d_idx) == 0, "replica %d's pages changed by a request of replica %d" % (h, g)
        assert [m.listen for m in dep.decodes[0][1]] == list(range(ddp * dtp))
        if pdp > 1:  # a request on the replica its room does not follow fails at once, as SGLang's senders
            wrong = [dep.Sender(m, dep.instances[0]["addr"], 74, [r], 0) for r, m in enumerate(dep.group(0, 1)[1])]
            for s in wrong:
                assert s.poll() == 0
                with pytest.raises(errors.FailedPrecondition, match="follow_bootstrap_room"):
                    s.failure_exception()
            finish([], wrong)
        if on_demand:
            dep.until(lambda: not any(m.links.count() for m in dep.instances[0]["mgrs"]), "idle links closed", 60)
        settle(dep, base)
    finally:
        dep.close()


@pytest.mark.parametrize("replicas", [False, True])
def test_poll_before_init_waits_for_the_dp_rank(replicas):
    """SGLang main's _update_handshake_waiters polls every receiver in the
    prealloc queue, also those whose prefill DP group it has not resolved
    yet (init(prefill_dp_rank) not called). Against a DP prefill instance
    such a poll stays Bootstrapping; it used to fail the request ("gave no
    prefill_dp_rank") once the instance's layout had arrived."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, prefill_dp=2, replicas=replicas)
    try:
        base = staging.handles_live()
        addr = dep.instances[0]["addr"]
        rv = dep.Receiver(dep.dec[0], addr, 81)
        dep.until(lambda: rv.poll() is not None and addr in dep.dec[0].prefill_info_table, "layout fetched")
        for _ in range(3):
            assert rv.poll() == 1, rv.error
        rv.init(1)
        dep.until(lambda: rv.poll() == 2, "resolved after init(prefill_dp_rank)")
        assert set(rv.ranks) == {m.kv_rank for m in dep.group(0, 1)[1]}
        rv.send_metadata([2, 6], 3, None, decode_prefix_len=0)
        snds = dep.senders(0, 81, dp=1)
        dep.prefill(0, snds, 81, 1, [7, 9], 3, dp=1)
        assert dep.run([rv], snds, 3, 81) == (4, 4) and dep.corrupt(81, 1, [2, 6]) == 0
        finish([rv], snds)
        settle(dep, base)
    finally:
        dep.close()


@pytest.mark.parametrize("ptp,dtp,cp,pdp,on_demand", [(1, 1, 2, 1, False), (2, 1, 2, 1, True),
                                                     (1, 2, 4, 1, True), (2, 2, 2, 2, True)])
def test_prefill_context_parallelism(ptp, dtp, cp, pdp, on_demand):
    """Prefill with attn-cp-size > 1 (optionally under DP attention): every
    CP rank holds the request's KV (SGLang all-gathers it), CP rank 0 of
    the group sends it and the others are dummies (no agent, no link;
    WaitingForInput, then Success after their last chunk), as SGLang's
    backends by default. The dummies hold other bytes: a write from one
    would show as corrupt heads."""
    from kvfence import sglang_bootstrap
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, cp=cp, prefill_dp=pdp, on_demand=on_demand,
                     extra=dict(idle_close_s=0.5))
    try:
        base = staging.handles_live() + sum(m.agent is None for m in dep.dec)
        st, info = sglang_bootstrap.request("GET", "http://%s/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                                            "&target_tp_rank=-1&target_pp_rank=-1" % dep.instances[0]["addr"])
        assert st == 200 and (info["attn_cp_size"], info["attn_tp_size"], info["dp_size"]) == (cp, ptp, pdp), info
        for room in (90, 91):
            dp = room % pdp
            rvs, snds, d, p = dep.request(room, 2, [3, 8], [5, 1], aux_index=room % 8, dp=dp)
            assert (d, p) == (4, 4) and dep.corrupt(room, 1, [3, 8]) == 0
            mgrs = dep.group(0, dp)[1]
            assert len(snds) == ptp * cp and set().union(*(rv.ranks for rv in rvs)) == \
                {m.kv_rank for m in mgrs if not m.is_dummy_cp_rank}
            assert sum(m.is_dummy_cp_rank for m in mgrs) == ptp * (cp - 1)
            assert all(not s.snds for s, m in zip(snds, mgrs) if m.is_dummy_cp_rank), "a dummy CP rank sends"
            for e in dep.d_eng:
                assert e.aux_row(room % 8) == dep.group(0, dp)[0][0].aux_row(room % 8)
            finish(rvs, snds)
        if on_demand:
            dep.until(lambda: not any(m.links.count() for m in dep.instances[0]["mgrs"] if m.links is not None),
                      "idle links closed", 60)
        settle(dep, base)
    finally:
        dep.close()


def test_decode_dp_attention_refuses_static_pairing():
    """A prefill paired statically (decode_addrs: one group's ranks) would
    write every request to that group: a DP decode fails the requests
    FailedPrecondition instead (no hang, no page of another group)."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, decode_dp=2)
    try:
        base = staging.handles_live()
        for g in (0, 1):
            dep.use(0, g)
            rv = dep.Receiver(dep.dec[0], dep.instances[0]["addr"], 60 + g)
            rv.init(0)
            dep.until(lambda: rv.poll() == 0, "DP decode refuses a static prefill")
            with pytest.raises(errors.FailedPrecondition, match="M:N"):
                rv.failure_exception()
            rv.clear()
        settle(dep, base)
    finally:
        dep.close()


@pytest.mark.parametrize("ptp,dtp,pdp", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 2)])
def test_pipeline_parallel_stages(ptp, dtp, pdp):
    """PP 2 on both sides: each stage's schedulers hold their own layers
    (Engine.layer0: a page's bytes name its layer in the whole model).
    One request: every decode stage gets every head of its own layers
    from the same stage's prefill ranks only, aux row included; nothing
    left afterwards."""
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, prefill_dp=pdp, pp=2, on_demand=True,
                     extra=dict(idle_close_s=0.5))
    try:
        base = staging.handles_live() + sum(m.agent is None for _, ms in dep.decodes for m in ms)
        room, d_idx, p_idx, aux = 70, [3, 8], [5, 1], 6
        stages = []
        for s in (0, 1):  # SGLang's decode: every stage's scheduler takes the request
            dep.use(0, 0, s)
            rvs = dep.receivers(0, room, dp=room % pdp)
            for rv in rvs:
                rv.send_metadata(d_idx, aux, None, decode_prefix_len=0)
            stages.append(rvs)
        ranks = [set().union(*(rv.ranks for rv in rvs)) for rvs in stages]
        assert not ranks[0] & ranks[1], "stages share writers: %s" % ranks
        for s in (0, 1):
            dep.use(0, 0, s)
            snds = dep.senders(0, room, dp=room % pdp)
            dep.prefill(0, snds, room, 1, p_idx, aux, dp=room % pdp)
            assert dep.run(stages[s], snds, aux, room) == (4, 4), "stage %d\n%s" % (s, dep.describe(snds, stages[s]))
            assert dep.corrupt(room, 1, d_idx) == 0, "stage %d's layers" % s
            finish(stages[s], snds)
        for s in (0, 1):  # stage 1's writes never landed in stage 0's layers
            dep.use(0, 0, s)
            assert dep.corrupt(room, 1, d_idx) == 0
        dep.until(lambda: not any(m.links.count() for m in dep.instances[0]["mgrs"]), "idle links closed", 60)
        settle(dep, base)
    finally:
        dep.close()


def test_pipeline_parallel_refusals():
    """Unequal PP sizes (decode PP 1 would need each stage to fill a layer
    range of one slot) fail each request Unimplemented; a prefill with PP
    and static decode_addrs is refused at start-up."""
    import types
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, pp=2, on_demand=True)
    other = Deployment(P, prefill_tp=(1,), decode_tp=1, on_demand=True)  # PP 1 everywhere
    try:
        base = staging.handles_live()
        rv = dep.Receiver(dep.dec[0], other.instances[0]["addr"], 71)  # decode PP 2 -> prefill PP 1
        rv.init(0)
        dep.until(lambda: rv.poll() == 0, "unequal PP refused")
        with pytest.raises(errors.Unimplemented, match="PP"):
            rv.failure_exception()
        rv.clear()
        assert staging.handles_live() == base
    finally:
        dep.close()
        other.close()
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(decode_addrs=["127.0.0.1:1"], log_level="error"))
    try:
        e = Engine(HEADS, 0, (16, 8))
        with pytest.raises(errors.Unimplemented, match="M:N"):
            P.get_kv_class("manager")(e.kv_args(P.get_kv_class("kvargs"), 0), "prefill",
                                      types.SimpleNamespace(pp_size=2, tp_size=1), False)
    finally:
        del os.environ["KVFENCE_SGLANG_CONFIG"]


def test_start_up_refusals():
    import types
    from kvfence.sglang import refuse_unsupported
    a = types.SimpleNamespace(state_types=[])
    for sa, word in ((types.SimpleNamespace(enable_dp_attention=True), "DP attention"),
                     (types.SimpleNamespace(attn_cp_size=2), "context parallelism on decode")):
        with pytest.raises(errors.Unimplemented, match=word):
            refuse_unsupported(sa, a)
    with pytest.raises(errors.Unimplemented, match="SWA state buffers without a bound"):  # no state_items bound
        refuse_unsupported(None, types.SimpleNamespace(state_types=["swa"], state_data_ptrs=[[16]],
                                                       state_data_lens=[[8]], state_item_lens=[[8]]))
    refuse_unsupported(types.SimpleNamespace(tp_size=4), a)
    with pytest.raises(errors.Unimplemented, match="dcp_size 2"):  # newest upstream's KVArgs field
        refuse_unsupported(None, types.SimpleNamespace(state_types=[], dcp_size=2))
    refuse_unsupported(None, types.SimpleNamespace(state_types=[], dcp_size=1))
    dpa = types.SimpleNamespace(enable_dp_attention=True, dp_size=2, tp_size=4)
    refuse_unsupported(dpa, a, "prefill")  # carried on both sides
    refuse_unsupported(dpa, a, "decode")
    refuse_unsupported(types.SimpleNamespace(dp_size=2, tp_size=2), a, "prefill")  # DP replicas: carried
    cp = types.SimpleNamespace(attn_cp_size=2, tp_size=2)
    refuse_unsupported(cp, a, "prefill")  # CP rank 0 sends: carried
    with pytest.raises(errors.Unimplemented, match="context parallelism on decode"):
        refuse_unsupported(cp, a, "decode")
    os.environ["SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"] = "true"
    try:
        with pytest.raises(errors.Unimplemented, match="ALL_CP_RANKS_TRANSFER"):
            refuse_unsupported(cp, a, "prefill")
    finally:
        del os.environ["SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"]
    with pytest.raises(errors.Unimplemented, match="tp-size 3 over dp-size 2"):
        refuse_unsupported(types.SimpleNamespace(enable_dp_attention=True, dp_size=2, tp_size=3), a, "prefill")


def test_instance_of_another_tp_is_refused_per_request():
    """Decode sized for prefill TP2 meets an instance registering TP1: its
    requests fail FailedPrecondition (never silently wrong heads)."""
    dep = Deployment(P, prefill_tp=(2, 1), decode_tp=1)
    try:
        rv = dep.Receiver(dep.dec[0], dep.instances[1]["addr"], 81)
        rv.init(0)
        dep.until(lambda: rv.poll() == 0, "refusal")
        with pytest.raises(errors.FailedPrecondition, match="TP"):
            rv.failure_exception()
        rv.clear()
    finally:
        dep.close()


def test_bootstrap_routes_answer_as_sglang():
    from kvfence import sglang_bootstrap as sb
    srv = P.get_kv_class("bootstrap_server")("127.0.0.1", 0)
    url = "http://127.0.0.1:%d" % srv.port
    try:
        q = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        assert sb.request("GET", url + "/health")[0] == 200
        assert sb.request("GET", url + "/route")[0] == 400
        assert sb.request("GET", url + q)[0] == 503  # not every rank registered yet
        reg = dict(attn_tp_size=2, attn_cp_size=1, attn_dp_size=1, attn_dp_rank=0, attn_cp_rank=0, pp_size=1,
                   pp_rank=0, system_dp_size=1, system_dp_rank=0, rank_ip="h", rank_port=1, page_size=2,
                   kv_cache_dtype="auto", kvfence_rank_base=5000)
        for r in (0, 1, 1):  # a retry counts once
            assert sb.request("PUT", url + "/route", dict(reg, attn_tp_rank=r))[0] == 200
        st, info = sb.request("GET", url + q)
        assert st == 200 and info["attn_tp_size"] == 2 and info["dp_size"] == 1 and info["follow_bootstrap_room"]
        assert sb.request("GET", url + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0") \
            == (200, {"rank_ip": "h", "rank_port": 1})
        assert sb.request("GET", url + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=7&target_pp_rank=0")[0] == 404
        assert sb.request("POST", url + "/register_dp_rank", {"bootstrap_room": 9, "dp_rank": 0})[0] == 200
        assert sb.request("POST", url + "/query_dp_ranks", {"bootstrap_rooms": [9, 10]}) == (200, {"9": 0})
        assert sb.request("GET", url + "/kvfence")[1]["rank_base"] == 5000
        assert sb.request("PUT", url + "/route", {"junk": 1})[0] == 400  # a bad request never stops the server
        assert sb.request("GET", url + "/health")[0] == 200
    finally:
        srv.close()


def test_calls_after_the_agent_closed_fail_the_request_never_raise():
    """The agent underneath is gone (shutdown, a crashed plugin): every call
    SGLang makes returns (poll: Failed) and failure_exception says why."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1)
    try:
        rvs = dep.receivers(0, 91)
        rvs[0].send_metadata([1], 1, None, decode_prefix_len=0)
        snds = dep.senders(0, 91)
        snds[0].init(1, 1)
        dep.dec[0].agent.close()
        dep.instances[0]["mgrs"][0].agent.close()
        snds[0].send([2], [])
        assert snds[0].poll() == 0 and rvs[0].poll() == 0
        for x in (rvs[0], snds[0]):
            with pytest.raises(errors.KVFenceError):
                x.failure_exception()
            x.abort()
            x.clear()
    finally:
        dep.close()


def test_held_request_closed_elsewhere_never_raises(dep):
    """A held request whose handle was closed elsewhere (SGLang's clear()
    racing the receiver's let-go on another thread, or the manager's close)
    is not asked again: the sweep that every poll runs must not raise
    FailedPrecondition into the scheduler (it did once, in CI)."""
    base = staging.handles_live()
    rvs = dep.receivers(0, 91)
    rvs[0].send_metadata([1, 2], 1, None, decode_prefix_len=0)
    rvs[0].abort()
    rvs[0].poll()
    mgr = rvs[0].mgr
    mgr.hold(91, rvs[0].rv)  # held twice, as the race leaves it
    rvs[0].rv.close()
    assert mgr.is_abort_release_safe(91) is True  # nothing of ours is left to ask
    assert 91 not in mgr.held_rooms()
    settle(dep, base)


def test_prefill_recompute_fails_the_request_never_raises(dep):
    """Newest upstream's decode calls kv_manager.submit_prefill_recompute
    right after send_metadata for a PD rebootstrap; kvfence does not carry
    it: the request fails Unimplemented through poll, nothing stays held."""
    base = staging.handles_live()
    rvs = dep.receivers(0, 93)
    rvs[0].send_metadata([1, 2], 1, None, decode_prefix_len=0)
    rvs[0].mgr.submit_prefill_recompute(rvs[0], {"rid": "r93"})
    assert rvs[0].poll() == 0
    with pytest.raises(errors.Unimplemented, match="rebootstrap"):
        rvs[0].failure_exception()
    finish(rvs, [])
    settle(dep, base)
