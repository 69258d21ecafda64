#!/usr/bin/env python3
"""A small deterministic DDP training script written for torchrun.

It is the reference workload of the end-to-end tests and of bench/launch_bench.py:
the same script must give the same result under `torchrun` and under `cohort run`.

* init_process_group("gloo") from the env:// variables set by the launcher;
* a tiny MLP trained with SGD + momentum on synthetic regression data; the batch of
  step i depends only on (seed, i), and each rank takes the shard rank::world_size;
* rank 0 prints `step <i> loss <x>` each step and, at the end, `final_loss <x>`
  (the loss of the trained model on a fixed evaluation set, full precision);
* rank 0 checkpoints after every step into --ckpt-dir (tmp file + os.replace) and all
  ranks resume from that checkpoint at start when it exists;
* fault injection: with FAULT_RANK=r and FAULT_STEP=s in the environment and
  TORCHELASTIC_RESTART_COUNT == "0", rank r SIGKILLs itself at the start of step s;
* timestamps for the benchmark: with BENCH_TIMES_FILE set, rank 0 appends JSON lines
  {"event": "first_step", ...} after its first step of this attempt, every rank appends
  {"event": "done", ...} just before exiting, and the faulting rank appends
  {"event": "kill", ...} just before killing itself.

The step count is --steps N or a leading positional N. Other unknown
command-line arguments are ignored, so tests can pass a marker string.
"""
import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_DIM = 16
HIDDEN = 32
GLOBAL_BATCH = 64
EVAL_SIZE = 512


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-dir", default=None,
                   help="checkpoint directory; resume from it when a checkpoint exists")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep in each step (to make runs last longer)")
    args, unknown = p.parse_known_args(argv)
    # `ddp_train.py 30` also works; other unknown arguments (markers) are ignored.
    if unknown and unknown[0].isdigit():
        args.steps = int(unknown[0])
    return args


def bench_event(event, **extra):
    path = os.environ.get("BENCH_TIMES_FILE")
    if not path:
        return
    rec = {"event": event, "t": time.time(),
           "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
           "rank": int(os.environ.get("RANK", "0"))}
    rec.update(extra)
    line = (json.dumps(rec) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one small O_APPEND write: lines from ranks do not interleave
    finally:
        os.close(fd)


def true_weights(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(IN_DIM, 1, generator=g)


def batch_for_step(seed, step, w):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    x = torch.randn(GLOBAL_BATCH, IN_DIM, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(GLOBAL_BATCH, 1, generator=g)
    return x, y


def eval_set(seed, w):
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(EVAL_SIZE, IN_DIM, generator=g)
    return x, torch.tanh(x @ w)


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


def ckpt_path(ckpt_dir):
    return os.path.join(ckpt_dir, "ckpt.pt")


def save_checkpoint(ckpt_dir, model, opt, next_step):
    os.makedirs(ckpt_dir, exist_ok=True)
    final = ckpt_path(ckpt_dir)
    tmp = "%s.tmp.%d" % (final, os.getpid())
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "next_step": next_step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    # A bounded collective timeout: a stuck peer fails the run with a traceback instead of
    # hanging for gloo's default 30 minutes.
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=90))
    rank = dist.get_rank()
    world = dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    fault_rank = os.environ.get("FAULT_RANK")
    fault_step = os.environ.get("FAULT_STEP")
    fault_here = (fault_rank is not None and fault_step is not None
                  and restart == "0" and int(fault_rank) == rank)

    model = make_model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    if args.ckpt_dir and os.path.exists(ckpt_path(args.ckpt_dir)):
        state = torch.load(ckpt_path(args.ckpt_dir))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["next_step"])
        if rank == 0:
            print("resumed at step %d (restart %s)" % (start, restart), flush=True)
    # Everyone has read the checkpoint before rank 0 may overwrite it.
    dist.barrier()

    ddp = DDP(model)  # broadcasts rank 0's parameters; all ranks already agree
    loss_fn = nn.MSELoss()
    w = true_weights(args.seed)
    first = True
    for step in range(start, args.steps):
        if fault_here and step == int(fault_step):
            print("rank %d: injecting SIGKILL at step %d" % (rank, step), flush=True)
            bench_event("kill", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch_for_step(args.seed, step, w)
        xs, ys = x[rank::world], y[rank::world]
        opt.zero_grad()
        loss = loss_fn(ddp(xs), ys)
        loss.backward()
        opt.step()
        # Global mean loss of this step (deterministic: fixed order of two-party sums).
        l = loss.detach().clone()
        dist.all_reduce(l)
        l /= world
        if rank == 0:
            print("step %d loss %.10f" % (step, l.item()), flush=True)
            if args.ckpt_dir:
                save_checkpoint(args.ckpt_dir, model, opt, step + 1)
            if first:
                bench_event("first_step", step=step)
        first = False
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)

    if rank == 0:
        ex, ey = eval_set(args.seed, w)
        with torch.no_grad():
            final = loss_fn(model(ex), ey).item()
        print("final_loss %r" % final, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if os.environ.get("BENCH_TIMES_FILE"):
        sys.stdout.flush()
        sys.stderr.flush()
        bench_event("done")
        # Skip interpreter teardown so that "done" is really the end of the worker.
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
