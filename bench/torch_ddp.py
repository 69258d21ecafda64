#!/usr/bin/python3
"""The same PyTorch DDP training script on the "cohort" backend and on "gloo", side by side.

    /usr/bin/python3 bench/torch_ddp.py [--nprocs 2,4] [--steps 40] [--width 32] [--reps 3]

Workload: tests/torch/ddp_fashion.py --bench (a CNN on the real Fashion-MNIST, global batch
64, DDP with its default 25 MiB buckets), launched by `cohort run --nproc-per-node N` for
each backend in a rotated order within each repetition. Reported per backend, median over
repetitions: samples/s over steps 2..N, and the share of that time the loop spent waiting
for gradient communication that backward() did not hide (from the last bucket's all-reduce
being issued to its completion, measured by a comm hook with the default hook's
arithmetic).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "torch" / "ddp_fashion.py"


def one(cohort, n, backend, args):
    cmd = [cohort, "run", "--nproc-per-node", str(n), str(SCRIPT), "--backend", backend,
           "--bench", "--steps", str(args.steps), "--width", str(args.width)]
    env = dict(os.environ, COHORT_PYTHON="/usr/bin/python3")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.timeout, start_new_session=True)
    m = re.search(r"samples_per_s ([0-9.]+) comm_wait_share ([0-9.]+)", p.stdout)
    if p.returncode != 0 or not m:
        sys.stderr.write("!! %s failed (%d)\n%s\n" % (" ".join(cmd), p.returncode,
                                                     p.stderr[-2000:]))
        return None
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=32, help="CNN width (32: 3.3M parameters)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--cohort-bin", default=os.environ.get(
        "COHORT_BIN", str(REPO / "build/dev/cohort/cli/cohort")))
    args = ap.parse_args()
    backends = ["cohort", "gloo"]
    print("| workers | backend | samples/s | comm wait share | samples/s vs gloo |")
    print("|---|---|---|---|---|")
    for n in [int(x) for x in args.nprocs.split(",")]:
        runs = {b: [] for b in backends}
        for rep in range(args.reps):
            for b in backends[rep % 2:] + backends[:rep % 2]:
                r = one(args.cohort_bin, n, b, args)
                if r:
                    runs[b].append(r)
        med = {b: (statistics.median(x[0] for x in runs[b]),
                   statistics.median(x[1] for x in runs[b])) if runs[b] else None
               for b in backends}
        for b in backends:
            if med[b] is None:
                print("| %d | %s | failed | | |" % (n, b))
                continue
            ratio = med[b][0] / med["gloo"][0] if med["gloo"] else float("nan")
            print("| %d | %s | %.0f | %.1f%% | %.2fx |" % (n, b, med[b][0], 100 * med[b][1],
                                                          ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
