#!/usr/bin/env bash
# Quickstart 1: installs the Debian packages, builds cohort and runs the main job on this
# machine with the embedded store (no external service): two data-parallel workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh dev
export COHORT_PYTHON=/usr/bin/python3
ckpt="$(mktemp -d /tmp/cohort-main-job.XXXXXX)"
trap 'rm -rf "$ckpt"' EXIT
exec build/dev/cohort/cli/cohort run --nproc-per-node 2 --max-restarts 2 \
  tests/e2e/ddp_train.py --steps 50 --ckpt-dir "$ckpt"
