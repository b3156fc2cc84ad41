"""kvfence against SGLang's own code: runs sglang_upstream_check.py when
$SGLANG_SRC names the python/ directory of an SGLang checkout (never part of
this repository). Skipped, saying so, when it is not set."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SGLANG_SRC")


@pytest.mark.skipif(not SRC, reason="SGLANG_SRC is not set: SGLang's base classes and plugin loader were not checked")
def test_classes_satisfy_sglang_and_plugin_routes_get_kv_class(tmp_path):
    assert os.path.isdir(os.path.join(SRC, "sglang", "srt", "disaggregation", "base")), \
        "SGLANG_SRC=%s is not SGLang's python/ directory" % SRC
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.path.join(HERE, "..")]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "sglang_upstream_check.py"), str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=120)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("OK")
