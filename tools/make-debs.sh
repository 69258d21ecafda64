#!/usr/bin/env bash
# Makes cohort's Debian packages (cohort, python3-cohort-torch) with CPack from a build tree:
# configures it for Debian's layout (prefix /usr: the store unit names its binary by that
# path), builds what changed, and writes the .deb files to OUT, printing each one's
# Package, Version and Depends. Usage: tools/make-debs.sh BUILD_DIR OUT_DIR
# (tools/package-test.sh and tools/image-test.sh use it). Idempotent.
set -euo pipefail
build=$(realpath "$1")
out=$(mkdir -p "$2" && realpath "$2")
cmake -DCMAKE_INSTALL_PREFIX=/usr "$build" >/dev/null
cmake --build "$build" >/dev/null
(cd "$build" && cpack -G DEB -B "$out" >"$out/cpack.log" 2>&1) ||
  { tail -30 "$out/cpack.log"; exit 1; }
rm -rf "$out/_CPack_Packages"
for d in "$out"/*.deb; do
  echo "$(basename "$d"):"; dpkg-deb -f "$d" Package Version Depends | sed 's/^/  /'
done
