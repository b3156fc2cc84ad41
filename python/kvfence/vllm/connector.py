"""KVFenceConnector: kvfence's guarantees in vLLM's terms.

- vLLM's string request ids never reach kvfence: prefill's request_finished
  mints a 128-bit transfer id; its hash is kvfence's room, and each load
  attempt on decode takes a fresh generation, so a reused request id (or a
  retried load) never meets the writes of an earlier one.
- Decode (kv_consumer): a load is reported in finished_recving only once
  kvfence let go of it: copied into vLLM's blocks after a verified hand-off,
  or, for an aborted or failed load, once the runtime released its slots
  (every writer drained, the transport fenced them, or the bound passed).
  vLLM keeps a WAITING_FOR_REMOTE_KVS request's blocks until then, whatever
  its scheduler did with the request meanwhile. vLLM's blocks are written
  only by this worker's copy, never after an abort.
- A failed load names every block of the request in
  get_block_ids_with_load_errors, in the same pass that reports it finished:
  never a silent partial load.
- Prefill (kv_producer): request_finished returns delay_free_blocks=True;
  the request is reported in finished_sending only once every decode rank
  answered and every sender committed or failed, or decode abandoned it,
  or no decode came within abort_timeout_s (then nothing ever read them).
- Peers: each prefill worker's rendezvous address travels in its handshake
  metadata to its scheduler and from there in kv_transfer_params to decode.

GPU caches (staged mode): when the CUDA driver says the registered tensors
are device memory, no host code touches them. Prefill's blocks are gathered
by block index into the sender's pinned host pages on kvfence's Go threads
(kvfence.staging), off vLLM's threads; decode's network writes land only in
kvfence's host slots, and the scatter into vLLM's GPU blocks is queued only
after the hand-off was verified, so a late write can land only in host
memory kvfence holds. A load is reported finished only once its scatter
ended. HND caches in GPU memory are refused (layout.py).
One KV cache group (SupportsHMA is declared so vLLM's hybrid allocator
does not refuse the connector; several groups are refused).
"""
import concurrent.futures
import hashlib
import os
import secrets
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .. import api, errors, staging
from . import layout, rendezvous
from ._base import KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole, SupportsHMA

PRODUCER, CONSUMER = "kv_producer", "kv_consumer"
# Test-only control arms (the known-unsafe behaviours the tests must catch);
# honoured only with KVFENCE_TEST_CONTROL_ARM=1 in the environment.
UNSAFE_ARMS = ("swallow_load_errors", "free_on_abort", "unchecked_scatter")


def room_of(tid):
    return int.from_bytes(hashlib.sha256(tid.encode()).digest()[:8], "big") & ((1 << 63) - 1)


def rank_id(engine_id, tp_rank):
    """A prefill worker's kvfence rank: distinct per instance and TP rank."""
    h = hashlib.sha256(("%s/%d" % (engine_id, tp_rank)).encode()).digest()
    return 1 + (int.from_bytes(h[:4], "big") & 0x3FFFFFFF)


@dataclass
class KVFenceHandshakeMetadata(KVConnectorHandshakeMetadata):
    host: str
    port: int
    tp_rank: int
    engine_id: str


@dataclass
class KVFenceConnectorMetadata(KVConnectorMetadata):
    recv: list = field(default_factory=list)  # loads to start (decode)
    send: list = field(default_factory=list)  # finished requests to send (prefill)


def _status_name(request):
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


class _Options:
    def __init__(self, vllm_config):
        kt = vllm_config.kv_transfer_config
        self.role = kt.kv_role
        if self.role not in (PRODUCER, CONSUMER):
            raise errors.Unimplemented("kvfence.vllm: kv_role %r; kv_producer or kv_consumer (kv_both is not supported)" % (self.role,))
        self.engine_id = str(kt.engine_id)
        x = dict(getattr(kt, "kv_connector_extra_config", None) or {})
        self.x = x
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.prefill_tp = int(x.get("prefill_tp_size", self.tp_size))
        self.total_heads = x.get("num_kv_heads")
        if self.total_heads is None and getattr(vllm_config, "model_config", None) is not None:
            try:
                self.total_heads = vllm_config.model_config.get_total_num_kv_heads()
            except Exception:
                self.total_heads = None
        self.kv_layout = x.get("kv_layout", "auto")
        self.rendezvous_host = x.get("rendezvous_host", "127.0.0.1")
        self.decode_host = x.get("decode_host", "127.0.0.1")
        self.secret = rendezvous.secret_from(x)
        self.abort_timeout_s = float(x.get("abort_timeout_s", 120.0))
        self.link_timeout_s = float(x.get("link_timeout_s", 30.0))
        self.load_timeout_s = float(x.get("load_timeout_s", 300.0))
        self.idle_close_s = float(x.get("idle_close_s", 300.0))
        self.agent = {k: x[k] for k in ("plugin", "log_level", "log_file", "tls_cert", "tls_key", "tls_ca", "checksums") if k in x}
        self.decode_cfg = dict(slots=int(x.get("slots", 1024)), lease_ms=int(x.get("lease_ms", 5000)),
                               max_hold_ms=int(x.get("max_hold_ms", 60000)))
        self.prefill_cfg = dict(source_pages=int(x.get("source_pages", 1024)), heartbeat_ms=int(x.get("heartbeat_ms", 500)),
                                bootstrap_timeout_ms=int(x.get("bootstrap_timeout_ms", 30000)),
                                request_tombstone_ms=int(x.get("request_tombstone_ms", 30000)))
        arm = x.get("unsafe_control_arm")
        if arm and (arm not in UNSAFE_ARMS or os.environ.get("KVFENCE_TEST_CONTROL_ARM") != "1"):
            raise errors.InvalidArgument("kvfence.vllm: unsafe_control_arm is for kvfence's own tests only")
        self.unsafe = arm or ""
        self.tp_rank_override = x.get("tp_rank")


def _tp_rank(opts):
    if opts.tp_rank_override is not None:
        return int(opts.tp_rank_override)
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return int(get_tensor_model_parallel_rank())


class KVFenceConnector(KVConnectorBase_V1, SupportsHMA):
    """One class, two roles (vLLM builds one per role, in separate processes)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if groups is not None and len(groups) != 1:
            raise errors.Unimplemented("kvfence.vllm: %d KV cache groups; one is supported" % len(groups))
        self.opts = _Options(vllm_config)
        self.block_size = int(vllm_config.cache_config.block_size)
        if role == KVConnectorRole.SCHEDULER:
            self.sched = _Scheduler(self.opts, self.block_size)
            self.worker = None
        else:
            self.sched = None
            self.worker = _Worker(self.opts, self.block_size)

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.sched.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.sched.build_meta()

    def request_finished(self, request, block_ids):
        return self.sched.finished(request, list(block_ids))

    def request_finished_all_groups(self, request, block_ids):
        if len(block_ids) != 1:
            raise errors.Unimplemented("kvfence.vllm: %d KV cache groups; one is supported" % len(block_ids))
        return self.request_finished(request, block_ids[0])

    def set_xfer_handshake_metadata(self, metadata):
        self.sched.set_peers(metadata)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # NHD and HND both: pages are canonical on the wire

    # ---- worker side ----
    def register_kv_caches(self, kv_caches):
        self.worker.register(kv_caches)

    def get_handshake_metadata(self):
        return self.worker.handshake() if self.worker else None

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if meta is not None:
            self.worker.start(meta)

    def wait_for_layer_load(self, layer_name):
        """Loads complete between steps (async, whole requests)."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Prefill sends a request's blocks once it finished, not per layer."""

    def wait_for_save(self):
        """Nothing is saved per layer (see save_kv_layer)."""

    def get_finished(self, finished_req_ids):
        return self.worker.finished(set(finished_req_ids or ()))

    def get_block_ids_with_load_errors(self):
        return self.worker.take_load_errors()

    def shutdown(self):
        if self.worker:
            self.worker.close()


class _Scheduler:
    """Scheduler-side state: which requests load or send, and the peers."""

    def __init__(self, opts, block_size):
        self.opts, self.block_size = opts, block_size
        self.peers = []
        self.recv, self.send = [], []
        self.lock = threading.Lock()

    def set_peers(self, metadata):
        ms = [metadata[r] for r in sorted(metadata)]
        self.peers = [[m.host, int(m.port)] for m in ms]

    @staticmethod
    def _params(request):
        return getattr(request, "kv_transfer_params", None) or {}

    def matched(self, request, num_computed_tokens):
        p = self._params(request)
        if self.opts.role == CONSUMER and p.get("do_remote_prefill") and p.get("kvfence_tid"):
            n = len(request.prompt_token_ids or ()) - int(num_computed_tokens)
            if n > 0:
                return n, True
        return 0, False

    def after_alloc(self, request, blocks, num_external_tokens):
        p = self._params(request)
        if self.opts.role != CONSUMER or not p.get("do_remote_prefill") or not p.get("kvfence_tid"):
            return
        p["do_remote_prefill"] = False  # loaded once; a preempted request recomputes locally
        if num_external_tokens <= 0:
            self._abandon(p)  # full local prefix hit: prefill may free its blocks now
            return
        local = list(blocks.get_unhashed_block_ids())
        remote = list(p.get("remote_block_ids") or ())
        skip = len(remote) - len(local)
        with self.lock:
            self.recv.append(dict(req_id=request.request_id, tid=p["kvfence_tid"], peers=p["kvfence_peers"],
                                  engine_id=p.get("remote_engine_id", ""), prefill_tp=int(p.get("remote_tp_size", 1)),
                                  block_size=int(p.get("remote_block_size", self.block_size)),
                                  skip=skip, local=local))

    def build_meta(self):
        with self.lock:
            meta = KVFenceConnectorMetadata(recv=self.recv, send=self.send)
            self.recv, self.send = [], []
        return meta

    def finished(self, request, block_ids):
        p = self._params(request)
        if p.get("do_remote_prefill") and p.get("kvfence_tid"):
            self._abandon(p)  # decode let go before it ever loaded
            return False, None
        if self.opts.role != PRODUCER or not p.get("do_remote_decode"):
            return False, None
        if _status_name(request) != "FINISHED_LENGTH_CAPPED":
            return False, None  # aborted or stopped: nothing to send
        if not block_ids:
            return False, None
        tid = secrets.token_hex(16)
        with self.lock:
            self.send.append(dict(req_id=request.request_id, tid=tid, blocks=list(block_ids)))
        return True, dict(do_remote_prefill=True, do_remote_decode=False, remote_engine_id=self.opts.engine_id,
                          remote_block_ids=list(block_ids), remote_tp_size=self.opts.tp_size,
                          remote_block_size=self.block_size, kvfence_tid=tid, kvfence_peers=list(self.peers))

    def _abandon(self, p):
        peers, tid, secret = list(p.get("kvfence_peers") or ()), p["kvfence_tid"], self.opts.secret

        def run():
            for host, port in peers:
                try:
                    rendezvous.call(host, port, dict(op="abandon", tid=tid), secret, timeout=10)
                except errors.KVFenceError:
                    pass  # prefill's abort_timeout_s frees them anyway

        threading.Thread(target=run, name="kvfence-abandon", daemon=True).start()


class _Load:
    """One decode load attempt (runs on its own thread)."""

    def __init__(self, w, r):
        self.w, self.r = w, r
        self.req_id = r["req_id"]
        self.aborted = threading.Event()
        self.done = False
        self.errors = set()
        self.rv = None
        self.rv_released = False
        self.t = threading.Thread(target=self._run, name="kvfence-load", daemon=True)

    def _run(self):
        try:
            ok = self._load()
        except errors.KVFenceError as e:
            self.w.log("load %s failed: %s" % (self.req_id, e))
            ok = False
        except Exception as e:  # never leaves the request without an answer
            self.w.log("load %s failed: %s: %s" % (self.req_id, type(e).__name__, e))
            ok = False
        if not ok and not self.aborted.is_set():
            self.errors = set(self.r["local"])
        if not ok:
            self._cancel()
        self._wait_released()
        self.done = True

    def _load(self):
        w, r = self.w, self.r
        if r["block_size"] != w.block_size:
            raise errors.Unimplemented("prefill block size %d, decode %d" % (r["block_size"], w.block_size))
        if r["skip"] < 0:
            raise errors.InvalidArgument("decode allocated more blocks than prefill sent")
        writers = w.writers(r["prefill_tp"])
        ids = [rank_id(r["engine_id"], p) for p, _ in writers]
        room = room_of(r["tid"])
        gen = w.next_gen(room)
        self._pull(gen, dict(writers))
        w.dec.wait_linked(ids, timeout=w.opts.link_timeout_s)
        self.rv = w.dec.receiver(room, gen)
        self._expose(ids)
        if not self._wait_handoff():
            return False
        if self.aborted.is_set() and w.opts.unsafe != "free_on_abort":
            self.rv.abandon()  # handed off, but vLLM let the request go: no copy into its blocks
            return False
        if w.staged is not None:
            self._scatter_staged(len(writers))
        else:
            w.scatter(r["local"], writers, self.rv.read(0, len(r["local"])))
        self.rv.finish()
        return True

    def _scatter_staged(self, shards):
        """Copies the handed-off slots into vLLM's GPU blocks on kvfence's
        Go threads and waits for the copy: vLLM holds the blocks until this
        load is reported, so an abort meanwhile lets the copy end."""
        w = self.w
        try:
            staging.scatter(self.rv, w.staged, self.r["local"], shards=shards, mla=w.caches.mla)
            if w.opts.unsafe == "unchecked_scatter":
                return  # known-unsafe: the copy's outcome is never asked (finish still waits for it)
            while not staging.scatter_done(self.rv, 1.0):
                pass
        except errors.KVFenceError:
            self.rv.finish()  # handed off: the slots go back (after the copy ended); every block is a load error
            raise

    def _cancel(self):
        """Tells every prefill rank this decode rank will not take the
        request (a pull that failed, or an abort): a rank still waiting for
        this pull gives its blocks back now, not at abort_timeout_s. A rank
        whose sender runs lets it end on its own."""
        w, r = self.w, self.r
        for host, port in r["peers"]:
            try:
                rendezvous.call(host, port, dict(op="cancel", tid=r["tid"], decode_rank=w.tp_rank, decode_tp=w.tp_size),
                                w.opts.secret, timeout=10)
            except errors.KVFenceError:
                pass  # that rank's abort_timeout_s still bounds it

    def _pull(self, gen, heads):
        """Tells every prefill rank where to write (non-writers learn they
        have nothing to send); an error answer fails the load."""
        w, r = self.w, self.r
        for p, (host, port) in enumerate(r["peers"]):
            rendezvous.call(host, port, dict(op="pull", tid=r["tid"], gen=gen, decode_rank=w.tp_rank, decode_tp=w.tp_size,
                                             decode_addr=w.dec.addr, block_size=w.block_size, skip=r["skip"],
                                             count=len(r["local"]), heads=heads.get(p), shard_bytes=w.shard_bytes),
                            w.opts.secret, timeout=w.opts.link_timeout_s)

    def _expose(self, ids):
        end = time.monotonic() + self.w.opts.link_timeout_s
        while True:
            try:
                self.rv.init(len(self.r["local"]), ids)
                return
            except errors.ResourceExhausted:
                if time.monotonic() > end or self.aborted.is_set():
                    raise
                time.sleep(0.01)

    def _wait_handoff(self):
        """True at a hand-off; False once vLLM aborted the request (the
        receiver is aborted: kvfence holds its slots until released)."""
        w = self.w
        deadline = time.monotonic() + w.opts.load_timeout_s
        while True:
            # abandon, not abort: a handoff landing meanwhile must not
            # leave the slots in use (and _wait_released waiting) for good
            if self.aborted.is_set() and w.opts.unsafe != "free_on_abort":
                self.rv.abandon()
                return False
            if time.monotonic() > deadline:
                self.rv.abandon()
                raise errors.Unavailable("no hand-off within load_timeout_s (%.0f s)" % w.opts.load_timeout_s)
            st = self.rv.wait(0.1)
            if st == api.KVPoll.Success:
                return True
            if st == api.KVPoll.Failed:
                raise self.rv.failure() or errors.Unavailable("load failed")

    def _wait_released(self):
        if self.rv is None:
            return
        if self.w.opts.unsafe != "free_on_abort":
            while not self.rv.released:
                time.sleep(0.01)
            self.rv_released = True
        self.rv.close()


class _Outgoing:
    """One prefill request on one prefill worker: its blocks and the decode
    ranks that pulled it."""

    def __init__(self, tid):
        self.tid = tid
        self.req_id = None
        self.blocks = None
        self.pulls = {}  # decode_rank -> msg
        self.started = set()
        self.ended = set()
        self.decode_tp = None
        self.abandoned = False
        self.t0 = time.monotonic()

    def finished(self, timeout):
        if self.blocks is None:
            return False
        if self.started - self.ended:
            return False  # a sender still runs: its source blocks stay held
        if self.abandoned:
            return True
        if self.decode_tp is not None and len(self.ended) >= self.decode_tp:
            return True
        # No decode came (or some decode ranks never did) within the bound:
        # no sender runs, so nothing reads the blocks any more.
        return time.monotonic() - self.t0 > timeout


class _Worker:
    def __init__(self, opts, block_size):
        self.opts, self.block_size = opts, block_size
        self.lock = threading.Lock()
        self.loads = {}
        self.load_errors = set()
        self.gens = {}
        self.out = {}  # tid -> _Outgoing
        self.reported_unreleased = 0  # loads reported to vLLM while kvfence still held them
        self.gone = {}  # tid -> when: transfers that ended here; a later pull is refused
        self.agents = {}  # decode addr -> api.Prefill
        self.dec = self.srv = self.caches = self.staged = None
        self.opener = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvfence-open")
        self.agents_opened = 0  # prefill agents ever opened (tests: one per decode rank)
        self.closed = False

    def log(self, msg):
        if self.opts.x.get("log_level", "warn") != "off":
            import sys
            sys.stderr.write("kvfence.vllm: %s\n" % msg)

    def register(self, kv_caches):
        self.caches = layout.open_caches(kv_caches, self.opts.kv_layout)
        if self.caches.device:
            self.staged = staging.Layout(*self.caches.staged_layout())
        self.tp_rank, self.tp_size = _tp_rank(self.opts), self.opts.tp_size
        if self.caches.block_size != self.block_size:
            raise errors.InvalidArgument("kvfence.vllm: cache block size %d, config %d" % (self.caches.block_size, self.block_size))
        heads = self.opts.total_heads or self.caches.heads * self.tp_size
        self.total_heads = 1 if self.caches.mla else int(heads)
        if self.opts.role == CONSUMER:
            writers = self.writers(self.opts.prefill_tp)
            self.shard_bytes = self.caches.shard_bytes(len(writers[0][1]))
            self.dec = api.Decode(rank=self.tp_rank, shard_bytes=self.shard_bytes, shards=len(writers),
                                  control_addr="%s:0" % self.opts.decode_host, **self.opts.decode_cfg, **self.opts.agent)
        else:
            self.srv = rendezvous.Server(self._on_message, self.opts.rendezvous_host, int(self.opts.x.get("rendezvous_port", 0)),
                                         self.opts.secret)

    def handshake(self):
        if self.srv is None:
            return None
        return KVFenceHandshakeMetadata(host=self.srv.host, port=self.srv.port, tp_rank=self.tp_rank, engine_id=self.opts.engine_id)

    def writers(self, prefill_tp):
        return layout.plan(self.tp_rank, self.tp_size, prefill_tp, self.total_heads, self.caches.mla)

    def next_gen(self, room):
        with self.lock:
            self.gens[room] = self.gens.get(room, 0) + 1
            return self.gens[room]

    def scatter(self, blocks, writers, page):
        """page: count slots of len(writers) shards; shard k holds decode's
        heads [k*n, (k+1)*n) in the plan's order."""
        sb = self.shard_bytes
        buf = np.frombuffer(page, dtype=np.uint8)
        slot = sb * len(writers)
        for i, b in enumerate(blocks):
            for k, (_, hs) in enumerate(writers):
                n = len(hs)
                mine = list(range(k * n, (k + 1) * n)) if not self.caches.mla else [0]
                self.caches.scatter(b, mine, buf[i * slot + k * sb:i * slot + (k + 1) * sb])

    # ---- decode ----
    def start(self, meta):
        for r in meta.recv:
            ld = _Load(self, r)
            with self.lock:
                self.loads[r["req_id"]] = ld
            ld.t.start()
        for s in meta.send:
            with self.lock:
                o = self.out.setdefault(s["tid"], _Outgoing(s["tid"]))
                o.req_id, o.blocks, o.t0 = s["req_id"], list(s["blocks"]), time.monotonic()
                ready = [m for d, m in o.pulls.items() if d not in o.started and m is not None]
                o.started.update(int(m["decode_rank"]) for m in ready)
            for m in ready:
                self._start_send(o, m)

    def finished(self, finished_req_ids):
        with self.lock:
            recving = self._finished_loads(finished_req_ids)
            sending = self._finished_sends()
        self._close_idle()
        return (sending or None), (recving or None)

    def _finished_loads(self, finished_req_ids):
        """Loads kvfence let go of; vLLM's finished ids abort the rest."""
        recving = set()
        for req_id in finished_req_ids:
            ld = self.loads.get(req_id)
            if ld is not None and not ld.done:
                ld.aborted.set()
        for req_id, ld in list(self.loads.items()):
            early = self.opts.unsafe == "free_on_abort" and ld.aborted.is_set()
            if not (ld.done or early):
                continue
            recving.add(req_id)
            if not ld.done or (ld.rv is not None and not ld.rv_released):
                self.reported_unreleased += 1  # only the unsafe arm gets here
            if self.opts.unsafe != "swallow_load_errors":
                self.load_errors |= ld.errors
            del self.loads[req_id]
        return recving

    def _finished_sends(self):
        """Prefill requests whose blocks nothing reads any more."""
        sending, now = set(), time.monotonic()
        for tid, o in list(self.out.items()):
            if o.finished(self.opts.abort_timeout_s):
                if o.req_id is not None:
                    sending.add(o.req_id)
            elif not (o.blocks is None and now - o.t0 > 2 * self.opts.abort_timeout_s):
                continue  # (else: a pull for a request this worker never got)
            del self.out[tid]
            self.gone[tid] = now
        cut = now - 4 * self.opts.abort_timeout_s - 600
        for tid in [t for t, at in self.gone.items() if at < cut]:
            del self.gone[tid]
        return sending

    def take_load_errors(self):
        with self.lock:
            out, self.load_errors = self.load_errors, set()
        return out

    # ---- prefill ----
    def _on_message(self, msg):
        op, tid = msg.get("op"), str(msg.get("tid", ""))
        if len(tid) != 32:
            raise errors.InvalidArgument("rendezvous: bad transfer id")
        with self.lock:
            if tid in self.gone:
                raise errors.FailedPrecondition("transfer %s ended here (sent, abandoned or expired)" % tid[:8])
        if op == "abandon":
            with self.lock:
                o = self.out.setdefault(tid, _Outgoing(tid))
                o.abandoned = True
            return {}
        if op == "cancel":
            d = int(msg["decode_rank"])
            with self.lock:
                o = self.out.setdefault(tid, _Outgoing(tid))
                o.decode_tp = int(msg["decode_tp"])
                o.pulls.setdefault(d, None)
                if d not in o.started:
                    o.started.add(d)
                    o.ended.add(d)  # this decode rank will never take it
            return {}
        if op != "pull":
            raise errors.InvalidArgument("rendezvous: unknown op %r" % (op,))
        return self._on_pull(tid, msg)

    def _on_pull(self, tid, msg):
        d = int(msg["decode_rank"])
        heads = msg.get("heads")
        if int(msg["block_size"]) != self.block_size:
            raise errors.Unimplemented("block size %d here, %d on decode" % (self.block_size, int(msg["block_size"])))
        held = None
        if heads is not None:
            sb = self.caches.shard_bytes(len(heads))
            if sb != int(msg["shard_bytes"]):
                raise errors.InvalidArgument("shard of %d bytes here, %d on decode (layouts differ)" % (sb, int(msg["shard_bytes"])))
            self._agent(msg["decode_addr"], sb, d, hold=True)
            held = msg["decode_addr"]
        try:
            return self._register_pull(tid, d, heads, msg)
        except BaseException:
            if held is not None:
                self._use(held, -1)
            raise

    def _register_pull(self, tid, d, heads, msg):
        """Records decode rank d's pull; with heads, its agent stays held
        until the sender ends (_send gives it back)."""
        with self.lock:
            if tid in self.gone:
                raise errors.FailedPrecondition("transfer %s ended here (sent, abandoned or expired)" % tid[:8])
            o = self.out.setdefault(tid, _Outgoing(tid))
            if o.abandoned or d in o.pulls:
                raise errors.FailedPrecondition("transfer already abandoned or pulled by decode rank %d" % d)
            if o.blocks is None and o.req_id is None and time.monotonic() - o.t0 > self.opts.abort_timeout_s:
                raise errors.FailedPrecondition("transfer expired")
            if o.blocks is not None and time.monotonic() - o.t0 > self.opts.abort_timeout_s:
                raise errors.FailedPrecondition("transfer expired: its blocks are given back")
            o.decode_tp = int(msg["decode_tp"])
            o.pulls[d] = msg
            if heads is None:
                o.started.add(d)
                o.ended.add(d)  # nothing for this rank to send that decode rank
                return {}
            ready = o.blocks is not None
            if ready:
                o.started.add(d)  # in the same hold of the lock: the blocks cannot be given back meanwhile
        if ready:
            self._start_send(o, msg)
        return {}

    def _agent(self, addr, shard_bytes, decode_rank, hold=False):
        """The prefill agent linked to the decode rank at addr: one per
        decode rank, opened by the first pull that names it. While this
        runs, and after it with hold (the caller gives it back with _use),
        the agent counts as in use and is never closed as idle."""
        while True:
            with self.lock:
                slot = self.agents.setdefault(addr, dict(lock=threading.Lock(), agent=None, used=0.0, active=0))
            with slot["lock"]:
                with self.lock:
                    if self.agents.get(addr) is not slot:
                        continue  # closed as idle meanwhile: take the new slot
                    slot["active"] += 1
                try:
                    a = self._open_in(slot, addr, shard_bytes, decode_rank)
                except BaseException:
                    self._use(addr, -1)
                    raise
            break
        try:
            if a.page_bytes != shard_bytes:
                raise errors.InvalidArgument("decode rank at %s asked for %d-byte shards, then %d" % (addr, a.page_bytes, shard_bytes))
            a.wait_linked(self.opts.link_timeout_s)
        except BaseException:
            self._use(addr, -1)
            raise
        if not hold:
            self._use(addr, -1)
        return a

    def _open_in(self, slot, addr, shard_bytes, decode_rank):
        if slot["agent"] is None:
            self.agents_opened += 1
            # Opened on the worker's long-lived opener thread: the agent's
            # plugin process dies with the thread that started it (Linux
            # ties a child's parent-death signal to the forking thread, and
            # cgo forks on the calling thread), and rendezvous handler and
            # sender threads are short-lived.
            slot["agent"] = self.opener.submit(
                api.Prefill, rank=rank_id(self.opts.engine_id, self.tp_rank), decode_addr=addr,
                decode_rank=int(decode_rank), shard_bytes=shard_bytes, **self.opts.prefill_cfg,
                **self.opts.agent).result()
        return slot["agent"]

    def _use(self, addr, n):
        """Counts the pulls naming addr whose sender has not ended: an agent
        with one is never closed as idle."""
        with self.lock:
            slot = self.agents.get(addr)
            if slot is not None:
                slot["active"] += n
                slot["used"] = time.monotonic()

    def _close_idle(self):
        """Closes agents (and their plugin processes) idle for idle_close_s:
        decode ranks come and go (a restarted one has a new address)."""
        now, idle = time.monotonic(), []
        with self.lock:
            for addr, slot in list(self.agents.items()):
                if slot["active"] == 0 and now - slot["used"] > self.opts.idle_close_s and slot["lock"].acquire(False):
                    del self.agents[addr]
                    idle.append(slot)
        for slot in idle:
            a, slot["agent"] = slot["agent"], None
            slot["lock"].release()
            if a is not None:
                self.opener.submit(a.close)

    def live_agents(self):
        with self.lock:
            return sum(slot["agent"] is not None for slot in self.agents.values())

    def _start_send(self, o, msg):
        """Runs one sender; the caller marked it started under the lock
        that also decides when o's blocks go back."""
        threading.Thread(target=self._send, args=(o, msg), name="kvfence-send", daemon=True).start()

    def _send(self, o, msg):
        d = int(msg["decode_rank"])
        s = None
        try:
            a = self._agent(msg["decode_addr"], int(msg["shard_bytes"]), d)
            s = a.sender(room_of(o.tid), int(msg["gen"]))
            self._fill(s, o, msg)
            while s.wait(1.0) not in (api.KVPoll.Success, api.KVPoll.Failed):
                pass
        except errors.KVFenceError as e:
            self.log("send %s to decode rank %d: %s" % (o.req_id, d, e))
            while s is not None and s.poll() not in (api.KVPoll.Success, api.KVPoll.Failed):
                time.sleep(0.05)
        finally:
            if s is not None:
                s.close()
            self._use(msg["decode_addr"], -1)
            with self.lock:
                o.ended.add(d)

    def _fill(self, s, o, msg):
        skip, count, heads = int(msg["skip"]), int(msg["count"]), msg["heads"]
        blocks = o.blocks[skip:skip + count]
        if len(blocks) != count:
            raise errors.InvalidArgument("decode wants %d blocks from %d; %d were computed" % (count, skip, len(o.blocks)))
        end = time.monotonic() + self.opts.link_timeout_s
        while True:
            try:
                s.init(count)
                break
            except errors.ResourceExhausted:
                if time.monotonic() > end:
                    raise
                time.sleep(0.01)
        if self.staged is not None:
            self._fill_staged(s, blocks, heads)
            return
        buf = np.empty(int(msg["shard_bytes"]), dtype=np.uint8)
        try:
            for i, b in enumerate(blocks):
                self.caches.gather(b, heads, buf)
                s.write(i, buf)
                s.send(i + 1)
            s.finish(count)
        except (errors.NotFound, errors.FailedPrecondition):
            pass  # decode ended the request meanwhile: the sender fails

    def _fill_staged(self, s, blocks, heads):
        """Gathers blocks (GPU) into s's pinned source pages on kvfence's Go
        threads, then sends them all; returns once the gather ended, so the
        blocks stay held (o.ended) while the driver may still read them."""
        part, parts = self.caches.slice_of(heads)
        staging.gather(s, self.staged, blocks, 0, upto=len(blocks), total=len(blocks), part=part, parts=parts)
        try:
            while not staging.gather_wait(s, 1.0):
                pass
        except (errors.NotFound, errors.FailedPrecondition):
            pass  # decode ended the request meanwhile: the sender fails
        except errors.KVFenceError:
            s.abort()  # a copy failed: decode learns it now, not at its load timeout
            raise

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self.srv:
            self.srv.close()
        for slot in list(self.agents.values()):
            if slot["agent"] is not None:
                slot["agent"].close()
        if self.dec:
            self.dec.close()
        if self.staged is not None:
            self.staged.close()
        self.opener.shutdown(wait=False)
