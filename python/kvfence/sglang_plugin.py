"""The SGLang plugin (entry point group sglang.srt.plugins, see
python/pyproject.toml). SGLang calls register() in every scheduler process;
it makes `--disaggregation-transfer-backend kvfence` a valid choice, adds
KVFENCE to TransferBackend and routes get_kv_class for it to
KVFenceBackendProvider. Hooks go through SGLang's HookRegistry, which also
rebinds modules that imported the old names."""
import enum

BACKEND = "kvfence"


def _enlarged(old):
    members = {m.name: m.value for m in old}
    members["KVFENCE"] = BACKEND
    new = enum.Enum(old.__name__, members)
    new.__module__ = old.__module__
    return new


def _route(original, transfer_backend, class_type, *args, **kwargs):
    if getattr(transfer_backend, "value", transfer_backend) == BACKEND:
        from .sglang import KVFenceBackendProvider
        return KVFenceBackendProvider().get_kv_class(class_type)
    return original(transfer_backend, class_type, *args, **kwargs)


def register():
    from sglang.srt.disaggregation import utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import add_disagg_transfer_backend_choices

    add_disagg_transfer_backend_choices([BACKEND])
    if BACKEND not in {m.value for m in utils.TransferBackend}:
        HookRegistry.register("sglang.srt.disaggregation.utils.TransferBackend", _enlarged(utils.TransferBackend),
                              HookType.REPLACE)
    HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class", _route, HookType.AROUND)
