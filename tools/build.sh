#!/usr/bin/env bash
# Configures and builds cohort with the given CMake preset (default: dev). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-dev}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
