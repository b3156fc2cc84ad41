"""The SGLang scheduler-order scenarios of test_sglang_topologies.py with
every KV buffer in (fake) GPU memory: kvfence's staged mode.

The fake CUDA driver (gpumem/testdata/fakecuda.c, built here with gcc) maps
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
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CHILD = os.environ.get("KVFENCE_GPU_TEST_CHILD") == "1"


def _build_fake(dirname):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the fake CUDA driver cannot be built")
    lib = os.path.join(dirname, "libfakecuda.so")
    r = subprocess.run(["gcc", "-Wall", "-shared", "-fPIC", "-O1", "-pthread", "-o", lib,
                        os.path.join(ROOT, "gpumem", "testdata", "fakecuda.c")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("the fake CUDA driver does not build: %s" % r.stderr.strip()[-300:])
    return lib


if not CHILD:
    def test_sglang_scenarios_with_kv_in_fake_gpu_memory():
        with tempfile.TemporaryDirectory(prefix="kvfence-gpu-") as d:
            env = dict(os.environ, KVFENCE_GPU_TEST_CHILD="1", KVFENCE_CUDA_LIB=_build_fake(d))
            env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), HERE, env.get("PYTHONPATH", "")])
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
                               env=env, capture_output=True, text=True, timeout=1500)
            tail = (r.stdout + r.stderr)[-6000:]
            assert r.returncode == 0, "the GPU scenarios failed (exit %d; a negative one is a signal):\n%s" % (
                r.returncode, tail)
            print(tail.strip().splitlines()[-1])
else:
    from kvfence import checks, errors
    import sglang_topo

    class _Cuda:
        """The fake driver, loaded by path: the same library (and device
        memory) kvfence's Go side opened."""

        def __init__(self, path):
            self.lib = ctypes.CDLL(path)
            for name, args in (("cuInit", [ctypes.c_uint]),
                               ("cuMemAlloc_v2", [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                               ("cuMemcpyHtoD_v2", [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]),
                               ("cuMemcpyDtoH_v2", [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t])):
                fn = getattr(self.lib, name)
                fn.restype, fn.argtypes = ctypes.c_int, args
            assert self.lib.cuInit(0) == 0

        def alloc(self, n):
            p = ctypes.c_uint64(0)
            assert self.lib.cuMemAlloc_v2(ctypes.byref(p), n) == 0
            return p.value

        def upload(self, dst, src):
            assert self.lib.cuMemcpyHtoD_v2(dst, ctypes.addressof(src), len(src)) == 0

        def download(self, dst, src):
            assert self.lib.cuMemcpyDtoH_v2(ctypes.addressof(dst), src, len(dst)) == 0

    CUDA = _Cuda(os.environ["KVFENCE_CUDA_LIB"])
    HostEngine = sglang_topo.Engine

    class GPUEngine(HostEngine):
        """An engine whose KV buffers live in fake device memory: self.kv
        is the test's host image of them, moved only through the driver."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.dev = [CUDA.alloc(len(b)) for b in self.kv]
            for d, b in zip(self.dev, self.kv):
                CUDA.upload(d, b)  # zeros

        def kv_args(self, cls, rank):
            a = super().kv_args(cls, rank)
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
