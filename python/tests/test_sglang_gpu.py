"""The SGLang scheduler-order scenarios of test_sglang_topologies.py with
every KV buffer in (fake) GPU memory: kvfence's staged mode.

The fake CUDA driver (gpumem/testdata/fakecuda.c, built by fakecuda.py with gcc) maps
its device memory PROT_NONE to the host, so any host touch of a KV page -
by kvfence or by the test - crashes the process: the scenarios passing
proves every KV byte moved through the driver. Every page is written and
checked by copying through the driver (cuMemcpyHtoD / cuMemcpyDtoH). Aux
rows stay host memory (kvfence's SGLang classes copy them with host code).

kvfence's Go side reads $KVFENCE_CUDA_LIB when the library loads, so the
scenarios run in a child pytest with it pointing at the fake; this file's
parent test only builds the fake and runs the child. Skipped with a reason
when gcc or the fake cannot be built."""
import ctypes
import os
import subprocess
import sys

import pytest

import fakecuda

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.environ.get("KVFENCE_GPU_TEST_CHILD") == "1"

if not CHILD:
    def test_sglang_scenarios_with_kv_in_fake_gpu_memory():
        fakecuda.run_child(__file__, 1500)
else:
    from kvfence import checks, errors
    import sglang_topo

    CUDA = fakecuda.Cuda(os.environ["KVFENCE_CUDA_LIB"])
    HostEngine = sglang_topo.Engine

    class GPUEngine(HostEngine):
        """An engine whose KV buffers live in fake device memory: self.kv
        is the test's host image of them, moved only through the driver."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.dev = [CUDA.alloc(len(b)) for b in self.kv]
            for d, b in zip(self.dev, self.kv):
                CUDA.upload(d, b)  # zeros

        def kv_args(self, cls, rank, dp=0):
            a = super().kv_args(cls, rank, dp)
            a.kv_data_ptrs = list(self.dev)
            return a

        def fill(self, *a, **kw):
            for d, b in zip(self.dev, self.kv):
                CUDA.download(b, d)
            super().fill(*a, **kw)
            for d, b in zip(self.dev, self.kv):
                CUDA.upload(d, b)

        def corrupt_heads(self, *a, **kw):
            for d, b in zip(self.dev, self.kv):
                CUDA.download(b, d)
            return super().corrupt_heads(*a, **kw)

    sglang_topo.Engine = GPUEngine

    # Every scenario of the topologies file, now over GPUEngine.
    from test_sglang_topologies import *  # noqa: F401,F403,E402

    def test_kv_buffers_are_device_memory():
        e = GPUEngine(2, 0, (16, 8))
        assert all(checks.is_device(p) for p in e.dev)
        assert not any(checks.is_device(ctypes.addressof(b)) for b in e.aux)
        checks.device_range(e.dev[0], len(e.kv[0]))
        with pytest.raises(errors.InvalidArgument):
            checks.device_range(ctypes.addressof(e.kv[0]), len(e.kv[0]))

    def test_aux_rows_in_device_memory_are_refused():
        from kvfence.sglang import KVFenceBackendProvider
        P = KVFenceBackendProvider()
        e = GPUEngine(4, 0, (16, 8))
        a = e.kv_args(P.get_kv_class("kvargs"), 0)
        a.aux_data_ptrs = [CUDA.alloc(len(b)) for b in e.aux]
        with pytest.raises(errors.Unimplemented):
            P.get_kv_class("manager")(a, "decode", None, False)

    def test_control_a_host_touch_of_fake_device_memory_kills_the_process():
        """The control arm: the scenarios above would not survive a single
        host-side read of a KV page (the fake's device memory is PROT_NONE
        to the host), so their passing shows nothing touched one."""
        code = ("import ctypes, os, sys; sys.path[:0] = %r; import test_sglang_gpu as g; "
                "e = g.GPUEngine(2, 0, (16, 8)); buf = (ctypes.c_char * 8)(); "
                "ctypes.memmove(buf, e.dev[0], 8); print('read device memory from the host')" % ([HERE],))
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=120)
        assert r.returncode == -11 and "read device memory" not in r.stdout, (r.returncode, r.stdout, r.stderr[-500:])
