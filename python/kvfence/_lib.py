"""Loads bin/libkvfence.so with ctypes and declares the C ABI's signatures.

The library is found at $KVFENCE_LIB, else next to this package in a source
checkout (../../bin/libkvfence.so), else by the dynamic loader's search path.
"""
import ctypes
import os

from . import checks, errors

_HERE = os.path.dirname(os.path.abspath(__file__))


class Error(ctypes.Structure):
    """kvfence_error: a code and a NUL-terminated message."""

    _fields_ = [("code", ctypes.c_int32), ("message", ctypes.c_char * 512)]


def library_path():
    env = os.environ.get("KVFENCE_LIB")
    if env:
        return env
    local = os.path.normpath(os.path.join(_HERE, "..", "..", "bin", "libkvfence.so"))
    if os.path.exists(local):
        return local
    return "libkvfence.so"


def plugin_path():
    """The transport plugin the agents start: $KVFENCE_PLUGIN, else the TCP
    plugin beside the library."""
    env = os.environ.get("KVFENCE_PLUGIN")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(library_path())), "kvfence-plugin-tcp")


H = ctypes.c_uint64
E = ctypes.POINTER(Error)
I = ctypes.c_int
P = ctypes.c_void_p
S = ctypes.c_size_t

_SIGNATURES = {
    "kvfence_version": (ctypes.c_char_p, []),
    "kvfence_decode_open": (I, [ctypes.c_char_p, ctypes.POINTER(H), E]),
    "kvfence_prefill_open": (I, [ctypes.c_char_p, ctypes.POINTER(H), E]),
    "kvfence_close": (I, [H, E]),
    "kvfence_agent_addr": (I, [H, ctypes.c_char_p, S, E]),
    "kvfence_prefill_linked": (I, [H]),
    "kvfence_prefill_quiesce": (I, [H, ctypes.c_int64]),
    "kvfence_prefill_resume": (I, [H]),
    "kvfence_decode_linked": (I, [H, ctypes.c_uint32]),
    "kvfence_agent_metrics": (I, [H, ctypes.c_char_p, S, ctypes.POINTER(S), E]),
    "kvfence_agent_stats": (I, [H, ctypes.c_char_p, S, ctypes.POINTER(S), E]),
    "kvfence_page_bytes": (ctypes.c_int64, [H]),
    "kvfence_receiver_new": (I, [H, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(H), E]),
    "kvfence_receiver_init": (I, [H, I, ctypes.POINTER(ctypes.c_uint32), I, E]),
    "kvfence_receiver_init_at": (I, [H, ctypes.POINTER(ctypes.c_int32), I, ctypes.POINTER(ctypes.c_uint32), I, E]),
    "kvfence_receiver_read": (I, [H, I, I, P, S, E]),
    "kvfence_receiver_finish": (I, [H, E]),
    "kvfence_receiver_abort": (I, [H, E]),
    "kvfence_receiver_released": (I, [H]),
    "kvfence_sender_new": (I, [H, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(H), E]),
    "kvfence_sender_init": (I, [H, I, E]),
    "kvfence_sender_write": (I, [H, I, I, P, S, E]),
    "kvfence_sender_send": (I, [H, I, E]),
    "kvfence_sender_finish": (I, [H, I, E]),
    "kvfence_sender_abort": (I, [H, E]),
    "kvfence_poll": (I, [H]),
    "kvfence_wait": (I, [H, ctypes.c_int64]),
    "kvfence_failure": (I, [H, E]),
}

_lib = None


def lib():
    """The loaded library (loaded on first use, so importing kvfence never
    needs it: SGLang imports the plugin before any transfer is made)."""
    global _lib
    if _lib is None:
        path = library_path()
        try:
            so = ctypes.CDLL(path)
        except OSError as exc:
            raise errors.FailedPrecondition(
                "cannot load %s (%s): run `make bindings` or set KVFENCE_LIB" % (path, exc)) from None
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(so, name)
            fn.restype, fn.argtypes = res, args
        _lib = so
    return _lib


def call(name, *args):
    """Calls a function whose last argument is a kvfence_error and raises
    the classified exception when it fails. Every integer argument is
    range-checked against the function's argtypes first (checks.py)."""
    fn = getattr(lib(), name)
    checks.arguments(name, (fn.argtypes or [])[:-1], args)
    err = Error()
    code = fn(*args, ctypes.byref(err))
    if code != 0:
        raise errors.from_code(code, err.message.decode("utf-8", "replace"))
    return code


def ret(name, *args):
    """Calls a function without a kvfence_error (poll-style: its result is
    a state or a negated code), its integer arguments checked first."""
    fn = getattr(lib(), name)
    checks.arguments(name, fn.argtypes or [], args)
    return fn(*args)


def ret_handle(name, handle):
    """ret() for a function whose one argument is a handle this package got
    from the library (never caller input): the range check is skipped, so
    a scheduler's per-iteration poll pays only the call."""
    return getattr(lib(), name)(handle)


def check_state(value):
    """A poll-style result: a state (>= 0) or a negated error code."""
    if value < 0:
        raise errors.from_code(-value, "kvfence call failed")
    return value


def text_out(name, handle):
    """Calls a text-returning function, growing the buffer as it says."""
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        need = S(0)
        err = Error()
        code = getattr(lib(), name)(handle, buf, size, ctypes.byref(need), ctypes.byref(err))
        if code == 0:
            return buf.value.decode("utf-8")
        if code == errors.RESOURCE_EXHAUSTED and need.value > size:
            size = need.value
            continue
        raise errors.from_code(code, err.message.decode("utf-8", "replace"))
