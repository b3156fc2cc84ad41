#!/bin/bash
# fuzz.sh PKG TARGET FUZZTIME: go test -fuzz TARGET in PKG for FUZZTIME.
#
# Go 1.26's fuzz coordinator can end a run that found nothing with
# "context deadline exceeded" at the -fuzztime boundary, a race in its own
# shutdown (go.dev/issue/75804, fixed in Go 1.27; seen here once in CI on
# FuzzDecodeControl). A real failure writes its input under
# PKG/testdata/fuzz/TARGET; so exactly that outcome — the deadline message
# and no new input — is run again (twice at most), and anything else fails.
set -u
pkg=$1 target=$2 fuzztime=$3
dir=$pkg/testdata/fuzz/$target
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for try in 1 2 3; do
  before=$(ls "$dir" 2>/dev/null)
  echo "${GO:-go} test -run '^\$' -fuzz '^$target\$' -fuzztime $fuzztime $pkg"
  "${GO:-go}" test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" "$pkg" > "$out" 2>&1
  rc=$?
  cat "$out"
  [ $rc = 0 ] && exit 0
  if grep -q '^    context deadline exceeded$' "$out" && [ "$(ls "$dir" 2>/dev/null)" = "$before" ]; then
    echo "fuzz.sh: $target: the fuzz coordinator stopped with 'context deadline exceeded' at -fuzztime and wrote no failing input (go.dev/issue/75804): run $try, running it again"
    continue
  fi
  exit $rc
done
echo "fuzz.sh: $target: the coordinator's deadline race three times in a row"
exit 1
