#!/usr/bin/env bash
# Prints what `make unit-long` runs: first line the -run pattern naming every
# top-level test that holds the long-test mark, then one package directory
# per line. A test is long when it (or one of its subtests) skips, when
# KVFENCE_TEST_QUICK is set (make unit sets it), with exactly this reason:
# a test that gains the mark is run by `make test-long` (and so by CI)
# without a list to keep in step.
set -euo pipefail
cd "$(dirname "$0")/.."
mark='long test: make test-long runs it'
names=() dirs=()
while IFS= read -r f; do
  # The enclosing top-level function of each mark; a mark outside a Test
  # function (a helper) could not be selected with -run: refuse it.
  while IFS= read -r n; do
    case "$n" in
      Test*) names+=("$n") ;;
      *) echo "$f: the long-test mark is outside a Test function ($n): make test-long could not select it" >&2; exit 1 ;;
    esac
  done < <(awk -v mark="$mark" '
    /^func / { fn = $2; sub(/\(.*/, "", fn) }
    index($0, mark) { print (fn == "" ? "(none)" : fn) }' "$f" | sort -u)
  dirs+=("./$(dirname "$f")")
done < <(git ls-files -co --exclude-standard '*_test.go' | xargs grep -l -F "$mark" || true)
if [ ${#names[@]} = 0 ]; then echo '^$'; exit 0; fi
printf '^(%s)$\n' "$(printf '%s\n' "${names[@]}" | sort -u | paste -sd'|')"
printf '%s\n' "${dirs[@]}" | sort -u
