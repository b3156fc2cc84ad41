"""One rank of the multi-process test (test_multiprocess.py): a decode rank
or a prefill rank of a TP2 prefill, each in its own Python process, driven
through the plain kvfence API.

Every process allocates a host KV pool of its own (the engine's memory) and
moves pages between it and kvfence by address. All ranks derive the same
request plan from the seed: room, page count, and whether decode aborts it
(after a random delay, while prefill is still sending page by page). The last
line on stdout is this rank's result as JSON.
"""
import argparse
import concurrent.futures
import ctypes
import hashlib
import json
import os
import random
import sys
import threading
import time

import kvfence

SHARD = 4096
WINDOW = 6
PREFILL_RANKS = [1, 2]


def plan(seed, n):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        abort = rng.random() < 0.35
        # An aborted request has 3-5 pages that prefill sends 10 ms apart, so
        # decode's abort (2-30 ms after exposure) lands while pages move.
        reqs.append(dict(room=1000 + i, pages=rng.randint(3 if abort else 1, 5), abort=abort,
                         abort_after=rng.uniform(0.002, 0.03), pace=0.01 if abort else 0.004))
    return reqs


def shard(room, rank, page):
    """What prefill rank writes for (room, page): unique per request, rank
    and page, so a byte that lands in the wrong place shows."""
    seed = hashlib.sha256(b"%d/%d/%d" % (room, rank, page)).digest()
    return seed * (SHARD // len(seed))


class HostPool:
    """The engine's KV memory: a host buffer of pages with a free list."""

    def __init__(self, pages, page_bytes):
        self.buf = (ctypes.c_char * (pages * page_bytes))()
        # Pages move by raw address: kvfence takes those only inside
        # memory registered with it.
        self.reg = kvfence.register_memory(ctypes.addressof(self.buf), pages * page_bytes)
        self.page_bytes = page_bytes
        self.free = list(range(pages))
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)

    def take(self, n):
        with self.cv:
            while len(self.free) < n:
                self.cv.wait()
            got, self.free = self.free[:n], self.free[n:]
            return got

    def give(self, pages):
        with self.cv:
            self.free.extend(pages)
            self.cv.notify_all()

    def addr(self, page):
        return ctypes.addressof(self.buf) + page * self.page_bytes

    def view(self, page):
        return memoryview(self.buf).cast("B")[page * self.page_bytes:(page + 1) * self.page_bytes]


def wait_files(paths, timeout=60.0):
    """Waits for the other ranks' marker files (the ranks' only rendezvous)."""
    end = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > end:
            raise SystemExit("timed out waiting for %s" % paths)
        time.sleep(0.01)


def retry_full(fn, deadline=30.0):
    end = time.monotonic() + deadline
    while True:
        try:
            return fn()
        except kvfence.ResourceExhausted:
            if time.monotonic() > end:
                raise
            time.sleep(0.005)


WHO = {}  # first 32 bytes of a shard -> whose shard it is (diagnostics)


def run_decode(args, reqs):
    for r in reqs:
        for rank in PREFILL_RANKS:
            for i in range(r["pages"]):
                WHO[shard(r["room"], rank, i)[:32]] = "room %d rank %d page %d" % (r["room"], rank, i)
    dec = kvfence.Decode(rank=0, slots=48, shard_bytes=SHARD, shards=len(PREFILL_RANKS), lease_ms=5000,
                         max_hold_ms=20000, control_addr="127.0.0.1:0", log_level=os.environ.get("KVFENCE_TEST_LOG", "error"))
    with open(args.addr_file + ".tmp", "w") as f:
        f.write(dec.addr)
    os.rename(args.addr_file + ".tmp", args.addr_file)
    pool = HostPool(64, dec.page_bytes)  # the pools hold every request of a window (6 × 5 pages) and holds
    # An exposure's Assign reaches only linked ranks: start once both are.
    dec.wait_linked(PREFILL_RANKS, timeout=60)
    out = dict(verified=0, corrupt=0, succeeded=0, aborted=0, abort_won=0, held_after_abort=0)
    lock = threading.Lock()
    aborted = []

    def one(r):
        rv = dec.receiver(r["room"])
        retry_full(lambda: rv.init(r["pages"], PREFILL_RANKS))
        if r["abort"]:
            time.sleep(r["abort_after"])
            rv.abort()
        t0 = time.monotonic()
        state = rv.wait(20)
        with lock:
            out["wait_s"] = out.get("wait_s", 0) + time.monotonic() - t0
        if state == kvfence.KVPoll.Success:
            dst = pool.take(r["pages"])
            try:
                for i, p in enumerate(dst):  # into the engine's pages, by address
                    rv.read_into(pool.addr(p), first=i, count=1)
                bad = 0
                for i, p in enumerate(dst):
                    page = pool.view(p)
                    for k, rank in enumerate(PREFILL_RANKS):
                        got = bytes(page[k * SHARD:(k + 1) * SHARD])
                        if got != shard(r["room"], rank, i):
                            bad += 1
                            with lock:
                                out.setdefault("corrupt_detail", []).append(dict(
                                    room=r["room"], rank=rank, page=i, pages=r["pages"], planned_abort=r["abort"],
                                    holds=WHO.get(got[:32], "unknown bytes (zero: %s)" % (got == bytes(SHARD)))))
            finally:
                pool.give(dst)
            rv.finish()
            with lock:
                out["succeeded"] += 1
                out["verified"] += r["pages"] * len(PREFILL_RANKS)
                out["corrupt"] += bad
                out["abort_won"] += r["abort"]
        else:
            assert state == kvfence.KVPoll.Failed, state
            with lock:
                out["aborted"] += 1
                if not r["abort"]:
                    out.setdefault("unexpected", []).append((r["room"], str(rv.failure())))
                out["held_after_abort"] += not rv.released
                aborted.append(rv)
            return
        rv.close()

    with concurrent.futures.ThreadPoolExecutor(WINDOW) as ex:
        for f in [ex.submit(one, r) for r in reqs]:
            f.result()
    # Each wait below gets its own deadline: one budget shared by both let
    # a slow first wait (a loaded machine) starve the second.
    end = time.monotonic() + 20
    while any(not rv.released for rv in aborted) and time.monotonic() < end:
        time.sleep(0.02)
    out["unreleased"] = sum(not rv.released for rv in aborted)
    # Finish returns slots through the rank's event loop: wait until the
    # metrics count every handed-off request before reading them.
    end = time.monotonic() + 20
    while dec.stats().get("released", {}).get("completed", 0) < out["succeeded"] and time.monotonic() < end:
        time.sleep(0.02)
    out["stats"] = dec.stats()
    m = dec.metrics()
    out["releases"] = {dict(ls)["path"]: v for (n, ls), v in m.items() if n == "kvfence_releases_total"}
    out["hold_count"] = {dict(ls)["path"]: v for (n, ls), v in m.items() if n == "kvfence_hold_duration_seconds_count"}
    with open(args.done_file, "w") as f:
        f.write("done")
    # Prefill ranks close first; decode stays up until they say so.
    wait_files([args.done_file + ".%d" % r for r in PREFILL_RANKS])
    dec.close()
    return out


def run_prefill(args, reqs):
    wait_files([args.addr_file])
    addr = open(args.addr_file).read()
    pre = kvfence.Prefill(rank=args.rank, decode_addr=addr, source_pages=64, shard_bytes=SHARD,
                          heartbeat_ms=100, request_tombstone_ms=5000, bootstrap_timeout_ms=3000,
                          max_batch_pages=int(os.environ.get("KVFENCE_TEST_BATCH_PAGES", "4")), log_level=os.environ.get("KVFENCE_TEST_LOG", "error"))
    pre.wait_linked()
    pool = HostPool(64, SHARD)
    out = dict(succeeded=0, failed=0, failed_after_sending=0, unexpected=[])
    lock = threading.Lock()

    def one(r):
        s = pre.sender(r["room"])
        retry_full(lambda: s.init(r["pages"]))
        src = pool.take(r["pages"])
        sent = 0
        try:
            for i, p in enumerate(src):
                pool.view(p)[:] = shard(r["room"], args.rank, i)  # the engine computes page i
                if s.poll() == kvfence.KVPoll.Failed:
                    break
                s.write(i, pool.addr(p))  # from the engine's page, by address
                s.send(i + 1)
                sent = i + 1
                time.sleep(r["pace"])
            else:
                s.finish(r["pages"])
        except (kvfence.NotFound, kvfence.FailedPrecondition):
            pass  # decode aborted it meanwhile: the request (and its source pages) are gone here
        finally:
            pool.give(src)  # write copied it: the engine's page is free again
        t0 = time.monotonic()
        # A request decode aborted before this rank got its Assign ends here
        # only at the bootstrap timeout (3 s): nothing told this rank about it.
        state = s.wait(30)
        with lock:
            out["wait_s"] = out.get("wait_s", 0) + time.monotonic() - t0
            if state == kvfence.KVPoll.Success:
                out["succeeded"] += 1
            elif state == kvfence.KVPoll.Failed:
                out["failed"] += 1
                out["failed_after_sending"] += sent > 0
                if not r["abort"]:
                    out["unexpected"].append((r["room"], str(s.failure())))
            else:
                out["unexpected"].append((r["room"], "state %d" % state))
        s.close()

    with concurrent.futures.ThreadPoolExecutor(WINDOW) as ex:
        for f in [ex.submit(one, r) for r in reqs]:
            f.result()
    out["stats"] = pre.stats()
    wait_files([args.done_file])
    pre.close()
    open(args.done_file + ".%d" % args.rank, "w").close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["decode", "prefill"])
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--addr-file", required=True)
    ap.add_argument("--done-file", required=True)
    args = ap.parse_args()
    reqs = plan(args.seed, args.requests)
    out = run_decode(args, reqs) if args.role == "decode" else run_prefill(args, reqs)
    out["pid"] = os.getpid()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
