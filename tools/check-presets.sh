#!/usr/bin/env bash
# Configures every visible configure preset of CMakePresets.json into a temporary build
# directory (removed afterwards), so a preset that no longer configures fails the tests.
# Usage: tools/check-presets.sh   (from anywhere; run by ctest as presets_configure)
set -euo pipefail
cd "$(dirname "$0")/.."
presets=$(/usr/bin/python3 -c 'import json
for p in json.load(open("CMakePresets.json"))["configurePresets"]:
    if not p.get("hidden"): print(p["name"])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for p in $presets; do
  if cmake --preset "$p" -B "$work/$p" >"$work/$p.log" 2>&1; then
    echo "preset $p: configures"
  else
    echo "preset $p: FAILED to configure"; cat "$work/$p.log"; failed=1
  fi
done
exit $failed
