#!/usr/bin/env bash
# Shows that .ci/check-links.sh can fail: in a scratch repository holding a
# copy of it, each kind of bad link (an inline link, a reference definition
# and a symlink pointing outside the repository; a link to nothing) alone
# makes it exit 1 naming the file, and the clean tree passes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd -P)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/repo/.ci" "$scratch/repo/docs"
cp "$here/check-links.sh" "$scratch/repo/.ci/"
echo outside > "$scratch/outside.md"
cd "$scratch/repo"
git init -q .
printf '# ok\n[design](../README.md) [self](#top) [web](https://example.com)\n\n[ref]: ../README.md\n' > docs/good.md
echo readme > README.md
git add -A
./.ci/check-links.sh || { echo "check-links-test: the clean tree failed" >&2; exit 1; }
fail=0
expect_refused() { # NAME: check-links must exit 1 and name the file
  local err
  if err=$(./.ci/check-links.sh 2>&1); then
    echo "check-links-test: $1 passed, want refused" >&2; fail=1
  elif ! grep -q "$2" <<<"$err"; then
    echo "check-links-test: $1 refused without naming $2: $err" >&2; fail=1
  fi
  git rm -q --cached -r docs/bad* >/dev/null; rm -rf docs/bad*
}
printf '[x](../../outside.md)\n' > docs/bad.md; git add docs/bad.md
expect_refused "an inline link outside" "docs/bad.md: link ../../outside.md points outside"
printf 'text\n\n[x]: ../../outside.md\n' > docs/bad.md; git add docs/bad.md
expect_refused "a reference definition outside" "docs/bad.md: link ../../outside.md points outside"
printf '[x](nothing-here.md)\n' > docs/bad.md; git add docs/bad.md
expect_refused "a link to nothing" "docs/bad.md: link nothing-here.md points to nothing"
ln -s ../../outside.md docs/bad-link.md; git add docs/bad-link.md
expect_refused "a symlink outside" "docs/bad-link.md: symlink points outside"
exit $fail
