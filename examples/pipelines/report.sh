#!/bin/sh
# Writes the run's report (markdown) to $1 from the values the pipeline passes in env.
set -eu
cat > "$1" <<REPORT
# Fashion-MNIST pipeline report

| | |
|---|---|
| model | $MODEL |
| runtime | $RUNTIME |
| steps | $MAX_STEPS |
| training samples | $TRAIN_SAMPLES |
| test samples | $TEST_SAMPLES |
| test accuracy | $ACCURACY |
| training time | ${TRAIN_SECONDS}s |
REPORT
cat "$1"
