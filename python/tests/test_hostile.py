"""Hostile calls into the Python package (issue 19 item 3): each runs in its
own subprocess, must raise a classified exception (a kvfence.KVFenceError,
and the Python class it promises) and leave the process alive: after it the
child makes a good call and exits 0. A crash, a wrapped integer that is
accepted, or a hang (killed at the timeout) fails the case.

Run directly (python3 test_hostile.py CASE), it is the child of one case.
"""
import ctypes
import json
import math
import os
import subprocess
import sys
import threading
import time

import pytest

SHARD = 64


def _agents():
    import kvfence
    dec = kvfence.Decode(slots=4, shard_bytes=SHARD, log_level="error")
    pre = kvfence.Prefill(rank=1, decode_addr=dec.addr, source_pages=4, shard_bytes=SHARD, log_level="error")
    return dec, pre


def _sender(pre, pages=2):
    s = pre.sender(7)
    s.init(pages)
    return s


def _unmapped():
    """An address that was mapped and is not any more."""
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    # Far from where the kernel (top-down from mmap_base) and Go's heap (from
    # 0xc000000000 up) place other threads' mappings, so nothing else maps the
    # hole between our munmap and the register call (it did once, with a hint
    # of None).
    hint = 0x3A5A00000000
    addr = libc.mmap(hint, 1 << 16, 3, 0x22 | 0x100000, -1, 0)  # RW, PRIVATE|ANONYMOUS|FIXED_NOREPLACE
    if addr in (None, ctypes.c_void_p(-1).value):
        addr = libc.mmap(None, 1 << 16, 3, 0x22, -1, 0)
    libc.munmap(addr, 1 << 16)
    return addr


def _wait_closed(dec, pre):
    """A wait with a huge timeout, woken by a close from another thread."""
    rv = dec.receiver(11)
    h = rv._h
    threading.Thread(target=lambda: (time.sleep(0.2), rv.close())).start()
    from kvfence import _lib
    _lib.check_state(_lib.lib().kvfence_wait(h, 10 ** 9))  # 11 days


def _numpy_strided(dec, pre):
    import numpy as np
    a = np.zeros((4, SHARD * 2), dtype=np.uint8)[:, ::2]
    dec.receiver(12).read_into(a, 0, 1)


def _registered_overrun(dec, pre):
    import kvfence
    buf = (ctypes.c_char * SHARD)()
    kvfence.register_memory(ctypes.addressof(buf), SHARD)
    _sender(pre).write(0, ctypes.addressof(buf), count=2)


# case -> (call(dec, pre), the exception classes it must raise)
CASES = {
    "write_unmapped_address": (lambda d, p: _sender(p).write(0, _unmapped()), ("InvalidArgument",)),
    "read_into_unmapped_address": (lambda d, p: d.receiver(1).read_into(_unmapped()), ("InvalidArgument",)),
    "write_unregistered_address": (lambda d, p: _sender(p).write(0, ctypes.addressof((ctypes.c_char * SHARD)())),
                                   ("InvalidArgument",)),
    "write_small_integer_address": (lambda d, p: _sender(p).write(0, 4096), ("InvalidArgument",)),
    "write_registered_overrun": (_registered_overrun, ("InvalidArgument",)),
    "register_unmapped": (lambda d, p: __import__("kvfence").register_memory(_unmapped(), 4096), ("InvalidArgument",)),
    "receiver_room_negative": (lambda d, p: d.receiver(-1), ("OutOfRange", "OverflowError")),
    "receiver_room_2_64": (lambda d, p: d.receiver(2 ** 64), ("OutOfRange", "OverflowError")),
    "sender_finish_2_40": (lambda d, p: _sender(p).finish(2 ** 40), ("OutOfRange", "OverflowError")),
    "sender_send_2_31": (lambda d, p: _sender(p).send(2 ** 31), ("OutOfRange", "OverflowError")),
    "sender_init_negative": (lambda d, p: p.sender(8).init(-1), ("InvalidArgument",)),
    "receiver_init_pages_2_31": (lambda d, p: d.receiver(2).init(2 ** 31, [1]), ("OutOfRange", "OverflowError")),
    "receiver_init_rank_negative": (lambda d, p: d.receiver(3).init(1, [-1]), ("OutOfRange", "OverflowError")),
    "receiver_init_too_many_ranks": (lambda d, p: d.receiver(4).init(1, [1] * 100000), ("InvalidArgument",)),
    "wait_negative": (lambda d, p: d.receiver(5).wait(-1), ("InvalidArgument", "ValueError")),
    "wait_infinite": (lambda d, p: d.receiver(6).wait(math.inf), ("OutOfRange", "OverflowError")),
    "wait_nan": (lambda d, p: d.receiver(6).wait(math.nan), ("InvalidArgument", "ValueError")),
    "wait_woken_by_close": (_wait_closed, ("NotFound",)),
    "linked_rank_2_32": (lambda d, p: d.linked(2 ** 32), ("OutOfRange", "OverflowError")),
    "read_into_strided_numpy": (_numpy_strided, ("WrongType", "TypeError")),
    "read_into_bytes": (lambda d, p: d.receiver(13).read_into(bytes(SHARD)), ("WrongType", "TypeError")),
    "read_into_claimed_size": (lambda d, p: d.receiver(14).read_into(bytearray(SHARD), size=1 << 30),
                               ("OutOfRange", "OverflowError")),
    "write_not_a_buffer": (lambda d, p: _sender(p).write(0, object()), ("WrongType", "TypeError")),
    "write_short_buffer": (lambda d, p: _sender(p).write(0, bytearray(SHARD), count=2), ("InvalidArgument",)),
    "write_first_negative": (lambda d, p: _sender(p).write(-1, bytearray(SHARD)), ("InvalidArgument",)),
    "decode_huge_pool": (lambda d, p: __import__("kvfence").Decode(slots=2 ** 40, shard_bytes=2 ** 30),
                         ("InvalidArgument",)),
}


def run_case(name):
    import kvfence
    dec, pre = _agents()
    call, _ = CASES[name]
    raised = None
    try:
        call(dec, pre)
    except Exception as exc:  # noqa: BLE001 (the classes are the result)
        raised = exc
    alive = dec.page_bytes == SHARD and kvfence.version().startswith("kvfence")
    classes = [c.__name__ for c in type(raised).__mro__] if raised else []
    print(json.dumps({"raised": classes, "message": str(raised), "alive": alive}))
    sys.stdout.flush()
    pre.close()
    dec.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_call_is_refused_and_the_process_lives(name):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(here, "..")] + [p for p in [env.get("PYTHONPATH")] if p])
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), name], env=env, capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("%s: the call hung (killed after 120 s)" % name)
    assert p.returncode == 0, "%s: the process died (rc %d): %s" % (name, p.returncode, p.stderr[-2000:])
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    assert lines, "%s: no result line: %s" % (name, p.stderr[-2000:])
    out = json.loads(lines[-1])
    assert out["alive"], "%s: the process did not answer a good call after it" % name
    assert out["raised"], "%s: accepted, no exception" % name
    assert "KVFenceError" in out["raised"], "%s raised %s, not a classified kvfence error" % (name, out["raised"])
    for want in CASES[name][1]:
        assert want in out["raised"], "%s raised %s (%s), want %s" % (name, out["raised"][0], out["message"], want)


if __name__ == "__main__":
    run_case(sys.argv[1])
