#!/usr/bin/python3
"""Side-by-side training benchmark: cohort-train under `cohort run` against PyTorch DDP
(bench/torch_ddp_cnn.py) under `torchrun`, CNN on Fashion-MNIST, 1 and 2 workers.

Run with Debian's python (it has torch):   /usr/bin/python3 bench/train_bench.py [--reps 5]

Workload (identical on both sides): the `cnn` model of cohort/train/models.cc (85,822
parameters), the gz idx files of --data-dir normalised with mean 0.2860 / std 0.3530, batch
--batch-size per worker, SGD lr 0.05 momentum 0.9, --steps steps in all (cohort-train
--max-steps), one compute thread per worker (OMP_NUM_THREADS=1; the torch script also calls
torch.set_num_threads(1)), no checkpoints. Launchers:
  cohort   cohort run --nproc-per-node K  cohort-train --model cnn --dataset fashion-mnist ...
  torch    torchrun --redirects 2 --tee 2 --standalone --nproc_per_node K
           bench/torch_ddp_cnn.py ... (gloo, DistributedSampler)
Within a repetition every (workers, system) pair runs once, the systems alternating (order
rotated every repetition); reported numbers are medians over repetitions.

Throughput: both programs write a JSON line every --log-every steps from rank 0 (cohort:
--metrics-file) with the window's wall time `window_s`; a window starts right after the
previous line (before the first step for the first one), so windows tile the training loop
without start-up, data loading before training, or evaluation. Steady-state samples/s =
(steps in windows after the first --warmup steps) * batch * workers / (sum of their
window_s), i.e. summed over workers. Each window includes the loss allreduce both programs
do at a log step.

Communication share of step time:
  cohort   sum of comm_wait_s (time DistributedDataParallel::FinishGradientSync blocked on
           the gradient allreduce) over the measured windows / their wall time
  torch    no counter exists; estimated as (mean time in loss.backward() in the measured
           windows - mean time in loss.backward() under ddp.no_sync(), measured on 100
           extra steps after the timed ones) / mean step time: the backward time the
           allreduce adds. Also shown: DDP's own sampled runtime stats
           (avg_backward_comm_time - avg_backward_compute_comm_overlap_time) / step time,
           sampled on only some iterations (the first 10, then every 100th).
Target (issue 3, "Speed"): cohort samples/s at 2 workers >= 1.5x torch DDP's.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import e2e_util as U  # noqa: E402

TARGET_RATIO_2W = 1.5
SYSTEMS = ("cohort", "torch")


def argv_for(system, k, args, metrics):
    common = ["--data-dir", args.data_dir, "--batch-size", str(args.batch_size),
              "--lr", str(args.lr), "--momentum", str(args.momentum), "--seed", str(args.seed),
              "--max-steps", str(args.steps), "--log-every", str(args.log_every),
              "--metrics-file", str(metrics)]
    if system == "cohort":
        return [str(args.cohort_bin), "run", "--nproc-per-node", str(k), str(args.train_bin),
                "--model", "cnn", "--dataset", "fashion-mnist", "--optimizer", "sgd",
                "--epochs", "1"] + common
    return [U.TORCHRUN, *U.TORCHRUN_FIXED, "--standalone", "--nproc_per_node", str(k),
            str(HERE / "torch_ddp_cnn.py"), "--epochs", "1"] + common


def one_run(system, k, args, workdir, verbose):
    run_dir = Path(tempfile.mkdtemp(prefix="%s-%dw-" % (system, k), dir=workdir))
    metrics = run_dir / "metrics.jsonl"
    env = U.clean_env(OMP_NUM_THREADS="1")
    argv = argv_for(system, k, args, metrics)
    res = {"system": system, "workers": k}
    t0 = time.monotonic()
    with open(run_dir / "stdout", "wb") as out, open(run_dir / "stderr", "wb") as err:
        p = subprocess.Popen(argv, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, start_new_session=True)
        try:
            p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print("  !! %s %dw timed out after %ss" % (system, k, args.timeout), file=sys.stderr)
            try:
                os.killpg(p.pid, 9)
            except OSError:
                pass
            p.wait()
    res["rc"] = p.returncode
    res["wall_s"] = time.monotonic() - t0
    evs = U.read_json_lines(metrics)
    steps = [e for e in evs if e.get("event") == "step"]
    end = next((e for e in evs if e.get("event") == "end"), {})
    prev, n, w, wait, bwd = 0, 0, 0.0, 0.0, 0.0
    for e in steps:
        d = e["step"] - prev
        prev = e["step"]
        if e["step"] <= args.warmup:
            continue
        n += d
        w += e["window_s"]
        wait += e.get("comm_wait_s", 0.0)
        bwd += e.get("backward_s", 0.0)
    ok = p.returncode == 0 and n > 0 and w > 0
    res["measured_steps"] = n
    res["sps"] = n * args.batch_size * k / w if ok else None
    res["last_loss"] = steps[-1]["loss"] if steps else None
    res["train_s"] = end.get("train_s")
    step_s = w / n if n else None
    if system == "cohort":
        res["comm_pct"] = 100.0 * wait / w if ok else None
        res["ddpstat_pct"] = None
    else:
        ns = end.get("nosync_backward_mean_s")
        res["comm_pct"] = (100.0 * (bwd / n - ns) / step_s) if (ok and ns is not None) else None
        dl = end.get("ddp_logging") or {}
        if ok and "avg_backward_comm_time" in dl:
            exposed = (dl["avg_backward_comm_time"] -
                       dl.get("avg_backward_compute_comm_overlap_time", 0)) / 1e9
            res["ddpstat_pct"] = 100.0 * exposed / step_s
        else:
            res["ddpstat_pct"] = None
    if not ok:
        tail = (run_dir / "stderr").read_text(errors="replace").splitlines()[-15:]
        print("  !! %s %dw rc=%s measured_steps=%d\n     %s" % (
            system, k, p.returncode, n, "\n     ".join(tail)), file=sys.stderr)
    elif not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    if verbose:
        print("  %-6s %dw rc=%s samples/s=%s comm=%s wall=%.1fs loss=%s" % (
            system, k, res["rc"], fmt(res["sps"], "%.0f"), fmt(res["comm_pct"], "%.1f%%"),
            res["wall_s"], fmt(res["last_loss"], "%.3f")), flush=True)
    return res


def fmt(v, f):
    return "n/a" if v is None else f % v


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median; >= 3)")
    ap.add_argument("--workers", default="1,2", help="comma list of worker counts")
    ap.add_argument("--steps", type=int, default=600, help="training steps per run")
    ap.add_argument("--warmup", type=int, default=100,
                    help="steps excluded at the start (a multiple of --log-every)")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=64, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--cohort-bin", default=str(U.cohort_bin()))
    ap.add_argument("--train-bin", default=os.environ.get(
        "COHORT_TRAIN_BIN", str(REPO / "build/dev/cohort/cli/cohort-train")))
    ap.add_argument("--systems", default="cohort,torch", help="comma list of cohort, torch")
    ap.add_argument("--timeout", type=float, default=180, help="per-run limit, seconds")
    ap.add_argument("--json", help="also write the raw samples and medians here")
    ap.add_argument("--keep", action="store_true", help="keep run directories")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args()

    if args.warmup % args.log_every or args.warmup >= args.steps:
        sys.exit("train_bench: --warmup must be a multiple of --log-every and < --steps")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if "torch" in systems and not U.torch_available():
        sys.exit("train_bench: /usr/bin/python3 cannot import torch (or no torchrun)")
    if "cohort" in systems and not (Path(args.cohort_bin).exists() and
                                    Path(args.train_bin).exists()):
        sys.exit("train_bench: %s or %s not built" % (args.cohort_bin, args.train_bin))
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    started = datetime.datetime.utcnow()

    workdir = tempfile.mkdtemp(prefix="train_bench-")
    samples = {s: {k: [] for k in workers} for s in systems}
    try:
        for rep in range(args.reps):
            order = systems[rep % len(systems):] + systems[:rep % len(systems)]
            if not args.quiet:
                print("rep %d/%d" % (rep + 1, args.reps), flush=True)
            for k in workers:
                for s in order:
                    samples[s][k].append(one_run(s, k, args, workdir, not args.quiet))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    med = {s: {k: {m: median([r[m] for r in samples[s][k]])
                   for m in ("sps", "comm_pct", "ddpstat_pct", "wall_s")}
               for k in workers} for s in systems}
    for s in systems:
        for k in workers:
            xs = [r["sps"] for r in samples[s][k] if r["sps"] is not None]
            med[s][k]["spread"] = ((max(xs) - min(xs)) / statistics.median(xs) * 100.0
                                   if xs else None)
            med[s][k]["failures"] = sum(1 for r in samples[s][k] if r["sps"] is None)

    def get(s, k, m):
        return med.get(s, {}).get(k, {}).get(m)

    hdr = ("workers", "cohort samples/s", "torch DDP samples/s", "ratio",
           "cohort comm wait", "torch comm (bwd - no_sync bwd)", "torch comm (DDP stats)")
    rows = []
    for k in workers:
        c, t = get("cohort", k, "sps"), get("torch", k, "sps")
        rows.append((str(k),
                     "%s (spread %s)" % (fmt(c, "%.0f"), fmt(get("cohort", k, "spread"), "%.0f%%")),
                     "%s (spread %s)" % (fmt(t, "%.0f"), fmt(get("torch", k, "spread"), "%.0f%%")),
                     ("%.2fx" % (c / t)) if (c and t) else "n/a",
                     fmt(get("cohort", k, "comm_pct"), "%.1f%%"),
                     fmt(get("torch", k, "comm_pct"), "%.1f%%") if k > 1 else "n/a (1 worker)",
                     fmt(get("torch", k, "ddpstat_pct"), "%.1f%%")))
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"
    print()
    print("training benchmark: cnn on fashion-mnist, batch %d per worker, sgd lr %g momentum %g, "
          "%d steps per run, first %d excluded, %d reps, medians; started %s UTC; %s" % (
              args.batch_size, args.lr, args.momentum, args.steps, args.warmup, args.reps,
              started.strftime("%Y-%m-%d %H:%M"),
              ", ".join("%s failures=%d" % (s, sum(get(s, k, "failures") for k in workers))
                        for s in systems)))
    print("samples/s: steady state, summed over workers (spread = (max-min)/median over reps); "
          "comm: share of step time")
    print(line(hdr))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    if 1 in workers and 2 in workers:
        for s in systems:
            one, two = get(s, 1, "sps"), get(s, 2, "sps")
            eff = two / (2 * one) if (one and two) else None
            print("scaling efficiency %-6s: 2-worker samples/s / (2 x 1-worker) = %s" % (
                s, fmt(eff, "%.2f")))
    if 2 in workers:
        c, t = get("cohort", 2, "sps"), get("torch", 2, "sps")
        ratio = c / t if (c and t) else None
        verdict = "n/a" if ratio is None else ("PASS" if ratio >= TARGET_RATIO_2W else "FAIL")
        print("target: cohort at 2 workers >= %.1fx torch DDP samples/s: %s (%s)" % (
            TARGET_RATIO_2W, verdict, fmt(ratio, "%.2fx")))
    print("median wall time per run (launch to exit, incl. start-up and evaluation): " + ", ".join(
        "%s %dw %s" % (s, k, fmt(get(s, k, "wall_s"), "%.1fs")) for s in systems for k in workers))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": {s: {str(k): v for k, v in med[s].items()} for s in med},
                       "samples": {s: {str(k): v for k, v in samples[s].items()}
                                   for s in samples},
                       "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
