"""M:N and links on demand (kvfence.sglang_links): prefill instances get no
decode_addrs; each request's decode ranks announce themselves at the
prefill instance's bootstrap server, prefill links to them on demand and
closes links idle for idle_close_s. Every head of every page and the aux
row checked; no slot, hold, handle or link left at the end."""
import time

import pytest

from kvfence import errors, staging
from kvfence.sglang import KVFenceBackendProvider

from sglang_topo import Deployment
from test_sglang_topologies import finish
from test_sglang_topologies import settle as settle_all


P = KVFenceBackendProvider()


def decode_agents(dep):
    """Decode agents made so far: decode sizes itself from the first prefill
    instance it meets, so its agent appears with the first request."""
    return sum(m.agent is not None for _, mgrs in dep.decodes for m in mgrs)


def rest(dep):
    """Handles open at rest, not counting decode agents made lazily."""
    return staging.handles_live() - decode_agents(dep)


def settle(dep, base):
    settle_all(dep, base + decode_agents(dep))


def links(dep):
    return sum(m.links.count() for inst in dep.instances for m in inst["mgrs"])


def no_links_left(dep, timeout=60):
    dep.until(lambda: links(dep) == 0, "idle links closed", timeout)


def why(objs):
    out = []
    for o in objs:
        try:
            o.failure_exception()
        except Exception as exc:  # the classified failure, for the assertion message
            out.append(repr(exc))
    return out


def deliver(dep, room, d_idx, p_idx, aux_index, inst):
    rvs, snds, d, p = dep.request(room, len(d_idx), d_idx, p_idx, aux_index=aux_index, inst=inst)
    assert (d, p) == (4, 4), why(rvs + snds)
    assert dep.corrupt(room, 1, d_idx) == 0, "heads misplaced"
    for e in dep.d_eng:
        assert e.aux_row(aux_index) == dep.instances[inst]["engs"][0].aux_row(aux_index)
    finish(rvs, snds)


@pytest.mark.parametrize("ptp,dtp", [(2, 2), (2, 1), (1, 2)])
def test_router_pairs_any_decode_with_any_prefill(ptp, dtp):
    """Two decode instances, two prefill instances, the router's pick per
    request: every pairing delivers; each prefill rank keeps one link per
    decode rank it served."""
    dep = Deployment(P, prefill_tp=(ptp, ptp), decode_tp=dtp, decode_instances=2, on_demand=True,
                     extra=dict(idle_close_s=0.5))
    try:
        base = rest(dep)
        room = 100
        for d_inst, p_inst in ((0, 0), (1, 1), (0, 1), (1, 0), (1, 0), (0, 0)):
            dep.use(d_inst)
            room += 1
            deliver(dep, room, [room % 30, (room + 7) % 30], [3, 4], room % 8, p_inst)
        no_links_left(dep)
        settle(dep, base)
    finally:
        dep.close()


def test_idle_link_is_closed_and_made_again_on_the_next_request():
    dep = Deployment(P, prefill_tp=(2,), decode_tp=1, on_demand=True, extra=dict(idle_close_s=0.3))
    try:
        base = rest(dep)
        assert links(dep) == 0, "no link before a request"
        deliver(dep, 201, [1, 2], [3, 4], 1, 0)
        no_links_left(dep)
        closed = sum(m.links.closed_idle for m in dep.instances[0]["mgrs"])
        assert closed == 2
        dep.until(lambda: not any(dep.dec[0].agent.linked(r) for r in (10000, 10001)), "decode saw the links go")
        deliver(dep, 202, [5, 6], [7, 8], 2, 0)  # made again on demand
        no_links_left(dep)
        assert sum(m.links.closed_idle for m in dep.instances[0]["mgrs"]) == 4
        settle(dep, base)
    finally:
        dep.close()


def test_decode_instance_that_disappears_fails_prefill_senders_and_leaks_nothing():
    """Decode instance 1 announces itself for a room, then goes away before
    prefill linked: prefill's senders fail Unavailable after link_timeout_s
    and release their links; a room whose decode never announced fails the
    same way; decode instance 0 keeps serving."""
    dep = Deployment(P, prefill_tp=(2,), decode_tp=1, decode_instances=2, on_demand=True,
                     extra=dict(idle_close_s=0.3, link_timeout_s=2))
    try:
        dep.use(1)
        rvs = dep.receivers(0, 301)  # announced at the prefill's bootstrap server
        for m in dep.dec:
            m.close()  # the decode instance disappears
        del dep.decodes[1]
        dep.use(0)
        base = rest(dep)
        for room in (301, 302):  # 302: no decode ever announced itself
            snds = [dep.Sender(m, dep.instances[0]["addr"], room, [r], 0)
                    for r, m in enumerate(dep.instances[0]["mgrs"])]
            dep.until(lambda: all(s.poll() == 0 for s in snds), "prefill senders fail after the bound", 60)
            for s in snds:
                with pytest.raises(errors.Unavailable):
                    s.failure_exception()
            finish([], snds)
        finish(rvs, [])
        # The 2 s bound was for the rooms above; room 303 makes a new link
        # (a plugin process, a dial, a handshake), which a loaded machine
        # may not finish in 2 s: it gets the deployment's usual bound.
        for m in dep.instances[0]["mgrs"] + dep.dec:
            m.link_timeout_s = 30
        deliver(dep, 303, [1, 2], [3, 4], 3, 0)
        no_links_left(dep)
        settle(dep, base)
    finally:
        dep.close()


def test_bootstrap_server_holds_a_radix_decode_back_until_its_prefix():
    """A decode with its radix cache on announces radix first; prefill's
    look-up finds nothing until the prefix decode holds is announced too
    (the unsafe variant, prefill going on without it, would send pages
    decode already has into the pages after them)."""
    from kvfence import sglang_bootstrap
    from kvfence.sglang import KVFenceBootstrapServer
    boot = KVFenceBootstrapServer("127.0.0.1", 0)
    addr = "127.0.0.1:%d" % boot.port
    try:
        assert sglang_bootstrap.announce_decoder(addr, 5, 2, 0, "a:1", radix=True)
        assert sglang_bootstrap.announce_decoder(addr, 5, 2, 1, "a:2", radix=True)
        assert sglang_bootstrap.lookup_decoder(addr, 5) is None
        assert sglang_bootstrap.announce_decoder(addr, 5, 2, 1, "a:2", radix=True, decode_prefix_len=8)
        assert sglang_bootstrap.lookup_decoder(addr, 5) == (["a:1", "a:2"], 8)
        assert sglang_bootstrap.announce_decoder(addr, 6, 1, 0, "b:1")  # no radix cache: no wait, prefix 0
        assert sglang_bootstrap.lookup_decoder(addr, 6) == (["b:1"], 0)
        assert not sglang_bootstrap.announce_decoder(addr, 7, 1, 0, "b:1", decode_prefix_len=-1)
    finally:
        boot.close()


@pytest.mark.parametrize("ptp,dtp", [(2, 1), (1, 2)])
def test_decode_radix_prefix_is_not_sent(ptp, dtp):
    """Decode holds the first prefix pages (its radix cache): it sends only
    the pages after them (SGLang's delta indices) with decode_prefix_len;
    prefill stays Bootstrapping until it knows, pops the prefix, sends only
    the pages after it, and decode's prefix pages are never written."""
    from sglang_topo import PAGE_SIZE
    dep = Deployment(P, prefill_tp=(ptp,), decode_tp=dtp, on_demand=True, extra=dict(idle_close_s=0.5),
                     decode_extra=dict(decode_radix_cache=True))
    try:
        base = rest(dep)
        room, prefix_pages, d_idx, p_idx = 401, 2, [11, 12], [5, 6]
        rvs = dep.receivers(0, room)
        snds = [dep.Sender(m, dep.instances[0]["addr"], room, [r], 0) for r, m in enumerate(dep.instances[0]["mgrs"])]
        for _ in range(20):  # links may come up, but no WaitingForInput before decode's metadata
            assert max(s.poll() for s in snds) < 2
            time.sleep(0.01)
        before = [bytes(b) for e in dep.d_eng for b in e.kv]
        for rv in rvs:
            rv.send_metadata(d_idx, 3, None, decode_prefix_len=prefix_pages * PAGE_SIZE)
        dep.until(lambda: min(s.poll() for s in snds) >= 2, "prefill bootstrap after decode's prefix", 60)
        dep.prefill(0, snds, room, 1, p_idx, 3, prefix=prefix_pages * PAGE_SIZE)
        assert dep.run(rvs, snds, 3, room) == (4, 4), why(rvs + snds)
        assert dep.corrupt(room, 1, d_idx) == 0
        after = [bytes(b) for e in dep.d_eng for b in e.kv]
        for e, (b0, b1) in zip([e for e in dep.d_eng for _ in e.kv], zip(before, after)):
            it = e.item
            for page in range(len(b0) // it):
                if page not in d_idx:
                    assert b0[page * it:(page + 1) * it] == b1[page * it:(page + 1) * it], "page %d written" % page
        finish(rvs, snds)
        no_links_left(dep)
        settle(dep, base)
    finally:
        dep.close()


def test_idle_link_holding_the_next_assign_stays_open():
    """Decode exposes a request over the link it still has: prefill's agent
    from the last request, idle, gets the next request's Assign before any
    prefill sender acquires it. Closing that agent for idleness lost the
    Assign (the request failed when decode's lease lapsed): an agent that
    holds a stream stays open, and the request runs over it."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, on_demand=True, extra=dict(idle_close_s=30))
    try:
        deliver(dep, 401, [1, 2], [3, 4], 1, 0)
        rvs = dep.receivers(0, 402)
        for rv in rvs:
            rv.send_metadata([5, 6], 2, None, decode_prefix_len=0)
        assert all(rv.exposed for rv in rvs), "decode did not expose over the link it had"
        mgrs = dep.instances[0]["mgrs"]
        agents = [e[0] for m in mgrs for e in m.links.agents.values()]
        dep.until(lambda: all(a.stats()["Streams"] > 0 for a in agents), "the Assign at the idle agent",
                  show=lambda: dep.describe((), rvs))
        for m in mgrs:
            m.links.idle_close_s = 0.1  # idle long enough now: the senders' sweep would close it
        time.sleep(0.3)
        snds = dep.senders(0, 402)
        assert links(dep) == len(agents), "an agent holding an Assign was closed for idleness"
        dep.prefill(0, snds, 402, 1, [3, 4], 2)
        d, p = dep.run(rvs, snds, 2, 402)
        assert (d, p) == (4, 4), why(rvs + snds)
        finish(rvs, snds)
    finally:
        dep.close()


def _close_race(unsafe):
    """Decode picks the idle link for the next request at the worst moment:
    the sweeper found the agent closable (the handshake agreed, or in the
    known-unsafe variant it held no stream) and is about to close it. The
    hook runs decode's send_metadata there. Returns (exposed in the hook,
    decode's state, prefill's state, why)."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, on_demand=True, extra=dict(idle_close_s=30))
    try:
        deliver(dep, 501, [1, 2], [3, 4], 1, 0)
        links_ = dep.instances[0]["mgrs"][0].links
        links_.handshake = not unsafe
        rvs = dep.receivers(0, 502)
        seen = []

        def hook(where, key):
            if seen:
                return
            for rv in rvs:
                rv.send_metadata([5, 6], 2, None, decode_prefix_len=0)
            seen.append(all(rv.exposed for rv in rvs))
        links_._interleave = hook
        links_.idle_close_s = 0.05
        links_.sweep()
        dep.until(lambda: seen and links_.closed_idle == 1, "the idle agent closed after the hook")
        snds = [dep.Sender(m, dep.instances[0]["addr"], 502, [r], 0) for r, m in enumerate(dep.instances[0]["mgrs"])]
        links_.idle_close_s = 30  # the next link stays while the request runs
        dep.until(lambda: min(s.poll() for s in snds) != 1, "prefill bootstrap", 60)
        dep.prefill(0, snds, 502, 1, [3, 4], 2)
        # decode fails when its lease (5 s) lapses; prefill's sender may wait
        # for an Assign that never comes, so decode's end is what is judged
        dep.until(lambda: dep.decode_state(rvs, 2, 502) in (0, 4), "decode's end", 60,
                  show=lambda: dep.describe(snds, rvs))
        d = dep.decode_state(rvs, 2, 502)
        if d == 4:
            d, p = dep.run(rvs, snds, 2, 502)
            assert dep.corrupt(502, 1, [5, 6]) == 0
        else:
            p = min(s.poll() for s in snds)
        out = seen[0], d, p, why(rvs + snds)
        for x in rvs + snds:
            x.abort() if x.conclude_state is None else None
        finish(rvs, snds)
        return out
    finally:
        dep.close()


def test_idle_close_is_a_handshake_no_assign_is_lost():
    """The sweeper closes the agent right after decode picked the link: with
    the handshake decode had already agreed not to expose requests to the
    closing link, so the request waits for the next link and completes."""
    exposed, d, p, _ = _close_race(unsafe=False)
    assert not exposed, "decode exposed a request to a link its rank agreed to close"
    assert (d, p) == (4, 4)


def test_idle_close_without_handshake_loses_the_assign():
    """Known-unsafe variant: close once no stream is held, without asking
    decode. The request decode exposed between the check and the close
    loses its Assign and fails (the flake of
    test_router_pairs_any_decode_with_any_prefill)."""
    exposed, d, _, reasons = _close_race(unsafe=True)
    assert exposed, "the interleaving did not happen: decode never used the link"
    assert d == 0, "the lost Assign went unnoticed: %s" % reasons


def test_idle_close_keeps_a_link_that_got_an_assign_first():
    """The Assign reaches the agent before the handshake: decode's answer
    follows it on the link, the agent holds a stream, so it stays open
    (resumed) and the request runs over it."""
    dep = Deployment(P, prefill_tp=(1,), decode_tp=1, on_demand=True, extra=dict(idle_close_s=30))
    try:
        deliver(dep, 601, [1, 2], [3, 4], 1, 0)
        links_ = dep.instances[0]["mgrs"][0].links
        rvs = dep.receivers(0, 602)
        for rv in rvs:
            rv.send_metadata([5, 6], 2, None, decode_prefix_len=0)
        assert all(rv.exposed for rv in rvs)
        agent = next(iter(links_.agents.values()))[0]
        dep.until(lambda: agent.stats()["Streams"] > 0, "the Assign at the idle agent")
        assert not agent.quiesce(5.0), "an agent holding an Assign agreed to close"
        for rv in rvs:  # decode was told to carry on: nothing refused
            assert rv.poll() in (2, 3)
        snds = dep.senders(0, 602)
        dep.prefill(0, snds, 602, 1, [3, 4], 2)
        assert dep.run(rvs, snds, 2, 602) == (4, 4), why(rvs + snds)
        assert links_.closed_idle == 0
        finish(rvs, snds)
    finally:
        dep.close()
