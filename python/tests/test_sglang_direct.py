"""SGLang's decode in direct mode (gpu_mode "direct", kvfence.sglang_direct)
on the fake CUDA driver: the TCP plugin process writes each request's KV
straight into decode's KV buffers (fake device memory, exported as a
dma-buf) at SGLang's page indices, no scatter; every head of every page
is read back through the driver.

The test plays SGLang's decode scheduler around kvfence's classes
(sglang_topo's order, TP polls MIN-reduced) and its page allocator with
the deferred decode-KV release: a failed request whose receiver says
abort_notified keeps its pages until every TP rank's manager answers
is_abort_release_safe(room, len(bootstrap_infos)); only then may another
request (or a running request's next token) get them.

The known-unsafe variant (the manager says safe at once: pages released
to SGLang at abort) is caught by a late write: while kvfence still holds
an aborted request's pages (the transport may still write them; the
decode plugin process is stopped so the hold cannot end under the test),
the test writes into them through the driver, as a late NIC write would,
after the page's next owner wrote its own bytes there.

Every deployment has SGLang's aux rows (as every real SGLang decode
does) unless a test says otherwise: a request's aux row lands in decode's
host landing pages (direct_host_pages, the pages of its aux_index) and
is copied into SGLang's aux buffers on Success, where the metadata gate
(bootstrap_room in the row) must open and the whole row match prefill's.

Direct mode is refused at start-up where it cannot keep its promise: an
SGLang without the deferred release, or whose deferred release gives up
(SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT) before
kvfence's hold can end, several writers per page with page_size > 1."""
import ctypes
import hashlib
import os
import signal

import pytest

import fakecuda

CHILD = os.environ.get("KVFENCE_GPU_TEST_CHILD") == "1"

if not CHILD:
    def test_sglang_direct_mode_on_the_fake_driver():
        fakecuda.run_child(__file__, 1200)
else:
    from kvfence import errors, staging
    from kvfence.sglang import KVFenceBackendProvider, KVFenceKVManager, KVFenceKVReceiver, _released_or_closed
    import sglang_topo

    P = KVFenceBackendProvider()
    CUDA = fakecuda.Cuda(os.environ["KVFENCE_CUDA_LIB"])
    # 128 pages: every buffer's pages x page bytes a multiple of the host
    # page (the dma-buf export's rule) at decode TP 1 and 2.
    sglang_topo.PAGES = PAGES = 128

    class DevEngine(sglang_topo.Engine):
        """KV buffers in fake device memory (self.kv is the host image,
        moved only through the driver); aux rows in host memory, as SGLang
        keeps them."""

        def __init__(self, heads, first_head, aux_items):
            super().__init__(heads, first_head, aux_items)
            self.dev = [CUDA.alloc(len(b)) for b in self.kv]
            self.sync(up=True)

        def sync(self, up):
            for d, b in zip(self.dev, self.kv):
                (CUDA.upload(d, b) if up else CUDA.download(b, d))

        def kv_args(self, cls, rank, dp=0):
            a = super().kv_args(cls, rank, dp)
            a.kv_data_ptrs = list(self.dev)
            return a

        def fill(self, *a, **kw):
            self.sync(up=False)
            super().fill(*a, **kw)
            self.sync(up=True)

        def corrupt_heads(self, *a, **kw):
            self.sync(up=False)
            return super().corrupt_heads(*a, **kw)

        def stamp(self, pages, byte):
            """A page's next owner (another request, a running request's
            tokens) writes its bytes there."""
            for d in self.dev:
                for p in pages:
                    CUDA.upload(d + p * self.item, (ctypes.c_char * self.item)(*([byte] * self.item)))

        def stamped(self, pages, byte):
            """Pages of pages whose owner's bytes were overwritten."""
            bad = set()
            for d in self.dev:
                for p in pages:
                    got = (ctypes.c_char * self.item)()
                    CUDA.download(got, d + p * self.item)
                    if bytes(got) != bytes([byte]) * self.item:
                        bad.add(p)
            return sorted(bad)

    def _children():
        pids = set()
        for t in os.listdir("/proc/self/task"):
            try:
                with open("/proc/self/task/%s/children" % t) as f:
                    pids.update(int(x) for x in f.read().split())
            except FileNotFoundError:  # a thread that just ended
                pass
        return pids

    class DirectDeployment(sglang_topo.Deployment):
        """sglang_topo's deployment with decode in direct mode; remembers
        decode's plugin processes; with aux rows (aux_items, default as
        sglang_topo's) SGLang's metadata gate, without them none."""

        def __init__(self, prefill_tp=1, decode_tp=1, aux_items=(16, 8), engine=None, decode=None, plugin_env=None,
                     **kw):
            extra = dict(gpu_mode="direct", decode=dict(lease_ms=5000, max_hold_ms=60000) if decode is None else decode)
            if plugin_env:
                extra["plugin_env"] = plugin_env
            self.aux_items = aux_items
            super().__init__(P, prefill_tp=(prefill_tp,), decode_tp=decode_tp, aux_items=aux_items, extra=extra,
                             engine=engine or DevEngine, **kw)
            self.free = list(range(1, PAGES))  # SGLang's allocator; page 0 is its padding page
            self.deferred = []  # (room, receivers, pages): SGLang's deferred releases

        def _decode_instance(self, cfg, aux_items):
            before = _children()
            out = super()._decode_instance(cfg, aux_items)
            self.decode_plugins = sorted(_children() - before)
            return out

        def decode_state(self, rvs, aux_index, room):
            if self.aux_items:
                return super().decode_state(rvs, aux_index, room)
            return sglang_topo._min(rv.poll() for rv in rvs)

        def aux_landed(self, aux_index):
            """Every decode rank's aux row at aux_index is prefill's."""
            want = self.instances[0]["engs"][0].aux_row(aux_index)
            return all(e.aux_row(aux_index) == want for e in self.d_eng)

        def alloc(self, n):
            pages, self.free = self.free[:n], self.free[n:]
            assert len(pages) == n, "SGLang's pool is empty: pages leaked"
            return pages

        def release(self, room, rvs, pages):
            """pop_transferred on a failed request: deferred while a rank's
            receiver says abort_notified, else freed at once."""
            if any(rv.abort_notified for rv in rvs):
                self.deferred.append((room, rvs, pages))
            else:
                self.free += pages
            self.resolve()

        def resolve(self):
            """resolve_deferred_releases: a hold ends once every TP rank's
            manager says its room is safe."""
            keep = []
            for room, rvs, pages in self.deferred:
                if all(rv.mgr.is_abort_release_safe(room, len(rv.bootstrap_infos)) for rv in rvs):
                    self.free += pages
                else:
                    keep.append((room, rvs, pages))
            self.deferred = keep

        def settle(self, handles, timeout=120):
            self.until(lambda: (self.resolve(), not self.deferred)[1], "SGLang's deferred releases", timeout,
                       show=self.describe)
            self.until(lambda: not self.held() and not self.slots_in_use(), "holds released and pages back",
                       timeout, show=self.describe)
            assert sorted(self.free) == list(range(1, PAGES)), "SGLang pages lost"
            assert staging.handles_live() == handles

    def _finish(xs):
        for x in xs:
            x.clear()

    def _good_request(dep, room, n=3, aux_index=0):
        pages = dep.alloc(n)
        rvs, snds, d, p = dep.request(room, n, pages, [5, 6, 7][:n], aux_index=aux_index)
        assert (d, p) == (4, 4), (d, p)
        assert dep.corrupt(room, 1, pages) == 0, "a head landed wrong in SGLang's pages"
        assert not dep.aux_items or dep.aux_landed(aux_index), "the aux row is not prefill's"
        _finish(rvs + snds)
        dep.free += pages  # the request ran and finished: SGLang frees its pages
        return pages

    @pytest.mark.parametrize("aux", [(16, 8), ()], ids=["aux", "no_aux"])
    @pytest.mark.parametrize("ptp,dtp,on_demand", [(1, 1, False), (2, 2, False), (1, 2, False), (2, 2, True)])
    def test_direct_pages_land_in_sglangs_buffers(ptp, dtp, on_demand, aux):
        """Decode TP 1 and 2 (static pairing, and M:N where decode sizes
        itself from the prefill instance): every head of every page where
        SGLang said, read back through the driver; with aux rows, each row
        (at its own aux_index, so in its own landing pages) is prefill's
        and opened SGLang's metadata gate; nothing lent at the end."""
        dep = DirectDeployment(ptp, dtp, aux_items=aux, on_demand=on_demand)
        try:
            assert all(m.direct for m in dep.dec)
            _good_request(dep, 700)  # M:N: decode's agents are made for the first request
            assert [bool(m.extra_pages) for m in dep.dec] == [bool(aux)] * dtp  # landing pages only with aux rows
            base = staging.handles_live()
            for i in range(1, 6):
                _good_request(dep, 700 + i, n=1 + i % 3, aux_index=i % sglang_topo.AUX_ROWS)
            dep.settle(base)
        finally:
            dep.close()

    class StateDevEngine(DevEngine):
        """DevEngine with a Mamba-like state buffer pair in host memory
        (older SGLang's flat KVArgs form: one state_type)."""
        STATE_ITEMS = (40, 24)

        def __init__(self, heads, first_head, aux_items):
            super().__init__(heads, first_head, aux_items)
            self.state = [(ctypes.c_char * (4 * n))() for n in self.STATE_ITEMS]

        def kv_args(self, cls, rank, dp=0):
            a = super().kv_args(cls, rank, dp)
            a.state_type = "mamba"
            a.state_data_ptrs = [ctypes.addressof(b) for b in self.state]
            a.state_data_lens = [len(b) for b in self.state]
            a.state_item_lens = list(self.STATE_ITEMS)
            return a

        def set_state(self, slot, room):
            for i, (b, n) in enumerate(zip(self.state, self.STATE_ITEMS)):
                b[slot * n:(slot + 1) * n] = hashlib.shake_128(b"state/%d/%d" % (room, i)).digest(n)

        def state_row(self, slot):
            return b"".join(bytes(b[slot * n:(slot + 1) * n]) for b, n in zip(self.state, self.STATE_ITEMS))

    def test_direct_state_row_lands_with_the_aux_row():
        """A model with a Mamba state row: the request's KV lands in
        SGLang's pages, its aux row and state row in decode's host landing
        pages, copied into SGLang's aux and state buffers on Success."""
        dep = DirectDeployment(1, 1, engine=StateDevEngine)
        try:
            assert all(m.state_pages for m in dep.dec)
            base = staging.handles_live()
            for k, (aux, dslot, pslot) in enumerate([(3, 2, 1), (5, 0, 3)]):
                room, pages = 860 + k, dep.alloc(2)
                rvs = dep.receivers(0, room)
                for rv in rvs:
                    rv.send_metadata(pages, aux, [dslot], decode_prefix_len=0)
                snds = dep.senders(0, room)
                for s, e in zip(snds, dep.instances[0]["engs"]):
                    s.init(2, aux)
                    e.fill(room, 1, [3, 4], False)
                    e.set_aux(aux, room, 1)
                    e.set_state(pslot, room)
                    s.send([3], None)
                    s.send([4], [pslot])
                assert dep.run(rvs, snds, aux, room) == (4, 4)
                assert dep.corrupt(room, 1, pages) == 0, "a head landed wrong in SGLang's pages"
                assert dep.aux_landed(aux), "the aux row is not prefill's"
                want = dep.instances[0]["engs"][0].state_row(pslot)
                assert all(e.state_row(dslot) == want for e in dep.d_eng), "the state row is not prefill's"
                _finish(rvs + snds)
                dep.free += pages
            dep.settle(base)
        finally:
            dep.close()

    def _abort_at(dep, where, room):
        """One request aborted at where (docs/sglang.md's abort points; at
        "exposed" it is left exposed with one page sent, not aborted);
        returns (receivers, senders, pages). Each room has its own aux_index
        (room % AUX_ROWS), as SGLang's metadata slots: a held request keeps
        its slot, so its aux landing page is not asked for again."""
        pages, aux = dep.alloc(2), room % sglang_topo.AUX_ROWS
        rvs = [dep.Receiver(m, dep.instances[0]["addr"], room) for m in dep.dec]
        snds = []
        if where == "before_init":
            for rv in rvs:
                rv.abort()
            return rvs, snds, pages
        for rv in rvs:
            rv.init(0)
        dep.until(lambda: min(rv.poll() for rv in rvs) >= 2, "handshake")
        if where == "prealloc":
            for rv in rvs:
                rv.abort()
                rv.send_metadata(pages, aux, None, decode_prefix_len=0)  # never exposed
            return rvs, snds, pages
        for rv in rvs:
            rv.send_metadata(pages, aux, None, decode_prefix_len=0)
        snds = dep.senders(0, room)
        if where == "after_metadata":
            for rv in rvs:
                rv.abort()
        for s in snds:
            s.init(2, aux)
        if where in ("mid_transfer", "after_handoff", "exposed"):
            for s, e in zip(snds, dep.instances[0]["engs"]):
                e.fill(room, 1, [3, 4], False)
                s.send([3], None)
        if where == "exposed":  # its first page landed: the transport holds keys over the pages
            dep.until(lambda: dep.corrupt(room, 1, pages[:1]) == 0, "the first page lands")
        if where == "after_handoff":
            for s in snds:
                s.send([4], [])
            dep.until(lambda: all(rv.rv.poll() == 4 for rv in rvs), "kvfence hands off")
        if where in ("mid_transfer", "after_handoff"):
            for rv in rvs:
                rv.abort()
        if where == "prefill_side":
            for s in snds:
                s.abort()
            dep.until(lambda: min(rv.poll() for rv in rvs) == 0, "decode learns of prefill's abort")
        return rvs, snds, pages

    @pytest.mark.parametrize("dtp", [1, 2])
    @pytest.mark.parametrize("where", ["before_init", "prealloc", "after_metadata", "mid_transfer", "after_handoff",
                                       "prefill_side"])
    def test_direct_abort_points_hold_sglangs_pages(where, dtp):
        """Each abort point: the request fails; SGLang keeps its pages
        (abort_notified) exactly when kvfence exposed them, until every
        rank says safe; then the same pages carry a good request."""
        dep = DirectDeployment(dtp, dtp)
        try:
            base = staging.handles_live()
            rvs, snds, pages = _abort_at(dep, where, 800)
            assert min(rv.poll() for rv in rvs) == 0
            for rv in rvs:
                with pytest.raises(errors.KVFenceError):
                    rv.failure_exception()
            exposed = where not in ("before_init", "prealloc")
            assert [rv.abort_notified for rv in rvs] == [exposed] * dtp
            assert all(len(rv.bootstrap_infos) == (1 if exposed else 0) for rv in rvs)
            dep.release(800, rvs, pages)
            for room, held_rvs, _ in dep.deferred:  # held by SGLang only while kvfence holds
                assert not all(rv.mgr.is_abort_release_safe(room, 1) for rv in held_rvs)
            _finish(rvs + snds)
            dep.settle(base)
            dep.free = pages + [p for p in dep.free if p not in pages]  # the next request gets them
            assert _good_request(dep, 801, n=2) == pages
            dep.settle(base)
        finally:
            dep.close()

    def test_a_page_kvfence_still_holds_fails_the_request():
        """An SGLang that handed out a page kvfence still holds (what the
        deferred release prevents): the new request fails
        FailedPrecondition and nothing is exposed over the page."""
        dep = DirectDeployment(1, 1)
        try:
            base = staging.handles_live()
            rvs, snds, pages = _abort_at(dep, "exposed", 820)
            _stopped(dep.decode_plugins)  # the hold cannot end meanwhile
            try:
                for rv in rvs:
                    rv.abort()
                again = dep.receivers(0, 821)
                again[0].send_metadata(pages, 0, None, decode_prefix_len=0)
                dep.until(lambda: again[0].poll() == 0, "the request over a held page fails")
                with pytest.raises(errors.FailedPrecondition, match="still lent"):
                    again[0].failure_exception()
                assert not again[0].abort_notified, "a request never exposed made SGLang hold its pages"
                # Free KV pages, but the held request's aux_index: its
                # landing page is still lent, so no second writer either.
                fresh = dep.alloc(2)
                aux_again = dep.receivers(0, 822)
                aux_again[0].send_metadata(fresh, 820 % sglang_topo.AUX_ROWS, None, decode_prefix_len=0)
                dep.until(lambda: aux_again[0].poll() == 0, "the request over a held aux landing page fails")
                with pytest.raises(errors.FailedPrecondition, match="still lent"):
                    aux_again[0].failure_exception()
                dep.free += fresh
            finally:
                for pid in dep.decode_plugins:
                    os.kill(pid, signal.SIGCONT)
            dep.release(820, rvs, pages)
            _finish(rvs + snds + again + aux_again)
            dep.settle(base)
        finally:
            dep.close()

    def _stopped(pids):
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

    def _late_write_run(dep, rounds=4):
        """Aborts exposed requests (one page sent) with decode's plugin
        stopped, lets SGLang release and reuse what it may, and writes late
        into every aborted page while kvfence still holds it. Returns (the
        pages whose next owner's bytes were overwritten, how many rounds
        wrote late): a round whose hold had ended already (kvfence then
        proved no write can land) writes nothing."""
        clobbered, late = [], 0
        for k in range(rounds):
            room = 900 + k
            rvs, snds, pages = _abort_at(dep, "exposed", room)
            _stopped(dep.decode_plugins)
            try:
                for rv in rvs:
                    rv.abort()
                dep.release(room, rvs, pages)
                reused = [p for p in pages if p in dep.free]
                for e in dep.d_eng:
                    e.stamp(reused, 0x5A)  # the next owner
                if not all(_released_or_closed(rv.rv) for rv in rvs if rv.rv is not None):
                    late += 1
                    for e in dep.d_eng:
                        e.stamp(pages, 0xEE)  # the late write, while kvfence holds the pages
                clobbered += [p for e in dep.d_eng for p in e.stamped(reused, 0x5A)]
            finally:
                for pid in dep.decode_plugins:
                    os.kill(pid, signal.SIGCONT)
            _finish(rvs + snds)
        return clobbered, late

    def test_late_write_never_reaches_a_page_sglang_reused():
        dep = DirectDeployment(1, 1)
        try:
            base = staging.handles_live()
            assert dep.decode_plugins, "decode's plugin process not found"
            clobbered, late = _late_write_run(dep)
            assert late, "no round wrote late: the test showed nothing"
            assert clobbered == [], "a late write reached pages SGLang had given to another owner"
            dep.settle(base)
        finally:
            dep.close()

    @pytest.mark.parametrize("variant", ["safe_at_once", "not_notified"])
    def test_control_pages_released_to_sglang_at_abort_are_caught(monkeypatch, variant):
        """The known-unsafe variants of pages released to SGLang at abort:
        the manager says safe at once, or the receiver does not ask SGLang
        to hold (abort_notified false: SGLang frees at once)."""
        if variant == "safe_at_once":
            monkeypatch.setattr(KVFenceKVManager, "is_abort_release_safe", lambda self, room, required_acks=None: True)
        else:
            monkeypatch.setattr(KVFenceKVReceiver, "abort_notified", False)
        dep = DirectDeployment(1, 1)
        try:
            clobbered, late = _late_write_run(dep)
            assert clobbered, "control arm not caught: no late write reached a page SGLang had reused (%d late)" % late
            print("control arm caught: %d reused pages overwritten by %d late writes" % (len(clobbered), late))
        finally:
            monkeypatch.undo()
            dep.close()

    def test_direct_refusals_at_start_up():
        """Unimplemented, with the reason, before anything is opened."""
        try:
            with pytest.raises(errors.Unimplemented, match="page_size 1"):
                DirectDeployment(2, 1)  # two writers per page, page_size 2: their heads are strided
            # SGLang frees a deferred request's pages after its own timeout:
            # shorter than kvfence's hold (max_hold_ms 60000 here, + the
            # writers' tail + clock margin), refused.
            os.environ["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"] = "10"
            with pytest.raises(errors.Unimplemented, match="KV_RELEASE_TIMEOUT=10s"):
                DirectDeployment(1, 1)
            # SGLang's default 30 s with the hold keys unset: direct mode
            # fits them (max_declared_tail_ms 5000, max_hold_ms 24900), and
            # the library refuses decode's own transport declaring a longer
            # tail (the TCP plugin's default: 11 s) ...
            os.environ["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"] = "30"
            with pytest.raises(errors.InvalidArgument, match="max_declared_tail_ms 5000"):
                DirectDeployment(1, 1, decode={})
            # ... and runs where every transport's tail fits (TCP: 1 s TTL + 1 s)
            dep = DirectDeployment(1, 1, decode={}, plugin_env=["KVFENCE_TCP_WRITE_TTL=1s"])
            try:
                base = staging.handles_live()
                _good_request(dep, 801)
                dep.settle(base)
            finally:
                dep.close()
            os.environ.pop("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT")
            os.environ["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] = "false"
            with pytest.raises(errors.Unimplemented, match="deferred decode-KV release"):
                DirectDeployment(1, 1)
        finally:
            os.environ.pop("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", None)
            os.environ.pop("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", None)
            os.environ.pop("KVFENCE_SGLANG_CONFIG", None)  # the refused deployment's

    def test_mn_decode_refuses_an_instance_it_cannot_take_direct():
        """M:N: decode sizes itself from the first prefill instance; two
        prefill ranks per decode rank at page_size 2 fail that instance's
        requests Unimplemented (the engine keeps running)."""
        dep = DirectDeployment(2, 1, on_demand=True)
        try:
            rvs = [dep.Receiver(m, dep.instances[0]["addr"], 830) for m in dep.dec]
            for rv in rvs:
                rv.init(0)
            dep.until(lambda: min(rv.poll() for rv in rvs) == 0, "the instance's request fails")
            assert not any(rv.abort_notified for rv in rvs)  # nothing exposed: SGLang frees at once
            with pytest.raises(errors.Unimplemented, match="page_size 1"):
                rvs[0].failure_exception()
            _finish(rvs)
        finally:
            dep.close()
