"""Run by test_sglang_queues.py in a fresh interpreter with $SGLANG_SRC (the
python/ directory of an SGLang checkout outside this repository): imports
SGLang's own disaggregation modules (decode.py, prefill.py, utils.py,
common/conn.py, base/conn.py), unmodified, with every module they pull that
is not there (torch, zmq, aiohttp, the rest of sglang.srt) replaced by
permissive stubs, then drives kvfence's classes through SGLang's real queue
methods: DecodePreallocQueue._resolve_pending_reqs / _ensure_prefill_info /
_resolve_prefill_dp_rank / _update_handshake_waiters, SGLang's
poll_and_all_reduce (a MIN over the TP ranks' threads), and
CommonKVReceiver.query_prefill_dp_ranks against kvfence's bootstrap server.
Prints one line per scenario and OK at the end."""
import ctypes
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import types
import urllib.request

SRC = os.environ["SGLANG_SRC"]
HERE = os.path.dirname(os.path.abspath(__file__))
REAL = {"sglang.srt.disaggregation.base", "sglang.srt.disaggregation.base.conn", "sglang.srt.disaggregation.utils",
        "sglang.srt.disaggregation.decode", "sglang.srt.disaggregation.prefill", "sglang.srt.disaggregation.common",
        "sglang.srt.disaggregation.common.conn", "sglang.srt.disaggregation.common.utils"}
PACKAGES = {"sglang": "sglang", "sglang.srt": "sglang/srt", "sglang.srt.disaggregation": "sglang/srt/disaggregation"}


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Dummy

    def __getitem__(cls, item):
        return Dummy

    def __or__(cls, other):
        return Dummy

    __ror__ = __or__


class Dummy(metaclass=_Meta):
    """Anything a stubbed module is asked for: a class, callable, value."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Dummy()

    def __call__(self, *a, **k):
        return Dummy()

    def __bool__(self):
        return False

    def get(self, *a):
        return None


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Dummy


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in REAL:
            return None
        if name in PACKAGES:
            spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
            spec.submodule_search_locations = [os.path.join(SRC, PACKAGES[name])]
            return spec
        top = name.split(".")[0]
        if top in ("sglang", "torch", "zmq", "aiohttp", "requests", "triton", "transformers", "psutil", "pydantic",
                   "setproctitle", "msgspec", "orjson", "uvloop", "fastapi", "einops"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = (types.ModuleType if spec.name in PACKAGES else StubModule)(spec.name)  # real packages: no stub attributes
        m.__path__ = spec.submodule_search_locations or []
        return m

    def exec_module(self, module):
        fill = STUBS.get(module.__name__)
        if fill:
            fill(module)


# ---- the few stubs whose behaviour matters ----

class _Resp:
    def __init__(self, status, body):
        self.status_code, self.text = status, body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.text)


def _http(method, url, json_body=None, timeout=5):
    data = json.dumps(json_body).encode() if json_body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return _Resp(r.status, r.read())
    except urllib.error.HTTPError as e:
        return _Resp(e.code, e.read())


def _requests(m):
    m.get = lambda url, timeout=5, **k: _http("GET", url, None, timeout)
    m.post = lambda url, json=None, timeout=5, **k: _http("POST", url, json, timeout)
    m.put = lambda url, json=None, timeout=5, **k: _http("PUT", url, json, timeout)


class Tensor:
    def __init__(self, data):
        self.data = list(data)

    def tolist(self):
        return list(self.data)


class Group:
    """A gloo group of n threads: all_reduce MIN with a barrier."""

    def __init__(self, n):
        self.n, self.barrier, self.lock, self.buf = n, threading.Barrier(n), threading.Lock(), None

    def min_reduce(self, t):
        with self.lock:
            self.buf = list(t.data) if self.buf is None else [min(a, b) for a, b in zip(self.buf, t.data)]
        self.barrier.wait()
        t.data = list(self.buf)
        if self.barrier.wait() == 0:
            self.buf = None
        self.barrier.wait()


def _torch(m):
    m.tensor = lambda data, dtype=None, device=None: Tensor(data)
    m.uint8 = "uint8"


def _dist(m):
    m.ReduceOp = types.SimpleNamespace(MIN="min")
    m.all_reduce = lambda t, op=None, group=None: group.min_reduce(t) if group is not None else None
    m.ProcessGroup = Group


def _network(m):
    class NetworkAddress:
        def __init__(self, host, port):
            self.host, self.port = host, int(port)

        def to_host_port_str(self):
            return "%s:%d" % (self.host, self.port)

        def to_url(self):
            return "http://" + self.to_host_port_str()
    m.NetworkAddress = NetworkAddress


class _EnvVar:
    def __init__(self, v=None):
        self.v = v

    def get(self):
        return self.v


def _environ(m):
    class Envs:
        def __getattr__(self, name):
            return _EnvVar({"SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL": 120,
                            "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": 4096}.get(name))
    m.envs = Envs()


def _server_args(m):
    m.ServerArgs = type("ServerArgs", (), {})


def _mem_cache_common(m):
    """mem_cache/common.py pulls torch kernels: only SGLang's own page
    arithmetic (kv_to_page_indices, kv_to_page_num, page_align_floor) is
    taken from it, compiled from the checkout's source."""
    import ast
    path = os.path.join(SRC, "sglang", "srt", "mem_cache", "common.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    want = {"kv_to_page_indices", "kv_to_page_num", "page_align_floor"}
    tree.body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in want]
    for n in tree.body:  # annotations may name types the stubs lack
        n.returns = None
        for a in n.args.args:
            a.annotation = None
    assert {n.name for n in tree.body} == want, "SGLang's mem_cache/common.py changed"
    exec(compile(tree, path, "exec"), m.__dict__)


STUBS = {"requests": _requests, "torch": _torch, "torch.distributed": _dist, "sglang.srt.utils.network": _network,
         "sglang.srt.environ": _environ, "sglang.srt.server_args": _server_args,
         "sglang.srt.utils": lambda m: setattr(m, "is_npu", lambda: False),
         "sglang.srt.mem_cache.common": _mem_cache_common}

sys.meta_path.insert(0, Finder())
sys.path.insert(0, SRC)
sys.path.insert(0, HERE)
import torch  # noqa: E402,F401  (the stub; decode.py's `import torch.distributed` needs the parent)
from sglang.srt.disaggregation import decode as sg_decode  # noqa: E402  (SGLang's own)
from sglang.srt.disaggregation import prefill as sg_prefill  # noqa: E402,F401
from sglang.srt.disaggregation import utils as sg_utils  # noqa: E402
from sglang.srt.disaggregation.common.conn import CommonKVReceiver  # noqa: E402
from sglang.srt.disaggregation.base.conn import BaseKVReceiver, BaseKVSender, KVPoll, StateType  # noqa: E402

from kvfence import sglang as kv  # noqa: E402
import numpy as np  # noqa: E402
import sglang_topo  # noqa: E402
from sglang_topo import Deployment  # noqa: E402

assert issubclass(kv.KVFenceKVReceiver, BaseKVReceiver) and issubclass(kv.KVFenceKVSender, BaseKVSender)


def tp_run(n, fn):
    """fn(rank) on n threads at once (the TP ranks of one scheduler), so
    SGLang's all_reduce meets every rank; re-raises a rank's exception."""
    out, errs = [None] * n, []

    def run(r):
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errs.append(exc)
    # daemon: a rank stuck at a barrier after another failed must not keep the process alive
    ts = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    if errs:
        raise errs[0]
    if any(t.is_alive() for t in ts):
        raise AssertionError("a TP rank's call did not return within 60 s")
    return out


class Req:
    def __init__(self, room, host, port):
        self.rid, self.bootstrap_room, self.bootstrap_host, self.bootstrap_port = "r%d" % room, room, host, port
        self.disagg_prefill_dp_rank = None
        self.time_stats = Dummy()
        self.finished_reason = None
        self.return_logprob = False


def prealloc_queues(dep):
    """One DecodePreallocQueue per decode TP rank, with only what the queue
    methods under test read (SGLang builds the rest from the scheduler)."""
    g = Group(dep.dtp)
    qs = []
    for d, mgr in enumerate(dep.dec):
        q = object.__new__(sg_decode.DecodePreallocQueue)
        q.kv_manager, q.gloo_group, q.tp_rank = mgr, g, d
        q.queue, q.pending_reqs = [], []
        q._ensure_last_attempt_time, q._ensure_retry_count = {}, {}
        q._ensure_retry_interval, q._max_ensure_retries = 0.0, 10_000
        q.scheduler = types.SimpleNamespace(metrics_reporter=types.SimpleNamespace(enable_metrics=False))
        qs.append(q)
    return qs


def handshake(dep, qs, inst, room):
    """DecodePreallocQueue.add's receivers, then SGLang's own
    _resolve_pending_reqs and _update_handshake_waiters until every rank's
    request waits for input (or failed)."""
    host, port = dep.instances[inst]["addr"].rsplit(":", 1)
    drs = []
    for q, mgr in zip(qs, dep.dec):
        req = Req(room, host, int(port))
        dr = sg_decode.DecodeRequest(req=req, kv_receiver=kv.KVFenceKVReceiver(mgr, "%s:%s" % (host, port), room))
        q.queue.append(dr)
        q.pending_reqs.append(dr)
        drs.append(dr)

    def step(d):
        qs[d]._resolve_pending_reqs()
        qs[d]._update_handshake_waiters()
        return drs[d].waiting_for_input or drs[d].kv_receiver.conclude_state == KVPoll.Failed
    Deployment.until(lambda: all(tp_run(dep.dtp, step)), "SGLang's handshake")
    return drs


def transfer(dep, drs, snds, room, aux_index):
    """SGLang's poll_and_all_reduce on both sides until both end."""
    pg = Group(len(snds))
    done = {}

    def step():
        d = tp_run(dep.dtp, lambda r: sg_utils.poll_and_all_reduce([drs[r].kv_receiver], drs[0] and qs_group(drs))[0])
        p = tp_run(len(snds), lambda r: sg_utils.poll_and_all_reduce([snds[r]], pg)[0])
        gate = all(e.room_row(aux_index) == room for e in dep.d_eng)
        done["d"], done["p"] = (3 if d[0] == 4 and not gate else d[0]), p[0]
        return done["d"] in (0, 4) and done["p"] in (0, 4)
    Deployment.until(step, "transfer")
    return done["d"], done["p"]


_GROUPS = {}


def qs_group(drs):
    """The decode ranks' gloo group of one request's receivers. The list is
    kept with its group: an id is unique only while its object lives, and a
    later list of another length reusing it got a barrier for the wrong
    number of ranks (a hang, seen once)."""
    return _GROUPS.setdefault(id(drs), (drs, Group(len(drs))))[1]


def scenario_topology(ptp, dtp, mla=False):
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(ptp,), decode_tp=dtp, mla=mla)
    try:
        qs = prealloc_queues(dep)
        room, d_idx, p_idx, aux = 501, [3, 1, 7], [2, 4, 6], 2
        drs = handshake(dep, qs, 0, room)
        assert all(dr.waiting_for_input for dr in drs)
        assert dep.instances[0]["addr"] in dep.dec[0].prefill_info_table  # filled as SGLang's own backends do
        for dr in drs:
            dr.kv_receiver.send_metadata(d_idx, aux, [], decode_prefix_len=0)
        snds = dep.senders(0, room)
        dep.prefill(0, snds, room, 1, p_idx, aux)
        d, p = transfer(dep, drs, snds, room, aux)
        bad = dep.corrupt(room, 1, d_idx)
        for x in [dr.kv_receiver for dr in drs] + snds:
            x.clear()
        assert (d, p, bad) == (4, 4, 0), (d, p, bad)
        print("prefill TP%d -> decode TP%d%s: Success, 0 corrupt heads" % (ptp, dtp, " MLA" if mla else ""))
    finally:
        dep.close()


def scenario_aborts_and_instances():
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2, 2), decode_tp=1,
                     extra=dict(slots=16, source_pages=16))
    try:
        qs = prealloc_queues(dep)
        # Abort in the prealloc queue after the handshake: SGLang aborts the
        # receiver, its own _update_handshake_waiters sees conclude_state and
        # reports Failed; send_metadata afterwards exposes nothing.
        drs = handshake(dep, qs, 0, 601)
        drs[0].kv_receiver.abort()
        qs[0]._update_handshake_waiters()
        assert drs[0].kv_receiver.poll() == KVPoll.Failed
        drs[0].kv_receiver.send_metadata([1, 2], 1, [], decode_prefix_len=0)
        assert dep.slots_in_use() == 0
        drs[0].kv_receiver.clear()
        qs[0].queue.clear()
        # Abort after send_metadata, mid-transfer.
        drs = handshake(dep, qs, 0, 602)
        drs[0].kv_receiver.send_metadata([1, 2, 3], 1, [], decode_prefix_len=0)
        snds = dep.senders(0, 602)
        for s in snds:
            s.init(3, 1)
            s.send([4], None)
        drs[0].kv_receiver.abort()
        d, p = transfer(dep, drs, snds, 602, 1)
        assert d == 0, d
        for x in [drs[0].kv_receiver] + snds:
            x.clear()
        qs[0].queue.clear()
        # The second instance (another rank base) through SGLang's own
        # dp-rank query against kvfence's bootstrap server.
        boot = dep.instances[1]["addr"]
        sg_utils_req = sys.modules["requests"]
        sg_utils_req.post("http://%s/register_dp_rank" % boot, json={"bootstrap_room": 603, "dp_rank": 0})
        assert CommonKVReceiver.query_prefill_dp_ranks(boot, [603, 604]) == {"603": 0}
        drs = handshake(dep, qs, 1, 603)
        drs[0].kv_receiver.send_metadata([5, 6], 3, [], decode_prefix_len=0)
        snds = dep.senders(1, 603)
        dep.prefill(1, snds, 603, 1, [1, 2], 3)
        d, p = transfer(dep, drs, snds, 603, 3)
        assert (d, p) == (4, 4) and dep.corrupt(603, 1, [5, 6]) == 0
        for x in [drs[0].kv_receiver] + snds:
            x.clear()
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("aborts in prealloc and mid-transfer settle; second instance via query_prefill_dp_ranks: Success, "
              "0 corrupt, 0 slots or holds left")
    finally:
        dep.close()


class PReq(Req):
    """What PrefillBootstrapQueue reads of a request."""

    def __init__(self, room, host, port, tokens):
        super().__init__(room, host, port)
        self.origin_input_ids = list(range(tokens))
        self.sampling_params = types.SimpleNamespace(max_new_tokens=None)
        self.metadata_buffer_index = -1
        self.is_retracted = False
        self.time_stats = types.SimpleNamespace(prefill_retry_count=0, set_bootstrap_done_time=lambda: None,
                                                set_wait_queue_entry_time=lambda: None)


class Allocator:
    def __init__(self, n):
        self.free = list(range(n))

    def available_size(self):
        return len(self.free)

    def alloc(self):
        return self.free.pop(0) if self.free else None


def bootstrap_queues(dep, inst, failures):
    """One PrefillBootstrapQueue per prefill TP rank with what add(),
    pop_bootstrapped() and finalize_bootstrap() read; get_kv_class routed
    to kvfence as kvfence's plugin hook routes SGLang's."""
    sg_prefill.get_kv_class = lambda backend, class_type: kv.KVFenceBackendProvider().get_kv_class(
        str(getattr(class_type, "value", class_type)).lower())
    mgrs = dep.instances[inst]["mgrs"]
    tp = Group(len(mgrs))
    qs = []
    for r, mgr in enumerate(mgrs):
        q = object.__new__(sg_prefill.PrefillBootstrapQueue)
        q.kv_manager, q.tp_rank, q.pp_rank, q.queue = mgr, r, 0, []
        q.bootstrap_port = int(dep.instances[inst]["addr"].rsplit(":", 1)[1])
        q.transfer_backend, q.max_total_num_tokens = "kvfence", 1 << 20
        q.req_to_metadata_buffer_idx_allocator = Allocator(8)
        q.token_to_kv_pool = types.SimpleNamespace(page_size=2)
        q.scheduler = types.SimpleNamespace(attn_cp_cpu_group=Group(1), attn_tp_cpu_group=tp,
                                            server_args=types.SimpleNamespace(optimistic_prefill_retries=0),
                                            handle_bootstrap_failure=failures.append)
        qs.append(q)
    return qs


def scenario_prefill_queue():
    """SGLang's own PrefillBootstrapQueue.add / pop_bootstrapped /
    finalize_bootstrap (prefill TP2) into decode TP1, then a request whose
    decode never answers: SGLang's pop_bootstrapped gets Failed after the
    bound and calls handle_bootstrap_failure; nothing raises."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2,), decode_tp=1, extra=dict(link_timeout_s=2))
    try:
        failures = []
        qs, dq = bootstrap_queues(dep, 0, failures), prealloc_queues(dep)
        host, port = dep.instances[0]["addr"].rsplit(":", 1)
        drs = handshake(dep, dq, 0, 701)
        drs[0].kv_receiver.send_metadata([1, 2], 1, [], decode_prefix_len=0)
        reqs = [PReq(701, host, port, 4) for _ in qs]
        for q, req in zip(qs, reqs):
            q.add(req, num_kv_heads=2)
        popped = []
        Deployment.until(lambda: popped.extend(sum(tp_run(len(qs), lambda r: qs[r].pop_bootstrapped()), [])) or
                         len(popped) == len(qs), "SGLang's pop_bootstrapped")
        assert all(not r.pending_bootstrap and r.metadata_buffer_index >= 0 for r in reqs)
        snds = [r.disagg_kv_sender for r in reqs]
        aux = reqs[0].metadata_buffer_index
        for e, s in zip(dep.instances[0]["engs"], snds):
            e.fill(701, 1, [3, 4], False)
            e.set_aux(aux, 701, 1)
            s.send([3, 4], [])  # send_kv_chunk's last chunk
        d, p = transfer(dep, drs, snds, 701, 1)
        assert (d, p) == (4, 4) and dep.corrupt(701, 1, [1, 2]) == 0, (d, p)
        for x in [drs[0].kv_receiver] + snds:
            x.clear()
        # The decode instance dies: a new request never bootstraps and fails
        # after link_timeout_s through SGLang's own failure path.
        for m in dep.dec:
            m.close()
        Deployment.until(lambda: not any(m.linked() for m in dep.instances[0]["mgrs"]), "links down")
        dead = [PReq(702, host, port, 4) for _ in qs]
        for q, req in zip(qs, dead):
            q.add(req, num_kv_heads=2)
        Deployment.until(lambda: tp_run(len(qs), lambda r: qs[r].pop_bootstrapped()) and False or
                         len(failures) == len(qs), "SGLang's handle_bootstrap_failure")
        for req in dead:
            try:
                req.disagg_kv_sender.failure_exception()
                raise AssertionError("no failure recorded")
            except kv.errors.Unavailable:
                pass
            req.disagg_kv_sender.clear()
        print("SGLang's PrefillBootstrapQueue.add/pop_bootstrapped/finalize_bootstrap, prefill TP2 -> decode TP1: "
              "Success, 0 corrupt heads; decode gone: Failed after link_timeout_s via handle_bootstrap_failure")
    finally:
        dep.close()


class TArr(np.ndarray):
    """What SGLang's queues do with a torch index tensor: index, slice,
    arithmetic (newest upstream hands the tensor to kv_to_page_indices
    as is), .cpu().numpy()."""

    def __new__(cls, a):
        return np.asarray(a).view(cls)

    def __getitem__(self, key):
        got = super().__getitem__(key)
        return got if isinstance(got, np.ndarray) else np.asarray(got).view(TArr)  # torch: a 0-d tensor

    def cpu(self):
        return self

    def numpy(self):
        return np.asarray(self)


STATE_ITEMS = (24, 40)  # a Mamba conv and temporal state: bytes per slot
STATE_SLOTS = 6


class StateEngine(sglang_topo.Engine):
    """sglang_topo's engine with Mamba state buffers (SGLang's StateType)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.state = [(ctypes.c_char * (STATE_SLOTS * n))() for n in STATE_ITEMS]

    def kv_args(self, cls, rank, dp=0):
        a = super().kv_args(cls, rank, dp)
        a.state_types = [StateType.MAMBA]
        a.state_data_ptrs = [[ctypes.addressof(b) for b in self.state]]
        a.state_data_lens = [[len(b) for b in self.state]]
        a.state_item_lens = [list(STATE_ITEMS)]
        return a

    def slot(self, idx):
        return b"".join(bytes(b[idx * n:(idx + 1) * n]) for b, n in zip(self.state, STATE_ITEMS))

    def set_slot(self, idx, data):
        for b, n in zip(self.state, STATE_ITEMS):
            b[idx * n:(idx + 1) * n], data = data[:n], data[n:]


def state_row(room, rank):
    return hashlib.shake_128(b"mamba/%d/%d" % (room, rank)).digest(sum(STATE_ITEMS))


def token_row(prefix_pages, pages, first_prefix_page=20):
    """A req_to_token row: the prefix on pages from first_prefix_page on,
    then pages, PAGE_SIZE tokens each."""
    ps = sglang_topo.PAGE_SIZE
    locs = [p * ps + t for p in list(range(first_prefix_page, first_prefix_page + prefix_pages)) + list(pages)
            for t in range(ps)]
    return np.array(locs, dtype=np.int32)


def decode_state_queues(dep, prefix_tokens, d_pages, d_slot, pool_idx=3):
    """prealloc_queues plus what pop_preallocated reads: SGLang's own
    pop_preallocated computes the delta page indices past the radix
    prefix, the Mamba payload and decode_prefix_len, and calls
    send_metadata. Only its memory accounting is replaced (a pool with
    room) and the radix match returns prefix_tokens held."""
    ps = sglang_topo.PAGE_SIZE
    qs = prealloc_queues(dep)
    row = token_row(prefix_tokens // ps, d_pages)
    for q in qs:
        q.scheduler = types.SimpleNamespace(
            metrics_reporter=types.SimpleNamespace(enable_metrics=False), running_batch=types.SimpleNamespace(reqs=[]),
            enable_priority_scheduling=False, enable_hisparse=False, enable_decode_hicache=False,
            server_args=types.SimpleNamespace(disaggregation_decode_enable_radix_cache=True))
        table = np.zeros((8, len(row)), dtype=np.int32)
        mamba = np.zeros(8, dtype=np.int64)
        q.req_to_token_pool = types.SimpleNamespace(available_size=lambda: 8, req_to_token=TArr(table),
                                                    req_index_to_mamba_index_mapping=TArr(mamba))
        q.req_to_metadata_buffer_idx_allocator = Allocator(8)
        q.token_to_kv_pool_allocator = types.SimpleNamespace(page_size=ps)
        q.transfer_queue, q.tree_cache = types.SimpleNamespace(enable_staging=False), Dummy()
        q.num_reserved_decode_tokens = 0
        q._uses_swa_tail_prealloc = lambda: False
        q._allocatable_token_budgets = lambda **k: 1 << 20
        q._hicache_pending_restore_tokens = lambda: 0
        q._required_alloc_tokens = lambda fill_len, prefix_len: fill_len - prefix_len
        q._match_prefix_and_lock = lambda req, n=prefix_tokens: types.SimpleNamespace(
            prefix_indices=list(range(n)), l1_prefix_len=n, decode_prefix_len=n, restore_token_count=0)

        def pre_alloc(req, prefix_indices, prefix_len, total_prefix_len, table=table, mamba=mamba):
            req.req_pool_idx = pool_idx
            table[pool_idx, :] = row
            mamba[pool_idx] = d_slot
            return TArr(row[prefix_len:])
        q._pre_alloc = pre_alloc
    return qs


def send_kv_chunks(dep, reqs, snds, room, p_prefix, p_pages, p_slot, aux):
    """SGLang's own send_kv_chunk (the prefill scheduler mixin) on each
    prefill rank: two chunks from start_send_idx (decode's prefix), the
    last with the aux row and the Mamba payload. The state slot stays the
    request's until the transfer ends: SGLang frees it in release_kv_cache
    (mem_cache/common.py), which prefill.py calls once the TP-reduced poll
    is Success or Failed (reuse_state_slots, after transfer)."""
    ps = sglang_topo.PAGE_SIZE
    row = token_row(p_prefix // ps, p_pages, first_prefix_page=24)
    mid = p_prefix + ps * (len(p_pages) // 2)
    for r, (req, snd, eng, mgr) in enumerate(zip(reqs, snds, dep.instances[0]["engs"], dep.instances[0]["mgrs"])):
        eng.fill(room, 1, p_pages, dep.mla)
        eng.set_slot(p_slot, state_row(room, r))
        table, mamba = np.zeros((8, len(row)), dtype=np.int32), np.zeros(8, dtype=np.int64)
        table[5, :], mamba[5] = row, p_slot
        req.req_pool_idx, req.fill_len = 5, len(row)
        sched = types.SimpleNamespace(
            token_to_kv_pool_allocator=types.SimpleNamespace(page_size=ps),
            req_to_token_pool=types.SimpleNamespace(req_to_token=TArr(table), req_index_to_mamba_index_mapping=TArr(mamba)),
            disagg_metadata_buffers=types.SimpleNamespace(set_buf=lambda q, e=eng: e.set_aux(aux, room, 1)),
            disagg_prefill_bootstrap_queue=types.SimpleNamespace(kv_manager=mgr))
        sg_prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk(sched, req, False, mid)
        sg_prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk(sched, req, True)


def reuse_state_slots(dep, p_slot):
    """Prefill reuses its state slot once the request ended (SGLang's
    release_kv_cache): nothing written then may reach decode."""
    for eng in dep.instances[0]["engs"]:
        eng.set_slot(p_slot, b"\0" * sum(STATE_ITEMS))


def scenario_state_and_prefix(tp):
    """Mamba state_indices and decode_prefix_len through SGLang's own
    DecodePreallocQueue.pop_preallocated, PrefillBootstrapQueue
    add/pop_bootstrapped/finalize_bootstrap and send_kv_chunk (M:N, decode
    radix cache on, prefill TP = decode TP = tp): only the pages past the
    prefix travel, every head of them and each rank's state row land,
    decode's prefix pages and other state slots are never written."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(tp,), decode_tp=tp, on_demand=True, engine=StateEngine,
                     decode_extra=dict(decode_radix_cache=True))
    try:
        room, prefix, d_pages, p_pages, d_slot, p_slot = 801, 2 * sglang_topo.PAGE_SIZE, [7, 3, 9, 12], [2, 5, 6, 11], 4, 1
        before = [(bytes(b), e.item) for e in dep.d_eng for b in e.kv]
        qs = decode_state_queues(dep, prefix, d_pages, d_slot)
        drs = handshake(dep, qs, 0, room)
        for dr in drs:
            dr.req.origin_input_ids = list(range(prefix + sglang_topo.PAGE_SIZE * len(d_pages)))
            dr.req.output_ids, dr.req.priority = [], 0
            dr.req.sampling_params = types.SimpleNamespace(max_new_tokens=16)
        popped = tp_run(tp, lambda d: qs[d].pop_preallocated()[0])
        assert all(len(p) == 1 for p in popped), popped
        aux = drs[0].metadata_buffer_index
        assert all(dr.kv_receiver.error is None for dr in drs), [dr.kv_receiver.error for dr in drs]
        assert all(list(dr.kv_receiver.kv_indices) == d_pages for dr in drs)  # SGLang's delta pages
        failures = []
        pq = bootstrap_queues(dep, 0, failures)
        host, port = dep.instances[0]["addr"].rsplit(":", 1)
        reqs = [PReq(room, host, port, prefix + sglang_topo.PAGE_SIZE * len(p_pages)) for _ in pq]
        for q, req in zip(pq, reqs):
            q.add(req, num_kv_heads=2)
        got = []
        Deployment.until(lambda: got.extend(sum(tp_run(tp, lambda r: pq[r].pop_bootstrapped()), [])) or
                         len(got) == tp, "SGLang's pop_bootstrapped after decode's prefix")
        assert all(r.start_send_idx == prefix for r in reqs), [r.start_send_idx for r in reqs]
        snds = [r.disagg_kv_sender for r in reqs]
        send_kv_chunks(dep, reqs, snds, room, prefix, p_pages, p_slot, reqs[0].metadata_buffer_index)
        d, p = transfer(dep, drs, snds, room, aux)
        assert (d, p) == (4, 4), (d, p, failures)
        reuse_state_slots(dep, p_slot)
        assert dep.corrupt(room, 1, d_pages) == 0
        for r, e in enumerate(dep.d_eng):
            assert e.slot(d_slot) == state_row(room, r), "rank %d's state row" % r
            assert all(e.slot(i) == b"\0" * sum(STATE_ITEMS) for i in range(STATE_SLOTS) if i != d_slot)
        after = [bytes(b) for e in dep.d_eng for b in e.kv]
        for (b0, item), b1 in zip(before, after):
            for page in range(len(b0) // item):
                if page not in d_pages:
                    assert b0[page * item:(page + 1) * item] == b1[page * item:(page + 1) * item], "page %d" % page
        for x in [dr.kv_receiver for dr in drs] + snds:
            x.clear()
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("Mamba state_indices + decode_prefix_len %d via SGLang's pop_preallocated, finalize_bootstrap and "
              "send_kv_chunk, TP%d -> TP%d: Success, 0 corrupt heads, state rows in place, prefix pages untouched"
              % (prefix, tp, tp))
    finally:
        dep.close()


def scenario_prealloc_abort_and_rebootstrap():
    """Through SGLang's own pop_preallocated (TP1 -> TP1, M:N): a request
    aborted (FINISH_ABORT) while it waits in the prealloc queue is never
    exposed (newest upstream clears its receiver there, main @ 9e9fde14
    leaves that to the scheduler: cleared here), nothing stays held; on
    SGLang with PD rebootstrap (DecodeRequest.is_rebootstrap), a
    rebootstrap request's submit_prefill_recompute fails it Unimplemented
    through poll instead of raising into the scheduler."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(1,), decode_tp=1, on_demand=True)
    try:
        qs = decode_state_queues(dep, 0, [7, 3], 0)
        streamed = []
        qs[0].scheduler.output_streamer = types.SimpleNamespace(stream_output=lambda reqs, lp: streamed.extend(reqs))
        rooms = (811, 812) if "is_rebootstrap" in sg_decode.DecodeRequest.__dataclass_fields__ else (811,)
        drs = [handshake(dep, qs, 0, room)[0] for room in rooms]
        for dr in drs:
            dr.req.origin_input_ids = list(range(sglang_topo.PAGE_SIZE * 2))
            dr.req.output_ids, dr.req.priority = [], 0
            dr.req.sampling_params = types.SimpleNamespace(max_new_tokens=16)
        aborted, rv = drs[0], drs[0].kv_receiver
        aborted.req.finished_reason = sg_decode.FINISH_ABORT()
        if len(drs) > 1:
            drs[1].is_rebootstrap = True
            drs[1].req.build_rebootstrap_payload = lambda: {"rid": drs[1].req.rid}
        popped, failed = qs[0].pop_preallocated()
        assert failed == [aborted] and streamed == [aborted.req], (failed, streamed)
        assert rv.rv is None and dep.slots_in_use() == 0, "an aborted receiver was exposed"
        rv.clear()  # upstream already did (and dropped it); clear is idempotent
        if len(drs) > 1:
            assert popped == [drs[1]], popped
            assert drs[1].kv_receiver.poll() == KVPoll.Failed
            try:
                drs[1].kv_receiver.failure_exception()
                raise AssertionError("no failure recorded")
            except kv.errors.Unimplemented:
                pass
            drs[1].kv_receiver.clear()
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("abort in the prealloc queue via SGLang's pop_preallocated: never exposed, 0 slots or holds left%s"
              % ("; PD rebootstrap: Failed (Unimplemented) through poll" if len(drs) > 1 else ""))
    finally:
        dep.close()


def group_request(dep, g, room, d_idx, p_idx, aux, dp=0):
    """One request to decode group (or replica) g from prefill group dp,
    through each decode rank's own DecodePreallocQueue handshake and SGLang's
    poll_and_all_reduce; every head checked; its handles cleared."""
    dep.use(0, g)
    drs = handshake(dep, prealloc_queues(dep), 0, room)
    rvs = [dr.kv_receiver for dr in drs]
    writers = set().union(*(rv.ranks for rv in rvs))
    want = {m.kv_rank for m in dep.group(0, dp)[1] if not m.is_dummy_cp_rank}
    assert {rv.dp or 0 for rv in rvs} == {dp} and writers == want, writers
    for dr in drs:
        dr.kv_receiver.send_metadata(d_idx, aux, [], decode_prefix_len=0)
    snds = dep.senders(0, room, dp=dp)
    dep.prefill(0, snds, room, 1, p_idx, aux, dp=dp)
    d, p = transfer(dep, drs, snds, room, aux)
    assert (d, p) == (4, 4) and dep.corrupt(room, 1, d_idx) == 0, (g, d, p)
    for x in [dr.kv_receiver for dr in drs] + snds:
        x.clear()


def scenario_decode_dp_attention():
    """DP attention on decode (2 groups of TP2, prefill TP2): each group's
    own DecodePreallocQueue runs SGLang's handshake for a request of its
    own at the same page indices; each lands in its group's pool only."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2,), decode_tp=2, decode_dp=2, on_demand=True)
    try:
        d_idx, p_idx, aux = [5, 9], [1, 8], 4
        for g, room in ((0, 961), (1, 962)):
            group_request(dep, g, room, d_idx, p_idx, aux)
        dep.use(0, 0)
        assert dep.corrupt(961, 1, d_idx) == 0, "group 0's pages changed by group 1's request"
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("decode DP attention (2 groups of TP2) <- prefill TP2 via SGLang's handshake and poll_and_all_reduce: "
              "Success, 0 corrupt heads, each group's pool only")
    finally:
        dep.close()


def scenario_pipeline_parallel():
    """PP 2 on both sides (prefill TP2, decode TP1): every decode stage's
    own DecodePreallocQueue runs SGLang's _resolve_pending_reqs and
    _update_handshake_waiters; each stage gets its own layers from the same
    stage's prefill ranks through SGLang's poll_and_all_reduce."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2,), decode_tp=1, pp=2, on_demand=True)
    try:
        room, d_idx, p_idx, aux = 951, [6, 2], [4, 7], 3
        stages = []
        for s in (0, 1):
            dep.use(0, 0, s)
            drs = handshake(dep, prealloc_queues(dep), 0, room)
            for dr in drs:
                dr.kv_receiver.send_metadata(d_idx, aux, [], decode_prefix_len=0)
            stages.append(drs)
        for s in (0, 1):
            dep.use(0, 0, s)
            snds = dep.senders(0, room)
            dep.prefill(0, snds, room, 1, p_idx, aux)
            d, p = transfer(dep, stages[s], snds, room, aux)
            assert (d, p) == (4, 4) and dep.corrupt(room, 1, d_idx) == 0, (s, d, p)
            for x in [dr.kv_receiver for dr in stages[s]] + snds:
                x.clear()
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("PP 2 (prefill TP2 -> decode TP1 per stage) via SGLang's handshake and poll_and_all_reduce: "
              "Success, 0 corrupt heads in either stage's layers")
    finally:
        dep.close()


def scenario_dp_attention():
    """Prefill with DP attention (2 groups, round robin): the request on
    group 1 registers its room; SGLang's own _resolve_pending_reqs finds
    no DP rank locally, asks query_prefill_dp_ranks and calls
    init(prefill_dp_rank=1); decode reads group 1's writers only."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2,), decode_tp=1, prefill_dp=2, balance="round_robin")
    try:
        room = 901
        snds = dep.senders(0, room, dp=1)
        drs = handshake(dep, prealloc_queues(dep), 0, room)
        rv = drs[0].kv_receiver
        assert rv.dp == 1 and set(rv.ranks) == {m.kv_rank for m in dep.group(0, 1)[1]}, (rv.dp, rv.ranks)
        rv.send_metadata([4, 9], 2, [], decode_prefix_len=0)
        dep.prefill(0, snds, room, 1, [3, 5], 2, dp=1)
        d, p = transfer(dep, drs, snds, room, 2)
        assert (d, p) == (4, 4) and dep.corrupt(room, 1, [4, 9]) == 0, (d, p)
        for x in [rv] + snds:
            x.clear()
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("prefill DP attention (2 groups of TP2, round robin) -> decode TP1 via SGLang's query_prefill_dp_ranks "
              "and init(prefill_dp_rank): Success, 0 corrupt heads")
    finally:
        dep.close()


def scenario_dp_replicas():
    """dp-size 2 without DP attention on both sides (replicas of prefill TP2
    and of decode TP1, follow_bootstrap_room): SGLang's own
    _resolve_prefill_dp_rank picks room % 2 from the prefill_info_table
    kvfence filled, each decode replica's DecodePreallocQueue runs the
    handshake; each request lands in its decode replica's pool only,
    written by its prefill replica's ranks."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2,), decode_tp=1, prefill_dp=2, decode_dp=2,
                     on_demand=True, replicas=True)
    try:
        d_idx, p_idx, aux = [5, 9], [1, 8], 4
        for g, room in ((0, 971), (1, 972)):
            group_request(dep, g, room, d_idx, p_idx, aux, dp=room % 2)
        dep.use(0, 0)
        assert dep.corrupt(971, 1, d_idx) == 0, "replica 0's pages changed by replica 1's request"
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("dp-size 2 without DP attention (prefill 2 x TP2 -> decode 2 x TP1) via SGLang's "
              "_resolve_prefill_dp_rank and handshake: Success, 0 corrupt heads, each replica's pool only")
    finally:
        dep.close()


def scenario_prefill_cp():
    """Prefill attn-cp-size 2 (TP2 per CP rank) -> decode TP1: SGLang's
    handshake resolves the instance; senders on all four prefill ranks,
    MIN-reduced by SGLang's poll_and_all_reduce; CP rank 0 writes, the
    dummies' other bytes never land."""
    dep = Deployment(kv.KVFenceBackendProvider(), prefill_tp=(2,), decode_tp=1, cp=2, on_demand=True)
    try:
        group_request(dep, 0, 981, [5, 9], [1, 8], 4)
        Deployment.until(lambda: dep.held() == 0 and dep.slots_in_use() == 0, "holds released")
        print("prefill CP 2 x TP2 -> decode TP1 via SGLang's handshake and poll_and_all_reduce over every CP rank: "
              "Success, 0 corrupt heads (CP rank 0 writes)")
    finally:
        dep.close()


from kvfence import staging  # noqa: E402

live = staging.handles_live()
for ptp, dtp, mla in ((1, 1, False), (2, 1, False), (1, 2, False), (4, 2, False), (2, 2, False), (2, 1, True)):
    scenario_topology(ptp, dtp, mla)
scenario_aborts_and_instances()
scenario_prefill_queue()
for tp in (1, 2):
    scenario_state_and_prefix(tp)
scenario_dp_attention()
scenario_prealloc_abort_and_rebootstrap()
scenario_pipeline_parallel()
scenario_decode_dp_attention()
scenario_dp_replicas()
scenario_prefill_cp()
assert staging.handles_live() == live, "handles leaked: %d" % (staging.handles_live() - live)
print("OK")
