"""The fake CUDA driver (gpumem/testdata/fakecuda.c) for the Python tests
of KV in GPU memory: build() compiles it with gcc, run_child() runs a test
file again in a child pytest with kvfence pointed at it, and Cuda loads it
by path to allocate "device memory" and move the test's bytes through it.

Its device memory is mapped PROT_NONE to the host: a host read of it kills
the process. kvfence's Go side reads $KVFENCE_CUDA_LIB when the library
loads, hence the child process. test_vllm_gpu.py and test_sglang_gpu.py
use it."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def build(dirname):
    """The fake's path under dirname; skips the test (with the reason) when
    gcc is missing or the fake does not build."""
    import pytest
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the fake CUDA driver cannot be built")
    lib = os.path.join(dirname, "libfakecuda.so")
    src = os.path.join(ROOT, "gpumem", "testdata", "fakecuda.c")
    r = subprocess.run(["gcc", "-Wall", "-shared", "-fPIC", "-O1", "-pthread", "-o", lib, src], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("the fake CUDA driver does not build: %s" % r.stderr.strip()[-300:])
    return lib


def run_child(test_file, timeout, **env_extra):
    """Runs test_file in a child pytest with KVFENCE_GPU_TEST_CHILD=1 and
    KVFENCE_CUDA_LIB at a fresh fake; fails with the child's tail."""
    with tempfile.TemporaryDirectory(prefix="kvfence-gpu-") as d:
        env = dict(os.environ, KVFENCE_GPU_TEST_CHILD="1", KVFENCE_CUDA_LIB=build(d), **env_extra)
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), HERE, env.get("PYTHONPATH", "")])
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file],
                           env=env, capture_output=True, text=True, timeout=timeout)
    out = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, "the GPU scenarios failed (exit %d; a negative one is a signal):\n%s" % (r.returncode, out)
    print(out.strip().splitlines()[-1])


class Cuda:
    """The driver at path (the same library, so the same device memory,
    that kvfence's Go side opened in this process)."""

    _CALLS = {"cuInit": [ctypes.c_uint], "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
              "cuMemcpyHtoD_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
              "cuMemcpyDtoH_v2": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]}

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name, args in self._CALLS.items():
            getattr(self.lib, name).restype = ctypes.c_int
            getattr(self.lib, name).argtypes = args
        assert self.lib.cuInit(0) == 0

    def alloc(self, n):
        p = ctypes.c_uint64(0)
        assert self.lib.cuMemAlloc_v2(ctypes.byref(p), n) == 0
        return p.value

    def upload(self, dst, arr):
        """The bytes of arr (a C-contiguous numpy array or a ctypes array)
        to device address dst."""
        ptr, n = _host(arr)
        assert self.lib.cuMemcpyHtoD_v2(dst, ptr, n) == 0

    def download(self, arr, src):
        ptr, n = _host(arr)
        assert self.lib.cuMemcpyDtoH_v2(ptr, src, n) == 0


def _host(arr):
    """(address, bytes) of a host buffer the tests hand the driver."""
    if isinstance(arr, ctypes.Array):
        return ctypes.addressof(arr), ctypes.sizeof(arr)
    assert arr.flags.c_contiguous
    return arr.ctypes.data, arr.nbytes
