"""Drives kvfence's SGLang classes in the order SGLang's scheduler calls
them (disaggregation/prefill.py and decode.py, main-2606): managers built
from a KVArgs the harness fills like the scheduler does, per-request sender
and receiver, TP poll results MIN-reduced across ranks, the aux row written
before the last chunk, and the metadata gate (decode's Success counts only
once the aux bootstrap_room row arrived)."""
import ctypes
import hashlib
import json
import os
import time

from kvfence import errors

LAYERS = 2  # K and V buffer per layer: 4 buffers
PAGE_SIZE = 4
HEAD_BYTES = 8
DECODE_HEADS = 4
PAGES = 16
AUX_ROWS = 8
AUX_ITEMS = [16, 8]  # output ids, bootstrap_room (int64)


class Engine:
    """One scheduler process's memory: KV buffers and aux rows."""

    def __init__(self, heads):
        self.item = PAGE_SIZE * heads * HEAD_BYTES
        self.kv = [(ctypes.c_char * (PAGES * self.item))() for _ in range(2 * LAYERS)]
        self.aux = [(ctypes.c_char * (AUX_ROWS * n))() for n in AUX_ITEMS]

    def kv_args(self, cls, rank):
        a = cls()
        a.engine_rank = rank
        a.kv_data_ptrs = [ctypes.addressof(b) for b in self.kv]
        a.kv_data_lens = [len(b) for b in self.kv]
        a.kv_item_lens = [self.item] * len(self.kv)
        a.aux_data_ptrs = [ctypes.addressof(b) for b in self.aux]
        a.aux_data_lens = [len(b) for b in self.aux]
        a.aux_item_lens = list(AUX_ITEMS)
        a.state_types, a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], [], []
        a.page_size, a.kv_head_num, a.pp_rank, a.system_dp_rank = PAGE_SIZE, 0, 0, 0
        a.prefill_start_layer, a.gpu_id, a.ib_device = 0, 0, ""
        return a

    def room_row(self, aux_index):
        return int.from_bytes(bytes(self.aux[1][aux_index * 8:(aux_index + 1) * 8]), "little")

    def set_aux(self, aux_index, room, first_token):
        self.aux[0][aux_index * 16:(aux_index + 1) * 16] = first_token.to_bytes(16, "little")
        self.aux[1][aux_index * 8:(aux_index + 1) * 8] = room.to_bytes(8, "little")


def head_bytes(room, gen, layer_buf, n, token, head):
    """What global head `head` of token `token` of the request's n-th page
    holds in buffer layer_buf: unique per request generation."""
    return hashlib.blake2b(b"%d/%d/%d/%d/%d/%d" % (room, gen, layer_buf, n, token, head), digest_size=HEAD_BYTES).digest()


def fill_prefill(eng, tp_rank, heads, room, gen, indices):
    for n, idx in enumerate(indices):
        for b in range(2 * LAYERS):
            for t in range(PAGE_SIZE):
                for h in range(heads):
                    off = idx * eng.item + (t * heads + h) * HEAD_BYTES
                    eng.kv[b][off:off + HEAD_BYTES] = head_bytes(room, gen, b, n, t, tp_rank * heads + h)


def check_decode(eng, room, gen, indices):
    bad = 0
    for n, idx in enumerate(indices):
        for b in range(2 * LAYERS):
            for t in range(PAGE_SIZE):
                for h in range(DECODE_HEADS):
                    off = idx * eng.item + (t * DECODE_HEADS + h) * HEAD_BYTES
                    bad += bytes(eng.kv[b][off:off + HEAD_BYTES]) != head_bytes(room, gen, b, n, t, h)
    return bad


class Cluster:
    """A decode scheduler (TP1) and a prefill TP2, each rank with its own
    kvfence rank, built the way the scheduler builds managers."""

    def __init__(self, provider, mode_decode="decode", mode_prefill="prefill", tp=2, extra=None, engine=None):
        Engine_ = engine or Engine  # a test's Engine subclass (e.g. with state buffers)
        self.tp = tp
        self.boot = provider.get_kv_class("bootstrap_server")("127.0.0.1", 0)
        self.boot_addr = "127.0.0.1:%d" % self.boot.port
        kvargs = provider.get_kv_class("kvargs")
        manager = provider.get_kv_class("manager")
        self.Sender = provider.get_kv_class("sender")
        self.Receiver = provider.get_kv_class("receiver")
        base = dict(prefill_tp=tp, slots=24, source_pages=24, log_level="error", decode=dict(lease_ms=1000),
                    prefill=dict(heartbeat_ms=100))
        base.update(extra or {})
        os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(base, decode_addrs=["127.0.0.1:0"]))
        self.d_eng = Engine_(DECODE_HEADS)
        self.dec = manager(self.d_eng.kv_args(kvargs, 0), mode_decode, None, False)
        os.environ["KVFENCE_SGLANG_CONFIG"] = json.dumps(dict(base, decode_addrs=[self.dec.agent.addr],
                                                              bootstrap_addr=self.boot_addr))
        self.p_eng = [Engine_(DECODE_HEADS // tp) for _ in range(tp)]
        self.pre = [manager(self.p_eng[r].kv_args(kvargs, r), mode_prefill, None, False) for r in range(tp)]
        for m in self.pre:
            m.register_to_bootstrap()
        del os.environ["KVFENCE_SGLANG_CONFIG"]

    def close(self):
        for m in self.pre + [self.dec]:
            m.close()
        self.boot.close()

    @staticmethod
    def all_reduce_min(polls):
        return min(int(p) for p in polls)  # the scheduler's MIN all-reduce over TP

    def wait_bootstrapped(self, senders, timeout=10):
        end = time.monotonic() + timeout
        while self.all_reduce_min(s.poll() for s in senders) < 2:  # WaitingForInput
            assert time.monotonic() < end, "prefill never bootstrapped"
            time.sleep(0.01)

    def decode_poll(self, rv, aux_index, room):
        """decode's poll with the metadata gate."""
        st = rv.poll()
        if st == 4 and self.d_eng.room_row(aux_index) != room:
            return 3  # Success without the aux row: still Transferring
        return st

    def start(self, room, pages, d_idx, aux_index, p_idx):
        """Decode: receiver, init, poll to WaitingForInput, send_metadata.
        Prefill: one sender per TP rank, bootstrap, pop_decode_prefix_len,
        init."""
        rv = self.Receiver(self.dec, self.boot_addr, room)
        rv.init(0)
        end = time.monotonic() + 15
        while rv.poll() != 2:  # the bootstrap server's layout is fetched off the scheduler thread
            assert time.monotonic() < end, "decode never resolved the prefill instance"
            time.sleep(0.01)
        rv.send_metadata(d_idx, aux_index, None, decode_prefix_len=0)
        senders = [self.Sender(m, self.boot_addr, room, [r], 0) for r, m in enumerate(self.pre)]
        self.wait_bootstrapped(senders)
        for s in senders:
            assert s.pop_decode_prefix_len() == 0
            s.init(pages, aux_index)
        return rv, senders

    def send_chunk(self, senders, room, gen, p_idx, lo, hi, last, aux_index, first_token=7):
        for r, s in enumerate(senders):
            if lo == 0:
                fill_prefill(self.p_eng[r], r, DECODE_HEADS // self.tp, room, gen, p_idx)
            if last:
                self.p_eng[r].set_aux(aux_index, room, first_token)  # MetadataBuffers.set_buf before the last send
            if s.should_send_kv_chunk(hi - lo, last):
                s.send(p_idx[lo:hi], [] if last else None)

    @staticmethod
    def reuse_once_released(snd, reuse):
        """Calls reuse() once snd.poll() is first Success or Failed: SGLang
        frees a prefill request's KV pages and state (release_kv_cache) then
        and may hand them to another request at once; kvfence copies them
        on Go threads until then (docs/sglang.md, the copy-off-the-scheduler
        rule), so bytes written after it must never reach decode."""
        poll = snd.poll

        def polled():
            st = poll()
            if st in (0, 4) and getattr(snd, "_reuse", None) is not None:
                done, snd._reuse = snd._reuse, None
                done()
            return st
        snd._reuse, snd.poll = reuse, polled

    def run_until_final(self, rv, senders, aux_index, room, timeout=15):
        end = time.monotonic() + timeout
        while True:
            d = self.decode_poll(rv, aux_index, room)
            p = self.all_reduce_min(s.poll() for s in senders)
            if d in (0, 4) and p in (0, 4):
                return d, p
            assert time.monotonic() < end, "stuck: decode %d prefill %d" % (d, p)
            time.sleep(0.005)

    def abort_at(self, point, room, state, last_send):
        """One request aborted by decode at point (before_metadata,
        after_metadata, after_last_send, after_handoff) in SGLang's call
        order: state is send_metadata's state_indices, last_send(snd) the
        prefill's last send(). Ends as SGLang does (decode's Failed,
        failure_exception, clear; prefill's terminal poll, clear). False
        when the request was never exposed (before_metadata)."""
        rv = self.Receiver(self.dec, self.boot_addr, room)
        rv.init(0)
        if point == "before_metadata":
            rv.abort()
            rv.send_metadata([0], 2, state, decode_prefix_len=0)  # SGLang may still call it: never exposed
            assert rv.poll() == 0 and rv.kv_indices is None
            rv.clear()
            return False
        _until(lambda: rv.poll() == 2, "decode never WaitingForInput")
        rv.send_metadata([0], 2, state, decode_prefix_len=0)
        snd = self.Sender(self.pre[0], self.boot_addr, room, [0], 0)
        self.wait_bootstrapped([snd], timeout=30)
        snd.init(1, 2)
        if point == "after_metadata":
            rv.abort()
        last_send(snd)
        if point == "after_last_send":
            rv.abort()
        if point == "after_handoff":  # prefill done, decode aborts before its next poll
            _until(lambda: snd.poll() == 4, "prefill never Success")
            rv.abort()
        assert rv.poll() == 0
        try:
            rv.failure_exception()
        except errors.KVFenceError:
            pass
        else:
            raise AssertionError("failure_exception() did not raise after the abort")
        rv.clear()
        _until(lambda: snd.poll() in (0, 4), "prefill never ended")
        snd.clear()
        return True


def _until(cond, what, timeout=30):
    """Waits for cond, one bounded wait per step (never a shared budget)."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.01)
