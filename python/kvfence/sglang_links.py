"""Prefill's links to decode ranks, made on demand and closed when idle.

With SGLang's router any decode instance may pair with any prefill instance
per request (M:N). The prefill rank learns where the request's decode ranks
listen from its own bootstrap server (each decode rank announces itself
there for the room: PUT /kvfence/decode, done off the scheduler thread by
the receiver), and keeps one kvfence prefill agent per decode rank address
it serves. An agent with no request for idle_close_s is closed once decode
agreed (a handshake over the link, agent/link_quiesce.go); the next request
to that address makes a new one. Mutual TLS stays: discovery says
where, the certificates say who may write.

Owns: the agents by address, their use counts and idle clocks, the per-room
look-ups, the close handshake's Python half (the sweeper thread). Never:
touches pages, staging or a request's state (the sender does), nor blocks
the scheduler thread (look-ups and the handshake run on threads), nor
closes an agent decode did not agree to let go (its Assign would be lost).
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
        self.stop, self.wake = threading.Event(), threading.Event()
        # Idle links close on time even when no request comes to sweep them.
        threading.Thread(target=self._sweeper, daemon=True).start()

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

    # False only in the known-unsafe variant the tests catch: an agent is
    # closed once it holds no stream, without asking decode (an Assign on
    # the wire, or sent between the check and the close, is lost).
    handshake = True
    quiesce_timeout_s = 5.0

    @staticmethod
    def _interleave(where, key):
        """A test's hook: runs once an idle agent was found closable, just
        before it is closed (the race tests act there as decode would)."""

    def sweep(self):
        """Wakes the sweeper: the close handshake is a round trip to
        decode, never run on a scheduler thread."""
        self.wake.set()

    def _sweeper(self):
        while not self.stop.is_set():
            self.wake.wait(max(0.05, self.idle_close_s / 4))
            self.wake.clear()
            if not self.stop.is_set():
                self._sweep()

    def _sweep(self):
        """Closes agents no request used for idle_close_s, once decode
        agreed (kvfence_prefill_quiesce): decode exposes a request to the
        link it has, so an idle agent may be getting the next request's
        Assign. Decode answers on the same ordered link after it stopped
        exposing requests to this rank, and the agent agrees only if it
        then holds no stream; a request that acquired the agent meanwhile
        keeps it (resumed)."""
        now = time.monotonic()
        with self.lock:
            idle = [(k, e[0]) for k, e in self.agents.items() if e[1] == 0 and now - e[2] >= self.idle_close_s]
        for k, agent in idle:
            agreed = self._agree(k, agent)
            if agreed:
                self._interleave("closable", k)
            with self.lock:
                e = self.agents.get(k)
                close = agreed and e is not None and e[0] is agent and e[1] == 0
                if close:
                    del self.agents[k]
                    self.closing += 1
            if close:
                try:
                    agent.close()
                finally:
                    with self.lock:
                        self.closing -= 1
                        self.closed_idle += 1
            elif agreed and self.handshake:
                agent.resume()  # acquired since: decode may expose to it again

    def _agree(self, key, agent):
        try:
            if self.handshake:
                return agent.quiesce(self.quiesce_timeout_s)
            return agent.stats().get("Streams", 0) == 0
        except Exception:  # noqa: BLE001  (a failing agent is kept until it answers; closed with the manager)
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
        self.wake.set()
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
