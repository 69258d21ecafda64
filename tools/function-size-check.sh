#!/usr/bin/env bash
# Lists production functions in cohort/ longer than 100 lines (clang-tidy's
# readability-function-size), from the compile commands of build/<preset>. About 5 minutes
# on 2 cores, so it is not part of the CI run; docs/map.md asks for it before a review.
#   bash tools/function-size-check.sh [build dir, default build/dev]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/dev}
mapfile -t files < <(git ls-files 'cohort/*.cc' | grep -v -E '_test\.cc$|/fuzz/|_peer\.cc$')
out=$(clang-tidy -p "$build" --quiet -checks='-*,readability-function-size' \
  -config='{CheckOptions: [{key: readability-function-size.LineThreshold, value: 100}]}' \
  "${files[@]}" 2>/dev/null | grep -A3 'warning: function' | grep -E 'warning|lines including' || true)
if [ -n "$out" ]; then
  echo "$out"
  echo "function-size-check: the functions above are longer than 100 lines" >&2
  exit 1
fi
echo "function-size-check: no function in ${#files[@]} files is longer than 100 lines"
