"""run_groups.py, the runner make bindings-py uses: every file runs once,
the heavy ones apart, and a failing group fails the run."""
import os
import subprocess
import sys

import run_groups

HERE = os.path.dirname(os.path.abspath(__file__))


def test_plan_runs_every_file_once_and_spreads_the_heavy_ones():
    files = [f"t/test_{i}.py" for i in range(9)] + [f"t/{n}" for n in run_groups.WEIGHTS]
    groups = run_groups.plan(files, 3)
    flat = [f for g in groups for f in g]
    assert sorted(flat) == sorted(files)
    heaviest = sorted(run_groups.WEIGHTS, key=run_groups.WEIGHTS.get)[-3:]
    homes = {i for i, g in enumerate(groups) for f in g if os.path.basename(f) in heaviest}
    assert len(homes) == 3, groups
    assert run_groups.plan(files, 1) == [sorted(files)]


def run(tmp_path, *files):
    for name, body in files:
        (tmp_path / name).write_text(body)
    return subprocess.run([sys.executable, os.path.join(HERE, "run_groups.py"), "--groups", "2",
                           "--ignore", str(tmp_path / "test_ignored.py"), str(tmp_path),
                           "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=120)


def test_a_failing_group_fails_the_run_and_its_output_is_shown(tmp_path):
    r = run(tmp_path, ("test_good.py", "def test_ok():\n    pass\n"),
            ("test_bad.py", "def test_broken():\n    assert 1 == 2\n"),
            ("test_ignored.py", "def test_never():\n    assert False\n"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_broken" in r.stdout and "1 passed" in r.stdout
    assert "test_never" not in r.stdout


def test_all_groups_passing_pass(tmp_path):
    r = run(tmp_path, ("test_a.py", "def test_a():\n    pass\n"), ("test_b.py", "def test_b():\n    pass\n"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("1 passed") == 2


def test_nonsense_is_a_usage_error(tmp_path):
    for args in (["--groups", "0", str(tmp_path)], ["--groups", "x", str(tmp_path)], [str(tmp_path / "missing")], [str(tmp_path)]):
        r = subprocess.run([sys.executable, os.path.join(HERE, "run_groups.py"), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, args
