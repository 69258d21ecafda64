#!/usr/bin/env bash
# Quickstart 2: installs the Debian packages, builds cohort and runs the whole test suite
# (C++ unit tests and the end-to-end tests with real PyTorch) through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh dev
cd build/dev
ctest --output-on-failure --timeout 900 -j 2
