"""SGLang's disaggregation transfer backend on kvfence.

SGLang asks a backend for five classes (KVClassType: kvargs, manager, sender,
receiver, bootstrap_server). KVFenceBackendProvider().get_kv_class(class_type)
returns them (the provider contract of SGLang's `dynamic` backend); the plugin
in kvfence.sglang_plugin routes upstream SGLang's get_kv_class here for
`--disaggregation-transfer-backend kvfence`.

The classes keep SGLang's method names and KVPoll integers and subclass
SGLang's base classes when SGLang is importable (plain classes otherwise, so
this module imports without SGLang). Underneath, kvfence's guarantees hold:

- Pages are staged on Go threads (kvfence.staging): send() only queues the
  copy of the chunk's pages (contiguous runs, 256 KiB pieces) into kvfence's
  source pages; decode's poll() queues the copy of a handed-off request
  into the engine's pages and reports Success once it is done. No transport
  ever writes engine memory, so SGLang may free its own pages at once after
  an abort; kvfence holds its slots until every prefill rank's writes are
  proven stopped (drained, fenced or timeout). Direct mode (decode's
  gpu_mode "direct", kvfence.sglang_direct) instead lands the KV in
  SGLang's pages and holds them through SGLang's deferred decode-KV
  release (abort_notified, is_abort_release_safe); the aux and state rows
  land in decode's host landing pages and are copied as staged mode does.
- Nothing raises into SGLang's scheduler: send(), poll(), init() and
  send_metadata() record a failure instead (conclude_state = KVPoll.Failed,
  failure_exception() raises the classified error). A full pool is
  backpressure for up to pool_wait_s; a peer that never links fails its
  requests after link_timeout_s.
- Discovery as SGLang does it: the bootstrap server answers SGLang's routes
  (kvfence.sglang_bootstrap); prefill ranks register there, decode fills
  prefill_info_table per bootstrap address and takes each instance's kvfence
  rank base from it, so several prefill instances never collide.
- Topologies: kvfence.sglang_layout pairs ranks as SGLang does (prefill TP
  over, equal to or under decode TP, SGLang's contiguous head split, MLA).
  Hybrid models' state buffers (state_indices: Mamba, SWA, DSA) travel as
  extra pages after the aux row (kvfence.sglang_state; equal TP, host
  memory; SWA/DSA need a state_items bound). DP attention on
  prefill: kvfence rank ids follow the global TP rank (unique over DP
  groups), pairing and head split the attention TP group; decode reads the
  writers of the group init(prefill_dp_rank) names, and a prefill sender
  registers its room (/register_dp_rank) unless rooms follow
  bootstrap_room. DP attention on decode: each scheduler (global TP rank
  g = system_dp_rank * attention TP + engine_rank) listens on
  decode_addrs[g], pairs and splits heads over its attention TP group, and
  announces itself per room (M:N pairing only; a statically paired prefill
  instance fails the requests). PP with equal sizes: each
  stage is a group of its own (rank ids per stage, decode_addrs stage
  major, announcements as one stage-major list); unequal sizes fail each
  request Unimplemented. dp-size > 1 without DP attention, context
  parallelism, state buffers in device memory and SWA/DSA state without a
  state_items bound are refused with one Unimplemented error at start-up.
  send()'s token_position_offset is checked (non-negative, never
  decreasing) and moves no page, as in SGLang's in-tree backends for these
  models.
- The aux metadata row (incl. bootstrap_room), of any size, travels as
  extra pages of the same request and is written into decode's aux buffer
  after the KV pages, so SGLang's metadata gate opens only for a complete
  request.
- A room id used again gets a new generation on both sides (per-manager
  count of the room's requests), so a late message of the old request never
  matches the new one.

Configuration: a JSON object in $KVFENCE_SGLANG_CONFIG, or the "kvfence"
object of --disaggregation-transfer-backend-extra-config (the fork's flag):
  decode_addrs   decode: this instance's TP ranks' control addresses
                 ("host:port"); decode rank d listens on decode_addrs[d]
                 (DP attention: d is the global TP rank, tp-size entries;
                 PP: stage major, pp-size x tp-size entries).
                 Prefill: static pairing with that one decode instance;
                 without it (M:N) each request's decode ranks announce
                 themselves at the prefill's bootstrap server and prefill
                 links on demand (kvfence.sglang_links)
  decode_tp      prefill without decode_addrs: the decode instances' TP
                 (default 1; a decode instance of another TP fails its
                 requests FailedPrecondition)
  idle_close_s   prefill without decode_addrs: a link no request used for
                 this long is closed (default 60)
  prefill_tp     decode: prefill's attention TP size; optional: without it
                 decode sizes itself from the first prefill instance's
                 layout (GET /route) and refuses instances of another TP
  rank_base      prefill: this instance's kvfence rank ids are rank_base +
                 TP rank (default: derived from host and bootstrap port)
  bootstrap_addr prefill: where to register ("host:port"; default the
                 server's host and --disaggregation-bootstrap-port)
  slots          decode's kvfence pool in pages (default 1024)
  source_pages   prefill's kvfence source pages (default 1024)
  pool_wait_s    how long a full pool is backpressure before the request
                 fails ResourceExhausted (default 60)
  link_timeout_s how long a request waits for its peer ranks to link
                 (default SGLang's bootstrap timeout, 300)
  decode_radix_cache  decode: its radix cache is on (also read from
                 SGLang's disaggregation_decode_enable_radix_cache): each
                 request's decode_prefix_len is announced at the prefill's
                 bootstrap server and prefill waits for it before
                 WaitingForInput (M:N pairing only; a prefill with
                 decode_addrs never asks)
  state_items    hybrid models: state indices per request, the same on
                 both sides; an int (every type) or per type, e.g.
                 {"mamba": 1, "swa": 9}: Mamba exactly (default 1),
                 SWA/DSA at most (no default: the rows reserve that
                 much; SWA: ceil((window + page - 1) / page) pages)
  plugin, plugin_env, tls_cert, tls_key, tls_ca, log_level, log_file,
  gpu_mode       the library's config fields both sides take (gpu_mode:
                 "staged", the default, or "direct": decode's transport
                 writes into SGLang's own KV pages, held through SGLang's
                 deferred decode-KV release; what it refuses:
                 kvfence.sglang_direct)
  decode, prefill  objects of further library config fields for that side
"""
import ctypes
import json
import logging
import operator
import os
import socket
import threading
import time
import zlib

from . import (api, checks, errors, sglang_bootstrap, sglang_direct, sglang_layout, sglang_links, sglang_state,
               staging)

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

# Library config fields both sides take; side-specific ones go in the
# "decode" or "prefill" object of the config.
_SHARED_KEYS = ("plugin", "plugin_env", "tls_cert", "tls_key", "tls_ca", "log_level", "log_file", "gpu_mode")
PREFILL_RANK_BASE = 1000  # kvfence rank ids below this are decode ranks'
_SCATTER_WAIT_S = 60.0  # an abort waits this long for a scatter in flight (a bounded memcpy)


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


def _check_memory(args):
    """KV buffers may be host memory or, where the CUDA driver says so,
    device memory (staged mode: kvfence's Go side copies them through the
    driver, never touching them from host code). Aux rows are read and
    written by host code, so a device pointer there is refused
    (Unimplemented) instead of crashing the scheduler at the first send.
    Without a driver no GPU memory can exist in this process."""
    for p, n in zip(args.kv_data_ptrs, args.kv_data_lens):
        if checks.is_device(int(p)):
            checks.device_range(int(p), int(n), "KV buffer")
    for p in list(getattr(args, "aux_data_ptrs", []) or []):
        if checks.is_device(int(p)):
            raise errors.Unimplemented(
                "kvfence: aux buffer at 0x%x is CUDA device memory; aux rows must be host memory "
                "(docs/bindings.md: GPU memory)" % int(p))


def refuse_unsupported(server_args, kv_args, mode=None, cfg=None):
    """One Unimplemented error at start-up for what kvfence cannot carry.
    DP attention and DP replicas (dp-size > 1 without it) are carried on
    both sides (decode: M:N pairing, checked per prefill instance in
    _admit). cfg: kvfence's config (default: read as the manager does);
    SWA/DSA state needs its state_items bound there."""
    sa = server_args
    if cfg is None:
        cfg = _config(server_args)
    why = []
    if sa is not None:
        dp, tp = int(getattr(sa, "dp_size", 1) or 1), int(getattr(sa, "tp_size", 0) or 0)
        if getattr(sa, "enable_dp_attention", False):
            if dp < 1 or tp < dp or tp % dp:
                why.append("DP attention with tp-size %d over dp-size %d" % (tp, dp))
        if int(getattr(sa, "attn_cp_size", 1) or 1) > 1:
            # prefill CP: every CP rank holds the whole KV (SGLang all-gathers
            # it), CP rank 0 sends it, as SGLang's backends do by default
            if _mode(mode) != "prefill":
                why.append("context parallelism on decode (SGLang requires decode attn-cp-size 1)")
            elif os.environ.get("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "").lower() in ("1", "true", "yes", "on"):
                why.append("context parallelism with SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER (each CP rank "
                           "sending its share of the pages)")
    if int(getattr(kv_args, "dcp_size", 1) or 1) > 1:
        # newest upstream's KVArgs: token loc i lives on DCP rank i % dcp_size
        why.append("decode context parallelism (KVArgs.dcp_size %d)" % int(kv_args.dcp_size))
    state = sglang_state.refusal(kv_args, cfg.get("state_items"))
    if state:
        why.append(state)
    if why:
        raise errors.Unimplemented("kvfence does not support %s yet (docs/sglang.md)" % ", ".join(why))


def _dp_group(args, group_tp):
    """(DP group, rank in it) under DP attention. SGLang's prefill gives the
    global TP rank as engine_rank; its decode gives the attention TP rank
    (tp_rank % attn_tp_size) and the group as system_dp_rank."""
    rank = int(getattr(args, "engine_rank", 0))
    if rank >= group_tp:
        return divmod(rank, group_tp)
    return int(getattr(args, "system_dp_rank", 0) or 0), rank


def _rank_base(cfg, server_args):
    """This prefill instance's kvfence rank base: configured, else derived
    from the host name and bootstrap port (instances differ in one)."""
    if "rank_base" in cfg:
        return int(cfg["rank_base"])
    port = int(getattr(server_args, "disaggregation_bootstrap_port", 8998) or 8998)
    h = zlib.crc32(("%s:%d" % (socket.gethostname(), port)).encode())
    return PREFILL_RANK_BASE + (h % (1 << 20)) * 256


def _layout(a):
    return staging.Layout(a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens, int(a.page_size))


_aux_bufs = threading.local()


def _aux_row(a, aux_index, size):
    """The aux buffers' rows at aux_index, concatenated, padded to size, in
    this thread's buffer of that size (a fresh 128 KiB one was an mmap, page
    faults and munmap inside the last send(): up to 190 µs measured).
    Bytes past the row that an earlier, longer row wrote are zeroed."""
    buf = getattr(_aux_bufs, "buf", None)
    if buf is None or len(buf) != size:
        buf, _aux_bufs.used = (ctypes.c_char * size)(), 0
        _aux_bufs.buf = buf
    off = 0
    for ptr, item in zip(a.aux_data_ptrs, a.aux_item_lens):
        ctypes.memmove(ctypes.addressof(buf) + off, int(ptr) + int(aux_index) * int(item), int(item))
        off += int(item)
    if _aux_bufs.used > off:
        ctypes.memset(ctypes.addressof(buf) + off, 0, _aux_bufs.used - off)
    _aux_bufs.used = off
    return buf


def _write_aux(a, aux_index, row):
    off = 0
    for ptr, item in zip(a.aux_data_ptrs, a.aux_item_lens):
        ctypes.memmove(int(ptr) + int(aux_index) * int(item), ctypes.addressof(row) + off, int(item))
        off += int(item)


def _never_raises(method):
    """SGLang's scheduler takes the server down on an exception from a
    backend call: an unexpected error fails this request instead
    (conclude_state Failed, failure_exception raises it)."""
    import functools

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        # One call at a time per request: SGLang's clear() may run on
        # another thread than the poll that lets the request go, and the
        # check-then-close of a handle must not interleave (a handle closed
        # by clear() was then abandoned and held by the manager).
        with self._serial:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001  (recorded, raised by failure_exception)
                err = exc if isinstance(exc, errors.KVFenceError) else errors.Internal(
                    "kvfence: %s.%s: %r" % (type(self).__name__, method.__name__, exc))
                try:
                    self._fail(err)
                except Exception:  # noqa: BLE001  (the failure is already recorded)
                    pass
                return KVPoll.Failed if method.__name__ == "poll" else None
    return guarded


class KVFenceKVArgs(KVArgs):
    """SGLang fills the attributes; kvfence reads the buffer layout."""


_log = logging.getLogger("kvfence.sglang")


class _Outcome:
    """A request's end as SGLang's in-tree backends record it."""

    conclude_state = None
    error = None
    started = None

    @staticmethod
    def _interleave(where):
        """A test's hook: runs at the named point of a check-then-act on
        the request's handles (the race tests park a thread there)."""

    def _fail(self, err):
        if self.error is None:
            self.error = err
            # SGLang's in-tree backends log a request's failure too: the
            # operator sees why, the scheduler only sees KVPoll.Failed. An
            # abort SGLang asked for is routine (storms of them): info.
            level = logging.INFO if getattr(self, "aborted", False) else logging.WARNING
            _log.log(level, "kvfence: %s room %s failed: %s", type(self).__name__, getattr(self, "room", "?"), err)
        self.conclude_state = KVPoll.Failed
        return KVPoll.Failed

    def _timed_out(self, since, limit, what):
        if since is not None and limit is not None and time.monotonic() - since > limit:
            self._fail(errors.Unavailable("kvfence: room %d: %s for %.0fs" % (self.room, what, limit)))
            return True
        return False

    def failure_exception(self):
        """SGLang calls this once the poll, MIN-reduced over the TP (and
        CP) group, is Failed, and frees the request's KV pages right after
        (prefill.py: the inflight queue and handle_bootstrap_failure call
        failure_exception() before release_kv_cache; decode.py:
        pop_transferred and the prealloc queue alike). Failed is the
        minimum, so this rank's own poll may still have been Transferring
        while another rank failed: its copy out of (prefill) or into
        (decode) those pages may still run. The request is failed here
        first, which fences that copy (_fail waits for it), so no page is
        read or written once SGLang may give it to another request."""
        with self._serial:
            if self.conclude_state is None:
                err = errors.Unavailable("kvfence: room %d: another rank of the request failed" % self.room)
                err.is_from_another_rank = True  # SGLang logs it at debug level, as its own backends' errors
                self._fail(err)
        raise self.error or errors.Unavailable("kvfence: room %d failed" % self.room)



def _released_or_closed(receiver):
    """Whether the runtime released the request, or its handle was closed
    elsewhere: a closed handle is no longer ours to ask, and the runtime
    keeps its hold either way. (clear() racing the let-go did that; each
    request's calls are now serialized, see _never_raises: this stays as
    the sweep's guard, so a poll never raises.)"""
    try:
        return receiver.released
    except errors.FailedPrecondition:
        return True

class KVFenceKVManager(BaseKVManager):
    """One per scheduler process: one kvfence decode rank, or the prefill
    rank's kvfence agents (one per decode rank it serves)."""

    # kvfence keeps aborted requests' memory held until every prefill rank's
    # writes are proven stopped. Staged: SGLang's engine pages are never a
    # transfer target, so they are free at once (receivers say
    # abort_notified False). Direct: the held memory is SGLang's pages, kept
    # by SGLang's deferred release until is_abort_release_safe.
    supports_deferred_decode_kv_release = True
    direct = False  # decode with gpu_mode "direct" (kvfence.sglang_direct)

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args, self.mode, self.server_args = args, _mode(disaggregation_mode), server_args
        self.is_mla_backend = bool(is_mla_backend)
        self.cfg = cfg = _config(server_args)
        refuse_unsupported(server_args, args, self.mode, cfg)
        _check_memory(args)
        # What SGLang's scheduler reads from a manager (Common* attributes).
        self.is_dummy_cp_rank = False
        self.prefill_info_table, self.transfer_infos, self.req_to_decode_prefix_len = {}, {}, {}
        self.enable_deferred_decode_kv_release = True
        self.rank = int(getattr(args, "engine_rank", 0))
        self.page_bytes = sum(int(x) for x in args.kv_item_lens)
        self.aux_bytes = sum(int(x) for x in getattr(args, "aux_item_lens", []) or [])
        self.state_items = cfg.get("state_items")  # None, an int or per type (kvfence.sglang_state.bound)
        self.radix = bool(getattr(server_args, "disaggregation_decode_enable_radix_cache", False)
                          or cfg.get("decode_radix_cache", False))
        self.state_bytes = sglang_state.row_bytes(args, self.state_items)
        self.pool_wait_s = float(cfg.get("pool_wait_s", 60))
        self.link_timeout_s = float(cfg.get("link_timeout_s", os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)))
        self._gens, self._held, self._lock = {}, {}, threading.Lock()
        self._swept = 0.0
        self.links = None  # prefill without decode_addrs: links on demand (kvfence.sglang_links)
        self._topology(cfg, args, server_args)
        self.follow_room = getattr(server_args, "load_balance_method", "follow_bootstrap_room") == "follow_bootstrap_room"
        self.layout = _layout(args)
        # the state buffers, registered once: requests pass only index arrays
        self.state_layout = (staging.StateLayout(sglang_state.layout_spec(args, self.state_items))
                             if self.state_bytes else None)
        self.state_plan = sglang_state.index_plan(args, self.state_items) if self.state_bytes else []
        passthrough = {k: v for k, v in cfg.items() if k in _SHARED_KEYS}
        passthrough.update(cfg.get("decode" if self.mode == "decode" else "prefill", {}))
        if self.mode == "decode":
            self._init_decode(cfg, passthrough)
        else:
            self._init_prefill(cfg, passthrough)

    def _topology(self, cfg, args, server_args):
        """TP, DP attention and PP: who this scheduler is among its
        instance's ranks (rank, dp_rank, pp_rank) and where decode listens."""
        self.addrs = cfg.get("decode_addrs") or ["127.0.0.1:17000"] * int(cfg.get("decode_tp", 1))
        self.prefill_tp = int(cfg.get("prefill_tp", 1))
        # PP: each stage is a scheduler group of its own (its layers' KV
        # buffers); decode lists every stage's addresses, stage major.
        self.pp_size = int(getattr(server_args, "pp_size", 1) or 1)
        self.pp_rank = int(getattr(args, "pp_rank", 0) or 0) if self.pp_size > 1 else 0
        if self.mode != "decode" and self.pp_size > 1 and cfg.get("decode_addrs"):
            raise errors.Unimplemented("kvfence: PP (pp-size %d) needs M:N pairing: no decode_addrs on prefill "
                                       "(docs/sglang.md)" % self.pp_size)
        # DP replicas (dp-size > 1 without DP attention): each a whole TP
        # group with its own KV pool and schedulers, told apart by
        # system_dp_rank; kvfence runs them as DP groups of tp-size ranks.
        self.replicas = 1 if getattr(server_args, "enable_dp_attention", False) else \
            int(getattr(server_args, "dp_size", 1) or 1)
        groups = self.pp_size * self.replicas if self.mode == "decode" else 1
        self.decode_tp = len(self.addrs) // groups
        sa_tp = int(getattr(server_args, "tp_size", 0) or 0)
        if self.mode == "decode" and sa_tp and sa_tp * groups != len(self.addrs):
            raise errors.InvalidArgument("kvfence: decode TP %d x PP %d x DP replicas %d but decode_addrs names %d ranks"
                                         % (sa_tp, self.pp_size, self.replicas, len(self.addrs)))
        # prefill CP (refuse_unsupported): ranks (DP group, CP rank, attention
        # TP rank); CP rank 0's ranks are the writers, the others dummies
        self.cp_size = int(getattr(server_args, "attn_cp_size", 1) or 1) if self.mode != "decode" else 1
        if self.mode != "decode" and sa_tp:
            self.prefill_tp = sa_tp // self.cp_size
        self.dp_size, self.dp_rank = 1, 0
        if getattr(server_args, "enable_dp_attention", False):
            # SGLang's DP attention: pairing and head split are the
            # attention TP group's (prefill_tp / decode_tp is its size). On
            # decode each group's ranks run their own KV pool and agent.
            self.dp_size = int(server_args.dp_size)
            group_tp = sa_tp // self.dp_size
            self.dp_rank, self.rank = _dp_group(args, group_tp)
            if self.mode == "decode":
                self.decode_tp = group_tp
            else:
                self.prefill_tp = group_tp // self.cp_size
        elif self.replicas > 1:
            self.dp_size, self.dp_rank = self.replicas, int(getattr(args, "system_dp_rank", 0) or 0)
            if not 0 <= self.dp_rank < self.dp_size:  # its rank ids would be another replica's
                raise errors.InvalidArgument("kvfence: system_dp_rank %d outside dp-size %d"
                                             % (self.dp_rank, self.dp_size))
        self.cp_rank, self.rank = divmod(self.rank, self.prefill_tp) if self.cp_size > 1 else (0, self.rank)
        self.is_dummy_cp_rank = self.cp_rank != 0  # sends nothing, as SGLang's dummy CP ranks
        # decode: this scheduler's index in decode_addrs (stage, DP group, rank)
        self.listen = (self.pp_rank * self.dp_size + self.dp_rank) * self.decode_tp + self.rank

    def _stage_group(self, dp=0):
        """Prefill: the index of (this PP stage, DP group dp) among the
        instance's groups of prefill_tp ranks: kvfence rank ids are base +
        index * prefill_tp + rank, unique over stages and groups (decode
        computes the same from the instance's dp_size, in instance())."""
        return self.pp_rank * self.dp_size + int(dp or 0)

    def _init_decode(self, cfg, passthrough):
        self.direct = passthrough.get("gpu_mode") == "direct"
        if self.direct:
            sglang_direct.refuse_at_start(self.kv_args, passthrough=passthrough)
            passthrough = sglang_direct.direct_hold_keys(passthrough)  # the hold fits SGLang's release timeout
        self._fetching, self._bad, self._bases = set(), {}, {}
        self.agents, self.agent = [], None
        self._sizing = (cfg, passthrough)
        if "prefill_tp" in cfg:
            self._size_decode(self.prefill_tp)
        # else (M:N): sized by the first prefill instance's layout from its
        # bootstrap server (_admit), before any prefill can link here.

    def _size_decode(self, prefill_tp):
        cfg, passthrough = self._sizing
        self.prefill_tp = int(prefill_tp)
        self.writers = sglang_layout.decode_writers(self.rank, self.prefill_tp, self.decode_tp)
        self.shards = len(self.writers)
        self.shard_bytes = sglang_layout.shard_bytes(self.page_bytes, self.prefill_tp, self.decode_tp,
                                                     self.is_mla_backend, "decode")
        self._size_extra()
        passthrough = dict(passthrough)
        passthrough.setdefault("control_addr", self.addrs[self.listen % len(self.addrs)])
        slots = int(cfg.get("slots", 1024))
        if self.direct:  # SGLang's pages are the slots: as many lent at once as SGLang has
            passthrough.update(sglang_direct.config(self.kv_args, self.shards, self.is_mla_backend, self.extra_pages))
            self.direct_pages = passthrough["direct_pages"]  # the first host landing page's index
            slots = int(cfg.get("slots", self.direct_pages + passthrough.get("direct_host_pages", 0)))
        # Sized lazily on a fetch thread: made on the lasting thread (sglang_links).
        self.agent = sglang_links.on_lasting_thread(api.Decode, rank=self.rank, slots=slots,
                                                    shard_bytes=self.shard_bytes, shards=self.shards, **passthrough)

    def _init_prefill(self, cfg, passthrough):
        self.rank_base = _rank_base(cfg, self.server_args)
        self.kv_rank = self.rank_base + self._stage_group(self.dp_rank) * self.prefill_tp + self.rank
        self.targets = sglang_layout.prefill_targets(self.rank, self.prefill_tp, self.decode_tp, self.is_mla_backend)
        self.shard_bytes = sglang_layout.shard_bytes(self.page_bytes, self.prefill_tp, self.decode_tp,
                                                     self.is_mla_backend, "prefill")
        self._size_extra()
        self.agents = []
        if self.is_dummy_cp_rank:  # no agent: CP rank 0 of its group sends the whole KV
            self.kv_rank, self.targets, self.agent = None, [], None
            if self.server_args is not None or cfg.get("bootstrap_addr"):
                threading.Thread(target=self._register_quietly, daemon=True).start()
            return
        if not self.cfg.get("decode_addrs"):
            # M:N: each request's decode ranks announce where they are at
            # this instance's bootstrap server; agents are made on demand.
            make = sglang_links.prefill_agent(passthrough, self.kv_rank, int(cfg.get("source_pages", 1024)),
                                              self.shard_bytes)
            self.links = sglang_links.Links(make, float(cfg.get("idle_close_s", 60)))
            self.agent = None
            if self.server_args is not None or cfg.get("bootstrap_addr"):
                threading.Thread(target=self._register_quietly, daemon=True).start()
            return
        try:
            for dr, _, _ in self.targets:
                self.agents.append(api.Prefill(rank=self.kv_rank, decode_addr=self.addrs[dr], decode_rank=dr,
                                               source_pages=int(cfg.get("source_pages", 1024)),
                                               shard_bytes=self.shard_bytes, **passthrough))
        except Exception:
            self.close()
            raise
        self.agent = self.agents[0]
        if self.server_args is not None or cfg.get("bootstrap_addr"):
            threading.Thread(target=self._register_quietly, daemon=True).start()

    def _size_extra(self):
        """Pages after a request's KV pages: its aux row, then its state
        row (hybrid models: equal TP only, see kvfence.sglang_state). A
        fixed count per manager: SWA/DSA rows are sized for their bound."""
        self.aux_pages = sglang_layout.aux_pages(self.aux_bytes, self.shard_bytes)
        self.state_pages = sglang_layout.aux_pages(self.state_bytes, self.shard_bytes)
        if self.state_pages and self.prefill_tp != self.decode_tp:
            raise errors.Unimplemented("kvfence: %s state buffers with prefill TP %d != decode TP %d "
                                       "(docs/sglang.md)" % (sglang_state.names(self.kv_args), self.prefill_tp,
                                                             self.decode_tp))
        self.extra_pages = self.aux_pages + self.state_pages

    def next_gen(self, room):
        """The generation of room's next request here (1, 2, ...)."""
        with self._lock:
            self._gens[room] = self._gens.get(room, 0) + 1
            return self._gens[room]

    # ---- discovery (SGLang's bootstrap routes) ----

    def _bootstrap_target(self):
        addr = self.cfg.get("bootstrap_addr")
        if addr:
            host, port = addr.rsplit(":", 1)
            return host, int(port)
        host = getattr(self.server_args, "host", None) or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return host, int(getattr(self.server_args, "disaggregation_bootstrap_port", 8998))

    def register_to_bootstrap(self):
        """PUT /route with SGLang's payload plus this instance's rank base."""
        if self.mode == "decode":
            return
        sa = self.server_args
        rep = self.replicas > 1  # DP replicas register as SGLang's do: system_dp_*, attention DP 1
        payload = {"attn_tp_size": self.prefill_tp, "attn_tp_rank": self.rank, "attn_cp_size": self.cp_size,
                   "attn_cp_rank": self.cp_rank,
                   "attn_dp_size": 1 if rep else self.dp_size, "attn_dp_rank": 0 if rep else self.dp_rank,
                   "pp_size": self.pp_size, "pp_rank": self.pp_rank, "system_dp_size": self.dp_size if rep else 1,
                   "system_dp_rank": self.dp_rank if rep else 0, "rank_ip": socket.gethostname(), "rank_port": 0,
                   "page_size": int(self.kv_args.page_size), "kv_cache_dtype": getattr(sa, "kv_cache_dtype", None),
                   "load_balance_method": getattr(sa, "load_balance_method", "follow_bootstrap_room"),
                   "kvfence_rank_base": self.rank_base, "kvfence_mla": self.is_mla_backend,
                   "kvfence_static": self.links is None}
        host, port = self._bootstrap_target()
        sglang_bootstrap.register(host, port, payload)

    def _register_quietly(self):
        try:
            self.register_to_bootstrap()
        except errors.KVFenceError:
            pass  # decode then finds the instance incomplete: its requests fail after link_timeout_s

    def try_ensure_parallel_info(self, bootstrap_addr):
        """Non-blocking, as SGLang's: True once the instance's layout is in
        prefill_info_table (or known to be refused: its receivers fail with
        the reason); else a fetch runs on a thread and SGLang asks again."""
        if bootstrap_addr in self.prefill_info_table or bootstrap_addr in self._bad:
            return True
        with self._lock:
            if bootstrap_addr not in self._fetching:
                self._fetching.add(bootstrap_addr)
                threading.Thread(target=self._fetch, args=(bootstrap_addr,), daemon=True).start()
        return False

    def _fetch(self, addr):
        try:
            info = sglang_bootstrap.fetch_instance(addr)
            if info is not None:
                self._admit(addr, info)
        finally:
            with self._lock:
                self._fetching.discard(addr)

    def _admit(self, addr, info):
        import types
        why = None
        # a prefill with CP: its CP rank 0 writes (the ranks instance() names)
        if int(info.get("kvfence_pp_size", 1)) != self.pp_size:
            why = errors.Unimplemented("kvfence: prefill %s has PP %s, this decode PP %d: kvfence carries equal "
                                       "PP sizes only (docs/sglang.md)"
                                       % (addr, info.get("kvfence_pp_size"), self.pp_size))
        elif self.agent is None and self._size_quietly(info) is not None:
            why = self._size_quietly(info)
        elif int(info["attn_tp_size"]) != self.prefill_tp:
            why = errors.FailedPrecondition("kvfence: prefill %s has TP %s, this decode was sized for prefill_tp %d"
                                            % (addr, info["attn_tp_size"], self.prefill_tp))
        elif (self.dp_size > 1 or self.pp_size > 1) and info.get("kvfence_static", False):
            why = errors.FailedPrecondition(
                "kvfence: prefill %s pairs statically (decode_addrs): DP attention or PP on decode needs M:N "
                "pairing (no decode_addrs on prefill), or its writes would go to one group's ranks" % addr)
        elif info.get("page_size") not in (None, int(self.kv_args.page_size)):
            why = errors.FailedPrecondition("kvfence: prefill %s page size %s, decode %s" % (addr, info["page_size"], self.kv_args.page_size))
        base = int(info["kvfence_rank_base"])
        with self._lock:
            other = self._bases.get(base)
            if why is None and other not in (None, addr):
                why = errors.FailedPrecondition("kvfence: prefill %s and %s share rank base %d: set rank_base" % (addr, other, base))
            if why is not None:
                self._bad[addr] = why
                return
            self._bases[base] = addr
        fields = {k: info.get(k) for k in ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size",
                                            "kv_cache_dtype", "follow_bootstrap_room")}
        self.prefill_info_table[addr] = types.SimpleNamespace(
            **fields, target_tp_ranks=list(self.writers), target_tp_rank=self.writers[0], target_cp_ranks=[0],
            target_pp_ranks=[self.pp_rank], required_dst_info_num=1, required_prefill_response_num=len(self.writers),
            kvfence_ranks=[base + w for w in self.writers], kvfence_base=base)

    def _size_quietly(self, info):
        """Sizes decode from the first prefill instance (M:N, no
        prefill_tp configured); the refusal when it cannot, else None."""
        with self._lock:
            if self.agent is not None:
                return None
            try:
                sglang_layout.check_sizes(int(info["attn_tp_size"]), self.decode_tp)
                self._size_decode(int(info["attn_tp_size"]))
            except errors.KVFenceError as exc:
                return exc
        return None

    def instance(self, addr, dp=0):
        """(kvfence rank ids of the instance's DP group dp, None) or (None,
        refusal) or (None, None) while the instance is not known yet."""
        if addr in self._bad:
            return None, self._bad[addr]
        info = self.prefill_info_table.get(addr)
        if info is None:
            return None, None
        groups = int(info.dp_size or 1)
        if dp is None and groups > 1:
            return None, errors.FailedPrecondition(
                "kvfence: prefill %s uses DP attention (%d groups) and SGLang gave no prefill_dp_rank" % (addr, groups))
        if not 0 <= int(dp or 0) < groups:
            return None, errors.InvalidArgument("kvfence: prefill_dp_rank %s outside prefill %s's %d DP groups"
                                                % (dp, addr, groups))
        group = self.pp_rank * groups + int(dp or 0)  # the prefill's _stage_group: its stages of DP groups
        return [info.kvfence_base + group * self.prefill_tp + w for w in self.writers], None

    # ---- holds and deferred release (newest upstream's names) ----

    def register_deferred_abort_room(self, room):
        return self._gens.get(room, 0)

    def note_abort_ack(self, room, prefill_rank, generation=None):
        """kvfence's ranks ack over its own control plane; nothing to do."""

    def hold(self, room, receiver):
        with self._lock:
            self._held.setdefault(room, []).append(receiver)

    def sweep(self, force=False):
        """Closes the handles of held requests the runtime released, so
        SGLang versions that never ask is_abort_release_safe leak nothing.
        Runs at most every 50 ms unless forced (receivers' polls call it)."""
        now = time.monotonic()
        if not force and now - self._swept < 0.05:
            return
        self._swept = now
        with self._lock:
            rooms = list(self._held)
        for room in rooms:
            self.is_abort_release_safe(room)

    def is_abort_release_safe(self, room, required_acks=None):
        """True once the runtime released every aborted request of room:
        each prefill rank drained, or its writes were fenced or timed out."""
        with self._lock:
            rs = self._held.get(room, [])
            # A handle closed elsewhere (the manager's close, a test) is
            # no longer ours to ask: the runtime keeps its hold either way.
            live = [r for r in rs if not _released_or_closed(r)]
            for r in rs:
                if r not in live:
                    r.close()
            if live:
                self._held[room] = live
            else:
                self._held.pop(room, None)
            return not live

    def clear_deferred_abort_state(self, room):
        """Forgets nothing the runtime still holds."""
        self.is_abort_release_safe(room)

    def submit_prefill_recompute(self, kv_receiver, payload=None):
        """Newest upstream's PD true-retraction rebootstrap (decode asks the
        prefill worker to recompute a retracted request's prefix): not
        carried. As upstream's contract says for any failure here, the
        request fails through KVPoll.Failed (Unimplemented), never raises."""
        kv_receiver.refuse(errors.Unimplemented(
            "kvfence: room %s: PD rebootstrap (prefill recompute of a retracted request) is not supported"
            % getattr(kv_receiver, "room", "?")))

    def held_rooms(self):
        self.sweep(force=True)
        with self._lock:
            return sorted(self._held)

    def linked(self):
        """Prefill: every agent's link to its decode rank is up."""
        return all(a.linked for a in self.agents)

    def close(self):
        for a in self.agents or [getattr(self, "agent", None)]:
            if a is not None:
                a.close()
        # Held requests' handles die with their agent: closed here, not
        # whenever the collector reaches them (a count of open handles
        # taken meanwhile would shift).
        with self._lock:
            held, self._held = getattr(self, "_held", {}), {}
        for rs in held.values():
            for r in rs:
                r.close()
        if getattr(self, "links", None) is not None:
            self.links.close()
        for name in ("layout", "state_layout"):
            layout = getattr(self, name, None)
            if layout is not None:
                layout.close()


class KVFenceKVSender(_Outcome, BaseKVSender):
    """Prefill's side of one request (SGLang's sender): one kvfence sender
    per decode rank this prefill rank serves."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=0,
                 req_has_disagg_prefill_dp_rank=False, *args, **kwargs):
        self._serial = threading.RLock()  # see _never_raises
        self.mgr, self.room = mgr, int(bootstrap_room or 0)
        self.gen = mgr.next_gen(self.room)
        self.snds = []
        self.created = time.monotonic()
        self.total = self.aux_index = self.waiting_since = None
        self.sent = self.bytes = 0
        self.backlog = []  # chunks sent while the pool was full, in order
        self.state_idx = None  # the state index arrays (int64 copies), from the send() that carried state_indices
        self.inited = self.aborted = self.closed = False
        self.links_used = []  # M:N: the agents this request acquired from mgr.links
        if mgr.dp_size > 1 and not self._route_dp(bootstrap_addr, req_has_disagg_prefill_dp_rank):
            return
        if mgr.links is not None:
            mgr.links.sweep()
            return  # the senders are made once decode announced itself (poll)
        try:
            for a, (_, part, parts) in zip(mgr.agents, mgr.targets):
                snd = a.sender(self.room, self.gen)
                snd.pages_reserved = False
                self.snds.append((snd, part, parts))
        except errors.KVFenceError as exc:
            self._fail(exc)

    def _route_dp(self, bootstrap_addr, routed):
        """DP attention, as SGLang's senders do: with rooms following
        bootstrap_room, a request on another DP group than room % dp_size
        fails at once (decode expects that group's writers); otherwise
        this group registers the room (POST /register_dp_rank, off the
        scheduler thread) for decode's query_prefill_dp_ranks."""
        m = self.mgr
        if routed:
            return True
        if m.follow_room:
            if self.room % m.dp_size == m.dp_rank:
                return True
            self._fail(errors.FailedPrecondition(
                "kvfence: room %d is on prefill DP group %d; with follow_bootstrap_room decode expects group %d"
                % (self.room, m.dp_rank, self.room % m.dp_size)))
            return False
        threading.Thread(target=sglang_bootstrap.request, daemon=True,
                         args=("POST", "http://%s/register_dp_rank" % bootstrap_addr,
                               {"bootstrap_room": self.room, "dp_rank": m.dp_rank})).start()
        return True

    def _fail(self, err):
        super()._fail(err)
        self._release()
        return KVPoll.Failed

    def _release(self):
        """Aborts and drops the kvfence senders: their source pages come
        back only when no posted write can still read them."""
        if self.closed:
            return
        self._interleave("release")
        self.closed = True
        for snd, _, _ in self.snds:
            for step in (snd.abort, snd.close):
                try:
                    step()
                except errors.KVFenceError:
                    pass
        self._release_links()

    def _release_links(self):
        """M:N: this request no longer uses its links (idle ones close)."""
        if self.mgr.links is not None:
            self.mgr.links.forget((self.room, self.gen))
            for a in self.links_used:
                self.mgr.links.release(a)
            self.links_used = []

    @_never_raises
    def init(self, num_kv_indices, aux_index=None):
        self.total, self.aux_index = int(num_kv_indices), aux_index
        self.started = self.waiting_since = time.monotonic()
        self._try_init()

    def _try_init(self):
        """Reserves source pages on every target; a full pool is
        backpressure until pool_wait_s (then ResourceExhausted)."""
        if self.inited or self.conclude_state is not None or self.total is None:
            return  # a send before init (optimistic prefill) waits in the backlog
        if self.mgr.links is not None and not self.linked_once:
            return  # M:N: no kvfence senders before decode's ranks are linked
        for snd, _, _ in self.snds:
            if snd.pages_reserved:
                continue
            try:
                snd.init(self.total + self.mgr.extra_pages)
                snd.pages_reserved = True
            except errors.ResourceExhausted as exc:
                if time.monotonic() - self.waiting_since > self.mgr.pool_wait_s:
                    self._fail(exc)
                return
            except errors.KVFenceError as exc:
                self._fail(exc)
                return
        self.inited = True
        backlog, self.backlog = self.backlog, []
        for chunk in backlog:
            self._stage(chunk)

    prefix_len = 0  # tokens decode already holds (its radix cache; M:N only)

    def pop_decode_prefix_len(self):
        return self.prefix_len

    def should_send_kv_chunk(self, num_pages, last_chunk):
        return num_pages > 0 or last_chunk

    @_never_raises
    def send(self, kv_indices, state_indices=None, token_position_offset=0, *args, **kwargs):
        """Queues the chunk's copy on Go threads and returns; never raises.

        The copy reads SGLang's pages after send() returned. That is safe
        because SGLang frees a prefill request's KV pages (release_kv_cache)
        only once the TP-reduced poll() is Success or Failed (prefill.py:
        process_disagg_prefill_inflight_queue, handle_bootstrap_failure;
        an optimistic prefill is released only while its bootstrap is
        pending, before any send()). So no copy may run once poll() is
        terminal: Success needs every page acked, and the library marks
        pages sendable and the request finished only after the gather job
        copied them (kvfence_sender_gather); Failed is reported only after
        _fail aborted the kvfence senders (Abort waits for the step being
        copied, the queued steps stop, close settles them); and
        failure_exception() fails the request the same way when another
        rank's Failed ended it."""
        if self.conclude_state is not None or self.aborted:
            return
        if sglang_state.given(state_indices) or (self.mgr.state_pages and state_indices is not None):
            # The indices now (SGLang may reuse its index arrays); Go checks
            # them and copies the items on a Go thread before Success, as the
            # KV pages are: SGLang frees the request's state
            # (release_kv_cache) only once poll() is Success or Failed.
            m = self.mgr
            self.state_idx = sglang_state.index_arrays(m.state_plan, state_indices)
        if not self._position_in_order(token_position_offset):
            return
        if not self.inited:
            self._try_init()
        if not self.inited:
            self.backlog.append(staging.as_indices(kv_indices))  # SGLang may reuse its array
            return
        self._stage(kv_indices)

    position = None  # the last chunk's token_position_offset

    def _position_in_order(self, offset):
        """SGLang's token_position_offset is the request-local position of
        the chunk's first entry. Its in-tree backends place KV pages by the
        chunk's order alone (the running page count) and use the offset
        only for compressed state buckets (DSA/SWA; kvfence carries those
        state rows whole with the last chunk), so here it moves no page; it is checked, not trusted: a negative
        or decreasing offset means chunks out of order, and the request
        fails InvalidArgument rather than land pages where decode does not
        expect them."""
        try:
            offset = operator.index(offset)  # int or numpy integer; never a float
        except TypeError:
            self._fail(errors.InvalidArgument("kvfence: room %d: token_position_offset %r is not an integer"
                                              % (self.room, offset)))
            return False
        if offset < 0 or (self.position is not None and offset < self.position):
            self._fail(errors.InvalidArgument(
                "kvfence: room %d: token_position_offset %d after %s: chunks out of order"
                % (self.room, offset, "nothing" if self.position is None else self.position)))
            return False
        self.position = offset
        return True

    def _stage(self, kv_indices):
        n = len(kv_indices)
        last = self.total is not None and self.sent + n >= self.total
        upto = self.sent + n
        try:
            for snd, part, parts in self.snds:
                total = 0
                if last:
                    total = upto = self.total + self.mgr.extra_pages
                    self._write_extra(snd)
                staging.gather(snd, self.mgr.layout, kv_indices, self.sent, upto=upto, total=total, part=part, parts=parts)
        except errors.KVFenceError as exc:
            if not isinstance(exc, (errors.NotFound, errors.FailedPrecondition)) or not self.aborted:
                self._fail(exc)
            return
        self.sent += n
        self.bytes += n * self.mgr.shard_bytes * len(self.snds)

    def _write_extra(self, snd):
        """The state row and the aux row go into the pages after the KV
        pages, sent with the last pages, both copied on the sender's Go
        staging thread after the queued gathers: the state row straight
        from SGLang's state buffers (only the index arrays are passed; Go
        expands one Mamba slot, or an SWA window of many pages, from the
        manager's registered StateLayout), then the aux row (tens of bytes, copied now), last:
        it opens SGLang's metadata gate on decode. The last gather, queued
        after them, sends and finishes the request, so Success waits for
        both."""
        m = self.mgr
        if m.state_pages:
            if self.state_idx is None:
                raise errors.InvalidArgument("kvfence: room %d: the last chunk carried no state_indices for a model "
                                             "with %s state" % (self.room, sglang_state.names(m.kv_args)))
            staging.gather_state_queued(snd, self.total + m.aux_pages, m.state_pages, m.state_layout, self.state_idx)
        if m.aux_pages:
            row = _aux_row(m.kv_args, self.aux_index, m.aux_bytes)
            staging.write_queued(snd, self.total, ctypes.addressof(row), len(row), count=m.aux_pages)

    @_never_raises
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        if self.aborted:
            return self._fail(errors.Unavailable("kvfence: room %d aborted" % self.room))
        if self.mgr.links is not None and not self.linked_once and not self._linked_on_demand():
            return KVPoll.Bootstrapping if self.conclude_state is None else KVPoll.Failed
        if self.total is None:
            # Bootstrapped once every link to decode is up.
            if self.mgr.links is not None or self.mgr.linked():
                return KVPoll.WaitingForInput
            if self._timed_out(self.created, self.mgr.link_timeout_s, "decode never linked"):
                self._release()
                return KVPoll.Failed
            return KVPoll.Bootstrapping
        if not self.inited:
            self._try_init()
            return KVPoll.WaitingForInput if self.conclude_state is None else KVPoll.Failed
        return self._transfer_state()

    def _linked_on_demand(self):
        """M:N: finds where this request's decode ranks are (announced at
        this instance's bootstrap server), links to each on demand; True
        once every one is linked. Fails after link_timeout_s."""
        m = self.mgr
        m.links.sweep()
        if not self.snds:
            host, port = m._bootstrap_target()
            got = m.links.lookup("%s:%d" % (host, port), self.room, (self.room, self.gen))
            addrs = None if got is None else got[0]
            if got is not None:
                self.prefix_len = got[1]
            if addrs is None:
                self._timed_out(self.created, m.link_timeout_s, "decode of room %d never announced itself" % self.room)
                return False
            if len(addrs) != m.decode_tp * m.pp_size:
                self._fail(errors.FailedPrecondition("kvfence: room %d's decode instance has %d ranks, this prefill "
                                                     "was sized for decode_tp %d x PP %d"
                                                     % (self.room, len(addrs), m.decode_tp, m.pp_size)))
                return False
            addrs = addrs[m.pp_rank * m.decode_tp:(m.pp_rank + 1) * m.decode_tp]  # this PP stage's decode ranks
            try:
                for dr, part, parts in m.targets:
                    a = m.links.acquire(addrs[dr], dr)
                    self.links_used.append(a)
                    snd = a.sender(self.room, self.gen)
                    snd.pages_reserved = False
                    self.snds.append((snd, part, parts))
            except errors.KVFenceError as exc:
                self._fail(exc)
                return False
        if all(a.linked for a in self.links_used):
            self.linked_once = True  # a link lost later fails the transfer (the kvfence senders say so)
            return True
        if self._timed_out(self.created, m.link_timeout_s, "decode never linked"):
            self._release()
        return False

    linked_once = False

    def _transfer_state(self):
        if self.mgr.is_dummy_cp_rank:  # done once SGLang sent its last chunk, as SGLang's dummy CP ranks
            if self.sent >= self.total:
                self.conclude_state = KVPoll.Success
            return self.conclude_state or KVPoll.WaitingForInput
        st = KVPoll.Success
        staged = self.staged or self.sent >= self.total  # once the last gather ended, no need to ask again
        for snd, _, _ in self.snds:
            try:
                staged = staging.gather_wait(snd) and staged if not self.staged else True
            except errors.KVFenceError as exc:
                return self._fail(exc)
            s = snd.poll()
            if s == KVPoll.Failed:
                return self._fail(snd.failure() or errors.Unavailable("kvfence: room %d failed" % self.room))
            st = min(st, s)
        self.staged = staged
        if st == KVPoll.Success:
            self.conclude_state = KVPoll.Success
        return st

    staged = False

    def get_transfer_metric(self):
        if KVTransferMetric is None:
            return None
        lat = time.monotonic() - self.started if self.started else None
        return KVTransferMetric(transfer_latency_s=lat, transfer_total_bytes=self.bytes)

    @_never_raises
    def abort(self):
        self.aborted = True
        self._fail(errors.Unavailable("kvfence: room %d aborted" % self.room))

    @_never_raises
    def clear(self):
        """Drops the handles; source pages come back only when no posted
        write can still read them (the runtime decides)."""
        if self.closed:
            return
        self.closed = True
        for snd, _, _ in self.snds:
            try:
                snd.close()
            except errors.KVFenceError:
                pass
        self._release_links()


class KVFenceKVReceiver(_Outcome, BaseKVReceiver):
    """Decode's side of one request (SGLang's receiver)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None, *args, **kwargs):
        self._serial = threading.RLock()  # see _never_raises
        self.mgr, self.room, self.bootstrap_addr = mgr, int(bootstrap_room or 0), bootstrap_addr
        self.gen = mgr.next_gen(self.room)
        self.rv = self.ranks = self.kv_indices = self.aux_index = self.aux_row = None
        self.state_indices = self.state_row = self.kv_pinned = None
        self.created = time.monotonic()
        self.metadata_at = None
        self.scattering = self.aborted = self.held = False
        self.require_staging = False  # what SGLang's decode queue reads

    @_never_raises
    def init(self, *args, **kwargs):
        """main-2606 on: init(prefill_dp_rank), the prefill DP group
        that has the request; older: init(kv_indices, aux_index,
        state_indices), which also sends the metadata (no DP group)."""
        self.init_called = True
        dp = kwargs.pop("prefill_dp_rank", args[0] if args else None)
        try:
            self.dp = operator.index(dp)
        except TypeError:
            self.dp = None  # the older call order: kv_indices first
        self._resolve()
        if args and self.dp is None:
            self.send_metadata(*args, **kwargs)

    def _resolve(self):
        """Finds the writers from the bootstrap server (never blocks)."""
        if self.ranks is not None or self.conclude_state is not None:
            return
        self.mgr.try_ensure_parallel_info(self.bootstrap_addr)
        info = self.mgr.prefill_info_table.get(self.bootstrap_addr)
        if self.dp is None and not self.init_called and info is not None and int(info.dp_size or 1) > 1:
            # SGLang main polls its pending receivers before it resolved
            # their DP group: init(prefill_dp_rank) is still to come
            self._timed_out(self.created, self.mgr.link_timeout_s, "no init(prefill_dp_rank)")
            return
        ranks, why = self.mgr.instance(self.bootstrap_addr, self.dp)
        if why is not None:
            self._fail(why)
        elif ranks is not None:
            self.ranks = ranks
            self._announce()
        else:
            self._timed_out(self.created, self.mgr.link_timeout_s, "prefill instance %s never registered" % self.bootstrap_addr)

    def _announce(self):
        """Says where this decode rank listens (M:N), off the scheduler
        thread; with decode's radix cache on, also whether and (once
        send_metadata said it) which prefix decode already holds: prefill
        waits for it before WaitingForInput, as Mooncake's does."""
        m = self.mgr
        extra = {"radix": True, "decode_prefix_len": self.prefix} if m.radix else {}
        if m.radix and self.prefix is None:
            extra.pop("decode_prefix_len")
        threading.Thread(target=sglang_links.announce, daemon=True,
                         # every PP stage's ranks as one list, stage major
                         args=(self.bootstrap_addr, self.room, m.decode_tp * m.pp_size,
                               m.pp_rank * m.decode_tp + m.rank, m.agent.addr, self.created + m.link_timeout_s),
                         kwargs=extra).start()

    prefix = None  # decode_prefix_len (tokens) once send_metadata gave it, radix cache on
    init_called = False
    dp = None  # the prefill DP group init(prefill_dp_rank) named

    @_never_raises
    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
        if self.conclude_state is not None or self.aborted:
            return  # an aborted receiver is never exposed
        if decode_prefix_len and not self.mgr.radix:
            self._fail(errors.InvalidArgument(
                "kvfence: decode_prefix_len %d without decode's radix cache configured (server args "
                "disaggregation_decode_enable_radix_cache or config decode_radix_cache)" % decode_prefix_len))
            return
        if self.mgr.state_bytes:
            sglang_state.check(self.mgr.kv_args, state_indices, self.mgr.state_items)
            # int64 copies (SGLang may reuse its arrays), pinned for the handoff
            self.state_indices = staging.pin_state(sglang_state.index_arrays(self.mgr.state_plan, state_indices))
        elif sglang_state.given(state_indices):
            self._fail(errors.InvalidArgument("kvfence: state_indices for a model without state buffers"))
            return
        if self.mgr.radix:
            self.prefix = int(decode_prefix_len or 0)
            if self.ranks is not None:
                self._announce()  # else _resolve announces it once the prefill instance is known
        self.kv_indices = staging.as_indices(kv_indices)  # no per-page Python loop on the scheduler thread
        self.kv_pinned = staging.pin(self.kv_indices)  # the handoff poll then touches no numpy
        self.aux_index = aux_index
        self.metadata_at = time.monotonic()
        self._expose()

    def _expose(self):
        """Opens the request on kvfence once every writer is linked and the
        pool has room; both wait at most their bounds."""
        m = self.mgr
        if not all(m.agent.linked(r) for r in self.ranks):
            self._timed_out(self.metadata_at, m.link_timeout_s, "prefill ranks %s not linked" % self.ranks)
            return
        try:
            if self.rv is None:
                self.rv = m.agent.receiver(self.room, self.gen)
            if m.direct:  # the KV lands in SGLang's pages kv_indices, the rows in host landing pages
                staging.init_at(self.rv, sglang_direct.landing_indices(
                    self.kv_indices, self.aux_index, m.direct_pages, m.extra_pages), self.ranks)
            else:
                self.rv.init(len(self.kv_indices) + m.extra_pages, self.ranks)
            self.exposed = True
        except errors.ResourceExhausted as exc:
            if time.monotonic() - self.metadata_at > m.pool_wait_s:
                self._fail(exc)
        except errors.Unavailable:
            # a writer agreed to close its idle link since the check above
            # (agent/link_quiesce.go): wait for its next link, as unlinked
            self._timed_out(self.metadata_at, m.link_timeout_s, "prefill ranks %s not linked" % self.ranks)
        except errors.KVFenceError as exc:
            self._fail(exc)

    exposed = False

    def _fail(self, err):
        super()._fail(err)
        self._let_go()
        return KVPoll.Failed

    def _let_go(self):
        """The request is over for SGLang: the handle closes once kvfence
        released its slots (held by the manager until then)."""
        if self.rv is None or self.held:
            return
        self._interleave("let_go")
        if self.scattering:
            try:
                staging.scatter_done(self.rv, _SCATTER_WAIT_S)
            except errors.KVFenceError:
                pass
            self.scattering = False
        self.held = True
        if not self.exposed:  # init refused (a page still lent, ...): nothing was lent, nothing to hold
            self.rv.close()
            return
        self.rv.abandon()  # finished if handed off (also since the last poll), else aborted
        self.mgr.hold(self.room, self.rv)

    @_never_raises
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        self.mgr.sweep()
        if self.ranks is None:
            self._resolve()
            return KVPoll.Bootstrapping if self.conclude_state is None else KVPoll.Failed
        if self.kv_indices is None:
            return KVPoll.WaitingForInput
        if not self.exposed:
            self._expose()
            return KVPoll.WaitingForInput if self.conclude_state is None else KVPoll.Failed
        if self.scattering:
            return self._scatter_state()
        st = self.rv.poll()
        if st == KVPoll.Success and self.mgr.direct:
            return self._landed()
        if st == KVPoll.Success:
            return self._start_scatter()
        if st == KVPoll.Failed:
            return self._fail(self.rv.failure() or errors.Unavailable("kvfence: room %d failed" % self.room))
        return st

    def _landed(self):
        """Direct mode: the KV is in SGLang's pages already; the state row is
        copied from its host landing pages on a Go thread, then the aux row;
        finishing gives kvfence's account of them back (SGLang owns them
        from here on)."""
        try:
            self._read_extra()
            self._scatter_state_row()
        except errors.KVFenceError as exc:
            return self._fail(exc)
        self.scattering = True
        return self._scatter_state()

    # ---- SGLang's deferred decode-KV release (direct mode's hold) ----

    @property
    def abort_notified(self):
        """What SGLang's transfer queue reads on a failed request: true
        (hold its pages until the manager's is_abort_release_safe) when
        kvfence's transport may have written SGLang's pages, i.e. a direct
        request that was exposed. Staged requests never touch them."""
        return bool(self.mgr.direct and self.exposed)

    @property
    def bootstrap_infos(self):
        """One entry per prefill rank that may write (SGLang's required
        acks); is_abort_release_safe answers for all of them at once."""
        return [{"rank": r} for r in (self.ranks or [])] if self.exposed else []

    def ensure_abort_notified(self, force_arm=False):
        """Newest SGLang on a failure decode did not start: kvfence's hold
        already began when the request failed; make sure it did."""
        self.abort()

    def retry_abort(self):
        """Newest SGLang after its release timeout: the hold is kvfence's
        and still bounded by drain, fence or max_hold; nothing to resend."""

    def _start_scatter(self):
        """Handed off: one call checks the state row's copy (SWA/DSA headers
        before anything is queued) and the KV scatter, reads the aux row
        (small), then queues the copies on a Go thread; Success once all
        are in place. One call, one lookup of the request's pages, one job
        started only after the checks (issue 20 item 6: three calls cost
        this poll ~250 µs of CPU with an SWA state row)."""
        m = self.mgr
        try:
            aux = None
            if m.aux_pages and self.aux_index is not None:
                aux = (len(self.kv_indices), m.aux_pages, m.shard_bytes, m.aux_bytes)
            row = staging.handoff(self.rv, m.layout, self.kv_pinned, shards=m.shards, mla=m.is_mla_backend,
                                  state=self._state_row_args(), aux=aux)
            if aux is not None:
                self.aux_row = row
        except errors.KVFenceError as exc:
            return self._fail(exc)
        self.scattering = True
        # The job was queued just now: the next poll asks whether it ended
        # (asking here too cost this poll ~25 µs of CPU, issue 20 item 6).
        return KVPoll.Transferring

    def _state_row_args(self):
        """(first, count, shard, layout, index arrays) of the state row's
        copy into SGLang's state buffers, or None without state."""
        m = self.mgr
        if not m.state_pages:
            return None
        return (len(self.kv_indices) + m.aux_pages, m.state_pages, m.shard_bytes, m.state_layout, self.state_indices)

    def _scatter_state_row(self):
        """Queues the state row's copy from the pages after the aux row into
        SGLang's state buffers on the receiver's Go thread (only the index
        arrays are passed; Go expands the items, headers and unused room
        skipped). SWA/DSA: prefill's lists must match decode's: Go checks
        the headers at the call (FailedPrecondition before any byte of the
        row or the aux row is written)."""
        args = self._state_row_args()
        if args is not None:
            staging.scatter_state(self.rv, *args)

    def _read_extra(self):
        """The aux row, read from the pages after the KV pages (staged
        slots, or direct mode's host landing pages)."""
        m = self.mgr
        if m.aux_pages and self.aux_index is not None:
            self.aux_row = self._read_rows(len(self.kv_indices), m.aux_pages, m.aux_bytes)

    def _write_extra(self):
        """Copies the aux row into SGLang's buffers once the state row's
        queued copy ended: the aux row opens SGLang's metadata gate."""
        if self.aux_row is not None:
            _write_aux(self.mgr.kv_args, self.aux_index, self.aux_row)

    def _read_rows(self, first, count, size=None):
        """The first size bytes (all by default) of count pages from first
        on as one row: page j of writer 0 is shard 0 of slot j (the aux and
        state rows are written by writer 0's rank alike; every writer sends
        them). Only the row's bytes are read (whole 128 KiB slots, just
        written by the plugin, cost decode's poll() ~300 µs of CPU)."""
        m = self.mgr
        return staging.read_row(self.rv, first, count, m.shard_bytes, count * m.shard_bytes if size is None else size)

    def _scatter_state(self):
        try:
            if not staging.scatter_done(self.rv):
                return KVPoll.Transferring
        except errors.KVFenceError as exc:
            return self._fail(exc)
        self.scattering = False
        self._write_extra()
        self.rv.finish()
        self.conclude_state = KVPoll.Success
        return KVPoll.Success

    @_never_raises
    def abort(self):
        self.aborted = True
        if self.conclude_state is None:
            self._fail(errors.Unavailable("kvfence: room %d aborted" % self.room))

    @_never_raises
    def refuse(self, err):
        """Fails the request with err (a classified reason) as abort() does."""
        self.aborted = True
        if self.conclude_state is None:
            self._fail(err)

    def abort_for_deferred_release(self):
        self.abort()

    @_never_raises
    def clear(self):
        """Drops this object's claim: a request kvfence still holds stays
        held (the manager closes it once released); nothing is freed here."""
        if self.conclude_state is None:
            self.abort()
        elif self.rv is not None and not self.held:
            self.rv.close()
            self.held = True  # nothing left to let go


class KVFenceBootstrapServer(BaseKVBootstrapServer):
    """SGLang starts one per prefill instance: SGLang's routes
    (kvfence.sglang_bootstrap) plus GET /kvfence."""

    def __init__(self, host, port, *args, **kwargs):
        ttl = float(os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL", 120))
        self.server = sglang_bootstrap.Server(host, port, entry_ttl_s=ttl)
        self.host, self.port = host, self.server.port

    def poll(self):
        return KVPoll.Success

    def close(self):
        self.server.close()


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
