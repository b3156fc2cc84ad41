#!/usr/bin/env bash
# Every relative link in the repository's Markdown (inline or a reference
# definition), and every symlink it holds, must resolve to an existing path
# inside the repository: a link to a file outside it works on one machine
# only. .ci/check-links-test.sh shows it catches each kind.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)
bad=0
inside() { case "$1" in "$root"|"$root"/*) return 0;; esac; return 1; }
# links FILE: the targets of its inline links, [text](target), and of its
# reference definitions, [label]: target (a <target> loses its brackets).
links() {
  { grep -oE '\]\([^) ]+\)' "$1" || true; } | sed -E 's/^\]\((.*)\)$/\1/'
  { grep -oE '^ {0,3}\[[^]]+\]: *[^ ]+' "$1" || true; } | sed -E 's/^ {0,3}\[[^]]+\]: *<?([^>]*)>?$/\1/'
}
while IFS= read -r f; do
  dir=$(dirname "$f")
  while IFS= read -r t; do
    t=${t%%#*}
    [ -n "$t" ] || continue
    case "$t" in http://*|https://*|mailto:*) continue;; esac
    case "$t" in /*) p=$t;; *) p=$(realpath -m "$dir/$t");; esac
    if ! inside "$p"; then echo "$f: link $t points outside the repository" >&2; bad=1
    elif [ ! -e "$p" ]; then echo "$f: link $t points to nothing" >&2; bad=1; fi
  done < <(links "$f")
done < <(git ls-files '*.md')
while IFS= read -r l; do
  p=$(realpath -m "$(dirname "$l")/$(readlink "$l")")
  if ! inside "$p"; then echo "$l: symlink points outside the repository ($p)" >&2; bad=1
  elif [ ! -e "$l" ]; then echo "$l: dangling symlink" >&2; bad=1; fi
done < <(git ls-files -s | awk '$1 == "120000" { print $4 }')
exit $bad
