#!/usr/bin/env bash
# Configures and builds cohort with the given CMake preset (default: dev); further arguments
# name the only targets to build (default: all). Idempotent.
#   tools/build.sh [PRESET [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-dev}"
shift || true
cmake --preset "$preset" >/dev/null
targets=()
if [ $# -gt 0 ]; then targets=(--target "$@"); fi
cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"
