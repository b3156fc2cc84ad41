"""vLLM's side of the connector tests, imitated: every scheduler connector
and every worker connector lives in its own process (as in vLLM: the
engine core's scheduler, one worker per TP rank), and the test drives them
in vLLM's call order (scheduler.py / kv_connector_model_runner_mixin.py at
vLLM 9aaf83ef), over pipes carrying pickled metadata as vLLM's do.

Host caches are numpy arrays in vLLM's logical shapes; HND caches are
permuted views of an HND buffer, as gpu_model_runner builds them. Cell
contents are a pure function of (request tag, layer, kv, global head,
token position), so decode checks every byte it received against what
prefill computed, without using the connector's own layout code.

With KVFENCE_TEST_GPU_CACHES=1 (test_vllm_gpu.py) every layer lives in the
fake CUDA driver's device memory ($KVFENCE_CUDA_LIB), which the host cannot
read: the connector gets tensors that carry only a device pointer, shape and
strides, and the test moves its host image of them through the driver. HND
is then NHD (kvfence refuses HND caches in GPU memory).
"""
import multiprocessing
import os
import sys
import threading
import time
import traceback
from types import SimpleNamespace

import numpy as np

LAYERS, HEAD, DT = 2, 8, np.float16  # head_size 8 x 2 bytes
GPU = os.environ.get("KVFENCE_TEST_GPU_CACHES") == "1"


class DeviceTensor:
    """What the connector sees of a CUDA tensor: a device pointer and the
    metadata (shape, strides in elements, element size) of its host image."""

    def __init__(self, ptr, image):
        self.ptr, self.shape = ptr, tuple(image.shape)
        self._stride = tuple(x // image.itemsize for x in image.strides)
        self._es = image.itemsize
        self.device = SimpleNamespace(type="cuda", index=0)

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self._stride

    def element_size(self):
        return self._es


def block_regions(t, kind, b):
    """The contiguous pieces of t (an NHD host image) holding block b."""
    return [t[0, b], t[1, b]] if kind == "flash" else [t[b]]


def _cfg(role, engine_id, tp, block_size, extra):
    kt = SimpleNamespace(kv_role=role, engine_id=engine_id, kv_connector="KVFenceConnector",
                         kv_connector_module_path="kvfence.vllm", kv_connector_extra_config=dict(extra))
    return SimpleNamespace(kv_transfer_config=kt, parallel_config=SimpleNamespace(tensor_parallel_size=tp),
                           cache_config=SimpleNamespace(block_size=block_size), model_config=None,
                           scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=True))


def make_cache(kind, hnd, blocks, bs, heads):
    """One layer's cache in vLLM's logical shape (HND: a permuted view)."""
    hnd = hnd and not GPU
    if kind == "mla":
        return np.zeros((blocks, bs, 4 * HEAD), DT)
    if kind == "flash":
        if hnd:
            return np.zeros((2, blocks, heads, bs, HEAD), DT).transpose(0, 1, 3, 2, 4)
        return np.zeros((2, blocks, bs, heads, HEAD), DT)
    if hnd:
        return np.zeros((blocks, 2, heads, bs, HEAD), DT).transpose(0, 1, 3, 2, 4)
    return np.zeros((blocks, 2, bs, heads, HEAD), DT)


def cell(t, kind, b, kv, tok, h):
    """The bytes of one (block, kv, token, local head) cell, by vLLM's
    logical indexing (independent of kvfence.vllm.layout)."""
    if kind == "mla":
        x = t[b, tok]
    elif kind == "flash":
        x = t[kv, b, tok, h]
    else:
        x = t[b, kv, tok, h]
    return x.view(np.uint8)


def pattern(tag, layer, kv, g, pos, n):
    base = (tag * 131 + layer * 31 + kv * 17 + g * 7 + pos * 3) % 251
    return ((np.arange(n, dtype=np.int64) + base) % 251).astype(np.uint8)


class Worker:
    """A worker process's connector over its own host caches."""

    def __init__(self, role, engine_id, tp, tp_rank, total_heads, kind, hnd, blocks, bs, extra):
        from kvfence.vllm import KVFenceConnector
        from kvfence.vllm._base import KVConnectorRole
        self.kind, self.bs, self.tp, self.rank, self.total = kind, bs, tp, tp_rank, total_heads
        self.heads = 1 if kind == "mla" else max(total_heads // tp, 1)
        self.caches = {"layer.%d" % i: make_cache(kind, hnd, blocks, bs, self.heads) for i in range(LAYERS)}
        self.dev = self.cuda = None
        if GPU:
            from fakecuda import Cuda
            self.cuda = Cuda(os.environ["KVFENCE_CUDA_LIB"])
            self.dev = {n: DeviceTensor(self.cuda.alloc(t.nbytes), t) for n, t in self.caches.items()}
            self._upload(range(blocks))
        x = dict(extra, tp_rank=tp_rank, num_kv_heads=total_heads, kv_layout=kind)
        self.c = KVFenceConnector(_cfg(role, engine_id, tp, bs, x), KVConnectorRole.WORKER,
                                  SimpleNamespace(kv_cache_groups=[0]))
        self.c.register_kv_caches(self.dev or self.caches)

    def _upload(self, blocks):
        """Writes blocks (only those: kvfence may be copying into others)
        of the host image to device memory."""
        for n, t in self.caches.items():
            for b in blocks:
                for piece in block_regions(t, self.kind, b):
                    self.cuda.upload(self.dev[n].ptr + piece.ctypes.data - t.ctypes.data, piece)

    def _download(self):
        for n, t in self.caches.items():
            self.cuda.download(t, self.dev[n].ptr)

    def handed_off(self, req_id):
        """Whether req_id's load got past its hand-off (its copy into the
        blocks may be running)."""
        from kvfence import api, errors
        ld = self.c.worker.loads.get(req_id)
        if ld is None or ld.done:
            return ld is not None
        try:
            return ld.rv is not None and ld.rv.poll() == api.KVPoll.Success
        except errors.KVFenceError:  # closed meanwhile: past it
            return True

    def staged(self):
        """Whether the connector took the caches as GPU memory (staged)."""
        return self.c.worker.staged is not None

    def handles_after_shutdown(self):
        """Open kvfence handles of this process once the connector shut down."""
        from kvfence import staging
        self.c.shutdown()
        return staging.handles_live()

    def global_heads(self):
        if self.kind == "mla":
            return [0]
        from kvfence.vllm.layout import heads_of
        return heads_of(self.rank, self.tp, self.total)

    def handshake(self):
        return {self.rank: self.c.get_handshake_metadata()}

    def fill(self, blocks, tag, first_pos=0):
        """The model computes tag's tokens into blocks (first_pos on)."""
        for layer, t in enumerate(self.caches.values()):
            for i, b in enumerate(blocks):
                for kv in (range(1) if self.kind == "mla" else range(2)):
                    for h, g in enumerate(self.global_heads()):
                        for tok in range(self.bs):
                            c = cell(t, self.kind, b, kv, tok, h)
                            c[...] = pattern(tag, layer, kv, g, first_pos + i * self.bs + tok, c.size)
        if self.dev is not None:
            self._upload(blocks)

    def corrupt(self, blocks, tag, first_pos=0):
        """How many cells of blocks differ from tag's data."""
        if self.dev is not None:
            self._download()
        bad = 0
        for layer, t in enumerate(self.caches.values()):
            for i, b in enumerate(blocks):
                for kv in (range(1) if self.kind == "mla" else range(2)):
                    for h, g in enumerate(self.global_heads()):
                        for tok in range(self.bs):
                            c = cell(t, self.kind, b, kv, tok, h)
                            bad += not np.array_equal(c, pattern(tag, layer, kv, g, first_pos + i * self.bs + tok, c.size))
        return bad

    def step(self, meta, finished_req_ids):
        """One forward pass's connector calls, in the mixin's order."""
        c = self.c
        c.bind_connector_metadata(meta)
        c.start_load_kv(None)
        for name in self.caches:
            c.wait_for_layer_load(name)
            c.save_kv_layer(name, (self.dev or self.caches)[name], None)
        c.wait_for_save()
        sending, recving = c.get_finished(set(finished_req_ids))
        errs = c.get_block_ids_with_load_errors()
        c.clear_connector_metadata()
        return sorted(sending or ()), sorted(recving or ()), sorted(errs)

    def base_classes(self):
        from kvfence.vllm import HAVE_VLLM
        return HAVE_VLLM, [c.__module__ + "." + c.__name__ for c in type(self.c).__mro__]

    def threads(self):
        return sum(t.name.startswith("kvfence-load") or t.name.startswith("kvfence-send") for t in threading.enumerate())

    def unreleased_reports(self):
        return self.c.worker.reported_unreleased

    def live_agents(self):
        return self.c.worker.live_agents()

    def agents_opened(self):
        return self.c.worker.agents_opened

    def exposed(self):
        return sum(ld.rv is not None for ld in list(self.c.worker.loads.values()))

    def live_handles(self):
        w = self.c.worker
        return dict(loads=len(w.loads), out=len(w.out))

    def shutdown(self):
        self.c.shutdown()


class Scheduler:
    """A scheduler process's connector; requests live here as vLLM's do."""

    def __init__(self, role, engine_id, tp, bs, extra):
        from kvfence.vllm import KVFenceConnector
        from kvfence.vllm._base import KVConnectorRole
        self.c = KVFenceConnector(_cfg(role, engine_id, tp, bs, extra), KVConnectorRole.SCHEDULER,
                                  SimpleNamespace(kv_cache_groups=[0]))
        self.reqs = {}

    def add(self, req_id, n_tokens, params):
        self.reqs[req_id] = SimpleNamespace(request_id=req_id, prompt_token_ids=list(range(n_tokens)),
                                            kv_transfer_params=dict(params or {}), status=SimpleNamespace(name="WAITING"))

    def set_peers(self, md):
        self.c.set_xfer_handshake_metadata(md)

    def matched(self, req_id, computed):
        return self.c.get_num_new_matched_tokens(self.reqs[req_id], computed)

    def after_alloc(self, req_id, blocks, n_ext, hashed=0):
        blk = [SimpleNamespace(block_id=b, block_hash=("h" if i < hashed else None)) for i, b in enumerate(blocks)]
        kb = SimpleNamespace(blocks=(blk,), get_unhashed_block_ids=lambda: [x.block_id for x in blk if x.block_hash is None])
        self.c.update_state_after_alloc(self.reqs[req_id], kb, n_ext)

    def meta(self):
        return self.c.build_connector_meta(None)

    def finished(self, req_id, blocks, status):
        r = self.reqs.pop(req_id)
        r.status = SimpleNamespace(name=status)
        return self.c.request_finished_all_groups(r, (list(blocks),))


def _serve(conn, cls, kwargs):
    try:
        if os.environ.get("KVFENCE_TEST_REAL_BASE") == "1":
            import vllm_stubs  # vLLM's own base class and factory, from $VLLM_SRC
            vllm_stubs.install()
        obj = cls(**kwargs)
        conn.send(("ok", os.getpid()))
    except BaseException as e:
        conn.send(("err", "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
        return
    while True:
        try:
            name, args = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", getattr(obj, name)(*args)))
        except BaseException as e:
            conn.send(("err", "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
        if name == "shutdown":
            return


class Remote:
    """An object in its own process; calls go over a pipe."""

    def __init__(self, cls, **kwargs):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.p = ctx.Process(target=_serve, args=(child, cls, kwargs), daemon=True)
        self.p.start()
        self.pid = self._answer(120)

    def _answer(self, timeout):
        if not self.conn.poll(timeout):
            raise TimeoutError("no answer in %ds" % timeout)
        st, v = self.conn.recv()
        if st == "err":
            raise RuntimeError(v)
        return v

    def __getattr__(self, name):
        def call(*args, timeout=120):
            self.conn.send((name, args))
            return self._answer(timeout)
        return call

    def kill(self):
        self.p.kill()
        self.p.join(10)

    def stop(self):
        if self.p.is_alive():
            try:
                self.shutdown(timeout=60)
            except Exception:
                pass
            self.p.join(10)
            if self.p.is_alive():
                self.p.kill()


class Instance:
    """One vLLM instance: its scheduler process, its workers, its block pool,
    and the scheduler's rules (scheduler.py) for when blocks come back."""

    def __init__(self, role, engine_id, tp, kind, hnd, total_heads, blocks=64, bs=4, extra=None):
        self.role, self.engine_id, self.tp, self.bs = role, engine_id, tp, bs
        self.kind = kind
        self.sched = Remote(Scheduler, role=role, engine_id=engine_id, tp=tp, bs=bs, extra=extra or {})
        self.workers = [Remote(Worker, role=role, engine_id=engine_id, tp=tp, tp_rank=r, total_heads=total_heads, kind=kind,
                               hnd=hnd, blocks=blocks, bs=bs, extra=extra or {}) for r in range(tp)]
        md = {}
        for w in self.workers:
            md.update(w.handshake())
        if role == "kv_producer":
            self.sched.set_peers(md)
        self.free = list(range(blocks))
        self.finished_ids = set()
        self.pending = {}  # req_id -> set of workers that have not reported yet
        self.errors = set()
        self.held = {}  # req_id -> blocks held past finish (delay_free_blocks)
        self.done = {}  # req_id -> "sent"/"recved"
        self.dead = set()  # killed workers: vLLM's executor would be gone; the test steps the rest

    def kill_worker(self, k):
        self.workers[k].kill()
        self.workers[k].stop = lambda: None
        self.dead.add(k)

    def alloc(self, n):
        assert len(self.free) >= n, "pool empty"
        got, self.free = self.free[:n], self.free[n:]
        return got

    def release(self, blocks):
        self.free = list(blocks) + self.free  # freed blocks are reused first, as vLLM's LRU free queue does

    def step(self):
        meta = self.sched.meta()
        ids, self.finished_ids = self.finished_ids, set()
        live = [k for k in range(self.tp) if k not in self.dead]
        outs = {k: self.workers[k].step(meta, ids) for k in live}
        for k, (sending, recving, errs) in outs.items():
            self.errors |= set(errs)
            for rid in list(sending) + list(recving):
                left = self.pending.setdefault(rid, set(live))
                left.discard(k)
                if not left:
                    del self.pending[rid]
                    self.done[rid] = True
                    if rid in self.held:
                        self.release(self.held.pop(rid))

    def run_until(self, pred, what, limit_s=120):
        end = time.monotonic() + limit_s
        while not pred():
            if time.monotonic() > end:
                raise AssertionError("timed out waiting for %s" % what)
            self.step()
            time.sleep(0.01)

    def stop(self):
        for r in self.workers + [self.sched]:
            r.stop()


def tokens_blocks(n, bs):
    return -(-n // bs)


if __name__ == "__main__":
    sys.exit("imported by test_vllm_connector.py")
