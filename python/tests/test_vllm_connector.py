"""kvfence.vllm in vLLM's call order: prefill and decode instances, every
scheduler and worker connector in its own process (vllm_harness.py), aborts
at each step; every block checked, nothing left held, no hang."""
import os

import pytest

from vllm_harness import Instance, tokens_blocks

BS = 4
FAST = dict(log_level=os.environ.get("KVFENCE_TEST_LOG", "error"), lease_ms=2000, max_hold_ms=20000, heartbeat_ms=100, bootstrap_timeout_ms=5000,
            request_tombstone_ms=5000, link_timeout_s=60)


def pair(p_tp, d_tp, kind="flash", p_hnd=False, d_hnd=True, heads=4, p_extra=None, d_extra=None):
    pi = Instance("kv_producer", "prefill-A", p_tp, kind, p_hnd, heads, bs=BS, extra=dict(FAST, **(p_extra or {})))
    try:
        di = Instance("kv_consumer", "decode-A", d_tp, kind, d_hnd, heads, bs=BS,
                      extra=dict(FAST, prefill_tp_size=p_tp, **(d_extra or {})))
    except BaseException:
        pi.stop()
        raise
    return pi, di


def prefill(pi, rid, n, tag):
    blocks = pi.alloc(tokens_blocks(n, BS))
    pi.sched.add(rid, n, {"do_remote_decode": True})
    assert pi.sched.matched(rid, 0) == (0, False)
    for w in pi.workers:
        w.fill(blocks, tag)
    delay, params = pi.sched.finished(rid, blocks, "FINISHED_LENGTH_CAPPED")
    assert delay and params["do_remote_prefill"]
    pi.held[rid] = blocks
    pi.finished_ids.add(rid)
    return params


def decode(di, rid, n, params, hashed=0):
    di.sched.add(rid, n, params)
    ext, load_async = di.sched.matched(rid, hashed * BS)
    assert (ext, load_async) == (n - hashed * BS, True)
    blocks = di.alloc(tokens_blocks(n, BS))
    di.sched.after_alloc(rid, blocks, ext, hashed)
    return blocks


def abort_decode(di, rid, blocks):
    """vLLM's finish_requests for a WAITING_FOR_REMOTE_KVS request: blocks
    stay until the workers report it in finished_recving."""
    assert di.sched.finished(rid, blocks, "FINISHED_ABORTED") == (False, None)
    di.finished_ids.add(rid)
    di.held[rid] = blocks


def both_step(pi, di):
    pi.step()
    di.step()


def settle(pi, di, rids_p, rids_d):
    """Steps both instances until every named request was reported (each
    step waits on its own; the bound only turns a hang into a failure)."""
    def done():
        pi.step()
        return all(r in pi.done for r in rids_p) and all(r in di.done for r in rids_d)
    try:
        di.run_until(done, "transfers to settle")
    except AssertionError:
        raise AssertionError("not settled: prefill pending %s, decode pending %s" % (
            [r for r in rids_p if r not in pi.done], [r for r in rids_d if r not in di.done]))


def check_clean(pi, di):
    for inst in (pi, di):
        assert not inst.held, "blocks still held: %s" % inst.held
        for w in inst.workers:
            assert w.live_handles() == dict(loads=0, out=0)
            assert w.unreleased_reports() == 0


def stop(*insts):
    for i in insts:
        i.stop()


@pytest.mark.parametrize("p_tp,d_tp,kind,p_hnd,d_hnd", [
    (2, 1, "flash", False, True),
    (1, 2, "flashinfer", True, False),
    (1, 2, "mla", False, False),
])
def test_transfers_with_aborts(p_tp, d_tp, kind, p_hnd, d_hnd):
    """Loads verified byte for byte across TP ratios and layouts; an abort at
    allocation and one a step into the load keep their blocks until kvfence
    let go, and the blocks' next owner is never written."""
    pi, di = pair(p_tp, d_tp, kind, p_hnd, d_hnd)
    try:
        plan = [("r0", 10, 1), ("r1", 4, 2), ("r2", 7, 3), ("r3", 13, 4)]
        params = {rid: prefill(pi, rid, n, tag) for rid, n, tag in plan}
        pi.step()
        blocks = {rid: decode(di, rid, n, params[rid]) for rid, n, _ in plan[:3]}
        abort_decode(di, "r2", blocks["r2"])  # aborted in the step its load starts
        di.step()
        blocks["r3"] = decode(di, "r3", 13, params["r3"])
        di.step()
        abort_decode(di, "r3", blocks["r3"])  # aborted a step into its load
        settle(pi, di, [r for r, _, _ in plan], [r for r, _, _ in plan])
        # The aborted requests' blocks went back only now; their next owner
        # computes into them, and no late write may land there.
        victim = di.alloc(len(blocks["r2"]) + len(blocks["r3"]))
        for w in di.workers:
            w.fill(victim, 99)
        for _ in range(20):
            both_step(pi, di)
        assert not di.errors & (set(blocks["r0"]) | set(blocks["r1"]))
        for w in di.workers:
            assert w.corrupt(blocks["r0"], 1) == 0
            assert w.corrupt(blocks["r1"], 2) == 0
            assert w.corrupt(victim, 99) == 0
        check_clean(pi, di)
    finally:
        stop(di, pi)


def test_prefix_hit_preemption_reused_id_and_aborts_before_scheduling():
    pi, di = pair(2, 2, "flash", True, False, p_extra=dict(abort_timeout_s=600, idle_close_s=0.5))
    try:
        pa = prefill(pi, "x", 9, 5)
        pb = prefill(pi, "gone", 8, 6)
        pc = prefill(pi, "hit", 8, 4)
        pi.step()
        # "hit" is all in decode's prefix cache: nothing to load, and prefill
        # is told at once that its blocks are free.
        di.sched.add("hit", 8, pc)
        assert di.sched.matched("hit", 8) == (0, False)
        di.sched.after_alloc("hit", di.alloc(2), 0, 2)
        # Decode has the first block from its own prefix cache.
        bx = decode(di, "x", 9, pa, hashed=1)
        for w in di.workers:
            w.fill(bx[:1], 5)
        # "gone" is aborted before decode ever scheduled it: prefill must be
        # told (abandon), not wait out its 600 s abort timeout.
        di.sched.add("gone", 8, pb)
        assert di.sched.finished("gone", [], "FINISHED_ABORTED") == (False, None)
        settle(pi, di, ["x", "gone", "hit"], ["x"])
        for w in di.workers:
            assert w.corrupt(bx, 5) == 0
        # Preempted after its load, "x" is scheduled again: vLLM asks once
        # more, and it recomputes locally instead of loading twice.
        assert di.sched.matched("x", 0) == (0, False)
        di.release(bx)
        # Idle prefill agents (one per decode rank) close, plugins and all.
        # (They may have closed already: settle steps prefill, and 0.5 s is
        # short on a loaded machine. Counted, not timed.)
        assert all(w.agents_opened() == 1 for w in pi.workers)  # decode rank d takes rank d's heads
        pi.run_until(lambda: all(w.live_agents() == 0 for w in pi.workers), "idle prefill agents to close")
        # The same request id again: a new transfer, a new room, new agents.
        pa2 = prefill(pi, "x", 9, 7)
        assert pa2["kvfence_tid"] != pa["kvfence_tid"]
        pi.done.pop("x")
        di.done.pop("x")
        bx2 = decode(di, "x", 9, pa2)
        settle(pi, di, ["x"], ["x"])
        for w in di.workers:
            assert w.corrupt(bx2, 7) == 0
        check_clean(pi, di)
    finally:
        stop(di, pi)


def test_prefill_side_abort_frees_at_once():
    pi = Instance("kv_producer", "prefill-B", 1, "flash", False, 2, bs=BS, extra=FAST)
    try:
        b = pi.alloc(2)
        pi.sched.add("p", 8, {"do_remote_decode": True})
        assert pi.sched.finished("p", b, "FINISHED_ABORTED") == (False, None)
        meta = pi.sched.meta()
        assert meta.send == [] and meta.recv == []
    finally:
        pi.stop()


def _expired_load(swallow, monkeypatch):
    """Prefill gave its blocks back (abort_timeout_s) before decode pulled:
    the load fails, and must say so for every block."""
    if swallow:
        monkeypatch.setenv("KVFENCE_TEST_CONTROL_ARM", "1")
    d_extra = dict(unsafe_control_arm="swallow_load_errors") if swallow else {}
    pi, di = pair(1, 1, "flash", p_extra=dict(abort_timeout_s=0.3), d_extra=d_extra)
    try:
        params = prefill(pi, "late", 12, 8)
        pi.run_until(lambda: "late" in pi.done, "prefill to give the blocks back at its timeout")
        blocks = decode(di, "late", 12, params)
        di.run_until(lambda: "late" in di.done, "the failed load to be reported")
        bad = sum(w.corrupt(blocks, 8) for w in di.workers)
        check_clean(pi, di)
        return set(blocks), di.errors, bad
    finally:
        stop(di, pi)


def test_failed_load_names_every_block(monkeypatch):
    blocks, errs, bad = _expired_load(False, monkeypatch)
    assert errs == blocks  # vLLM recomputes them; nothing is used unloaded
    assert bad > 0  # (they hold no data: naming them is what keeps that out)


def test_control_arm_swallow_load_errors_is_caught(monkeypatch):
    blocks, errs, bad = _expired_load(True, monkeypatch)
    # The unsafe arm reports the load done with no error: vLLM would use
    # blocks that never received a byte.
    assert not errs and bad > 0


def _abort_then_reuse(arm, monkeypatch):
    if arm:
        monkeypatch.setenv("KVFENCE_TEST_CONTROL_ARM", "1")
    d_extra = dict(unsafe_control_arm=arm) if arm else {}
    pi, di = pair(1, 1, "flash", d_extra=d_extra)
    try:
        # Prefill's workers get the send intent only after the blocks' next
        # owner computed into them (settle steps prefill), so a late copy
        # can only land after that, whatever the machine's load.
        params = prefill(pi, "a", 16, 9)
        blocks = decode(di, "a", 16, params)
        abort_decode(di, "a", blocks)
        di.run_until(lambda: "a" in di.done, "the aborted load to be reported")
        victim = di.alloc(len(blocks))
        assert victim == blocks  # vLLM hands the freed blocks out first
        for w in di.workers:
            w.fill(victim, 42)
        settle(pi, di, ["a"], [])
        di.run_until(lambda: all(w.threads() == 0 for w in di.workers), "load threads to end")
        return sum(w.corrupt(victim, 42) for w in di.workers), sum(w.unreleased_reports() for w in di.workers)
    finally:
        stop(di, pi)


def test_abort_keeps_blocks_until_released(monkeypatch):
    assert _abort_then_reuse(None, monkeypatch) == (0, 0)


def test_control_arm_free_on_abort_is_caught(monkeypatch):
    corrupt, unreleased = _abort_then_reuse("free_on_abort", monkeypatch)
    # Reported while kvfence still held the request, and the late copy
    # landed in the blocks' next owner.
    assert unreleased > 0 and corrupt > 0


def test_prefill_worker_killed_mid_load():
    """A prefill worker (and with it its plugin) dies after decode exposed
    the request's slots: the load fails for every block, and is reported
    only once kvfence released the slots (fence or lease)."""
    pi, di = pair(2, 1, "flash")
    try:
        params = prefill(pi, "k", 12, 3)
        # Prefill's workers never get the send intent (no step): the pull is
        # answered, decode exposes its slots, and no byte comes.
        blocks = decode(di, "k", 12, params)
        di.run_until(lambda: di.workers[0].exposed() == 1, "decode to expose the request")
        pi.kill_worker(1)
        di.run_until(lambda: "k" in di.done, "the failed load to be reported")
        assert di.errors == set(blocks)
        assert di.workers[0].unreleased_reports() == 0
        assert di.workers[0].live_handles() == dict(loads=0, out=0)
    finally:
        stop(di, pi)


def test_unsafe_arm_refused_outside_tests(monkeypatch):
    monkeypatch.delenv("KVFENCE_TEST_CONTROL_ARM", raising=False)
    with pytest.raises(RuntimeError, match="unsafe_control_arm is for kvfence's own tests only"):
        Instance("kv_consumer", "d", 1, "flash", False, 2, bs=BS, extra=dict(FAST, unsafe_control_arm="free_on_abort"))


def test_prefill_worker_hung_mid_load_lease_expires():
    """A prefill worker stops (SIGSTOP: no heartbeat, its plugin still up)
    after decode exposed the request: kvfence's lease on it passes, the load
    fails for every block and is reported once the slots were released."""
    import signal
    pi, di = pair(1, 1, "flash")
    try:
        params = prefill(pi, "h", 8, 5)
        blocks = decode(di, "h", 8, params)
        di.run_until(lambda: di.workers[0].exposed() == 1, "decode to expose the request")
        os.kill(pi.workers[0].pid, signal.SIGSTOP)
        try:
            di.run_until(lambda: "h" in di.done, "the load to fail at the lease")
        finally:
            os.kill(pi.workers[0].pid, signal.SIGCONT)
        assert di.errors == set(blocks)
        assert di.workers[0].unreleased_reports() == 0
        assert di.workers[0].live_handles() == dict(loads=0, out=0)
    finally:
        stop(di, pi)


def test_two_prefill_instances_feed_one_decode():
    """Two prefill instances (their own engine ids, so their own kvfence
    ranks) load into one decode instance, interleaved, every block checked."""
    pa = Instance("kv_producer", "prefill-A", 1, "flash", False, 2, bs=BS, extra=FAST)
    pb = Instance("kv_producer", "prefill-B", 1, "flash", True, 2, bs=BS, extra=FAST)
    di = Instance("kv_consumer", "decode-A", 1, "flash", False, 2, bs=BS, extra=dict(FAST, prefill_tp_size=1))
    try:
        plan = [(pa, "a0", 9, 11), (pb, "b0", 6, 12), (pa, "a1", 5, 13), (pb, "b1", 11, 14)]
        params = {rid: prefill(p, rid, n, tag) for p, rid, n, tag in plan}
        blocks = {rid: decode(di, rid, n, params[rid]) for _, rid, n, _ in plan}
        def settled():
            pa.step()
            pb.step()
            return all(rid in p.done for p, rid, _, _ in plan) and all(rid in di.done for _, rid, _, _ in plan)
        di.run_until(settled, "both instances' transfers to settle")
        assert not di.errors
        for _, rid, _, tag in plan:
            assert di.workers[0].corrupt(blocks[rid], tag) == 0
        check_clean(pa, di)
        check_clean(pb, di)
    finally:
        stop(di, pb, pa)


def test_failed_pull_tells_the_other_prefill_ranks():
    """Decode's pull to prefill rank 0 fails (that worker is gone), so rank 1
    is never pulled: the load fails for every block, and rank 1 gives its
    blocks back at once (cancel), not at its 600 s abort_timeout_s."""
    pi, di = pair(2, 1, "flash", p_extra=dict(abort_timeout_s=600))
    try:
        params = prefill(pi, "c", 12, 6)
        pi.kill_worker(0)
        blocks = decode(di, "c", 12, params)
        settle(pi, di, ["c"], ["c"])
        assert di.errors == set(blocks)
        assert pi.workers[1].live_handles() == dict(loads=0, out=0)
        assert di.workers[0].unreleased_reports() == 0
    finally:
        stop(di, pi)
