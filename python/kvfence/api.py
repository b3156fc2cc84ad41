"""The plain Python API over the C ABI, for any engine.

A decode rank exposes slots and reads handed-off pages; a prefill rank fills
source pages and sends them. Buffers are anything with the buffer protocol
(bytes, bytearray, memoryview, array, C-contiguous numpy arrays) or a raw
address (int) inside memory registered with kvfence.register_memory (the
engine's KV pool): pages are copied between the engine's memory and the
runtime's registered pool, so the engine's buffer is free again as soon as a
call returns. Arguments are checked before ctypes sees them (checks.py).
"""
import ctypes
import json
import re

from . import _lib, checks
from .errors import ResourceExhausted  # noqa: F401  (re-exported for callers)


class KVPoll:
    """Request states: SGLang's KVPoll integers."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


def version():
    return _lib.lib().kvfence_version().decode()


class _Handle:
    _h = 0

    def _handle(self):
        if not self._h:
            raise _lib.errors.FailedPrecondition("%s is closed" % type(self).__name__)
        return self._h

    def close(self):
        """Drops the handle (an agent stops; a request handle goes, and
        with it nothing that is held)."""
        if self._h:
            h, self._h = self._h, 0
            _lib.call("kvfence_close", h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _Agent(_Handle):
    def _open(self, fn, config):
        config.setdefault("plugin", _lib.plugin_path())
        h = _lib.H(0)
        _lib.call(fn, json.dumps(config).encode(), ctypes.byref(h))
        self._h = h.value
        self.page_bytes = _lib.check_state(_lib.ret("kvfence_page_bytes", self._h))

    @property
    def addr(self):
        buf = ctypes.create_string_buffer(256)
        _lib.call("kvfence_agent_addr", self._handle(), buf, len(buf))
        return buf.value.decode()

    def metrics_text(self):
        """The rank's Prometheus metrics (text exposition format)."""
        return _lib.text_out("kvfence_agent_metrics", self._handle())

    def metrics(self):
        """{(name, ((label, value), ...)): float} from the Prometheus text."""
        return parse_metrics(self.metrics_text())

    def stats(self):
        """Decode: release paths, hold durations, corrupt pages; prefill: the
        sender core's counters."""
        return json.loads(_lib.text_out("kvfence_agent_stats", self._handle()))


def direct_layers(ptrs, lens, items):
    """The decode config keys for direct mode over an engine's KV buffers,
    one per layer (K and V, or one MLA buffer), described as for the staged
    Layout: ptrs[i] is buffer i's device address, lens[i] its bytes,
    items[i] the bytes of one engine page in it. Engine page p is then
    items[i] bytes at p * items[i] in every buffer; sum(items) must be the
    decode rank's shard_bytes * shards. Every buffer must hold the same
    number of pages. Pass the result as keywords:
    Decode(..., shard_bytes=sum(items), **direct_layers(ptrs, lens, items))."""
    n = len(ptrs)
    if n == 0 or not (n == len(lens) == len(items)):
        raise _lib.errors.InvalidArgument("direct_layers: %d pointers, %d lengths, %d page sizes (one each per buffer, "
                                          "at least one)" % (n, len(lens), len(items)))
    ptrs, lens, items = [int(x) for x in ptrs], [int(x) for x in lens], [int(x) for x in items]
    if any(i <= 0 for i in items):
        raise _lib.errors.InvalidArgument("direct_layers: page sizes must be positive, got %s" % items)
    pages = {ln // it for ln, it in zip(lens, items)}
    if len(pages) != 1:
        raise _lib.errors.InvalidArgument("direct_layers: the buffers hold %s pages: a page index must name the same "
                                          "page in every buffer" % sorted(pages))
    return {"gpu_mode": "direct", "direct_buffers": ptrs, "direct_page_bytes": items, "direct_pages": pages.pop()}


class Decode(_Agent):
    """A decode rank: Decode(rank=0, slots=1024, shard_bytes=..., shards=TP of
    prefill, control_addr="0.0.0.0:7000", ...). Keyword arguments are the
    library's JSON config (cmd/libkvfence/config.go)."""

    def __init__(self, **config):
        self._open("kvfence_decode_open", config)

    def linked(self, rank):
        """Whether prefill rank's control link is up: a request exposed to a
        rank that is not linked fails (its Assign is lost)."""
        return _lib.check_state(_lib.ret("kvfence_decode_linked", self._handle(), rank)) == 1

    def wait_linked(self, ranks, timeout=10.0):
        import time
        end = time.monotonic() + timeout
        while not all(self.linked(r) for r in ranks):
            if time.monotonic() > end:
                raise _lib.errors.Unavailable("prefill ranks %s not all linked after %.1fs" % (list(ranks), timeout))
            time.sleep(0.01)

    def receiver(self, room, gen=1):
        h = _lib.H(0)
        _lib.call("kvfence_receiver_new", self._handle(), room, gen, ctypes.byref(h))
        return Receiver(self, h.value)


class Prefill(_Agent):
    """A prefill rank linked to one decode rank (decode_addr)."""

    def __init__(self, **config):
        self._open("kvfence_prefill_open", config)

    @property
    def linked(self):
        return _lib.check_state(_lib.ret("kvfence_prefill_linked", self._handle())) == 1

    def wait_linked(self, timeout=10.0):
        import time
        end = time.monotonic() + timeout
        while not self.linked:
            if time.monotonic() > end:
                raise _lib.errors.Unavailable("prefill rank not linked to decode after %.1fs" % timeout)
            time.sleep(0.01)

    def quiesce(self, timeout=5.0):
        """The close handshake (agent/link_quiesce.go): True once decode
        agreed that this idle agent may close and no Assign is held here;
        the caller then closes it or calls resume(). False: busy, or no
        answer within timeout (nothing to undo)."""
        return _lib.check_state(_lib.ret("kvfence_prefill_quiesce", self._handle(), int(timeout * 1000))) == 1

    def resume(self):
        """Undoes an agreed quiesce(): decode may expose requests here again."""
        _lib.check_state(_lib.ret("kvfence_prefill_resume", self._handle()))

    def sender(self, room, gen=1):
        h = _lib.H(0)
        _lib.call("kvfence_sender_new", self._handle(), room, gen, ctypes.byref(h))
        return Sender(self, h.value)


class _Request(_Handle):
    def __init__(self, agent, h):
        self.agent, self._h = agent, h

    def poll(self):
        """KVPoll state."""
        return _lib.check_state(_lib.ret_handle("kvfence_poll", self._handle()))

    def wait(self, timeout=10.0):
        """Waits up to timeout seconds for Success or Failed; the state.
        NotFound at once when another thread closes the handle, Unavailable
        when the agent closes."""
        return _lib.check_state(_lib.ret("kvfence_wait", self._handle(), checks.timeout_ms(timeout)))

    def failure(self):
        """The classified error a failed request failed with, else None."""
        err = _lib.Error()
        code = _lib.ret("kvfence_failure", self._handle(), ctypes.byref(err))
        if code == 0:
            return None
        return _lib.errors.from_code(code, err.message.decode("utf-8", "replace"))


class Receiver(_Request):
    """Decode's handle on one request."""

    def init(self, pages, ranks):
        """Exposes pages slots written by each prefill rank in ranks (a slot
        holds one shard per rank, in this order). ResourceExhausted: the
        pool is full; retry later."""
        rs = [checks.integer(r, ctypes.c_uint32, "rank") for r in ranks]
        arr = (ctypes.c_uint32 * len(rs))(*rs)
        _lib.call("kvfence_receiver_init", self._handle(), pages, arr, len(rs))

    def init_at(self, pages, ranks):
        """Direct mode (decode opened with gpu_mode "direct"): the request's
        pages land in the engine's own pages, page indices pages, in order.
        FailedPrecondition: a page is still lent to an earlier request whose
        writes may still land (reuse it only once that one's released() is
        true); ResourceExhausted: too many pages lent (holds count)."""
        ps = [checks.integer(p, ctypes.c_int32, "page index") for p in pages]
        rs = [checks.integer(r, ctypes.c_uint32, "rank") for r in ranks]
        idx = (ctypes.c_int32 * max(1, len(ps)))(*ps)
        arr = (ctypes.c_uint32 * len(rs))(*rs)
        _lib.call("kvfence_receiver_init_at", self._handle(), idx, len(ps), arr, len(rs))

    def read_into(self, buf, first=0, count=1, size=None):
        """Copies count pages from first on into buf (count × page_bytes)."""
        need = checks.integer(count, ctypes.c_int, "count") * self.agent.page_bytes
        addr, size, keep = checks.buffer(buf, need, writable=True, size=size)
        _lib.call("kvfence_receiver_read", self._handle(), first, count, addr, size)
        del keep

    def read(self, first=0, count=1):
        out = bytearray(count * self.agent.page_bytes)
        self.read_into(out, first, count)
        return out

    def finish(self):
        """Gives a handed-off request's slots back."""
        _lib.call("kvfence_receiver_finish", self._handle())

    def abort(self):
        """Stops the request; its slots stay held until no write can land.
        A request already handed off is not stopped: it stays readable and
        its slots stay in use until finish."""
        _lib.call("kvfence_receiver_abort", self._handle())

    def abandon(self):
        """The engine lets the request go, whatever its state: aborted, or
        finished when it was handed off already. A handoff may land between
        the engine's last poll and its abort (which then changes nothing):
        an engine that only aborted would leave those slots in use for good,
        as no hold bound applies to a handed-off request."""
        self.abort()
        if self.poll() == KVPoll.Success:  # once abort took, no handoff can follow (I2)
            self.finish()

    @property
    def released(self):
        return _lib.check_state(_lib.ret("kvfence_receiver_released", self._handle())) == 1


class Sender(_Request):
    """Prefill's handle on one request."""

    def init(self, pages):
        _lib.call("kvfence_sender_init", self._handle(), pages)

    def write(self, first, buf, count=1, size=None):
        """Copies count pages (count × page_bytes) from buf into the source
        pages from first on. FailedPrecondition once the request ended (its
        source pages went back to the pool)."""
        need = checks.integer(count, ctypes.c_int, "count") * self.agent.page_bytes
        addr, size, keep = checks.buffer(buf, need, writable=False, size=size)
        _lib.call("kvfence_sender_write", self._handle(), first, count, addr, size)
        del keep

    def send(self, upto):
        """Pages [0, upto) are computed and may be sent."""
        _lib.call("kvfence_sender_send", self._handle(), upto)

    def finish(self, total):
        _lib.call("kvfence_sender_finish", self._handle(), total)

    def abort(self):
        _lib.call("kvfence_sender_abort", self._handle())


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric_sum(metrics, name, **labels):
    """Sum of the samples of name whose labels include labels."""
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and want <= set(ls))
