#!/usr/bin/env bash
# Quickstart 1: installs the Debian packages, builds cohort and runs the main job on this
# machine with the embedded store (no external service): the C++ trainer (libtorch) on the
# real Fashion-MNIST data set, two data-parallel workers, restart budget 2, checkpoints.
# Lean: only the packages the main job needs, and only the two programs it runs (release
# build in build/release); tools/run-tests.sh installs and builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh --main
bash tools/build.sh release cohort cohort-train
ckpt="$(mktemp -d /tmp/cohort-main-job.XXXXXX)"
trap 'rm -rf "$ckpt"' EXIT
# Not exec: the trap removes the checkpoints when the job ends (cohort's exit code is kept).
build/release/cohort/cli/cohort run --nproc-per-node 2 --max-restarts 2 -- \
  build/release/cohort/cli/cohort-train --model cnn --dataset fashion-mnist \
  --data-dir /usr/share/datasets/fashion-mnist --epochs 6 --batch-size 64 --lr 0.05 \
  --checkpoint-dir "$ckpt" --checkpoint-every 200 --metrics-file "$ckpt/metrics.jsonl"
