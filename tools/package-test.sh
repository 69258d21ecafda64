#!/usr/bin/env bash
# The Debian packages, tested as a user installs them (root, Debian 12): builds them with
# CPack from a built tree (default build/dev), installs them with apt-get (their
# dependencies come from Debian's archive), moves the build tree out of reach and, from
# /usr/bin with no PYTHONPATH:
#   1. runs the main job, `cohort run --nproc-per-node 2 -- cohort-train ...` on Fashion-MNIST;
#   2. runs a PyTorch script that imports cohort_torch, all-reduces on the "cohort"
#      backend and saves and loads a checkpoint (cohort_torch.checkpoint), under
#      `cohort run` and under torchrun: both ranks print the same sum, restored;
#   3. checks the store's systemd unit (systemd-analyze verify) and the man pages;
#   4. removes the packages (purge) and checks that none of their files is left.
# Prints what it checks; exits non-zero at the first failure (the build tree is put back).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=$(realpath "${1:-build/dev}")
out=$(mktemp -d /tmp/cohort-package-test.XXXXXX)
step() { echo "== $*"; }

step "building the packages (cpack) in $out"
bash tools/make-debs.sh "$build" "$out"
debs=("$out"/*.deb)
step "installing them with apt-get"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${debs[@]}" >"$out/apt.log" 2>&1 ||
  { tail -30 "$out/apt.log"; exit 1; }
dpkg -L cohort python3-cohort-torch | sort -u >"$out/files.txt"
grep -v '^/\.\?$' "$out/files.txt" | while read -r f; do [ -d "$f" ] || echo "$f"; done \
  | grep . >"$out/installed-files.txt"
echo "installed files:"; sed 's/^/  /' "$out/installed-files.txt"

away="$build.away-$$"
mv "$build" "$away"
# Whatever happens: the build tree back, the packages removed.
trap 'mv "$away" "$build"; apt-get purge -y -q python3-cohort-torch cohort >/dev/null 2>&1 || true' EXIT
cd "$out"
unset PYTHONPATH
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

step "1. the main job from /usr/bin"
cohort run --nproc-per-node 2 --max-restarts 1 -- cohort-train --model cnn \
  --dataset fashion-mnist --data-dir /usr/share/datasets/fashion-mnist --epochs 1 \
  --max-steps 60 --batch-size 64 --log-every 20 --checkpoint-dir "$out/ckpt" \
  2>&1 | tee "$out/main.log" | tail -5
ls "$out/ckpt" | grep -q . || { echo "no checkpoint written"; exit 1; }

step "2. a PyTorch script that imports cohort_torch"
cat >"$out/allreduce.py" <<'PY'
import os
import torch
import torch.distributed as dist
import sys
import cohort_torch  # registers the "cohort" backend
import cohort_torch.checkpoint as ckpt
dist.init_process_group("cohort")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# A checkpoint through the installed extension, and the job's newest back on every rank.
ckpt.save({"sum": t}, 7, sys.argv[1])
ckpt.flush()
state, step = ckpt.load(sys.argv[1])
# One write(2) per line: under torchrun the ranks share one stdout.
os.write(1, ("rank %d of %d sum %g restored %g at %d from %s\n" % (
    dist.get_rank(), dist.get_world_size(), t.item(), state["sum"].item(), step,
    os.path.dirname(cohort_torch.__file__))).encode())
dist.destroy_process_group()
PY
check_sums() {  # $1: log; both ranks of 2 print sum 3 from the installed package
  local n
  n=$(grep -c "of 2 sum 3 restored 3 at 7 from /usr/lib/python3/dist-packages/cohort_torch" \
    "$1" || true)
  [ "$n" = 2 ] || { echo "expected 2 ranks with sum 3 (and its checkpoint) from the installed package:"; cat "$1"; exit 1; }
  echo "  2 ranks, equal sums, the checkpoint restored, cohort_torch from /usr/lib/python3/dist-packages"
}
cohort run --nproc-per-node 2 -- /usr/bin/python3 "$out/allreduce.py" "$out/ckpt-run" \
  >"$out/cohort-run.log" 2>&1
echo "under cohort run:"; check_sums "$out/cohort-run.log"
torchrun --standalone --nproc_per_node 2 --redirects 2 --tee 2 "$out/allreduce.py" "$out/ckpt-torchrun" \
  >"$out/torchrun.log" 2>&1
echo "under torchrun:"; check_sums "$out/torchrun.log"

step "3. cohort ui from the package, over a job the installed cohort ran"
export COHORT_HOME="$out/home"
printf 'name: packaged\nentrypoint: /bin/sh\nargs: [-c, "echo hello from the package"]\n' \
  >"$out/packaged.yaml"
cohort submit "$out/packaged.yaml" --wait >"$out/submit.log" 2>&1 || { cat "$out/submit.log"; exit 1; }
cohort ui >"$out/ui.log" 2>&1 &
ui_pid=$!
for _ in $(seq 100); do grep -q "cohort ui on" "$out/ui.log" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*/' "$out/ui.log" | head -1)
page=$(curl -fsS --noproxy '*' "${url}jobs/1" || true)
log=$(curl -fsS --noproxy '*' "${url}jobs/1/log.txt" || true)
kill "$ui_pid"; wait "$ui_pid" || true
unset COHORT_HOME
echo "$page" | grep -q 'data-state="succeeded"' && echo "$log" | grep -q "hello from the package" \
  || { echo "cohort ui did not show the job:"; cat "$out/ui.log"; echo "$page" | head -40; exit 1; }
echo "  $url: job 1 succeeded, its log served"

step "4. the store's systemd unit and the man pages"
unit=$(grep 'cohort-store.service$' "$out/installed-files.txt")
systemd-analyze verify "$unit" 2>&1 | grep -v "^$" | tee "$out/verify.log" || true
if grep -qi "error\|invalid\|unknown" "$out/verify.log"; then exit 1; fi
echo "  $unit verified"
for m in cohort.1 cohort-train.1; do
  f=$(grep "/man1/$m" "$out/installed-files.txt")
  zcat -f "$f" | grep -q "^.SH DESCRIPTION" || { echo "$f is not a man page"; exit 1; }
  echo "  $f"
done

step "5. removing the packages"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q python3-cohort-torch cohort \
  >"$out/purge.log" 2>&1 || { tail -20 "$out/purge.log"; exit 1; }
left=$(while read -r f; do [ -e "$f" ] && echo "$f"; done <"$out/installed-files.txt" || true)
[ -z "$left" ] || { echo "left behind:"; echo "$left"; exit 1; }
echo "  nothing left of $(wc -l <"$out/installed-files.txt") installed files"
echo "package test passed (logs in $out)"
