#!/bin/sh
# Copies the Fashion-MNIST files from $1 into $2, checks that they are whole gzip IDX files
# and writes the sample counts as the step outputs train_samples and test_samples.
set -eu
src=$1
dst=$2
mkdir -p "$dst"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  gzip -t "$src/$f.gz"
  cp "$src/$f.gz" "$dst/$f.gz.tmp"
  mv "$dst/$f.gz.tmp" "$dst/$f.gz"
done
# An IDX header: magic (4 bytes), then the count as a big-endian 32-bit number.
count() { gzip -dc "$1" | head -c 8 | od -An -tu1 | awk '{print $5*16777216 + $6*65536 + $7*256 + $8}'; }
train=$(count "$dst/train-labels-idx1-ubyte.gz")
test=$(count "$dst/t10k-labels-idx1-ubyte.gz")
echo "train samples: $train, test samples: $test"
[ "$train" -gt 0 ] && [ "$test" -gt 0 ]
echo "$train" > "$COHORT_OUTPUTS/train_samples"
echo "$test" > "$COHORT_OUTPUTS/test_samples"
