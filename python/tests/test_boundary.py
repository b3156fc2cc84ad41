"""The cost of the Python/C boundary per call, against the same poll made
from Go in the same run (kvfence_poll_go_ns). It prints the figures; the
only checks are that they were measured (speed is a benchmark, not a test)."""
import ctypes
import time

import kvfence
from kvfence import _lib


def test_poll_cost_python_vs_go():
    with kvfence.Decode(slots=4, shard_bytes=64, log_level="error") as dec:
        rv = dec.receiver(424242)
        n = 100000
        go = _lib.lib()
        go.kvfence_poll_go_ns.restype = ctypes.c_double
        go.kvfence_poll_go_ns.argtypes = [_lib.H, ctypes.c_int64]
        go_ns = go.kvfence_poll_go_ns(rv._h, n)
        raw = go.kvfence_poll
        h = rv._h
        t = time.perf_counter()
        for _ in range(n):
            raw(h)
        ctypes_ns = (time.perf_counter() - t) / n * 1e9
        t = time.perf_counter()
        for _ in range(n // 10):
            rv.poll()
        api_ns = (time.perf_counter() - t) / (n // 10) * 1e9
        rv.close()
        # A call without the event loop (a registry lookup): the crossing itself.
        go.kvfence_page_bytes_go_ns.restype = ctypes.c_double
        go.kvfence_page_bytes_go_ns.argtypes = [_lib.H, ctypes.c_int64]
        go_pb = go.kvfence_page_bytes_go_ns(dec._h, n)
        pb = go.kvfence_page_bytes
        t = time.perf_counter()
        for _ in range(n):
            pb(dec._h)
        py_pb = (time.perf_counter() - t) / n * 1e9
    print("boundary: page_bytes from Go %.0f ns; from Python via ctypes %.0f ns (%.0fx)" % (go_pb, py_pb, py_pb / go_pb))
    print("boundary: poll from Go %.0f ns; from Python via ctypes %.0f ns (%.1fx); via kvfence.Receiver.poll %.0f ns (%.1fx)"
          % (go_ns, ctypes_ns, ctypes_ns / go_ns, api_ns, api_ns / go_ns))
    assert go_ns > 0 and ctypes_ns > 0 and api_ns > 0 and go_pb > 0 and py_pb > 0
