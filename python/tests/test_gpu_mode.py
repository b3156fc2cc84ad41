"""gpu_mode "direct" (the NIC writes into the engine's GPU pages) is
opt-in and refused at start-up with a classified reason: here by the TCP
reference plugin, a real plugin process that takes CPU-mappable dma-bufs,
as Unimplemented, because the library does not yet export the engine's
buffers (the Go agent runs direct mode: docs/gpu-direct.md). The SGLang
classes pass the key through to both sides' library config."""
import pytest

from kvfence import api, errors, sglang


def test_direct_refused_by_tcp_plugin():
    with pytest.raises(errors.Unimplemented, match="does not yet export"):
        api.Decode(rank=0, slots=8, shard_bytes=64, gpu_mode="direct", log_level="off")
    with pytest.raises(errors.InvalidArgument, match="gpu_mode"):
        api.Decode(rank=0, slots=8, shard_bytes=64, gpu_mode="dirct", log_level="off")
    api.Decode(rank=0, slots=8, shard_bytes=64, gpu_mode="staged", log_level="off").close()


def test_sglang_passes_gpu_mode_through():
    assert "gpu_mode" in sglang._SHARED_KEYS
