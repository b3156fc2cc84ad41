"""What kvfence's SGLang classes cost the scheduler thread (issue 20 item 6):
one 512-token Llama-3-8B-shaped request (32 layers x K,V = 64 buffers,
8 KV heads x 128 x bf16 = 2 KiB per token, page size 1: 64 MiB), prefill
TP1 -> decode TP1 over loopback. Times every send() and poll() call on both
sides, wall and the calling thread's CPU time (a loaded host preempts the
thread inside any call: the wall tail is mostly that, the CPU time is what
the call itself costs), and, in the same run, the per-token Python memmove
staging the previous release did for the same pages (the baseline).
Checks every byte.

  PYTHONPATH=python:python/tests KVFENCE_LIB=bin/libkvfence.so \
    KVFENCE_PLUGIN=bin/kvfence-plugin-tcp python3 python/tests/bench_sglang_calls.py

With --compare OLD.so [--old-python DIR] [--rounds N] [--requests M] it
runs this script in child processes alternately on OLD.so (with the
kvfence package in DIR, e.g. `git archive REV python | tar -x`, when the
Python side changed too) and on $KVFENCE_LIB (M requests each, N rounds),
and prints each arm's p99 over all its calls, first, middle and last
send() apart, and the load before and after each child.

With KVFENCE_BENCH_STATE=swa (children inherit it) the model also has SWA
state (hybrid-model state rows, issue 20 item 6): 32 SWA layer buffers of
1 KiB per token (page size 1), a 4096-token window, so the last send()
carries a 128 MiB state row of 131072 items (state_items {"swa": 4096});
decode's "success poll" is the poll() that reports Success (it wrote the
row into SGLang's state buffers before this change), "decode poll max" the
costliest poll() of each request. Every state item is checked too.
"""
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import time

from kvfence import staging
from kvfence.sglang import KVFenceBackendProvider, KVFenceBootstrapServer

BUFS, ITEM, TOKENS, POOL, CHUNK = 64, 2048, 512, 1024, 128
STATE = os.environ.get("KVFENCE_BENCH_STATE", "") == "swa"
SWA_BUFS, SWA_ITEM, WINDOW, SWA_POOL = 32, 1024, 4096, 4608


class Engine:
    def __init__(self, seed):
        self.kv = [(ctypes.c_char * (POOL * ITEM))() for _ in range(BUFS)]
        rnd = random.Random(seed)
        for b in self.kv:
            ctypes.memmove(b, rnd.randbytes(len(b)), len(b))
        self.aux = [(ctypes.c_char * (8 * n))() for n in (64, 8)]
        self.swa = []
        if STATE:
            self.swa = [(ctypes.c_char * (SWA_POOL * SWA_ITEM))() for _ in range(SWA_BUFS)]
            for b in self.swa:
                ctypes.memmove(b, rnd.randbytes(len(b)), len(b))

    def kv_args(self, cls):
        a = cls()
        a.engine_rank, a.page_size, a.pp_rank, a.system_dp_rank = 0, 1, 0, 0
        a.kv_data_ptrs = [ctypes.addressof(b) for b in self.kv]
        a.kv_data_lens = [len(b) for b in self.kv]
        a.kv_item_lens = [ITEM] * BUFS
        a.aux_data_ptrs = [ctypes.addressof(b) for b in self.aux]
        a.aux_data_lens = [len(b) for b in self.aux]
        a.aux_item_lens = [64, 8]
        a.state_types = []
        if self.swa:
            import types
            a.state_types = [types.SimpleNamespace(value="swa")]
            a.state_data_ptrs = [[ctypes.addressof(b) for b in self.swa]]
            a.state_data_lens = [[len(b) for b in self.swa]]
            a.state_item_lens = [[SWA_ITEM] * SWA_BUFS]
        return a


def timed(samples, fn, *args):
    """Calls fn, appending (wall, thread CPU) seconds to samples."""
    t0, c0 = time.perf_counter(), time.thread_time()
    r = fn(*args)
    samples.append((time.perf_counter() - t0, time.thread_time() - c0))
    return r


def p99(xs):
    xs = sorted(xs)
    return xs[max(0, int(len(xs) * 0.99) - 1)]


def us(xs):
    xs = sorted(xs)
    return "median %.0f µs, p99 %.0f µs, max %.0f µs (%d calls)" % (
        statistics.median(xs) * 1e6, xs[int(len(xs) * 0.99) - 1 if len(xs) > 1 else 0] * 1e6, xs[-1] * 1e6, len(xs))


def old_staging(eng, idx):
    """The previous release's send(): one Python memmove per token per buffer."""
    out = (ctypes.c_char * (len(idx) * BUFS * ITEM))()
    base = ctypes.addressof(out)
    t0 = time.perf_counter()
    for n, i in enumerate(idx.tolist()):
        dst = base + n * BUFS * ITEM
        for b in eng.kv:
            ctypes.memmove(dst, ctypes.addressof(b) + i * ITEM, ITEM)
            dst += ITEM
    return time.perf_counter() - t0


def run(requests=3, quiet=False):
    """Runs requests one after another; per-call (wall, CPU) samples by kind."""
    out = {k: [] for k in ("first", "middle", "last", "prefill poll", "decode poll", "prefill success poll",
                           "decode success poll", "decode poll max")}
    P = KVFenceBackendProvider()
    kvargs, manager = P.get_kv_class("kvargs"), P.get_kv_class("manager")
    boot = KVFenceBootstrapServer("127.0.0.1", 0)
    addr = "127.0.0.1:%d" % boot.port
    extra = (WINDOW * SWA_BUFS * SWA_ITEM + 8) // (BUFS * ITEM) + 2 if STATE else 0  # the state row's pages
    base = dict(slots=TOKENS + 8 + extra, source_pages=TOKENS + 8 + extra, log_level="error", prefill_tp=1)
    if STATE:
        base["state_items"] = {"swa": WINDOW}
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(base, decode_addrs=["127.0.0.1:0"]))
    d_eng, p_eng = Engine(1), Engine(2)
    dec = manager(d_eng.kv_args(kvargs), "decode", None, False)
    os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(base, decode_addrs=[dec.agent.addr], bootstrap_addr=addr,
                                                          rank_base=7000))
    pre = manager(p_eng.kv_args(kvargs), "prefill", None, False)
    pre.register_to_bootstrap()
    rnd = random.Random(3)
    import numpy as np
    # int32 numpy arrays of page indices, as SGLang's kv_to_page_indices gives them
    p_idx = np.array(rnd.sample(range(POOL), TOKENS), dtype=np.int32)
    d_idx = np.array(rnd.sample(range(POOL), TOKENS), dtype=np.int32)
    p_swa = np.array(rnd.sample(range(SWA_POOL), WINDOW), dtype=np.int32)  # the window tail's SWA pages
    d_swa = np.array(rnd.sample(range(SWA_POOL), WINDOW), dtype=np.int32)
    try:
        for rep in range(requests):
            room = 900 + rep
            rv = P.get_kv_class("receiver")(dec, addr, room)
            rv.init(0)
            while rv.poll() != 2:
                time.sleep(0.005)
            rv.send_metadata(d_idx, 1, [d_swa] if STATE else None, decode_prefix_len=0)
            snd = P.get_kv_class("sender")(pre, addr, room, [0], 0)
            while snd.poll() != 2:
                time.sleep(0.005)
            snd.init(TOKENS, 1)
            p_eng.aux[1][8:16] = room.to_bytes(8, "little")
            sends, ppolls, dpolls = [], [], []
            t_start = time.perf_counter()
            for lo in range(0, TOKENS, CHUNK):
                last = lo + CHUNK >= TOKENS
                timed(sends, snd.send, p_idx[lo:lo + CHUNK], [p_swa] if STATE and last else None)
            d = p = 0
            while d != 4 or p != 4:
                was = (p, d)
                p = timed(ppolls, snd.poll)
                d = timed(dpolls, rv.poll)
                if p == 4 != was[0]:
                    out["prefill success poll"].append(ppolls[-1])
                if d == 4 != was[1]:
                    out["decode success poll"].append(dpolls[-1])
                assert 0 not in (d, p), (d, p)
                time.sleep(0.001)  # a scheduler iteration
            total = time.perf_counter() - t_start
            out["decode poll max"].append(max(dpolls))
            if STATE:
                bad = sum(ctypes.string_at(ctypes.addressof(d_eng.swa[b]) + di * SWA_ITEM, SWA_ITEM)
                          != ctypes.string_at(ctypes.addressof(p_eng.swa[b]) + pi * SWA_ITEM, SWA_ITEM)
                          for di, pi in zip(d_swa.tolist(), p_swa.tolist()) for b in range(SWA_BUFS))
                assert bad == 0, "%d corrupt state items" % bad
            bad = sum(ctypes.string_at(ctypes.addressof(d_eng.kv[b]) + di * ITEM, ITEM)
                      != ctypes.string_at(ctypes.addressof(p_eng.kv[b]) + pi * ITEM, ITEM)
                      for di, pi in zip(d_idx.tolist(), p_idx.tolist()) for b in range(BUFS))
            assert bad == 0, "%d corrupt items" % bad
            out["first"].append(sends[0])
            out["middle"] += sends[1:-1]
            out["last"].append(sends[-1])
            out["prefill poll"] += ppolls
            out["decode poll"] += dpolls
            if not quiet:
                old = old_staging(p_eng, p_idx)
                wall = [w for w, _ in sends]
                print("run %d: request of 64 MiB done in %.0f ms, %d corrupt items" % (rep, total * 1e3, bad))
                print("  send():         " + us(wall) + "; all four sends %.1f ms (per chunk %s µs wall, %s µs CPU; "
                      "the last also writes the aux row)" % (sum(wall) * 1e3, " ".join("%.0f" % (w * 1e6) for w, _ in sends),
                                                              " ".join("%.0f" % (c * 1e6) for _, c in sends)))
                print("  prefill poll(): " + us([w for w, _ in ppolls]))
                print("  decode poll():  " + us([w for w, _ in dpolls]))
                print("  previous release's per-token Python staging of the same pages: %.0f ms on the scheduler "
                      "thread (x%.0f the four sends)" % (old * 1e3, old / sum(wall)))
            rv.clear()
            snd.clear()
        if not quiet:
            print("handles open at the end: %d (agents and layouts)" % staging.handles_live())
    finally:
        pre.close()
        dec.close()
        boot.close()
    return out


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def compare(old, old_python, rounds, requests):
    """Alternates child runs on the old library and $KVFENCE_LIB."""
    here = os.path.dirname(os.path.abspath(__file__))
    new_python = os.path.dirname(here)
    arms = {"old " + old: (old, old_python or new_python),
            "new " + os.environ["KVFENCE_LIB"]: (os.environ["KVFENCE_LIB"], new_python)}
    got = {a: {} for a in arms}
    loads = [load()]
    for _ in range(rounds):
        for a, (lib, py) in arms.items():
            env = dict(os.environ, KVFENCE_LIB=lib, PYTHONPATH=os.pathsep.join([py, here]))
            res = subprocess.run([sys.executable, __file__, "--child", str(requests)], env=env, check=True,
                                 stdout=subprocess.PIPE, text=True)
            for k, xs in json.loads(res.stdout.splitlines()[-1]).items():
                got[a].setdefault(k, []).extend(xs)
            loads.append(load())
    print("load average (1 min) before and after each child run: %s" % " ".join(loads))
    for a in arms:
        print(a)
        for k, xs in got[a].items():
            print("  %-13s p99 wall %5.0f µs, CPU %5.0f µs; median wall %4.0f µs, CPU %4.0f µs (%d calls)" % (
                k, p99([w for w, _ in xs]) * 1e6, p99([c for _, c in xs]) * 1e6,
                statistics.median(w for w, _ in xs) * 1e6, statistics.median(c for _, c in xs) * 1e6, len(xs)))


def main():
    args = sys.argv[1:]
    if args[:1] == ["--child"]:
        print(json.dumps(run(int(args[1]), quiet=True)))
    elif args[:1] == ["--compare"]:
        opt = dict(zip(args[2::2], args[3::2]))
        compare(args[1], opt.get("--old-python"), int(opt.get("--rounds", 4)), int(opt.get("--requests", 6)))
    else:
        run()


if __name__ == "__main__":
    main()
