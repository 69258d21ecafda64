#!/usr/bin/env bash
# Quickstart 2: installs the Debian packages, builds cohort and runs the whole test suite
# (C++ unit tests and the end-to-end tests with real PyTorch) through ctest, then the
# package test (tools/package-test.sh: the Debian packages installed, used from /usr/bin
# with the build tree moved away, and removed; about a minute). It runs after ctest, not in
# it: it moves build/dev away while it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh dev
(cd build/dev && ctest --output-on-failure --timeout 900 -j 2)
bash tools/package-test.sh build/dev
