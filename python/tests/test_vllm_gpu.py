"""The vLLM connector scenarios of test_vllm_connector.py with every layer's
KV cache in (fake) GPU memory: kvfence's staged mode, in vLLM's call order.

The fake CUDA driver (gpumem/testdata/fakecuda.c, built here with gcc) maps
its device memory PROT_NONE to the host, so any host touch of a cache -
by kvfence or by the test - kills the worker process: the scenarios passing
shows every KV byte moved through the driver (prefill's gather by block
index into pinned host pages, decode's scatter after the hand-off). Every
block is written and checked through the driver (vllm_harness.py with
KVFENCE_TEST_GPU_CACHES=1). The connector file's control arms run here too:
free_on_abort (a load reported while kvfence still holds it, its scatter
landing in the blocks' next owner) must be caught in GPU memory; and so must
unchecked_scatter (a load reported as loaded without asking whether its
scatter ended well) when decode's device copies fault.

kvfence's Go side reads $KVFENCE_CUDA_LIB when the library loads, so the
scenarios run in a child pytest with it pointing at the fake; this file's
parent test only builds the fake and runs the child. Skipped with a reason
when gcc or the fake cannot be built."""
import os
import subprocess
import sys

import pytest

import fakecuda

HERE = os.path.dirname(os.path.abspath(__file__))

if os.environ.get("KVFENCE_GPU_TEST_CHILD") != "1":
    def test_vllm_scenarios_with_caches_in_fake_gpu_memory():
        fakecuda.run_child(__file__, 3000, KVFENCE_TEST_GPU_CACHES="1")
else:
    import numpy as np

    from kvfence import errors
    from kvfence.vllm import layout
    import vllm_harness
    from vllm_harness import DeviceTensor, Instance, make_cache

    # Every scenario of the connector file, now over GPU caches.
    from test_vllm_connector import *  # noqa: F401,F403,E402
    from test_vllm_connector import BS, FAST, abort_decode, check_clean, decode, pair, prefill, settle, stop  # noqa: F811

    CUDA = fakecuda.Cuda(os.environ["KVFENCE_CUDA_LIB"])
    assert vllm_harness.GPU

    def _dev(image):
        return DeviceTensor(CUDA.alloc(image.nbytes), image)

    @pytest.mark.parametrize("kind,heads", [("flash", 4), ("flashinfer", 2), ("mla", 1)])
    def test_staged_layout_of_each_backend(kind, heads):
        """The staged plan's buffers, from shape and strides alone."""
        img = make_cache(kind, False, 6, BS, heads)
        t = _dev(img)
        c = layout.open_caches({"l1": t, "l0": _dev(img)}, kind)
        assert c.device and c.num_blocks == 6 and c.block_size == BS
        ptrs, lens, items, page = c.staged_layout()
        item = img.nbytes // 6 // (2 if kind == "flash" else 1)
        assert len(ptrs) == (4 if kind == "flash" else 2)
        assert set(lens) == {6 * item} and set(items) == {item}
        assert page == {"flash": BS, "flashinfer": 2 * BS, "mla": BS}[kind]
        assert c.shard_bytes(heads) == sum(items)  # a block of every buffer
        if kind == "flash":
            assert ptrs[2:] == [t.ptr, t.ptr + 6 * item]  # sorted by name: l1 after l0; K then V
        if kind != "mla":
            assert c.slice_of(list(range(heads))) == (0, 1)
            assert c.slice_of([heads - 1]) == (heads - 1, heads)

    def test_gpu_caches_refused_where_no_plan_fits():
        img = make_cache("flash", False, 4, BS, 4)
        hnd = np.zeros((2, 4, 4, BS, 8), np.float16).transpose(0, 1, 3, 2, 4)  # HND: heads before tokens
        with pytest.raises(errors.Unimplemented, match="HND"):
            layout.open_caches({"l": DeviceTensor(CUDA.alloc(hnd.nbytes), hnd)})
        with pytest.raises(errors.InvalidArgument, match="host memory, some on a device"):
            layout.open_caches({"a": _dev(img), "b": img})
        sliced = img[:, :3]  # 3 of 4 blocks: K and V no longer adjacent, not packed
        with pytest.raises(errors.InvalidArgument, match="not packed"):
            layout.open_caches({"l": DeviceTensor(CUDA.alloc(img.nbytes), sliced)})
        with pytest.raises(errors.InvalidArgument, match="not device memory"):
            layout.open_caches({"l": DeviceTensor(img.ctypes.data, img)})  # a host pointer calling itself cuda
        with pytest.raises(errors.Unimplemented, match="equal part"):
            layout.open_caches({"l": _dev(img)}).slice_of([1, 2])

    def test_workers_take_the_caches_as_gpu_memory():
        pi, di = pair(1, 2, "flash")
        try:
            assert all(w.staged() for w in pi.workers + di.workers)
        finally:
            stop(di, pi)

    def _pair(monkeypatch, decode_env, arm=None, name="F"):
        """One prefill and one decode instance (TP 1); decode's workers are
        spawned with decode_env (the fake driver's knobs) in their
        environment, prefill's without."""
        if arm:
            monkeypatch.setenv("KVFENCE_TEST_CONTROL_ARM", "1")
        pi = Instance("kv_producer", "prefill-" + name, 1, "flash", False, 2, bs=BS, extra=FAST)
        try:
            for k, v in decode_env.items():
                monkeypatch.setenv(k, v)
            di = Instance("kv_consumer", "decode-" + name, 1, "flash", False, 2, bs=BS,
                          extra=dict(FAST, prefill_tp_size=1, **({"unsafe_control_arm": arm} if arm else {})))
            for k in decode_env:
                monkeypatch.delenv(k)
        except BaseException:
            pi.stop()
            raise
        return pi, di

    def test_abort_after_the_hand_off_and_no_handle_left(monkeypatch):
        """vLLM aborts a request right after decode's hand-off, while its
        device copies crawl (100 ms each): the abort meets the load between
        the hand-off and the scatter (no copy; the slots go back) or with
        the scatter in flight (it ends before the load is reported). Either
        way the blocks' next owner is never written, and the other load is
        whole. At the end no kvfence handle is left in any worker."""
        pi, di = _pair(monkeypatch, {"FAKECUDA_DELAY_US": "100000"}, name="H")
        try:
            params = prefill(pi, "h", 12, 21)
            params2 = prefill(pi, "ok", 8, 22)
            blocks = decode(di, "h", 12, params)
            ok = decode(di, "ok", 8, params2)
            di.run_until(lambda: pi.step() or di.workers[0].handed_off("h"), "the hand-off")
            abort_decode(di, "h", blocks)
            settle(pi, di, ["h", "ok"], ["h", "ok"])
            victim = di.alloc(len(blocks))
            assert victim == blocks
            di.workers[0].fill(victim, 77)
            for _ in range(10):
                di.step()
            assert di.workers[0].corrupt(victim, 77) == 0
            assert di.workers[0].corrupt(ok, 22) == 0 and not di.errors & set(ok)
            check_clean(pi, di)
            for inst in (pi, di):
                assert [w.handles_after_shutdown() for w in inst.workers] == [0] * len(inst.workers)
        finally:
            stop(di, pi)

    def _failed_scatter(arm, monkeypatch):
        """Decode's device copies fault (the fake's events report a device
        fault in decode's workers only): the load must fail for every block."""
        pi, di = _pair(monkeypatch, {"FAKECUDA_EVENT_FAIL": "1"}, arm)
        try:
            params = prefill(pi, "f", 12, 31)
            blocks = decode(di, "f", 12, params)
            settle(pi, di, ["f"], ["f"])
            check_clean(pi, di)
            return set(blocks), di.errors
        finally:
            stop(di, pi)

    def test_failed_scatter_names_every_block(monkeypatch):
        blocks, errs = _failed_scatter(None, monkeypatch)
        assert errs == blocks

    def test_control_arm_unchecked_scatter_is_caught(monkeypatch):
        # The unsafe arm never asks whether its scatter ended well (the
        # receiver's finish still waits for it to end): vLLM would decode
        # from blocks the copy failed to fill.
        blocks, errs = _failed_scatter("unchecked_scatter", monkeypatch)
        assert blocks and not errs

    def test_control_host_copy_of_a_gpu_cache_kills_the_worker():
        """The control arm: the connector's host path (numpy views, as used
        for host caches) over a GPU cache whose tensor claims to be on the
        CPU dies at its first read: so the scenarios above, which pass,
        never copied a block from host code."""
        code = ("import sys; sys.path[:0] = %r; import numpy as np; import vllm_harness as h; "
                "from kvfence.vllm import layout; img = h.make_cache('flash', False, 4, 4, 2); "
                "import fakecuda; t = h.DeviceTensor(fakecuda.Cuda(%r).alloc(img.nbytes), img); t.device.type = 'cpu'; "
                "c = layout.open_caches({'l': t}); assert not c.device; "
                "c.gather(1, [0, 1], np.empty(c.shard_bytes(2), np.uint8)); print('read a GPU block from the host')"
                % ([HERE, os.path.join(fakecuda.ROOT, "python")], os.environ["KVFENCE_CUDA_LIB"]))
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=120)
        assert r.returncode == -11 and "read a GPU block" not in r.stdout, (r.returncode, r.stdout, r.stderr[-500:])
