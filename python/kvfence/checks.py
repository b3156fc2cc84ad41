"""The Python side's argument checks, in one place.

Before ctypes sees an argument it is checked here, so that a bad one raises a
classified exception (kvfence.InvalidArgument and its subclasses) instead of
wrapping silently (ctypes turns -1 into 2**64-1 for an unsigned type) or
killing the engine's process (an integer that is no mapped address):

- integers are range-checked per ctypes type (OutOfRange: InvalidArgument and
  OverflowError); what is not an integer is WrongType (InvalidArgument and
  TypeError). _lib.call and _lib.ret check every integer argument of every C
  function against its declared argtypes, so functions added later are
  covered without a line here.
- buffers are buffer-protocol objects (bytes, bytearray, memoryview, array,
  ctypes arrays, C-contiguous numpy arrays) or, as raw integer addresses,
  ranges inside memory registered with register_memory (checked against
  /proc/self/maps when registered). An integer address outside registered
  memory is refused: kvfence cannot tell a good address from a stray one.
- device pointers (an engine's KV buffers in GPU memory) have their own
  rule: device_range accepts a range only when the CUDA driver
  ($KVFENCE_CUDA_LIB, else libcuda.so.1, the library kvfence's Go side
  opens) says its first and last byte are device memory; host code never
  touches it.
"""
import ctypes
import math
import os
import threading

from . import errors


class OutOfRange(errors.InvalidArgument, OverflowError):
    """An integer outside its C type's range (or the ABI's)."""


class WrongType(errors.InvalidArgument, TypeError):
    """An argument of a type the call cannot take."""


def _bits(ctype):
    return 8 * ctypes.sizeof(ctype)


def _range(ctype):
    n = _bits(ctype)
    signed = ctype(-1).value == -1
    return (-(1 << (n - 1)), (1 << (n - 1)) - 1) if signed else (0, (1 << n) - 1)


_INTEGER_TYPES = (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint8, ctypes.c_uint16,
                  ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint, ctypes.c_long, ctypes.c_ulong,
                  ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_ssize_t)
RANGES = {t: _range(t) for t in _INTEGER_TYPES}


def integer(value, ctype, what="argument"):
    """value as an int within ctype's range (bool is refused: True is not a
    count)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise WrongType("%s must be an integer, got %s" % (what, type(value).__name__))
    v = value.__index__()
    lo, hi = RANGES[ctype]
    if not lo <= v <= hi:
        raise OutOfRange("%s %d outside %s's range %d..%d" % (what, v, ctype.__name__, lo, hi))
    return v


def arguments(name, argtypes, args):
    """Checks each integer (and void pointer) argument of C function name."""
    if len(args) > len(argtypes):
        raise WrongType("%s takes %d arguments, got %d" % (name, len(argtypes), len(args)))
    for i, (t, a) in enumerate(zip(argtypes, args)):
        if t in RANGES:
            integer(a, t, "%s argument %d" % (name, i + 1))
        elif t is ctypes.c_void_p and a is not None and not isinstance(a, ctypes.c_void_p):
            integer(a, ctypes.c_uint64, "%s argument %d (address)" % (name, i + 1))


def count(value, what, lo, hi):
    """An integer within lo..hi (the ABI's range, narrower than the C type)."""
    v = integer(value, ctypes.c_int64, what)
    if not lo <= v <= hi:
        raise OutOfRange("%s %d outside %d..%d" % (what, v, lo, hi))
    return v


def timeout_ms(seconds):
    """kvfence_wait's timeout: finite and >= 0 seconds, as milliseconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise WrongType("timeout must be a number of seconds, got %s" % type(seconds).__name__)
    if math.isnan(seconds) or seconds < 0:
        raise errors.InvalidArgument("timeout %r: not a non-negative number of seconds" % seconds)
    if math.isinf(seconds) or seconds * 1000 > RANGES[ctypes.c_int64][1]:
        raise OutOfRange("timeout %r seconds: too large" % seconds)
    return int(seconds * 1000)


# Memory registered for raw-address use: [(start, end, writable)].
_registered = []
_registered_lock = threading.Lock()


def _mappings():
    """[(start, end, readable, writable)] of this process, from /proc/self/maps."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            out.append((lo, hi, perms[0] == "r", perms[1] == "w"))
    return out


def _mapped(start, end, writable):
    """Whether [start, end) is mapped readable (and writable) throughout."""
    at = start
    for lo, hi, r, w in sorted(_mappings()):
        if hi <= at:
            continue
        if lo > at or not r or (writable and not w):
            return False  # a hole, or a mapping without the access
        at = hi
        if at >= end:
            return True
    return False


class Registration:
    """A range registered with register_memory; unregister() when freed."""

    def __init__(self, start, size, writable):
        self.start, self.size, self.writable = start, size, writable

    def unregister(self):
        with _registered_lock:
            if self in _registered:
                _registered.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unregister()


def register_memory(address, size, writable=True):
    """Registers size bytes at address (the engine's own memory: a KV pool)
    so that kvfence may take raw integer addresses inside it. The range must
    be mapped (readable, and writable when writable) now, per
    /proc/self/maps; the caller keeps it mapped until unregister()."""
    start = integer(address, ctypes.c_uint64, "address")
    n = integer(size, ctypes.c_uint64, "size")
    if start == 0 or n == 0 or start + n > RANGES[ctypes.c_uint64][1]:
        raise errors.InvalidArgument("memory [%#x, +%d) is not a range" % (start, n))
    if not _mapped(start, start + n, writable):
        raise errors.InvalidArgument("memory [%#x, +%d) is not mapped %s in this process" % (
            start, n, "read-write" if writable else "readable"))
    reg = Registration(start, n, writable)
    with _registered_lock:
        _registered.append(reg)
    return reg


def _registered_room(addr, writable):
    """Bytes from addr to the end of the registered range holding it."""
    with _registered_lock:
        for reg in _registered:
            if reg.start <= addr < reg.start + reg.size and (reg.writable or not writable):
                return reg.start + reg.size - addr
    return None


def buffer(buf, need, writable, size=None):
    """(address, size, keepalive) for need bytes of buf. size, when given, is
    what the caller says the buffer holds (at least need, at most what it
    holds)."""
    addr, room, keep = _locate(buf, writable)
    if size is not None:
        size = integer(size, ctypes.c_size_t, "size")
        if size > room:
            raise OutOfRange("size %d: the buffer holds %d bytes" % (size, room))
    else:
        size = room
    if need > size:
        raise errors.InvalidArgument("buffer holds %d bytes, %d needed" % (size, need))
    return addr, size, keep


def _locate(buf, writable):
    if isinstance(buf, int) and not isinstance(buf, bool):
        room = _registered_room(buf, writable)
        if room is None:
            raise errors.InvalidArgument(
                "address %#x is not inside memory registered with kvfence.register_memory%s: pass a buffer "
                "object or register the engine's pool" % (buf, " (writable)" if writable else ""))
        return buf, room, None
    if isinstance(buf, bytes):
        if writable:
            raise WrongType("bytes are read-only")
        p = ctypes.c_char_p(buf)
        return ctypes.cast(p, ctypes.c_void_p).value, len(buf), p
    try:
        mv = memoryview(buf)
    except TypeError:
        raise WrongType("%s is neither a buffer nor an address in registered memory" % type(buf).__name__) from None
    if not mv.c_contiguous:
        raise WrongType("buffer is not C-contiguous")
    mv = mv.cast("B")
    if mv.readonly:
        if writable:
            raise WrongType("buffer is read-only")
        c = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
    else:
        c = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(c), mv.nbytes, c


# ---- device memory (KV buffers in GPU memory) ----
_cuda = None
_cuda_lock = threading.Lock()


def cuda_driver():
    """The CUDA driver library kvfence's Go side uses, or None when it does
    not load (then no device pointer is accepted)."""
    global _cuda
    with _cuda_lock:
        if _cuda is None:
            try:
                lib = ctypes.CDLL(os.environ.get("KVFENCE_CUDA_LIB") or "libcuda.so.1")
                lib.cuPointerGetAttribute.restype = ctypes.c_int
                lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
                lib.cuInit.restype, lib.cuInit.argtypes = ctypes.c_int, [ctypes.c_uint]
                _cuda = lib if lib.cuInit(0) == 0 else False
            except (OSError, AttributeError):
                _cuda = False
        return _cuda or None


def _is_device(cuda, addr):
    mem_type = ctypes.c_uint(0)
    # CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2; CU_MEMORYTYPE_DEVICE = 2.
    return cuda.cuPointerGetAttribute(ctypes.byref(mem_type), 2, ctypes.c_uint64(addr)) == 0 and mem_type.value == 2


def is_device(addr):
    """Whether the driver says addr is device memory (False without one)."""
    cuda = cuda_driver()
    return cuda is not None and _is_device(cuda, integer(addr, ctypes.c_uint64, "address"))


def device_range(addr, size, what="buffer"):
    """Accepts size bytes at addr only as device memory the CUDA driver
    knows (first and last byte): FailedPrecondition without a driver,
    InvalidArgument when the range is not (wholly) device memory."""
    addr = integer(addr, ctypes.c_uint64, what + " address")
    size = integer(size, ctypes.c_int64, what + " size")
    cuda = cuda_driver()
    if cuda is None:
        raise errors.FailedPrecondition("kvfence: %s at %#x: no CUDA driver loads (%s)"
                                        % (what, addr, os.environ.get("KVFENCE_CUDA_LIB") or "libcuda.so.1"))
    if size <= 0 or not (_is_device(cuda, addr) and _is_device(cuda, addr + size - 1)):
        raise errors.InvalidArgument("kvfence: %s of %d bytes at %#x is not device memory of the CUDA driver"
                                     % (what, size, addr))
    return addr, size
