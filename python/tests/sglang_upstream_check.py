"""Run by test_sglang_upstream.py in a fresh interpreter: imports SGLang's
own base classes, utils and plugin framework from a checkout outside this
repository ($SGLANG_SRC, its python/ directory), with the few modules that
pull torch, transformers and the like replaced by stubs, then checks that
kvfence's classes satisfy SGLang's ABCs, that SGLang's load_plugins() finds
kvfence's entry point and that SGLang's own get_kv_class then returns
kvfence's classes for --disaggregation-transfer-backend kvfence."""
import importlib
import os
import sys
import tomllib
import types

SRC = os.environ["SGLANG_SRC"]
HERE = os.path.dirname(os.path.abspath(__file__))
DIST = sys.argv[1]  # a directory for kvfence's dist-info (entry points)


def stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class _Env:
    def get(self):
        return None


class _Envs:
    def __getattr__(self, name):
        return _Env()


# The sglang package without its heavy __init__ (srt/ is a namespace package).
stub("sglang").__path__ = [os.path.join(SRC, "sglang")]
# ServerArgs is only an annotation in base/conn.py; the choices list and its
# extender are what the plugin calls.
CHOICES = ["mooncake", "nixl", "ascend", "fake", "mori"]
stub("sglang.srt.server_args", ServerArgs=type("ServerArgs", (), {}), DISAGG_TRANSFER_BACKEND_CHOICES=CHOICES,
     add_disagg_transfer_backend_choices=CHOICES.extend)
stub("torch").distributed = stub("torch.distributed")
stub("sglang.srt.utils", is_npu=lambda: False)
stub("sglang.srt.environ", envs=_Envs())

from sglang.srt.disaggregation.base import conn as base  # noqa: E402  (SGLang's own)
from sglang.srt.disaggregation import utils  # noqa: E402
import sglang.srt.plugins as plugins  # noqa: E402

import kvfence.sglang as ks  # noqa: E402  (after SGLang: it subclasses SGLang's ABCs)

pairs = [(ks.KVFenceKVManager, base.BaseKVManager), (ks.KVFenceKVSender, base.BaseKVSender),
         (ks.KVFenceKVReceiver, base.BaseKVReceiver), (ks.KVFenceBootstrapServer, base.BaseKVBootstrapServer),
         (ks.KVFenceKVArgs, base.KVArgs)]
for mine, theirs in pairs:
    assert issubclass(mine, theirs), (mine, theirs)
    assert not getattr(mine, "__abstractmethods__", frozenset()), (mine, mine.__abstractmethods__)
assert ks.KVPoll is base.KVPoll
print("base classes: kvfence's five classes subclass SGLang's and leave no abstract method")

# Direct mode needs SGLang's deferred decode-KV release (kvfence.sglang_direct).
from kvfence import errors as kerrors, sglang_direct  # noqa: E402
if not hasattr(base.BaseKVManager, "supports_deferred_decode_kv_release"):
    assert not sglang_direct.sglang_defers()
    try:
        sglang_direct.refuse_at_start(types.SimpleNamespace(kv_data_ptrs=[1 << 20]))
        raise AssertionError("direct mode accepted by an SGLang without the deferred release")
    except kerrors.Unimplemented as exc:
        assert "deferred decode-KV release" in str(exc), exc
    print("direct mode: refused at start-up (this SGLang has no deferred decode-KV release)")
else:
    print("direct mode: this SGLang declares the deferred decode-KV release")

# One request in scheduler order through classes SGLang's ABCs now govern.
sys.path.insert(0, HERE)
from sglang_harness import Cluster, check_decode  # noqa: E402

prov = ks.KVFenceBackendProvider()
c = Cluster(prov, utils.DisaggregationMode.DECODE, utils.DisaggregationMode.PREFILL)
try:
    rv, senders = c.start(21, 2, [1, 2], 0, [3, 4])
    c.send_chunk(senders, 21, 1, [3, 4], 0, 2, True, 0)
    res = c.run_until_final(rv, senders, 0, 21)
    assert res == (4, 4), (res, rv.failure_exception if res[0] == 0 else None, [s.snd.failure() for s in senders])
    assert check_decode(c.d_eng, 21, 1, [1, 2]) == 0
    m = senders[0].get_transfer_metric()
    assert isinstance(m, base.KVTransferMetric) and m.transfer_total_bytes > 0
finally:
    c.close()
print("scheduler order: one request through SGLang-derived classes, pages and aux row delivered")

# kvfence's entry point, as pip would install it from python/pyproject.toml.
with open(os.path.join(HERE, "..", "pyproject.toml"), "rb") as f:
    eps = tomllib.load(f)["project"]["entry-points"]["sglang.srt.plugins"]
info = os.path.join(DIST, "kvfence-0.1.0.dist-info")
os.makedirs(info, exist_ok=True)
with open(os.path.join(info, "METADATA"), "w") as f:
    f.write("Metadata-Version: 2.1\nName: kvfence\nVersion: 0.1.0\n")
with open(os.path.join(info, "entry_points.txt"), "w") as f:
    f.write("[sglang.srt.plugins]\n" + "".join("%s = %s\n" % kv for kv in eps.items()))
sys.path.insert(0, DIST)
importlib.invalidate_caches()

assert "kvfence" not in CHOICES
try:
    utils.TransferBackend("kvfence")
    raise AssertionError("kvfence is a TransferBackend before the plugin ran")
except ValueError:
    pass
plugins.load_plugins()  # SGLang's own loader: entry points, then HookRegistry.apply_hooks()
assert "kvfence" in CHOICES, CHOICES
backend = utils.TransferBackend("kvfence")
for kind, cls in [("KVARGS", ks.KVFenceKVArgs), ("MANAGER", ks.KVFenceKVManager), ("SENDER", ks.KVFenceKVSender),
                  ("RECEIVER", ks.KVFenceKVReceiver), ("BOOTSTRAP_SERVER", ks.KVFenceBootstrapServer)]:
    got = utils.get_kv_class(backend, getattr(utils.KVClassType, kind))
    assert got is cls, (kind, got)
assert {m.value for m in utils.TransferBackend} >= {"mooncake", "nixl", "fake", "kvfence"}
print("plugin: load_plugins() found kvfence's entry point; --disaggregation-transfer-backend kvfence is a choice; "
      "get_kv_class returns kvfence's five classes")
print("OK")
