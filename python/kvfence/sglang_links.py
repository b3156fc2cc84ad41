"""Prefill's links to decode ranks, made on demand and closed when idle.

With SGLang's router any decode instance may pair with any prefill instance
per request (M:N). The prefill rank learns where the request's decode ranks
listen from its own bootstrap server (each decode rank announces itself
there for the room: PUT /kvfence/decode, done off the scheduler thread by
the receiver), and keeps one kvfence prefill agent per decode rank address
it serves. An agent with no request for idle_close_s is closed; the next
request to that address makes a new one. Mutual TLS stays: discovery says
where, the certificates say who may write.

Owns: the agents by address, their use counts and idle clocks, the per-room
look-ups. Never: touches pages, staging or a request's state (the sender
does), nor blocks the scheduler thread (look-ups run on threads).
"""
import concurrent.futures
import threading
import time

from . import api, sglang_bootstrap


# Agents are made on one thread that lives as long as the process: an
# agent's plugin process dies with the thread that started it (the
# parent-death signal is per thread), so never on a short-lived one.
_MAKER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvfence-agents")


def on_lasting_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) run on the process-long agent-making thread.
    Its exception is raised here without the future's reference cycle
    (future -> exception -> traceback -> future), which would keep the
    caller's half-made objects and their handles alive until a GC."""
    def call():
        try:
            return True, fn(*args, **kwargs)
        except Exception as exc:  # handed to the caller's thread
            return False, exc
    ok, value = _MAKER.submit(call).result()
    if ok:
        return value
    raise value


class Links:
    """One per prefill manager: agents keyed by (decode address, decode
    rank); make(addr, dr) returns a new api.Prefill for them."""

    def __init__(self, make, idle_close_s):
        self.make, self.idle_close_s = make, float(idle_close_s)
        self.lock = threading.Lock()
        self.agents = {}    # (addr, dr) -> [agent, users, idle since]
        self.lookups = {}   # (bootstrap addr, room, gen) -> None while running, else addrs list
        self.closed_idle = 0
        self.closing = 0    # agents taken out but still closing
        self.stop = threading.Event()
        # Idle links close on time even when no request comes to sweep them.
        threading.Thread(target=self._sweeper, daemon=True).start()

    def _sweeper(self):
        while not self.stop.wait(max(0.05, self.idle_close_s / 4)):
            self.sweep()

    def acquire(self, addr, dr):
        """The agent for (addr, dr), made if none; counted as in use."""
        with self.lock:
            e = self.agents.get((addr, dr))
            if e is not None:
                e[1] += 1
                return e[0]
        agent = on_lasting_thread(self.make, addr, dr)  # dials off the lock (never held across the library)
        with self.lock:
            e = self.agents.get((addr, dr))
            if e is None:
                self.agents[(addr, dr)] = [agent, 1, None]
                return agent
            e[1] += 1
        agent.close()  # another request made it first
        return e[0]

    def release(self, agent):
        with self.lock:
            for e in self.agents.values():
                if e[0] is agent:
                    e[1] -= 1
                    if e[1] == 0:
                        e[2] = time.monotonic()
                    return

    def sweep(self):
        """Closes agents no request used for idle_close_s and that hold no
        stream: decode exposes a request to the link it has, so an agent
        idle here may already hold the next request's Assign (made before
        prefill's sender acquires the agent); closed, that Assign is lost
        and the request fails when decode's lease lapses."""
        now = time.monotonic()
        with self.lock:
            idle = [k for k, e in self.agents.items() if e[1] == 0 and now - e[2] >= self.idle_close_s]
        busy = {k for k in idle if self._has_streams(k)}
        with self.lock:
            gone = []
            for k in idle:
                e = self.agents.get(k)
                if k in busy or e is None or e[1] != 0:
                    continue  # a stream, or acquired since
                gone.append(self.agents.pop(k)[0])
            self.closing += len(gone)
        for a in gone:
            try:
                a.close()
            finally:
                with self.lock:
                    self.closing -= 1
                    self.closed_idle += 1

    def _has_streams(self, key):
        with self.lock:
            e = self.agents.get(key)
        try:
            return e is not None and e[0].stats().get("Streams", 0) > 0
        except Exception:  # noqa: BLE001  (a closed or failing agent holds nothing to keep)
            return False

    def count(self):
        """Agents open (or still closing)."""
        with self.lock:
            return len(self.agents) + self.closing

    def lookup(self, bootstrap_addr, room, key):
        """(where room's decode ranks are, decode_prefix_len), or None while
        unknown; the HTTP call runs on a thread, asked again by the next
        poll."""
        with self.lock:
            if key in self.lookups:
                got = self.lookups[key]
                if got is not None:
                    del self.lookups[key]
                return got
            self.lookups[key] = None
        threading.Thread(target=self._lookup, args=(bootstrap_addr, room, key), daemon=True).start()
        return None

    def _lookup(self, bootstrap_addr, room, key):
        addrs = None
        try:
            addrs = sglang_bootstrap.lookup_decoder(bootstrap_addr, room)
        finally:
            with self.lock:
                if addrs is None:
                    self.lookups.pop(key, None)  # asked again by the next poll
                elif key in self.lookups:
                    self.lookups[key] = addrs

    def forget(self, key):
        with self.lock:
            self.lookups.pop(key, None)

    def close(self):
        self.stop.set()
        with self.lock:
            gone = [e[0] for e in self.agents.values()]
            self.agents.clear()
        for a in gone:
            a.close()


def announce(bootstrap_addr, room, decode_tp, decode_rank, addr, until, **extra):
    """Decode rank tells the prefill instance where it listens for room
    (extra: radix, decode_prefix_len), retrying until accepted or the
    monotonic deadline until (run on a thread by the receiver)."""
    delay = 0.05
    while time.monotonic() < until:
        if sglang_bootstrap.announce_decoder(bootstrap_addr, room, decode_tp, decode_rank, addr, **extra):
            return True
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    return False


def prefill_agent(passthrough, kv_rank, source_pages, shard_bytes):
    """The factory Links uses: one kvfence prefill agent to decode rank dr."""
    def make(addr, dr):
        return api.Prefill(rank=kv_rank, decode_addr=addr, decode_rank=dr, source_pages=source_pages,
                           shard_bytes=shard_bytes, **passthrough)
    return make
