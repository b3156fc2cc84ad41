"""gpu_mode "direct" (the NIC writes into the engine's GPU pages) is
opt-in: decode needs the engine's buffer (direct_buffer, direct_pages),
and is refused at start-up with a classified reason without it (direct
mode itself runs in cmd/libkvfence's TestDirectModeThroughTheABI on the
fake driver: docs/gpu-direct.md). The SGLang classes pass the key through
to both sides' library config."""
import os
import time

import numpy as np
import pytest

import fakecuda
from kvfence import api, errors, sglang


def test_direct_refused_by_tcp_plugin():
    with pytest.raises(errors.InvalidArgument, match="direct_buffer"):
        api.Decode(rank=0, slots=8, shard_bytes=64, gpu_mode="direct", log_level="off")
    with pytest.raises(errors.InvalidArgument, match="gpu_mode"):
        api.Decode(rank=0, slots=8, shard_bytes=64, gpu_mode="dirct", log_level="off")
    api.Decode(rank=0, slots=8, shard_bytes=64, gpu_mode="staged", log_level="off").close()


def test_direct_layers_refusals():
    """direct_layers refuses what cannot name one page in every buffer."""
    with pytest.raises(errors.InvalidArgument, match="pointers"):
        api.direct_layers([4096, 8192], [4096], [1024, 1024])
    with pytest.raises(errors.InvalidArgument, match="positive"):
        api.direct_layers([4096], [4096], [0])
    with pytest.raises(errors.InvalidArgument, match="same page"):
        api.direct_layers([4096, 8192], [4096, 4096], [1024, 2048])
    assert api.direct_layers([4096, 8192], [4096, 8192], [1024, 2048]) == {
        "gpu_mode": "direct", "direct_buffers": [4096, 8192], "direct_page_bytes": [1024, 2048], "direct_pages": 4}


def test_sglang_passes_gpu_mode_through():
    assert "gpu_mode" in sglang._SHARED_KEYS


CHILD = os.environ.get("KVFENCE_GPU_TEST_CHILD") == "1"

if not CHILD:
    def test_direct_mode_on_the_fake_driver():
        """Direct mode through Python, in a child process whose driver is
        the fake (its device memory is PROT_NONE to the host)."""
        fakecuda.run_child(__file__, 300)
else:
    def test_direct_pages_land_in_the_engines_buffer():
        """decode's engine buffer is exported as a dma-buf at open and
        registered by the TCP plugin process; a request lands in the pages
        init_at named (read back through the driver); a page still lent
        is refused FailedPrecondition until the request is released."""
        cuda = fakecuda.Cuda(os.environ["KVFENCE_CUDA_LIB"])
        buf = cuda.alloc(16 * 4096)
        with api.Decode(rank=0, slots=4, shard_bytes=4096, gpu_mode="direct", direct_buffer=buf, direct_pages=16,
                        control_addr="127.0.0.1:0", log_level="error") as d, \
                api.Prefill(rank=1, decode_addr=d.addr, source_pages=4, shard_bytes=4096, gpu_mode="direct",
                            log_level="error") as p:
            p.wait_linked(60)
            d.wait_linked([1], 60)
            rv, other = d.receiver(41), d.receiver(42)
            rv.init_at([11, 3], [1])
            with pytest.raises(errors.FailedPrecondition, match="still lent"):
                other.init_at([3], [1])
            src = (np.arange(2 * 4096) * 7 % 251).astype(np.uint8)
            s = p.sender(41)
            s.init(2)
            s.write(0, src, count=2)
            s.send(2)
            s.finish(2)
            assert rv.wait(60) == 4
            for i, page in enumerate([11, 3]):
                got = np.zeros(4096, dtype=np.uint8)
                cuda.download(got, buf + page * 4096)
                assert (got == src[i * 4096:(i + 1) * 4096]).all(), "engine page %d" % page
            with pytest.raises(errors.FailedPrecondition, match="engine's own pages"):
                rv.read()
            rv.finish()
            deadline = time.monotonic() + 60
            while not rv.released:
                assert time.monotonic() < deadline, "the request was never released"
                time.sleep(0.01)
            other.init_at([3], [1])
            other.abort()

    def test_direct_pages_split_across_layer_buffers():
        """The engine's KV as one buffer per layer (K and V of two layers,
        direct_layers): each piece of a request's page lands in its
        buffer at the engine page init_at named, read back through the
        driver; an abort after success gives the pages back (released)
        without finish, and they can be lent again."""
        cuda = fakecuda.Cuda(os.environ["KVFENCE_CUDA_LIB"])
        items = [1024] * 4
        ptrs = [cuda.alloc(16 * it) for it in items]
        direct = api.direct_layers(ptrs, [16 * it for it in items], items)
        with api.Decode(rank=0, slots=4, shard_bytes=sum(items), control_addr="127.0.0.1:0", max_hold_ms=600000,
                        log_level="error", **direct) as d, \
                api.Prefill(rank=1, decode_addr=d.addr, source_pages=4, shard_bytes=4096, log_level="error") as p:
            p.wait_linked(60)
            d.wait_linked([1], 60)
            rv = d.receiver(61)
            rv.init_at([5, 14], [1])
            src = (np.arange(2 * 4096) * 13 % 241).astype(np.uint8)
            s = p.sender(61)
            s.init(2)
            s.write(0, src, count=2)
            s.send(2)
            s.finish(2)
            assert rv.wait(60) == 4
            for i, page in enumerate([5, 14]):
                for b, it in enumerate(items):
                    got = np.zeros(it, dtype=np.uint8)
                    cuda.download(got, ptrs[b] + page * it)
                    lo = i * 4096 + b * it
                    assert (got == src[lo:lo + it]).all(), "engine page %d, buffer %d" % (page, b)
            rv.abort()  # the engine drops a finished request: no finish
            deadline = time.monotonic() + 60
            while not rv.released:
                assert time.monotonic() < deadline, "the aborted finished request was never released"
                time.sleep(0.01)
            again = d.receiver(62)
            again.init_at([14, 5], [1])
            again.abort()
