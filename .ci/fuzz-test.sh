#!/usr/bin/env bash
# Shows that .ci/fuzz.sh can fail: with a stand-in for go, a run that wrote
# a failing input fails at once, a plain failure fails at once, the
# coordinator's deadline race with nothing written is run again and fails
# after three, and passes once a rerun passes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd -P)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/pkg"
cat > "$scratch/go" <<'GO'
#!/usr/bin/env bash
# the stand-in: $MODE says what this run does; runs are counted in $RUNS
echo x >> "$RUNS"
case $MODE in
  crasher) mkdir -p pkg/testdata/fuzz/FuzzX; echo input > pkg/testdata/fuzz/FuzzX/abc
           printf -- '--- FAIL: FuzzX\n    context deadline exceeded\n'; exit 1;;
  plain)   printf -- '--- FAIL: FuzzX\n    panic: boom\n'; exit 1;;
  race)    printf -- '--- FAIL: FuzzX\n    context deadline exceeded\n'; exit 1;;
  race-then-pass) [ "$(wc -l < "$RUNS")" -ge 2 ] && { echo PASS; exit 0; }
           printf -- '--- FAIL: FuzzX\n    context deadline exceeded\n'; exit 1;;
esac
GO
chmod +x "$scratch/go"
cd "$scratch"
check() { # MODE WANT_RC WANT_RUNS
  rm -rf pkg/testdata; : > runs
  rc=0; RUNS=$scratch/runs MODE=$1 GO=$scratch/go "$here/fuzz.sh" ./pkg FuzzX 1s > out 2>&1 || rc=$?
  runs=$(wc -l < runs)
  if [ "$rc" != "$2" ] || [ "$runs" != "$3" ]; then
    echo "fuzz-test: $1: exit $rc after $runs run(s), want exit $2 after $3" >&2; cat out >&2; exit 1
  fi
}
check crasher 1 1
check plain 1 1
check race 1 3
check race-then-pass 0 2
echo "fuzz-test: fuzz.sh fails on a written input or any other failure, and reruns only the deadline race"
