#!/usr/bin/env python3
"""Recovery from a node loss, and a node's join, three ways on the same PyTorch job:
cohort run with live reconfiguration (the workers stay), cohort run restarting the worker
group (COHORT_LIVE_RECONFIG=0, as before issue 17), and torchrun.

Three network-namespace hosts (tests/cluster/netns.py; root), one launcher per host with
--nnodes 2:3, each running examples/torch_live_reconfig.py (the cohort torch backend for
all three, checkpoint every step on the shared file system; under torchrun and with
COHORT_LIVE_RECONFIG=0 the script restarts from the checkpoint, under cohort it re-forms in
place). The elastic-* kinds run bench/elastic_worker.py instead (the same model written
with cohort_torch.elastic): elastic-cohort and elastic-gloo under cohort run with that
backend, elastic-torchrun under torchrun on gloo. Events come from the script's BENCH_TIMES_FILE (a "first_step" line per rank after
the first step of each group it forms).

- loss: 3 nodes train; host 2's launcher and worker are SIGKILLed; time from the kill to
  the first completed step of the survivors' next group. "redone" is how many steps the
  survivors did again (rank 0's last printed step at the kill, minus the step the next
  group started from).
- join: 2 nodes train; a launcher starts on host 2; time from its start to the first
  completed step of a group of 3 (the newcomer's first step).
- spare (`--scenarios spare`, the kinds under cohort run only): 3 nodes train and a fourth
  host runs `cohort run --standby` (warm: torch imported, waiting without joining); host 2
  is SIGKILLed; time from the kill to the first completed step of a group of 3 (the
  spare's first step).

torchrun uses the c10d rendezvous on node0 with --monitor_interval 0.1 and
last_call_timeout=1 (its default of 30 s would dominate); cohort uses last_call_timeout=1
and a 3 s dead-node timeout. Each host gets its own name (node<i>). Medians of --reps runs,
the kinds alternating.

    /usr/bin/python3 bench/node_loss_bench.py --reps 3 [--kinds elastic-gloo,torchrun]
        [--scenarios loss] [--keep /tmp/runs]
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests/cluster"))
sys.path.insert(0, str(REPO / "tests/e2e"))
import e2e_util as U  # noqa: E402
import netns  # noqa: E402

COHORT = REPO / "build/dev/cohort/cli/cohort"
SCRIPT = REPO / "examples/torch_live_reconfig.py"
PY = "/usr/bin/python3"
TORCHRUN = "/usr/bin/torchrun"
ELASTIC = REPO / "bench/elastic_worker.py"
KINDS = ("cohort-live", "cohort-restart", "torchrun", "elastic-cohort", "elastic-gloo",
         "elastic-torchrun")


def launcher_argv(kind, c, i, work, steps, standby=False):
    if kind.startswith("elastic"):  # cohort_torch.elastic; under torchrun on gloo
        backend = "cohort" if kind == "elastic-cohort" else "gloo"
        script = [str(ELASTIC), "--backend", backend]
    else:
        script = [str(SCRIPT)]
    script += ["--steps", str(steps), "--ckpt-dir", str(work / "ckpt"), "--ckpt-every", "1",
               "--step-sleep", "0.01"]
    if not kind.endswith("torchrun"):
        inner = [str(COHORT), "run", "--nnodes", "2:3", "--nproc-per-node", "1",
                 "--rdzv-endpoint", "%s:29400" % c.addr(0), "--rdzv-id", "bench",
                 "--local-addr", c.addr(i), "--max-restarts", "3",
                 "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.5,"
                                "keep_alive_max_attempt=6", *(["--standby"] if standby else []),
                 "--", *script]
    else:
        inner = [TORCHRUN, "--nnodes", "2:3", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                 "--rdzv_endpoint", "node0:29400", "--rdzv_id", "bench", "--max_restarts", "3",
                 "--monitor_interval", "0.1", "--redirects", "2", "--tee", "2",
                 "--rdzv_conf", "join_timeout=60,last_call_timeout=1", *script]
    # Own UTS namespace: this host is node<i> (resolvable on every host via /etc/netns).
    return ["unshare", "--uts", "sh", "-c", 'hostname node%d && exec "$@"' % i, "sh", *inner]


def first_step_after(times, t0, world=None):
    evs = [e for e in U.read_json_lines(times) if e.get("event") == "first_step"
           and e.get("t", 0) > t0 and (world is None or e.get("world") == world)]
    return min(evs, key=lambda e: e["t"]) if evs else None


def last_step(text):
    steps = [int(s) for s in re.findall(r"step (\d+) loss", text)]
    return max(steps) if steps else -1


def one_run(kind, scenario, steps, keep=None):
    with tempfile.TemporaryDirectory(prefix="nodeloss-") as d:
        work = Path(tempfile.mkdtemp(prefix="%s-%s-" % (scenario, kind), dir=keep)) if keep \
            else Path(d)
        c = netns.Cluster(4 if scenario == "spare" else 3, work)
        try:
            c.name_hosts()
            times = work / "times.jsonl"
            env = dict(os.environ, BENCH_TIMES_FILE=str(times), COHORT_TOKEN="bench-token",
                       COHORT_PYTHON=PY, OMP_NUM_THREADS="1", COHORT_COMM_TIMEOUT="10",
                       PYTHONPATH=str(REPO / "build/dev/cohort/cli/python"))
            if kind == "cohort-restart":
                env["COHORT_LIVE_RECONFIG"] = "0"
            for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k, None)
            start = lambda i, standby=False: c.start(  # noqa: E731
                i, launcher_argv(kind, c, i, work, steps, standby),
                dict(env, COHORT_HOST_ID="host%d" % i), "%s%d" % (kind, i))
            first = 2 if scenario == "join" else 3
            procs = [start(i) for i in range(first)]
            try:
                netns.wait_for(lambda: first_step_after(times, 0, world=first), 120,
                               "%s: training on %d nodes" % (kind, first))
            except AssertionError as e:
                raise AssertionError("%s\n%s" % (e, procs[0].describe())) from None
            time.sleep(2.0)  # let the job run a little before the change (not synchronisation)
            redone = None
            if scenario == "spare":  # a warm spare on host 3 takes host 2's place
                procs.append(start(3, standby=True))
                netns.wait_for(lambda: "waiting as a warm spare" in procs[3].stderr, 120,
                               "%s: the spare waiting" % kind)
                t0 = time.time()
                procs[2].kill()
                ev = netns.wait_for(lambda: first_step_after(times, t0, world=3), 180,
                                    "%s: a step on 3 nodes after the loss" % kind)
                procs = [procs[0], procs[1], procs[3]]
            elif scenario == "loss":
                t0 = time.time()
                before = last_step("".join(p.stdout for p in procs[:2]))
                procs[2].kill()
                ev = netns.wait_for(lambda: first_step_after(times, t0), 180,
                                    "%s: a step after the node loss" % kind)
                redone = max(before - (ev["step"] - 1), 0)
            else:
                t0 = time.time()
                procs.append(start(2))
                ev = netns.wait_for(lambda: first_step_after(times, t0, world=3), 180,
                                    "%s: a step on 3 nodes" % kind)
            survivors = procs[:2] if scenario == "loss" else procs
            for p in survivors:
                p.wait(300)
            return ev["t"] - t0, redone, [p.p.returncode for p in survivors]
        finally:
            c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--scenarios", default="loss,join")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--keep", help="keep each run's logs in a directory under this one")
    args = ap.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    if netns.available():
        sys.exit("node_loss_bench: " + netns.available())
    kinds = args.kinds.split(",")
    results = {(s, k): [] for s in args.scenarios.split(",") for k in kinds}
    redone = {k: [] for k in kinds}
    for scenario in args.scenarios.split(","):
        for rep in range(args.reps):
            order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
            for kind in order:
                try:
                    secs, again, rcs = one_run(kind, scenario, args.steps, args.keep)
                    print("%s rep %d %-14s %.2f s%s, exit %s" % (
                        scenario, rep + 1, kind, secs,
                        "" if again is None else ", %d step(s) redone" % again, rcs), flush=True)
                    results[(scenario, kind)].append(secs)
                    if again is not None:
                        redone[kind].append(again)
                except AssertionError as e:
                    print("%s rep %d %-14s FAILED: %s" % (scenario, rep + 1, kind,
                                                         str(e).splitlines()[0]), flush=True)
    med = {key: statistics.median(v) if v else float("nan") for key, v in results.items()}
    print("\n| scenario | %s |" % " | ".join(kinds))
    print("|---|%s" % ("---|" * len(kinds)))
    for scenario in args.scenarios.split(","):
        what = {"loss": "node SIGKILL -> next step",
                "join": "node start -> first step on 3 nodes",
                "spare": "node SIGKILL, warm spare -> first step on 3 nodes"}[scenario]
        print("| %s (median of %d) | %s |" % (what, args.reps, " | ".join(
            "%.2f s" % med[(scenario, k)] for k in kinds)))
    if any(redone.values()):
        print("| steps redone after the loss (max) | %s |" % " | ".join(
            str(max(redone[k])) if redone[k] else "-" for k in kinds))
    print("\nruns: " + "; ".join("%s %s: %s" % (s, k, ", ".join("%.2f" % x for x in v))
                                 for (s, k), v in results.items()))


if __name__ == "__main__":
    main()
