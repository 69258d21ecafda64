#!/usr/bin/env python3
"""Time to recover after a node loss: cohort run vs torchrun, the same scenario.

Three network-namespace hosts (tests/cluster/netns.py; root), one launcher per host with
--nnodes 2:3, each running the same PyTorch DDP script (tests/e2e/ddp_train.py, gloo,
checkpoint every step on the shared file system). Once training runs on 3 nodes, host 2's
launcher and worker are SIGKILLed; the time to recover is from the kill to rank 0's first
training step of the next attempt (the script's BENCH_TIMES_FILE events). torchrun uses the
c10d rendezvous on node0 with --monitor_interval 0.1 and last_call_timeout=1 (its default
of 30 s would dominate). Each host gets its own name (node<i>) so torchrun's agents, which
publish their hostname, can reach each other. Medians of --reps runs, alternating.

    /usr/bin/python3 bench/node_loss_bench.py --reps 3
"""
import argparse
import os
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
DDP = REPO / "tests/e2e/ddp_train.py"
PY = "/usr/bin/python3"
TORCHRUN = "/usr/bin/torchrun"


def launcher_argv(kind, c, i, work, steps):
    script = [str(DDP), "--steps", str(steps), "--ckpt-dir", str(work / "ckpt"),
              "--step-sleep", "0.01"]
    if kind == "cohort":
        inner = [str(COHORT), "run", "--nnodes", "2:3", "--nproc-per-node", "1",
                 "--rdzv-endpoint", "%s:29400" % c.addr(0), "--rdzv-id", "bench",
                 "--local-addr", c.addr(i), "--max-restarts", "3",
                 "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.5,"
                                "keep_alive_max_attempt=6", "--", *script]
    else:
        inner = [TORCHRUN, "--nnodes", "2:3", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                 "--rdzv_endpoint", "node0:29400", "--rdzv_id", "bench", "--max_restarts", "3",
                 "--monitor_interval", "0.1", "--redirects", "2", "--tee", "2",
                 "--rdzv_conf", "join_timeout=60,last_call_timeout=1", *script]
    # Own UTS namespace: this host is node<i> (resolvable on every host via /etc/netns).
    return ["unshare", "--uts", "sh", "-c", 'hostname node%d && exec "$@"' % i, "sh", *inner]


def one_run(kind, steps):
    with tempfile.TemporaryDirectory(prefix="nodeloss-") as d:
        work = Path(d)
        c = netns.Cluster(3, work)
        try:
            c.name_hosts()
            times = work / "times.jsonl"
            env = dict(os.environ, BENCH_TIMES_FILE=str(times), COHORT_TOKEN="bench-token",
                       COHORT_PYTHON=PY, OMP_NUM_THREADS="1", COHORT_COMM_TIMEOUT="10")
            for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k, None)
            procs = [c.start(i, launcher_argv(kind, c, i, work, steps),
                             dict(env, COHORT_HOST_ID="host%d" % i), "%s%d" % (kind, i))
                     for i in range(3)]
            # Training on 3 nodes: a first_step event, then some more steps.
            netns.wait_for(lambda: any(e.get("event") == "first_step" for e in U.read_json_lines(times)),
                           120, "%s: the first training step" % kind)
            time.sleep(2.0)  # let the job run a little before the fault (not synchronisation)
            t_kill = time.time()
            procs[2].kill()
            def recovered():
                evs = [e for e in U.read_json_lines(times) if e.get("event") == "first_step"
                       and e.get("t", 0) > t_kill]
                return evs[0] if evs else None
            ev = netns.wait_for(recovered, 180, "%s: a training step after the node loss" % kind)
            for p in procs[:2]:
                p.wait(300)
            return ev["t"] - t_kill, [p.p.returncode for p in procs[:2]]
        finally:
            c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    if netns.available():
        sys.exit("node_loss_bench: " + netns.available())
    results = {"cohort": [], "torchrun": []}
    for rep in range(args.reps):
        order = ["cohort", "torchrun"] if rep % 2 == 0 else ["torchrun", "cohort"]
        for kind in order:
            try:
                secs, rcs = one_run(kind, args.steps)
                print("rep %d %-8s recovery %.2f s, survivors exit %s" % (rep + 1, kind, secs, rcs))
                results[kind].append(secs)
            except AssertionError as e:
                print("rep %d %-8s FAILED: %s" % (rep + 1, kind, str(e).splitlines()[0]))
    med = {k: statistics.median(v) if v else float("nan") for k, v in results.items()}
    print("\n| launcher | recovery after a node loss (median of %d) |" % args.reps)
    print("|---|---|")
    for k in ("cohort", "torchrun"):
        print("| %s | %.2f s |" % (k, med[k]))
    if results["cohort"] and results["torchrun"]:
        print("ratio cohort/torchrun: %.2fx" % (med["cohort"] / med["torchrun"]))


if __name__ == "__main__":
    main()
