"""The staging gather through the C ABI against a plain copy of the same
bytes (issue 20: gather >= 0.8 of plain memcpy). One 512-token
Llama-3-8B-shaped request (32 layers x K,V = 64 buffers, 2 KiB per token:
64 MiB) is copied from the engine's KV pool into a kvfence sender's source
pages with staging.gather (queued, copied on a Go thread buffer by buffer
in 256 KiB steps, each checked against the request's pages; timed until gather_wait says
done), and, interleaved in the same run, as one ctypes.memmove of 64 MiB
between two host buffers. Arms: page size 1 with the pages at random pool
indices and at consecutive ones, and page sizes 16 and 64 at random
indices.
Prints plain-copy time / gather time, wall and process CPU (the
latter is what a loaded machine cannot hide), as median [min-max] over
the repetitions (1 = as fast as the plain copy). The bytes staged are checked by the
scenario tests, not here.

  PYTHONPATH=python:python/tests KVFENCE_LIB=bin/libkvfence.so \\
    KVFENCE_PLUGIN=bin/kvfence-plugin-tcp python3 python/tests/bench_sglang_gather.py
"""
import ctypes
import json
import os
import random
import statistics
import sys
import time

from kvfence import staging
from kvfence.sglang import KVFenceBackendProvider, KVFenceBootstrapServer

BUFS, TOKEN_BYTES, TOKENS, REPS = 64, 2048, 512, 15


class Aligned:
    """n bytes at a 64-byte aligned address (addr), as torch allocates a
    tensor; ctypes' own arrays start 16 bytes past a page here, which makes
    every 2 KiB item straddle one more cache line than SGLang's do."""

    def __init__(self, n):
        self.raw = (ctypes.c_char * (n + 64))()
        self.addr = ctypes.addressof(self.raw) + (-ctypes.addressof(self.raw)) % 64
        self.n = n


class Engine:
    """64 KV buffers of pool pages, page_size tokens per page, random bytes."""

    def __init__(self, page_size, pool, seed):
        self.ps, self.item = page_size, TOKEN_BYTES * page_size
        rnd = random.Random(seed)
        self.kv = [Aligned(pool * self.item) for _ in range(BUFS)]
        for b in self.kv:
            ctypes.memmove(b.addr, rnd.randbytes(b.n), b.n)
        self.aux = [(ctypes.c_char * 64)()]

    def kv_args(self, cls):
        a = cls()
        a.engine_rank, a.page_size, a.pp_rank, a.system_dp_rank = 0, self.ps, 0, 0
        a.kv_data_ptrs = [b.addr for b in self.kv]
        a.kv_data_lens = [b.n for b in self.kv]
        a.kv_item_lens = [self.item] * BUFS
        a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = [ctypes.addressof(self.aux[0])], [64], [8]
        a.state_types = []
        return a


def pair(page_size, pool):
    """A decode and a prefill manager (TP1, static pairing) and the
    prefill engine; the caller closes what it gets."""
    P = KVFenceBackendProvider()
    kvargs, manager = P.get_kv_class("kvargs"), P.get_kv_class("manager")
    boot = KVFenceBootstrapServer("127.0.0.1", 0)
    addr = "127.0.0.1:%d" % boot.port
    pages = TOKENS // page_size
    base = dict(slots=pages + 8, source_pages=pages + 8, log_level="error", prefill_tp=1)
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(base, decode_addrs=["127.0.0.1:0"]))
    d_eng = Engine(page_size, pool, 1)
    dec = manager(d_eng.kv_args(kvargs), "decode", None, False)
    dec.engine = d_eng  # its buffers live as long as the manager that points at them
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(base, decode_addrs=[dec.agent.addr], bootstrap_addr=addr,
                                                          rank_base=7000))
    eng = Engine(page_size, pool, 2)
    pre = manager(eng.kv_args(kvargs), "prefill", None, False)
    del os.environ["KVFENCE_SGLANG_CONFIG"]
    return P, boot, addr, dec, pre, eng


def timed_gather(snd, layout, idx):
    """Wall and process CPU seconds (the copy runs on the library's threads)."""
    t0, c0 = time.perf_counter(), time.process_time()
    staging.gather(snd, layout, idx, 0)
    while not staging.gather_wait(snd, 5.0):
        pass
    return time.perf_counter() - t0, time.process_time() - c0


def timed_copy(dst, src):
    t0, c0 = time.perf_counter(), time.process_time()
    ctypes.memmove(dst.addr, src.addr, dst.n)
    return time.perf_counter() - t0, time.process_time() - c0


def spread(xs):
    xs = sorted(xs)
    return "%.2f [%.2f-%.2f]" % (statistics.median(xs), xs[0], xs[-1])


def arm(name, page_size, pool, contiguous):
    import numpy as np
    P, boot, addr, dec, pre, eng = pair(page_size, pool)
    pages = TOKENS // page_size
    rnd = random.Random(7)
    idx = np.arange(3, 3 + pages, dtype=np.int32) if contiguous else np.array(rnd.sample(range(pool), pages), np.int32)
    src, dst = Aligned(TOKENS * TOKEN_BYTES * BUFS), Aligned(TOKENS * TOKEN_BYTES * BUFS)
    ctypes.memmove(src.addr, random.Random(9).randbytes(src.n), src.n)  # touched: never the shared zero page
    try:
        snd = P.get_kv_class("sender")(pre, addr, 1, [0], 0)
        while snd.poll() != 2:
            time.sleep(0.005)
        snd.init(pages, 0)
        ks = snd.snds[0][0]  # the kvfence sender of the one decode rank
        timed_gather(ks, pre.layout, idx), timed_copy(dst, src)  # warm both
        gs, ratios, cpu = [], [], []
        for _ in range(REPS):
            g, c = timed_gather(ks, pre.layout, idx), timed_copy(dst, src)
            gs.append(g[0])
            ratios.append(c[0] / g[0])
            cpu.append(c[1] / g[1] if g[1] > 0 else float("nan"))
        print("%-24s gather/copy wall %s, process CPU %s; gather median %.1f ms" % (
            name, spread(ratios), spread(cpu), statistics.median(gs) * 1e3))
        snd.abort()
        snd.clear()
    finally:
        pre.close()
        dec.close()
        boot.close()
    return statistics.median(ratios)


def main():
    arms = [("page 1, random indices", 1, 1024, False), ("page 1, consecutive", 1, 1024, True),
            ("page 16, random indices", 16, 64, False), ("page 64, random indices", 64, 16, False)]
    if len(sys.argv) > 1:
        arms = [a for a in arms if sys.argv[1] in a[0]]
    with open("/proc/loadavg") as f:
        print("load average %s" % " ".join(f.read().split()[:3]))
    for a in arms:
        arm(*a)


if __name__ == "__main__":
    main()
