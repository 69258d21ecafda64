#!/usr/bin/env python3
"""Checkpoints that do not stop training (issue 36): a PyTorch data-parallel job of two
nodes (two `cohort run` agents on this machine, one rank each, c10d rendezvous on
127.0.0.1, the cohort backend) trains an MLP of --params parameters with SGD + momentum
(state = parameters + momentum buffers), side by side in one job:

- none:        steps with no checkpoint;
- cohort:      cohort_torch.checkpoint.save() every step (the node's memory on both nodes,
               written to the directory by rank 0 in the background);
- torch.save:  what a PyTorch user does today: rank 0 torch.save()s the model's and the
               optimizer's state_dict every step (to a temporary file, then rename).

Per mode: the mean step time over --steps steps (after one warm-up step; every step ends
with a barrier, so it is the job's step), and the training stall per checkpoint on rank 0
(the blocking part: cohort's copy-and-checksum; torch.save's whole save). The "memcpy" mode
copies the same state into preallocated buffers (torch's copy_ per tensor) at the same
point of every step, on both ranks as cohort's snapshots do: the floor of any in-memory
snapshot in the same conditions (the other rank copying too, the machine busy); the stall
ratio is against it. A memcpy with the machine otherwise idle is printed too. Then
restores, each timed on every rank from the call to load() to
the state loaded into the model and optimizer:

- from a peer's memory: node 1's copy deleted and the checkpoint directory not given to it
  (a replacement node with nothing, no shared file system): node 0 sends its snapshot by
  broadcast;
- from disk: both nodes' memory copies deleted, the directory read after the page cache is
  dropped (as root; else the numbers are from the page cache: said in the table).

    /usr/bin/python3 bench/checkpoint_bench.py [--params 110e6] [--steps 6] [--batch 16]
        [--dir /var/tmp/ckpt-bench]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COHORT = Path(os.environ.get("COHORT_BIN", REPO / "build/dev/cohort/cli/cohort"))

WORKER = r'''
import glob, json, os, sys, time
import torch, torch.distributed as dist
import cohort_torch, cohort_torch.checkpoint as ckpt
args = json.loads(sys.argv[1])
dist.init_process_group("cohort")
rank = dist.get_rank()
torch.set_num_threads(1)
width = args["width"]
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                            torch.nn.Linear(width, width), torch.nn.ReLU(),
                            torch.nn.Linear(width, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
params = sum(p.numel() for p in model.parameters())
x = torch.randn(args["batch"], width)
y = torch.randint(0, 10, (args["batch"],))
saver = ckpt.Checkpointer(args["dir"], keep=2)

def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()

def state():
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}

def tensors():  # the state's tensors: parameters and momentum buffers
    return [*model.state_dict().values(),
            *[s["momentum_buffer"] for s in opt.state_dict()["state"].values()]]

out = {"params": params}
step()  # momentum buffers exist from here on
out["state_bytes"] = sum(t.numel() * t.element_size() for t in tensors())
dst = [torch.empty_like(t) for t in tensors()]
for d, t in zip(dst, tensors()):
    d.copy_(t)  # touched: the memcpy mode copies into memory already mapped
# Not in the means: the first snapshot reserves its staging slot (shared memory, reserved
# and mapped once), then a background thread reserves the others during the next steps.
first = []
for i in range(3):
    step()
    t = time.perf_counter()
    saver.save(state(), i)
    first.append(time.perf_counter() - t)
    dist.barrier()
saver.flush()
out["first_saves_s"] = first
for mode in ("none", "memcpy", "cohort", "torch.save"):
    stalls = []
    step()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args["steps"]):
        step()
        t = time.perf_counter()
        if mode == "memcpy":  # the floor of any snapshot, where a snapshot is taken
            for d, s in zip(dst, tensors()):
                d.copy_(s)
        elif mode == "cohort":
            saver.save(state(), 10 + i)
        elif mode == "torch.save" and rank == 0:
            path = os.path.join(args["dir"], "torch.pt")
            torch.save(state(), path + ".tmp")
            os.replace(path + ".tmp", path)
        stalls.append(time.perf_counter() - t)
        dist.barrier()
    out[mode] = {"step_s": (time.perf_counter() - t0) / args["steps"],
                 "stall_s": sum(stalls) / len(stalls)}
    if mode == "cohort":
        saver.flush()
        out["cohort"]["stats"] = saver.stats()
dist.barrier()
for _ in range(2):  # alone: no training, no persister, the other rank idle
    t = time.perf_counter()
    for d, s in zip(dst, tensors()):
        d.copy_(s)
    out["memcpy_alone_s"] = time.perf_counter() - t
dist.barrier()
del dst

def restore(what, directory):
    dist.barrier()
    t = time.perf_counter()
    got = ckpt.Checkpointer(directory).load()
    model.load_state_dict(got[0]["model"])
    opt.load_state_dict(got[0]["optimizer"])
    out[what] = time.perf_counter() - t
    dist.barrier()

memory = os.environ.get("COHORT_SNAPSHOT_DIR", "")
if rank == 1:
    for f in glob.glob(os.path.join(memory, "snap-*")):
        os.unlink(f)
# Node 1 is a replacement with nothing: no snapshot, and (no shared file system) no view
# of node 0's checkpoint directory.
restore("restore_peer_memory_s", args["dir"] if rank == 0 else None)
for f in glob.glob(os.path.join(memory, "snap-*")):
    os.unlink(f)
dist.barrier()
if rank == 0:
    dropped = os.system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null") == 0
    out["cold_cache"] = dropped
dist.barrier()
restore("restore_disk_s", args["dir"])
with open(os.path.join(args["out"], "rank%d.json" % rank), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def width_for(params):
    # Two width x width layers dominate: 2 w^2 + 13 w parameters.
    return int((params / 2) ** 0.5) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=110e6)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dir", default="")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cohort-ckpt-bench-"))
    ckpt_dir = Path(a.dir) if a.dir else work / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    script = work / "worker.py"
    script.write_text(WORKER)
    cfg = json.dumps({"width": width_for(a.params), "batch": a.batch, "steps": a.steps,
                      "dir": str(ckpt_dir), "out": str(work)})
    port = free_port()
    env = dict(os.environ, COHORT_TOKEN=os.urandom(16).hex(), COHORT_PYTHON="/usr/bin/python3")
    common = ["run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", "ckptbench",
              "--rdzv-conf", "join_timeout=60"]
    nodes = [subprocess.Popen([str(COHORT), *common, "--node-rank", str(i), "/usr/bin/python3",
                               str(script), cfg], env=env) for i in range(2)]
    rcs = [p.wait(timeout=3600) for p in nodes]
    if rcs != [0, 0]:
        sys.exit("the benchmark job failed: exit codes %s" % rcs)
    r = [json.loads((work / ("rank%d.json" % i)).read_text()) for i in range(2)]
    r0 = r[0]
    gb = r0["state_bytes"] / 1e9
    print("## Checkpoints: cohort_torch.checkpoint vs torch.save (issue 36)\n")
    print("MLP of %.0f M parameters, SGD with momentum: state %.2f GB (parameters + momentum); "
          "2 nodes x 1 rank on this machine, batch %d, mean of %d steps.\n"
          % (r0["params"] / 1e6, gb, a.batch, a.steps))
    print("| mode | step (s) | vs none | rank 0's stall per checkpoint (s) | stall / memcpy |")
    print("|---|---:|---:|---:|---:|")
    none = r0["none"]["step_s"]
    memcpy = r0["memcpy"]["stall_s"]
    for mode in ("none", "memcpy", "cohort", "torch.save"):
        m = r0[mode]
        stall = m["stall_s"] if mode != "none" else 0
        print("| %s | %.3f | %+.1f%% | %.3f | %s |" % (
            mode, m["step_s"], 100 * (m["step_s"] / none - 1), stall,
            "%.2fx" % (stall / memcpy) if mode != "none" else "-"))
    st = r0["cohort"]["stats"]
    print("\nmemcpy of the state in the training loop (copy_ per tensor into preallocated "
          "buffers, both ranks): %.3f s; alone on an idle machine: %.3f s. cohort's stall is "
          "its copy + CRC-32 into the node's shared memory; torch.save's stall is %.1fx "
          "cohort's." % (memcpy, r0["memcpy_alone_s"],
                         r0["torch.save"]["stall_s"] / max(r0["cohort"]["stall_s"], 1e-9)))
    print("cohort snapshots: %d taken, %d written to disk, %d dropped for a newer one, %d "
          "failed writes. The process's first snapshots, which reserve and map the staging "
          "slots (not timed above): %s s." % (
              st["taken"], st["persisted"], st["dropped"], st["write_failures"],
              ", ".join("%.2f" % x for x in r0["first_saves_s"])))
    print("\n| restore (%.2f GB) | node 0 (s) | node 1 (s) |" % gb)
    print("|---|---:|---:|")
    print("| from a peer's memory (node 1 has nothing; broadcast) | %.2f | %.2f |"
          % (r[0]["restore_peer_memory_s"], r[1]["restore_peer_memory_s"]))
    print("| from disk (%s) | %.2f | %.2f |" % (
        "page cache dropped" if r0.get("cold_cache") else "page cache NOT dropped: not root",
        r[0]["restore_disk_s"], r[1]["restore_disk_s"]))


if __name__ == "__main__":
    main()
