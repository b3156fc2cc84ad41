#!/usr/bin/env bash
# Runs `go test` with the given arguments and, when it fails, repeats the
# lines that say why at the end of the output. CI keeps only the tail of a
# run's output, and a crashed test binary's goroutine dump (thousands of
# lines) pushes its "fatal error:" or "panic:" header out of that tail: a
# CI run failed cmd/libkvfence with nothing but the dump's last goroutines
# to read.
set -uo pipefail
GO="${GO:-go}"
log="$(mktemp "${TMPDIR:-/tmp}/kvfence-gotest-XXXXXX.log")"
trap 'rm -f "$log"' EXIT

"$GO" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] && exit 0

echo "==> go test failed (exit $rc); why, from its output:"
# A crash: its header, the test running, and the first goroutine (the one
# that crashed) — up to the first blank line after it.
awk '
  /^(panic: |fatal error: |SIGSEGV|SIGBUS|unexpected fault address|checkptr: )/ { keep = 60 }
  /^WARNING: DATA RACE/ { keep = 40 }
  /^--- FAIL|^FAIL|_test\.go:[0-9]+: / && keep == 0 { print; next }
  keep > 0 { print; keep--; if (keep == 0) print "    [...]" }
' "$log" | head -n 400
# The crash's header once more, last: CI's tail may still cut the lines above
# (it did, keeping only the goroutine dump's end).
grep -m 3 -E '^(panic: |fatal error: |SIGSEGV|SIGBUS|unexpected fault address|checkptr: |WARNING: DATA RACE)' "$log" |
  sed 's/^/==> crashed: /'
exit "$rc"
