#!/usr/bin/env bash
# Quickstart 1: installs the Debian packages, builds cohort and runs the main job on this
# machine with the embedded store (no external service): the C++ trainer (libtorch) on the
# real Fashion-MNIST data set, two data-parallel workers, restart budget 2, checkpoints.
# Lean: only the packages the main job needs, and only the two programs it runs (release
# build in build/release); tools/run-tests.sh installs and builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() { echo "run-main-job: $1 in $SECONDS s"; SECONDS=0; }
SECONDS=0
bash tools/install-deps.sh --main
phase "packages"
bash tools/build.sh release cohort cohort-train
phase "built cohort and cohort-train"
ckpt="$(mktemp -d /tmp/cohort-main-job.XXXXXX)"
# Not exec: the trap removes the checkpoints when the job ends (cohort's exit code is kept).
trap 'rc=$?; phase "the main job ended (exit $rc)"; rm -rf "$ckpt"' EXIT
build/release/cohort/cli/cohort run --nproc-per-node 2 --max-restarts 2 -- \
  build/release/cohort/cli/cohort-train --model cnn --dataset fashion-mnist \
  --data-dir /usr/share/datasets/fashion-mnist --epochs 5 --batch-size 64 --lr 0.05 \
  --checkpoint-dir "$ckpt" --checkpoint-every 200 --metrics-file "$ckpt/metrics.jsonl"
