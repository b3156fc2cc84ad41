"""Runs the pytest suite as a few pytest processes at once (make bindings-py).

Most of the suite's time is waiting: leases running out, peers that hang on
purpose, known-unsafe races given time to show (about 55 s of CPU in 150 s
of wall time on a 2-core machine). Test files are spread over --groups
processes, the heaviest first, each onto the group with the least estimated
time; every file runs whole in one process, in pytest's own order, so a
file's fixtures and module state are what they are in a serial run. Each
group's output is printed whole when it ends (never interleaved), and the
exit status is the first failing group's, or 0.

Usage: run_groups.py [--groups N] [--ignore PATH]... DIR [pytest args...]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

# Seconds a serial run spends in a file (2-core machine, 2026-12-06); a file
# not listed counts as one second. Only the balance depends on these.
WEIGHTS = {
    "test_sglang_topologies.py": 67,
    "test_vllm_connector.py": 53,
    "test_sglang_links.py": 28,
    "test_sglang_races.py": 20,
    "test_hostile.py": 10,
    "test_sglang_swa.py": 9,
}


def plan(files, groups):
    """Assigns files to groups: heaviest first, each to the lightest group."""
    order = sorted(files, key=lambda f: (-WEIGHTS.get(os.path.basename(f), 1), f))
    load = [0] * groups
    out = [[] for _ in range(groups)]
    for f in order:
        g = load.index(min(load))
        out[g].append(f)
        load[g] += WEIGHTS.get(os.path.basename(f), 1)
    return [sorted(g) for g in out if g]


def main(argv):
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--ignore", action="append", default=[])
    ap.add_argument("dir")
    args, pytest_args = ap.parse_known_args(argv)
    if args.groups < 1:
        ap.error("--groups must be at least 1")
    if not os.path.isdir(args.dir):
        print(f"run_groups: {args.dir}: not a directory", file=sys.stderr)
        return 2
    ignored = {os.path.normpath(p) for p in args.ignore}
    files = sorted(
        os.path.join(args.dir, n) for n in os.listdir(args.dir)
        if n.startswith("test_") and n.endswith(".py")
        and os.path.normpath(os.path.join(args.dir, n)) not in ignored)
    if not files:
        print(f"run_groups: no test files in {args.dir}", file=sys.stderr)
        return 2
    procs = []
    for i, group in enumerate(plan(files, args.groups)):
        out = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "pytest", *pytest_args, *group]
        procs.append((i, group, out, time.monotonic(), subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)))
    took = {}
    while len(took) < len(procs):
        for i, _, _, began, p in procs:
            if i not in took and p.poll() is not None:
                took[i] = time.monotonic() - began
        time.sleep(0.2)
    status = 0
    for i, group, out, _, p in procs:
        rc = p.returncode
        out.seek(0)
        names = " ".join(os.path.basename(f) for f in group)
        print(f"--- group {i + 1}/{len(procs)} ({names}): exit {rc}, {took[i]:.0f} s")
        sys.stdout.write(out.read())
        sys.stdout.flush()
        if rc != 0 and status == 0:
            status = rc
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
