"""kvfence driven by SGLang's own queue methods: runs sglang_queues_check.py
when $SGLANG_SRC names the python/ directory of an SGLang checkout (never
part of this repository). Skipped, saying so, when it is not set; the same
scenarios run without SGLang in test_sglang_topologies.py."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SGLANG_SRC")


@pytest.mark.skipif(not SRC, reason="SGLANG_SRC is not set: SGLang's own DecodePreallocQueue (incl. "
                                    "pop_preallocated), send_kv_chunk, poll_and_all_reduce and "
                                    "query_prefill_dp_ranks were not run against kvfence")
def test_sglang_queue_methods_drive_kvfence():
    assert os.path.isfile(os.path.join(SRC, "sglang", "srt", "disaggregation", "decode.py")), \
        "SGLANG_SRC=%s is not SGLang's python/ directory" % SRC
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, ".."), HERE]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "sglang_queues_check.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.strip().endswith("OK")
