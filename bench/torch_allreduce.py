#!/usr/bin/python3
"""torch.distributed all_reduce through the "cohort" backend against "gloo", side by side,
and against `cohort bench` (libcohort without the binding) in the same methodology.

    /usr/bin/python3 bench/torch_allreduce.py [--nprocs 2,4] [-b 4K] [-e 256M] [--reps 3]

Methodology (what a training step sees): float32, sum, in place; before every timed call
a barrier (so no call overlaps the previous one); the per-call time is the median over the
calls of one size; busbw = bytes x 2(n-1)/n / time. The table shows, per size, the median
over --reps repetitions (the systems run one after another in a rotated order within each
repetition). Every rank checks the result of its last call.

The same file is the worker (`--worker`), started by `cohort run` with the env://
variables; it prints one `size <bytes> us <median> busbw <GB/s>` line per size on rank 0.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from allreduce_compare import human, parse_nccl, parse_size  # noqa: E402


def sizes(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def iterations(nbytes):
    return max(5, min(200, (64 << 20) // max(nbytes, 1)))


def worker(args):
    import datetime

    import torch
    import torch.distributed as dist
    if args.backend == "cohort":
        import cohort_torch  # noqa: F401
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.factor):
        t = torch.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(iterations(nbytes)):
            t.fill_(1.0)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        if t[0].item() != world or t[-1].item() != world:
            print("WRONG result %s" % t[0].item(), flush=True)
            sys.exit(1)
        med = statistics.median(times)
        if rank == 0:
            busbw = nbytes * 2 * (world - 1) / world / med / 1e9
            print("size %d us %.2f busbw %.3f" % (nbytes, med * 1e6, busbw), flush=True)
    dist.destroy_process_group()


def run(cmd, env, timeout):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout, start_new_session=True)
    if p.returncode != 0:
        sys.stderr.write("!! %s failed (%d):\n%s\n" % (" ".join(cmd), p.returncode,
                                                       p.stderr[-3000:]))
        return {}
    return {int(s): (float(us), float(bw))
            for s, us, bw in re.findall(r"size (\d+) us ([0-9.]+) busbw ([0-9.]+)", p.stdout)}


def run_cohort_bench(cohort, n, args, env):
    """libcohort alone: `cohort bench allreduce --per-call` (in-place columns), same
    methodology."""
    cmd = [cohort, "run", "--nproc-per-node", str(n), "--no-python", "--",
           str(Path(cohort).parent / "cohort-bench"), "allreduce", "-b", args.minbytes,
           "-e", args.maxbytes, "-f", str(args.factor), "--per-call", "-n", "50"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.timeout, start_new_session=True)
    # the in-place columns: time (us) and busbw
    out = {size: (cols[3], cols[4]) for size, cols in parse_nccl(p.stdout).items()}
    if not out:
        sys.stderr.write("!! cohort bench gave no lines:\n%s\n%s\n" % (p.stdout[-2000:],
                                                                     p.stderr[-2000:]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="cohort")
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("-b", "--minbytes", default="4K")
    ap.add_argument("-e", "--maxbytes", default="256M")
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--cohort-bin", default=os.environ.get(
        "COHORT_BIN", str(REPO / "build/dev/cohort/cli/cohort")))
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    env = dict(os.environ, COHORT_PYTHON="/usr/bin/python3")
    systems = ["cohort", "gloo", "cohort bench"]
    for n in [int(x) for x in args.nprocs.split(",")]:
        samples = {s: [] for s in systems}
        for rep in range(args.reps):
            order = systems[rep % 3:] + systems[:rep % 3]
            for s in order:
                if s == "cohort bench":
                    samples[s].append(run_cohort_bench(args.cohort_bin, n, args, env))
                else:
                    cmd = [args.cohort_bin, "run", "--nproc-per-node", str(n), __file__,
                           "--worker", "--backend", s, "-b", args.minbytes, "-e",
                           args.maxbytes, "-f", str(args.factor)]
                    samples[s].append(run(cmd, env, args.timeout))
        print("\n%d ranks, one host: torch all_reduce float32 sum in place, barrier before "
              "every call, median per-call time; median of %d reps" % (n, args.reps))
        print("| size | cohort us | gloo us | cohort/gloo speed | cohort busbw GB/s | "
              "cohort bench busbw GB/s | binding keeps |")
        print("|---|---|---|---|---|---|---|")
        for size in sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.factor):
            def med(s, i):
                xs = [r[size][i] for r in samples[s] if size in r]
                return statistics.median(xs) if xs else None
            c_us, g_us, c_bw, b_bw = med("cohort", 0), med("gloo", 0), med("cohort", 1), \
                med("cohort bench", 1)
            f = lambda v, p=1: ("%.*f" % (p, v)) if v is not None else "n/a"
            speed = f(g_us / c_us, 1) + "x" if c_us and g_us else "n/a"
            keep = f(c_bw / b_bw * 100, 0) + "%" if c_bw and b_bw else "n/a"
            print("| %s | %s | %s | %s | %s | %s | %s |" % (human(size), f(c_us), f(g_us), speed,
                                                           f(c_bw, 2), f(b_bw, 2), keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
