"""kvfence for Python engines, over the C ABI (bin/libkvfence.so) with ctypes.

- kvfence.Decode / kvfence.Prefill: the plain API for any engine (api.py).
- kvfence.sglang: SGLang's transfer-backend classes and KVFenceBackendProvider.
- kvfence.sglang_plugin: the SGLang plugin entry point (group
  sglang.srt.plugins) that makes --disaggregation-transfer-backend kvfence valid.

Importing kvfence loads neither the library nor SGLang.
"""
from .api import Decode, KVPoll, Prefill, Receiver, Sender, direct_layers, metric_sum, parse_metrics, version
from .checks import OutOfRange, Registration, WrongType, register_memory
from .errors import (AlreadyExists, FailedPrecondition, Internal, InvalidArgument, KVFenceError, NotFound,
                     ResourceExhausted, Unavailable, Unimplemented, Unknown)

__all__ = ["Decode", "Prefill", "Receiver", "Sender", "KVPoll", "version", "direct_layers", "parse_metrics",
           "metric_sum", "KVFenceError", "InvalidArgument", "NotFound", "AlreadyExists", "Unavailable", "FailedPrecondition",
           "ResourceExhausted", "Unimplemented", "Internal", "Unknown", "OutOfRange", "WrongType", "register_memory",
           "Registration"]
