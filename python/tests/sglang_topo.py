"""A whole disaggregated deployment in one process for kvfence's SGLang
classes: one decode instance (TP D) and one or more prefill instances (TP P
each), every TP rank its own manager and kvfence agent, driven in SGLang's
scheduler order with the TP MIN-reduce of poll states on each side and the
decode metadata gate. Heads are split contiguously over TP ranks as SGLang
splits them; every byte is a function of (room, generation, buffer, page,
token, global head), so a misplaced head or a stale generation is caught.
MLA: one latent per token, the same on every prefill rank."""
import ctypes
import hashlib
import json
import os
import time
import types

HEADS = 4         # KV heads in all (divides every TP size used)
HEAD_BYTES = 8
LAYERS = 2        # K and V per layer: 4 buffers
PAGE_SIZE = 2
PAGES = 32
AUX_ROWS = 8


def head_bytes(room, gen, buf, n, tok, head):
    return hashlib.blake2b(b"%d/%d/%d/%d/%d/%d" % (room, gen, buf, n, tok, head), digest_size=HEAD_BYTES).digest()


class Engine:
    """One scheduler process's memory: KV buffers holding heads
    [first_head, first_head + heads) and aux rows of aux_items bytes."""

    def __init__(self, heads, first_head, aux_items):
        self.heads, self.first_head = heads, first_head
        self.item = PAGE_SIZE * heads * HEAD_BYTES
        self.kv = [(ctypes.c_char * (PAGES * self.item))() for _ in range(2 * LAYERS)]
        self.aux_items = list(aux_items)
        self.aux = [(ctypes.c_char * (AUX_ROWS * n))() for n in self.aux_items]

    layer0 = 0  # the first layer's buffer index in the whole model (PP stage s holds its own layers)
    pp = 0  # its PP stage
    cp = 0  # its prefill CP rank

    def kv_args(self, cls, rank, dp=0):
        """SGLang's KVArgs: rank is the engine_rank (prefill: global TP
        rank; decode: the attention TP rank), dp the system_dp_rank."""
        a = cls()
        a.engine_rank = rank
        a.kv_data_ptrs = [ctypes.addressof(b) for b in self.kv]
        a.kv_data_lens = [len(b) for b in self.kv]
        a.kv_item_lens = [self.item] * len(self.kv)
        a.aux_data_ptrs = [ctypes.addressof(b) for b in self.aux]
        a.aux_data_lens = [len(b) for b in self.aux]
        a.aux_item_lens = list(self.aux_items)
        a.state_types, a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], [], []
        a.page_size, a.kv_head_num, a.pp_rank, a.system_dp_rank = PAGE_SIZE, self.heads, self.pp, dp
        a.prefill_start_layer, a.gpu_id, a.ib_device = 0, 0, ""
        return a

    def fill(self, room, gen, indices, mla):
        for n, idx in enumerate(indices):
            for b in range(2 * LAYERS):
                for t in range(PAGE_SIZE):
                    for h in range(self.heads):
                        off = idx * self.item + (t * self.heads + h) * HEAD_BYTES
                        head = 0 if mla else self.first_head + h
                        self.kv[b][off:off + HEAD_BYTES] = head_bytes(room, gen, self.layer0 + b, n, t, head)

    def corrupt_heads(self, room, gen, indices, mla):
        bad = 0
        for n, idx in enumerate(indices):
            for b in range(2 * LAYERS):
                for t in range(PAGE_SIZE):
                    for h in range(self.heads):
                        off = idx * self.item + (t * self.heads + h) * HEAD_BYTES
                        head = 0 if mla else self.first_head + h
                        bad += bytes(self.kv[b][off:off + HEAD_BYTES]) != head_bytes(room, gen, self.layer0 + b, n, t, head)
        return bad

    def set_aux(self, aux_index, room, salt):
        """Every aux buffer's row: derived from (room, salt); the last
        buffer's first 8 bytes are bootstrap_room (SGLang's gate)."""
        for i, n in enumerate(self.aux_items):
            row = hashlib.shake_256(b"%d/%d/%d" % (room, salt, i)).digest(n)
            if i == len(self.aux_items) - 1:
                row = room.to_bytes(8, "little") + row[8:]
            self.aux[i][aux_index * n:(aux_index + 1) * n] = row

    def aux_row(self, aux_index):
        return [bytes(self.aux[i][aux_index * n:(aux_index + 1) * n]) for i, n in enumerate(self.aux_items)]

    def room_row(self, aux_index):
        n = self.aux_items[-1]
        return int.from_bytes(bytes(self.aux[-1][aux_index * n:aux_index * n + 8]), "little")


def _quietly(f):
    try:
        return f()
    except Exception as exc:  # noqa: BLE001  (a closed handle: say so)
        return repr(exc)


def _min(states):
    return min(int(s) for s in states)


class Deployment:
    def __init__(self, provider, prefill_tp=(2,), decode_tp=1, mla=False, aux_items=(16, 8), extra=None,
                 decode_extra=None, decode_instances=1, on_demand=False, engine=None, prefill_dp=1,
                 balance="follow_bootstrap_room", decode_dp=1, pp=1, replicas=False, cp=1):
        """on_demand: prefill gets no decode_addrs (M:N, links on demand);
        decode_instances > 1 needs it. self.dec/self.d_eng are the decode
        instance requests use (self.use(i) picks another). engine: an
        Engine subclass (e.g. one with state buffers). prefill_dp: SGLang's
        DP attention on every prefill instance, prefill_dp groups of
        prefill_tp ranks (engine_rank the global TP rank, group major);
        balance: their load_balance_method. decode_dp: DP attention on every
        decode instance, decode_dp groups of decode_tp ranks (needs
        on_demand); self.use(i, g) picks group g. pp: pipeline stages on
        both sides (needs on_demand), each stage's engines holding their
        own layers (Engine.layer0); self.use(i, g, stage) picks a stage.
        replicas: prefill_dp / decode_dp are SGLang's dp-size without DP
        attention instead (replicas, each a whole TP group: engine_rank
        the TP rank, system_dp_rank the replica, tp_size one replica's).
        cp: SGLang's attn-cp-size on every prefill instance: each group's
        ranks are CP ranks of prefill_tp ranks; every CP rank holds the
        request's KV, but CP ranks other than 0 hold it as another
        generation's bytes, so a write from one of them shows as corrupt."""
        self.Eng = engine or Engine
        self.mla, self.dtp, self.pdp, self.ddp, self.pp = mla, decode_tp, prefill_dp, decode_dp, pp
        self.replicas, self.cp = replicas, cp
        self.kvargs, self.manager = provider.get_kv_class("kvargs"), provider.get_kv_class("manager")
        self.Sender, self.Receiver = provider.get_kv_class("sender"), provider.get_kv_class("receiver")
        # KVFENCE_TEST_LOG=info: the agents' log on stderr (shown for a failed test)
        base = dict(slots=64, source_pages=64, log_level=os.environ.get("KVFENCE_TEST_LOG", "error"), decode=dict(lease_ms=5000, max_hold_ms=10000),
                    prefill=dict(heartbeat_ms=100), link_timeout_s=30)
        base.update(extra or {})
        # on_demand: decode learns prefill's TP from the bootstrap server.
        sizing = {} if on_demand else dict(prefill_tp=prefill_tp[0])
        self.decodes = [self._decode_instance(dict(base, **sizing, **(decode_extra or {})), aux_items)
                        for _ in range(decode_instances)]
        self.use(0)
        addrs = None if on_demand else [m.agent.addr for m in self.dec]
        self.instances = []
        for i, ptp in enumerate(prefill_tp):
            where = dict(decode_tp=decode_tp) if on_demand else dict(decode_addrs=addrs)
            self.instances.append(self._prefill_instance(dict(base, prefill_tp=ptp, rank_base=10000 + 1000 * i,
                                                              **where), ptp, aux_items, balance))
        del os.environ["KVFENCE_SGLANG_CONFIG"]

    def _decode_instance(self, cfg, aux_items):
        """One decode instance's schedulers, stage major, then DP group,
        then rank; KVArgs as SGLang's decode fills them (engine_rank
        tp_rank % attn_tp_size, the DP group in system_dp_rank)."""
        dtp, ddp, pp = self.dtp, self.ddp, self.pp
        heads = 1 if self.mla else HEADS // dtp
        sa = None if ddp == 1 and pp == 1 else types.SimpleNamespace(
            enable_dp_attention=ddp > 1 and not self.replicas, dp_size=ddp,
            tp_size=dtp if self.replicas else dtp * ddp, pp_size=pp)
        os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(cfg, decode_addrs=["127.0.0.1:0"] * dtp * ddp * pp))
        engs, mgrs = [], []
        for d in range(dtp * ddp * pp):
            stage, g = divmod(d, dtp * ddp)
            eng = self.Eng(heads, 0 if self.mla else (g % dtp) * heads, aux_items)
            eng.layer0, eng.pp = stage * 2 * LAYERS, stage
            engs.append(eng)
            mgrs.append(self.manager(eng.kv_args(self.kvargs, g % dtp, g // dtp), "decode", sa, self.mla))
        return engs, mgrs

    def _prefill_instance(self, cfg, ptp, aux_items, balance):
        """One prefill instance: its bootstrap server and schedulers, stage
        major, then DP group (engine_rank the global TP rank)."""
        from kvfence.sglang import KVFenceBootstrapServer
        boot = KVFenceBootstrapServer("127.0.0.1", 0)
        addr = "127.0.0.1:%d" % boot.port
        os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(cfg, bootstrap_addr=addr))
        cp = self.cp
        heads, n = 1 if self.mla else HEADS // ptp, ptp * cp * self.pdp
        sa = None if self.pdp == 1 and self.pp == 1 and cp == 1 else types.SimpleNamespace(
            enable_dp_attention=self.pdp > 1 and not self.replicas, dp_size=self.pdp, attn_cp_size=cp,
            tp_size=ptp * cp if self.replicas else n, host="127.0.0.1", pp_size=self.pp,
            disaggregation_bootstrap_port=boot.port, load_balance_method=balance)
        engs, mgrs = [], []
        for d in range(n * self.pp):
            stage, r = divmod(d, n)
            group, within = divmod(r, ptp * cp)  # SGLang's rank layout: (DP group, CP rank, TP rank)
            eng = self.Eng(heads, 0 if self.mla else (within % ptp) * heads, aux_items)
            eng.layer0, eng.pp, eng.cp = stage * 2 * LAYERS, stage, within // ptp
            engs.append(eng)
            # SGLang's prefill: engine_rank the global TP rank under DP
            # attention, the replica's own TP rank for DP replicas
            rank = within if self.replicas else r
            mgrs.append(self.manager(eng.kv_args(self.kvargs, rank, group), "prefill", sa, self.mla))
        for m in mgrs:
            m.register_to_bootstrap()
        return dict(boot=boot, addr=addr, engs=engs, mgrs=mgrs, tp=ptp)

    def close(self):
        for inst in self.instances:
            for m in inst["mgrs"]:
                m.close()
            inst["boot"].close()
        for _, mgrs in self.decodes:
            for m in mgrs:
                m.close()

    def use(self, i, group=0, stage=0):
        """Requests from now on go to decode instance i (the router's pick),
        its DP group group (decode_dp > 1), and both sides' PP stage stage."""
        engs, mgrs = self.decodes[i]
        lo = (stage * self.ddp + group) * self.dtp
        self.d_eng, self.dec, self.stage = engs[lo:lo + self.dtp], mgrs[lo:lo + self.dtp], stage

    # ---- one request in SGLang's order ----

    def group(self, inst, dp):
        """(engines, managers) of prefill instance inst's DP group dp."""
        i = self.instances[inst]
        n = i["tp"] * self.cp  # with CP, the group's CP ranks too (senders on each, as SGLang)
        lo = (self.stage * self.pdp + dp) * n
        return i["engs"][lo:lo + n], i["mgrs"][lo:lo + n]

    def receivers(self, inst, room, dp=0):
        """DecodePreallocQueue.add + init(prefill_dp_rank) +
        _update_handshake_waiters until WaitingForInput (MIN over decode TP)."""
        rvs = [self.Receiver(m, self.instances[inst]["addr"], room) for m in self.dec]
        for rv in rvs:
            rv.init(dp)
        self.until(lambda: _min(rv.poll() for rv in rvs) >= 2, "decode handshake", show=lambda: self.describe((), rvs))
        return rvs

    def senders(self, inst, room, dp=0):
        snds = [self.Sender(m, self.instances[inst]["addr"], room, [r], 0) for r, m in enumerate(self.group(inst, dp)[1])]
        self.until(lambda: _min(s.poll() for s in snds) >= 2, "prefill bootstrap", show=lambda: self.describe(snds))
        return snds

    @staticmethod
    def until(cond, what, timeout=30, show=None):
        """Waits for cond; on giving up, the message carries show()'s
        account of the parties (a flake is then diagnosable from its log)."""
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() >= end:
                raise AssertionError("stuck: %s%s" % (what, "\n" + show() if show else ""))
            time.sleep(0.005)

    def describe(self, snds=(), rvs=()):
        """The named requests' states and every agent's pools, one line each."""
        lines = []
        for kind, xs in (("sender", snds), ("receiver", rvs)):
            for x in xs:
                hs = [h for h, *_ in x.snds] if kind == "sender" else [x.rv] if x.rv is not None else []
                inner = [_quietly(lambda: (h.poll(), h.failure())) for h in hs]
                fields = {k: v for k, v in vars(x).items() if k not in ("mgr", "snds", "rv", "kv_indices", "aux_row",
                                                                     "backlog", "links_used")}
                lines.append("%s room %d: %r kvfence %r" % (kind, x.room, fields, inner))
        for i, inst in enumerate(self.instances):
            for r, m in enumerate(inst["mgrs"]):
                for a in m.agents or ([e[0] for e in m.links.agents.values()] if m.links is not None else []):
                    lines.append("prefill %d rank %d: %s" % (i, r, _quietly(lambda: json.dumps(a.stats()))))
        for i, (_, mgrs) in enumerate(self.decodes):
            for r, m in enumerate(mgrs):
                if m.agent is not None:
                    c = m.agent.stats()["core"]
                    lines.append("decode %d rank %d: held rooms %s core %s" % (i, r, m.held_rooms(), json.dumps(c)))
        return "\n".join(lines)

    def prefill(self, inst, snds, room, gen, p_idx, aux_index, chunks=2, salt=1, prefix=0, position=None, dp=0):
        """finalize_bootstrap (pop_decode_prefix_len, init), then the chunks
        of send_kv_chunk, the aux row set before the last. position: pass
        newest SGLang's token_position_offset, position + the chunk's first
        token (tokens already held, then page_size per page sent)."""
        for s in snds:
            assert s.pop_decode_prefix_len() == prefix
            s.init(len(p_idx), aux_index)
        engs = self.group(inst, dp)[0]
        for e in engs:
            e.fill(room, gen + 1000 * e.cp, p_idx, self.mla)
        step = max(1, -(-len(p_idx) // chunks))
        for lo in range(0, len(p_idx), step):
            hi = min(lo + step, len(p_idx))
            last = hi == len(p_idx)
            for e, s in zip(engs, snds):
                if last:
                    e.set_aux(aux_index, room, salt + 1000 * e.cp)
                if not s.should_send_kv_chunk(hi - lo, last):
                    continue
                if position is None:
                    s.send(p_idx[lo:hi], [] if last else None)
                else:
                    s.send(p_idx[lo:hi], [] if last else None, token_position_offset=position + lo * PAGE_SIZE)

    def decode_state(self, rvs, aux_index, room):
        """Each rank's poll with the metadata gate, MIN-reduced."""
        out = []
        for rv, e in zip(rvs, self.d_eng):
            st = rv.poll()
            if st == 4 and e.room_row(aux_index) != room:
                st = 3
            out.append(st)
        return _min(out)

    def run(self, rvs, snds, aux_index, room, timeout=30):
        end = time.monotonic() + timeout
        while True:
            d = self.decode_state(rvs, aux_index, room)
            p = _min(s.poll() for s in snds)
            if d in (0, 4) and p in (0, 4):
                return d, p
            if time.monotonic() >= end:
                raise AssertionError("stuck: decode %d prefill %d\n%s" % (d, p, self.describe(snds, rvs)))
            time.sleep(0.005)

    def corrupt(self, room, gen, d_idx):
        return sum(e.corrupt_heads(room, gen, d_idx, self.mla) for e in self.d_eng)

    def request(self, room, n_pages, d_idx, p_idx, aux_index, inst=0, chunks=2, gen=1, position=None, dp=0):
        rvs = self.receivers(inst, room, dp)
        for rv in rvs:
            rv.send_metadata(d_idx, aux_index, None, decode_prefix_len=0)
        snds = self.senders(inst, room, dp)
        self.prefill(inst, snds, room, gen, p_idx, aux_index, chunks, position=position, dp=dp)
        d, p = self.run(rvs, snds, aux_index, room)
        return rvs, snds, d, p

    def held(self):
        return sum(len(m.held_rooms()) for _, mgrs in self.decodes for m in mgrs)

    def slots_in_use(self):
        """Slots assigned, held or handed on every decode rank of every
        decode instance (0 at rest)."""
        n = 0
        for m in (m for _, mgrs in self.decodes for m in mgrs if m.agent is not None):
            c = m.agent.stats()["core"]
            n += c["AssignedSlots"] + c["HeldSlots"] + c["HandedSlots"]
        return n
