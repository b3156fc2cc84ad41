"""Makes vLLM's connector-facing files importable from a source copy
($VLLM_SRC, outside the repository) without torch or vLLM's dependencies.

Real, unmodified: vllm/distributed/kv_transfer/kv_connector/v1/base.py,
v1/__init__.py, kv_connector/base.py, kv_connector/factory.py and
vllm/utils/func_utils.py. Stubbed: torch (a few names base.py uses in
annotations), typing_extensions (if missing), vllm.logger, and the modules
base.py imports only for annotations (attention backend, SchedulerOutput,
KVConnectorOutput) plus decode_bench_connector (v1/__init__ re-exports it).
Package __init__ files above those are skipped: vllm/__init__ pulls in the
whole engine.
"""
import logging
import os
import sys
import types


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _package(src, name):
    parts = name.split(".")
    return _module(name, __path__=[os.path.join(src, *parts)])


def install(src=None):
    src = src or os.environ["VLLM_SRC"]
    if "vllm.distributed.kv_transfer.kv_connector.factory" in sys.modules:
        return
    if "torch" not in sys.modules:
        class Tensor:  # annotations only
            pass
        _module("torch", Tensor=Tensor, dtype=type("dtype", (), {}), device=type("device", (), {}))
    try:
        import typing_extensions  # noqa: F401
    except ImportError:
        import typing
        _module("typing_extensions", ParamSpec=typing.ParamSpec)
    for p in ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer", "vllm.distributed.kv_transfer.kv_connector",
              "vllm.distributed.kv_transfer.kv_connector.v1", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched",
              "vllm.v1.attention", "vllm.utils", "vllm.config"]:
        _package(src, p)
    _module("vllm.logger", init_logger=logging.getLogger)
    _module("vllm.v1.attention.backend", AttentionBackend=type("AttentionBackend", (), {}),
            AttentionMetadata=type("AttentionMetadata", (), {}))
    _module("vllm.v1.core.sched.output", SchedulerOutput=type("SchedulerOutput", (), {}))
    _module("vllm.v1.outputs", KVConnectorOutput=type("KVConnectorOutput", (), {}))
    _module("vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector",
            DecodeBenchConnector=type("DecodeBenchConnector", (), {}))
    # The real v1 package __init__ (its re-exports), then the factory.
    import importlib.util
    v1 = os.path.join(src, "vllm", "distributed", "kv_transfer", "kv_connector", "v1", "__init__.py")
    spec = importlib.util.spec_from_file_location("vllm.distributed.kv_transfer.kv_connector.v1", v1,
                                                  submodule_search_locations=[os.path.dirname(v1)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    import vllm.distributed.kv_transfer.kv_connector.factory  # noqa: F401
