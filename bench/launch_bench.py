#!/usr/bin/python3
"""Side-by-side launcher benchmark: `cohort run` against `torchrun`.

Run with Debian's python (it has torch):   /usr/bin/python3 bench/launch_bench.py [--reps 5]

Workload: tests/e2e/ddp_train.py, 2 workers, with BENCH_TIMES_FILE set so the workers
append timestamps (first_step / kill / done). Launchers are run alternately within each
repetition (order rotated every repetition); each metric is the median over repetitions.

Metrics
  invoke -> first step   time.time() just before spawning the launcher -> rank 0 finishes
                         its first training step (attempt 0)
  restart                SIGKILL of worker 1 (FAULT_RANK=1, FAULT_STEP) -> rank 0 finishes its
                         first step of attempt 1
  exit                   the last worker's "done" (written just before os._exit) -> the
                         launcher process has exited (observed by a thread blocked in wait)
  RSS                    peak VmHWM of the launcher process (for torchrun: its python agent
                         process), sampled from /proc/<pid>/status while it runs
  256-agent rendezvous   `build/dev/bench/rdzv_bench --agents 256` (JSON line with "seconds")
                         when that binary exists

Launchers compared
  cohort            $COHORT_BIN or build/dev/cohort/cli/cohort, default flags
  torchrun-mi0.1    torchrun --monitor-interval 0.1 (Debian's torchrun also needs
                    --redirects 2 --tee 2, and 1.13 spells flags with underscores)
  torchrun          torchrun with its default monitor interval (5 s in 1.13)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import e2e_util as U  # noqa: E402

TARGETS = {
    "invoke": ("ratio", 0.6),
    "restart": ("ratio", 0.3),
    "exit": ("abs", 0.050),
    "rss": ("abs", 15.0),
    "rdzv256": ("abs", 1.0),
}


def launcher_argv(name, cohort_bin, max_restarts):
    if name == "cohort":
        return [str(cohort_bin), "run", "--nproc-per-node", "2",
                "--max-restarts", str(max_restarts)]
    base = [U.TORCHRUN, "--nproc_per_node", "2", *U.TORCHRUN_FIXED, "--standalone",
            "--max_restarts", str(max_restarts)]
    if name == "torchrun-mi0.1":
        return base + ["--monitor_interval", "0.1"]
    if name == "torchrun":
        return base
    raise ValueError(name)


def read_hwm_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def one_run(name, scenario, args, workdir, verbose):
    """Runs one launcher once; returns a dict of measurements (missing ones are None)."""
    run_dir = Path(tempfile.mkdtemp(prefix="%s-%s-" % (name, scenario), dir=workdir))
    times = run_dir / "times.jsonl"
    marker = U.new_marker()
    env = U.clean_env(BENCH_TIMES_FILE=times)
    if scenario == "fault":
        env["FAULT_RANK"] = "1"
        env["FAULT_STEP"] = str(args.fault_step)
    max_restarts = 1 if scenario == "fault" else 0
    argv = launcher_argv(name, args.cohort_bin, max_restarts) + [
        str(U.DDP_TRAIN), "--steps", str(args.steps), "--ckpt-dir", str(run_dir / "ckpt"),
        marker]
    out = open(run_dir / "stdout", "wb")
    err = open(run_dir / "stderr", "wb")
    res = {"launcher": name, "scenario": scenario}
    exit_t = {}
    t_invoke = time.time()
    p = subprocess.Popen(argv, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL,
                         stdout=out, stderr=err, start_new_session=True)

    def waiter():
        p.wait()
        exit_t["t"] = time.time()

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    hwm = None
    deadline = time.monotonic() + args.timeout
    try:
        while th.is_alive():
            v = read_hwm_kb(p.pid)
            if v is not None:
                hwm = v if hwm is None else max(hwm, v)
            if time.monotonic() > deadline:
                print("  !! %s/%s timed out after %ss" % (name, scenario, args.timeout),
                      file=sys.stderr)
                break
            th.join(args.sample_interval)
    finally:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except OSError:
                pass
            p.kill()
            p.wait()
        th.join(5)
        U.kill_marker_procs(marker)
        out.close()
        err.close()

    res["rc"] = p.returncode
    evs = U.read_json_lines(times)
    first0 = [e["t"] for e in evs if e["event"] == "first_step" and e["restart"] == 0]
    first1 = [e["t"] for e in evs if e["event"] == "first_step" and e["restart"] == 1]
    kills = [e["t"] for e in evs if e["event"] == "kill"]
    dones = [e["t"] for e in evs if e["event"] == "done"]
    ok = p.returncode == 0
    res["invoke"] = (first0[0] - t_invoke) if first0 else None
    res["restart"] = (first1[0] - kills[0]) if (scenario == "fault" and first1 and kills) \
        else None
    res["exit"] = (exit_t["t"] - max(dones)) if (ok and len(dones) >= 2 and "t" in exit_t) \
        else None
    res["rss"] = hwm / 1024.0 if hwm is not None else None
    if not ok or (scenario == "fault" and res["restart"] is None):
        tail = (run_dir / "stderr").read_text(errors="replace").splitlines()[-15:]
        print("  !! %s/%s rc=%s events=%s\n     %s" % (
            name, scenario, p.returncode, [e["event"] for e in evs], "\n     ".join(tail)),
            file=sys.stderr)
    elif not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    if verbose:
        print("  %-15s %-6s rc=%s invoke=%s restart=%s exit=%s rss=%s" % (
            name, scenario, res["rc"], fmt(res["invoke"], "s"), fmt(res["restart"], "s"),
            fmt(res["exit"], "ms"), fmt(res["rss"], "MB")), flush=True)
    return res


def fmt(v, unit):
    if v is None:
        return "n/a"
    if unit == "ms":
        return "%.1f ms" % (v * 1000.0)
    if unit == "MB":
        return "%.1f MB" % v
    return "%.3f s" % v


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_rdzv_bench(path, agents, reps):
    secs = []
    for _ in range(reps):
        try:
            r = subprocess.run([str(path), "--agents", str(agents)], capture_output=True,
                               text=True, timeout=300)
        except subprocess.TimeoutExpired:
            print("  !! rdzv_bench timed out", file=sys.stderr)
            continue
        found = None
        for line in reversed(r.stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    found = json.loads(line)
                    break
                except ValueError:
                    pass
        if r.returncode != 0 or not found or "seconds" not in found:
            print("  !! rdzv_bench rc=%s stdout=%r stderr=%r" % (
                r.returncode, r.stdout[-500:], r.stderr[-500:]), file=sys.stderr)
            continue
        secs.append(float(found["seconds"]))
        print("  rdzv_bench --agents %d: %s" % (agents, json.dumps(found)), flush=True)
    return median(secs)


def verdict(metric, cohort_v, ref_v):
    kind, target = TARGETS[metric]
    if cohort_v is None:
        return "n/a"
    if kind == "ratio":
        if ref_v is None or ref_v == 0:
            return "n/a"
        return "PASS" if cohort_v / ref_v <= target else "FAIL"
    return "PASS" if cohort_v <= target else "FAIL"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median; >= 5 advised)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run")
    ap.add_argument("--fault-step", type=int, default=5)
    ap.add_argument("--launchers", default="cohort,torchrun-mi0.1,torchrun",
                    help="comma list of cohort, torchrun-mi0.1, torchrun")
    ap.add_argument("--cohort-bin", default=str(U.cohort_bin()))
    ap.add_argument("--rdzv-bench", default=os.environ.get(
        "RDZV_BENCH", str(REPO / "build/dev/bench/rdzv_bench")))
    ap.add_argument("--rdzv-agents", type=int, default=256)
    ap.add_argument("--rdzv-reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300, help="per-run limit, seconds")
    ap.add_argument("--sample-interval", type=float, default=0.02,
                    help="VmHWM sampling period, seconds")
    ap.add_argument("--json", help="also write the raw samples and medians here")
    ap.add_argument("--keep", action="store_true", help="keep run directories")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args()

    if not U.torch_available():
        sys.exit("launch_bench: /usr/bin/python3 cannot import torch (or no torchrun)")
    launchers = [l.strip() for l in args.launchers.split(",") if l.strip()]
    if "cohort" in launchers and not Path(args.cohort_bin).exists():
        print("launch_bench: %s not built; benchmarking torchrun only" % args.cohort_bin,
              file=sys.stderr)
        launchers.remove("cohort")
    if not launchers:
        sys.exit("launch_bench: nothing to run")

    workdir = tempfile.mkdtemp(prefix="launch_bench-")
    samples = {l: {"plain": [], "fault": []} for l in launchers}
    try:
        for rep in range(args.reps):
            order = launchers[rep % len(launchers):] + launchers[:rep % len(launchers)]
            if not args.quiet:
                print("rep %d/%d" % (rep + 1, args.reps), flush=True)
            for l in order:
                for scenario in ("plain", "fault"):
                    samples[l][scenario].append(
                        one_run(l, scenario, args, workdir, not args.quiet))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    med = {}
    for l in launchers:
        plain, fault = samples[l]["plain"], samples[l]["fault"]
        med[l] = {
            "invoke": median([r["invoke"] for r in plain + fault]),
            "restart": median([r["restart"] for r in fault]),
            # The slowest run: targets hold for every run, not only the median.
            "invoke_worst": max([r["invoke"] for r in plain + fault
                                 if r["invoke"] is not None], default=None),
            "restart_worst": max([r["restart"] for r in fault if r["restart"] is not None],
                                 default=None),
            "exit": median([r["exit"] for r in plain + fault]),
            "rss": median([r["rss"] for r in plain + fault]),
            "failures": sum(1 for r in plain + fault if r["rc"] != 0),
        }

    rdzv = None
    if Path(args.rdzv_bench).exists():
        rdzv = run_rdzv_bench(args.rdzv_bench, args.rdzv_agents, args.rdzv_reps)
    elif not args.quiet:
        print("(no %s: 256-agent rendezvous not measured)" % args.rdzv_bench)

    c = med.get("cohort", {})
    rows = []

    def row(label, metric, unit, ref_name, target_txt):
        cv = c.get(metric)
        rv = med.get(ref_name, {}).get(metric)
        ratio = ("%.2fx" % (cv / rv)) if (cv is not None and rv) else "n/a"
        rows.append((label, fmt(cv, unit), fmt(rv, unit) + ("" if ref_name == "torchrun" else
                                                           " (%s)" % ref_name),
                     ratio, target_txt, verdict(metric, cv, rv)))

    def worst_row(label, metric, ref_name, target_txt):
        cv = c.get(metric + "_worst")
        rv = med.get(ref_name, {}).get(metric)
        ratio = ("%.2fx" % (cv / rv)) if (cv is not None and rv) else "n/a"
        rows.append((label, fmt(cv, "s"), fmt(rv, "s") + " (%s, median)" % ref_name, ratio,
                     target_txt, verdict(metric, cv, rv)))

    for ref in [r for r in ("torchrun-mi0.1", "torchrun") if r in launchers] or ["torchrun"]:
        row("invoke -> first step", "invoke", "s", ref, "<= 0.6x")
        worst_row("invoke -> first step, cohort's slowest run", "invoke", ref, "<= 0.6x")
    for ref in [r for r in ("torchrun-mi0.1", "torchrun") if r in launchers] or ["torchrun"]:
        row("SIGKILL -> first step after restart", "restart", "s", ref, "<= 0.3x")
        worst_row("SIGKILL -> first step, cohort's slowest run", "restart", ref, "<= 0.3x")
    for ref in [r for r in ("torchrun-mi0.1", "torchrun") if r in launchers] or ["torchrun"]:
        row("last worker done -> launcher exit", "exit", "ms", ref, "<= 50 ms")
    row("launcher peak RSS (VmHWM)", "rss", "MB",
        "torchrun" if "torchrun" in launchers else "torchrun-mi0.1", "<= 15 MB")
    rows.append(("256-agent rendezvous", fmt(rdzv, "s"), "n/a", "n/a", "<= 1 s",
                 verdict("rdzv256", rdzv, None)))

    hdr = ("metric", "cohort", "torchrun", "ratio", "target", "ok")
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"
    print()
    print("launch benchmark: %d reps, %d steps, 2 workers, medians; %s" % (
        args.reps, args.steps, ", ".join("%s failures=%d" % (l, med[l]["failures"])
                                         for l in launchers)))
    print(line(hdr))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": med, "rdzv256_seconds": rdzv, "samples": samples,
                       "reps": args.reps, "steps": args.steps}, f, indent=1)


if __name__ == "__main__":
    main()
