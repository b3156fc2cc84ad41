"""SGLang's disaggregation transfer backend on kvfence.

SGLang asks a backend for five classes (KVClassType: kvargs, manager, sender,
receiver, bootstrap_server). KVFenceBackendProvider().get_kv_class(class_type)
returns them (the provider contract of SGLang's `dynamic` backend); the plugin
in kvfence.sglang_plugin routes upstream SGLang's get_kv_class here for
`--disaggregation-transfer-backend kvfence`.

The classes keep SGLang's method names and KVPoll integers and subclass
SGLang's base classes when SGLang is importable (plain classes otherwise, so
this module imports without SGLang). Underneath, kvfence's guarantees hold:

- Pages are staged: send() copies the engine's pages (kv_data_ptrs at the
  page indices) into kvfence's source pages, and decode copies a handed-off
  request from kvfence's slots into the engine's pages only at Success. No
  transport ever writes engine memory, so SGLang may free its own pages at
  once after an abort; kvfence holds its slots until every prefill rank's
  writes are proven stopped (drained, fenced or timeout).
- clear() during a hold never drops the hold: the manager keeps the request
  until the runtime releases it (is_abort_release_safe says when).
- Every prefill rank of a request writes its shard and must drain: TP
  fan-out (decode TP smaller than prefill TP: each prefill rank's heads are
  scattered into decode's pages) and MLA (every rank writes the same
  latent; decode takes shard 0 and still waits for all).
- The aux metadata row (incl. bootstrap_room) travels as extra pages of the
  same request and is written into decode's aux buffer before Success, so
  SGLang's metadata gate opens only for a complete request.
- A room id used again gets a new generation on both sides (per-manager
  count of the room's requests), so a late message of the old request never
  matches the new one.

Configuration: a JSON object in $KVFENCE_SGLANG_CONFIG, or the "kvfence"
object of --disaggregation-transfer-backend-extra-config (the fork's flag):
  decode_addrs   list of decode ranks' control addresses ("host:port"),
                 decode rank d listens on decode_addrs[d]
  prefill_tp     prefill's TP size (decode needs to know who writes)
  slots          decode's kvfence pool in pages (default 1024)
  source_pages   prefill's kvfence source pages (default 1024)
  plugin, plugin_env, tls_cert, tls_key, tls_ca, log_level, log_file
                 the library's config fields both sides take
  decode, prefill  objects of further library config fields for that side
                 (decode: lease_ms, max_hold_ms, fence, ...; prefill:
                 heartbeat_ms, bootstrap_timeout_ms, lanes, ...)
"""
import ctypes
import json
import os
import threading
import time

from . import api, errors

try:  # SGLang's base classes when SGLang is there; plain ones otherwise.
    from sglang.srt.disaggregation.base.conn import (BaseKVBootstrapServer, BaseKVManager, BaseKVReceiver,
                                                     BaseKVSender, KVArgs, KVPoll)
    try:
        from sglang.srt.disaggregation.base.conn import KVTransferMetric
    except ImportError:  # older SGLang: no transfer metric
        KVTransferMetric = None
except ImportError:
    BaseKVManager = BaseKVSender = BaseKVReceiver = BaseKVBootstrapServer = object
    KVTransferMetric = None
    KVPoll = api.KVPoll

    class KVArgs:
        """SGLang's KVArgs: a bare attribute holder the scheduler fills."""

PREFILL_RANK_BASE = 1000
# Library config fields both sides take; side-specific ones go in the
# "decode" or "prefill" object of the config.
_SHARED_KEYS = ("plugin", "plugin_env", "tls_cert", "tls_key", "tls_ca", "log_level", "log_file")  # kvfence rank id of prefill TP rank r: base + r


def _config(server_args=None):
    cfg = {}
    extra = getattr(server_args, "disaggregation_transfer_backend_extra_config", None)
    if extra:
        cfg.update(json.loads(extra).get("kvfence", {}))
    env = os.environ.get("KVFENCE_SGLANG_CONFIG")
    if env:
        cfg.update(json.loads(env))
    return cfg


def _mode(mode):
    return str(getattr(mode, "value", mode)).lower()


def _refuse_device_memory(ptrs):
    """These classes stage pages with memmove, so every buffer must be host
    memory: a CUDA device pointer is refused here (Unimplemented) instead of
    crashing the scheduler at the first send. Checked with the CUDA driver's
    cuPointerGetAttribute when libcuda is present; without it, no GPU memory
    can exist in this process."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    mem_type = ctypes.c_uint(0)
    for p in ptrs:
        # CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2; CU_MEMORYTYPE_DEVICE = 2.
        if cuda.cuPointerGetAttribute(ctypes.byref(mem_type), 2, ctypes.c_uint64(int(p))) == 0 and mem_type.value == 2:
            raise errors.Unimplemented(
                "kvfence: buffer at 0x%x is CUDA device memory; this release stages through host memory only "
                "(README: GPU memory)" % int(p))


class KVFenceKVArgs(KVArgs):
    """SGLang fills the attributes; kvfence reads the buffer layout."""


class KVFenceKVManager(BaseKVManager):
    """One per scheduler process: one kvfence rank (decode or prefill)."""

    # kvfence keeps aborted requests' memory held until every prefill rank's
    # writes are proven stopped; SGLang's engine pages are never a transfer
    # target, so they are free at once (see the module doc).
    supports_deferred_decode_kv_release = True

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.mode = _mode(disaggregation_mode)
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        cfg = _config(server_args)
        self.cfg = cfg
        # What SGLang's scheduler reads from a manager (Common* attributes).
        self.is_dummy_cp_rank = False
        self.prefill_info_table, self.transfer_infos, self.req_to_decode_prefix_len = {}, {}, {}
        self.enable_deferred_decode_kv_release = True
        _refuse_device_memory(list(args.kv_data_ptrs) + list(getattr(args, "aux_data_ptrs", []) or []))
        self.rank = int(getattr(args, "engine_rank", 0))
        self.page_bytes = sum(int(x) for x in args.kv_item_lens)
        self.aux_bytes = sum(int(x) for x in getattr(args, "aux_item_lens", []) or [])
        self._gens = {}
        self._held = {}  # room -> [api.Receiver]: aborted requests the runtime still holds
        self._lock = threading.Lock()
        passthrough = {k: v for k, v in cfg.items() if k in _SHARED_KEYS}
        passthrough.update(cfg.get(self.mode if self.mode == "decode" else "prefill", {}))
        addrs = cfg.get("decode_addrs") or ["127.0.0.1:17000"]
        if self.mode == "decode":
            prefill_tp = int(cfg.get("prefill_tp", 1))
            dtp = len(addrs)
            self.prefill_ranks = [PREFILL_RANK_BASE + r for r in range(prefill_tp) if r % dtp == self.rank % dtp]
            self.shards = len(self.prefill_ranks)
            # Non-MLA: prefill ranks each hold 1/shards of decode's heads.
            shard = self.page_bytes if self.is_mla_backend else self.page_bytes // self.shards
            self.shard_bytes = max(shard, 1)
            self.aux_pages = -(-self.aux_bytes // self.shard_bytes) if self.aux_bytes else 0
            passthrough.setdefault("control_addr", addrs[self.rank % dtp])
            self.agent = api.Decode(rank=self.rank, slots=int(cfg.get("slots", 1024)), shard_bytes=self.shard_bytes,
                                    shards=self.shards, **passthrough)
        else:
            self.shard_bytes = self.page_bytes
            self.aux_pages = -(-self.aux_bytes // self.shard_bytes) if self.aux_bytes else 0
            self.agent = api.Prefill(rank=PREFILL_RANK_BASE + self.rank, decode_addr=addrs[self.rank % len(addrs)],
                                     source_pages=int(cfg.get("source_pages", 1024)), shard_bytes=self.shard_bytes,
                                     **passthrough)

    def next_gen(self, room):
        """The generation of room's next request here (1, 2, ...)."""
        with self._lock:
            self._gens[room] = self._gens.get(room, 0) + 1
            return self._gens[room]

    def register_to_bootstrap(self):
        """kvfence's ranks find each other over their control plane."""

    def try_ensure_parallel_info(self, bootstrap_addr):
        return True

    # Deferred decode-KV release (SGLang's names), answered by the runtime.
    def register_deferred_abort_room(self, room):
        return self._gens.get(room, 0)

    def note_abort_ack(self, room, prefill_rank, generation=None):
        """kvfence's ranks ack over its own control plane; nothing to do."""

    def hold(self, room, receiver):
        with self._lock:
            self._held.setdefault(room, []).append(receiver)

    def is_abort_release_safe(self, room, required_acks=None):
        """True once the runtime released every aborted request of room:
        each prefill rank drained, or its writes were fenced or timed out."""
        with self._lock:
            rs = self._held.get(room, [])
            live = [r for r in rs if not r.released]
            for r in rs:
                if r.released:
                    r.close()
            if live:
                self._held[room] = live
            else:
                self._held.pop(room, None)
            return not live

    def clear_deferred_abort_state(self, room):
        """Forgets nothing the runtime still holds."""
        self.is_abort_release_safe(room)

    def held_rooms(self):
        with self._lock:
            return sorted(self._held)

    def close(self):
        self.agent.close()


def _copy_pages(ptrs, item_lens, indices, out_addr, shard_bytes):
    """Gathers the engine's pages at indices (each buffer's item at its page
    index, buffers concatenated) into consecutive shards at out_addr."""
    for n, idx in enumerate(indices):
        dst = out_addr + n * shard_bytes
        for ptr, item in zip(ptrs, item_lens):
            ctypes.memmove(dst, int(ptr) + int(idx) * int(item), int(item))
            dst += int(item)


def _scatter_pages(buf, indices, ptrs, item_lens, page_size, shards, shard_bytes, mla):
    """Writes a handed-off request's slots (one shard per prefill rank) into
    decode's pages: MLA takes shard 0 whole; otherwise shard k holds prefill
    rank k's heads, so each token's bytes of every buffer come from all shards."""
    base = ctypes.addressof(buf)
    slot = shards * shard_bytes
    for n, idx in enumerate(indices):
        for k in range(1 if mla else shards):
            src = base + n * slot + k * shard_bytes
            for ptr, item in zip(ptrs, item_lens):
                item = int(item)
                page = int(ptr) + int(idx) * item
                if mla:
                    ctypes.memmove(page, src, item)
                    src += item
                    continue
                tok_d = item // page_size
                tok_p = tok_d // shards
                for t in range(page_size):
                    ctypes.memmove(page + t * tok_d + k * tok_p, src + t * tok_p, tok_p)
                src += item // shards


class KVFenceKVSender(BaseKVSender):
    """Prefill's side of one request (SGLang's sender)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=0, *args, **kwargs):
        self.mgr, self.room = mgr, int(bootstrap_room or 0)
        self.gen = mgr.next_gen(self.room)
        self.snd = mgr.agent.sender(self.room, self.gen)
        self.total = None
        self.sent = 0
        self.aux_index = None
        self.pending_init = False
        self.aborted = False
        self.started = None
        self.bytes = 0
        self._poll_inited = False

    def init(self, num_kv_indices, aux_index=None):
        self.total, self.aux_index = int(num_kv_indices), aux_index
        self.started = time.monotonic()
        self._try_init()

    def _try_init(self):
        try:
            self.snd.init(self.total + self.mgr.aux_pages)
            self.pending_init = False
        except errors.ResourceExhausted:
            self.pending_init = True  # no free source pages yet; poll retries

    def pop_decode_prefix_len(self):
        return 0

    def should_send_kv_chunk(self, num_pages, last_chunk):
        return num_pages > 0 or last_chunk

    def send(self, kv_indices, state_indices=None, *args, **kwargs):
        try:
            self._send(kv_indices)
        except (errors.NotFound, errors.FailedPrecondition):
            pass  # decode ended the request meanwhile: poll says Failed

    def _send(self, kv_indices):
        if self.pending_init:
            self._try_init()
            if self.pending_init:
                raise errors.ResourceExhausted("kvfence: no free source pages for room %d" % self.room)
        idx = [int(i) for i in kv_indices]
        if idx:
            staging = (ctypes.c_char * (len(idx) * self.mgr.shard_bytes))()
            _copy_pages(self.mgr.kv_args.kv_data_ptrs, self.mgr.kv_args.kv_item_lens, idx,
                        ctypes.addressof(staging), self.mgr.shard_bytes)
            self.snd.write(self.sent, staging, count=len(idx))
            self.sent += len(idx)
            self.bytes += len(staging)
        last = self.total is not None and self.sent >= self.total
        if last and self.mgr.aux_pages:
            # The aux row goes last: it is what opens decode's metadata gate.
            self.snd.write(self.sent, self._aux_row(), count=self.mgr.aux_pages)
        self.snd.send(self.sent + (self.mgr.aux_pages if last else 0))
        if last:
            self.snd.finish(self.total + self.mgr.aux_pages)

    def _aux_row(self):
        a = self.mgr.kv_args
        buf = (ctypes.c_char * (self.mgr.aux_pages * self.mgr.shard_bytes))()
        off = 0
        for ptr, item in zip(a.aux_data_ptrs, a.aux_item_lens):
            ctypes.memmove(ctypes.addressof(buf) + off, int(ptr) + int(self.aux_index) * int(item), int(item))
            off += int(item)
        return buf

    def poll(self):
        if self.aborted:
            return KVPoll.Failed
        if self.total is None:
            # Bootstrapped once the rank's link to decode is up.
            return KVPoll.WaitingForInput if self.mgr.agent.linked else KVPoll.Bootstrapping
        if self.pending_init:
            self._try_init()
            return KVPoll.WaitingForInput
        return self.snd.poll()

    def failure_exception(self):
        err = self.snd.failure() or errors.Unavailable("kvfence: room %d failed" % self.room)
        raise err

    def get_transfer_metric(self):
        lat = time.monotonic() - self.started if self.started else None
        if KVTransferMetric is None:
            return None
        return KVTransferMetric(transfer_latency_s=lat, transfer_total_bytes=self.bytes)

    def abort(self):
        self.aborted = True
        try:
            self.snd.abort()
        except errors.NotFound:
            pass

    def clear(self):
        """Drops the handle; source pages come back only when no posted
        write can still read them (the runtime decides)."""
        self.snd.close()


class KVFenceKVReceiver(BaseKVReceiver):
    """Decode's side of one request (SGLang's receiver)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None, *args, **kwargs):
        self.mgr, self.room = mgr, int(bootstrap_room or 0)
        self.gen = mgr.next_gen(self.room)
        self.rv = mgr.agent.receiver(self.room, self.gen)
        self.ready = False
        self.exposed = False
        self.kv_indices = None
        self.aux_index = None
        self.delivered = False
        self.aborted = False
        self.failed = None
        # What SGLang's decode queue reads from a receiver.
        self.conclude_state = None
        self.require_staging = False

    def init(self, *args, **kwargs):
        """main-2606 on: init(prefill_dp_rank); older: init(kv_indices,
        aux_index, state_indices), which also sends the metadata."""
        self.ready = True
        if args and not isinstance(args[0], int):
            self.send_metadata(*args, **kwargs)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
        self.kv_indices = [int(i) for i in kv_indices]
        self.aux_index = aux_index
        self._expose()

    def _expose(self):
        if not all(self.mgr.agent.linked(r) for r in self.mgr.prefill_ranks):
            self.exposed = False  # an Assign reaches linked ranks only: wait for every writer
            return
        try:
            self.rv.init(len(self.kv_indices) + self.mgr.aux_pages, self.mgr.prefill_ranks)
            self.exposed = True
        except errors.ResourceExhausted:
            self.exposed = False  # kvfence's pool is full (holds count): poll retries

    def poll(self):
        if self.failed is not None or self.aborted:
            return KVPoll.Failed
        if self.delivered:
            return KVPoll.Success
        if not self.ready:
            return KVPoll.Bootstrapping
        if self.kv_indices is None:
            return KVPoll.WaitingForInput
        if not self.exposed:
            self._expose()
            return KVPoll.WaitingForInput
        st = self.rv.poll()
        if st == KVPoll.Success:
            self._deliver()
            return KVPoll.Success
        return st

    def _deliver(self):
        m, a = self.mgr, self.mgr.kv_args
        n = len(self.kv_indices) + m.aux_pages
        buf = (ctypes.c_char * (n * m.agent.page_bytes))()
        self.rv.read_into(buf, 0, n)
        _scatter_pages(buf, self.kv_indices, a.kv_data_ptrs, a.kv_item_lens, int(a.page_size), m.shards,
                       m.shard_bytes, m.is_mla_backend)
        if m.aux_pages and self.aux_index is not None:
            src = ctypes.addressof(buf) + len(self.kv_indices) * m.agent.page_bytes  # shard 0 of the aux page
            for ptr, item in zip(a.aux_data_ptrs, a.aux_item_lens):
                ctypes.memmove(int(ptr) + int(self.aux_index) * int(item), src, int(item))
                src += int(item)
        self.rv.finish()
        self.delivered = True

    def failure_exception(self):
        err = self.rv.failure() or errors.Unavailable("kvfence: room %d failed" % self.room)
        raise err

    def abort(self):
        self.aborted = True
        if self.exposed and not self.delivered:
            self.rv.abort()
            self.mgr.hold(self.room, self.rv)

    def abort_for_deferred_release(self):
        self.abort()

    def clear(self):
        """Drops this object's claim. A request the runtime still holds stays
        held (the manager keeps it until released); nothing is freed here."""
        if self.aborted:
            return  # abort() handed the request to the manager's holds
        if self.exposed and not self.delivered:
            self.abort()
            return
        self.rv.close()


class KVFenceBootstrapServer(BaseKVBootstrapServer):
    """SGLang starts one on prefill. kvfence's ranks link over their own
    control plane, so it only answers GET /health (for load balancers)."""

    def __init__(self, host, port, *args, **kwargs):
        import http.server

        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/health"
                self.send_response(200 if ok else 404)
                self.end_headers()
                self.wfile.write(b"OK" if ok else b"kvfence needs no bootstrap routes")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer((host, int(port)), Health)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


_CLASSES = {
    "kvargs": KVFenceKVArgs,
    "manager": KVFenceKVManager,
    "sender": KVFenceKVSender,
    "receiver": KVFenceKVReceiver,
    "bootstrap_server": KVFenceBootstrapServer,
}


class KVFenceBackendProvider:
    """get_kv_class(class_type) for SGLang's KVClassType (or its value)."""

    def get_kv_class(self, class_type):
        return _CLASSES.get(str(getattr(class_type, "value", class_type)))
