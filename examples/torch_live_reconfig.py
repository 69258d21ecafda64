#!/usr/bin/env python3
"""A PyTorch DDP training loop that keeps going through a node loss or join without
restarting its processes (cohort's live reconfiguration, docs/multinode.md):

    cohort run --nnodes 2:3 --nproc-per-node 1 --rdzv-endpoint node0:29400 \\
        -- examples/torch_live_reconfig.py --steps 2000 --ckpt-dir /shared/ckpt

When a node is lost the survivors' step fails (or is interrupted), they re-form the
process group (the `cohort` backend, or --backend gloo) at the new rank and world size, take the newest state among them
and go on; a node that joins receives the model, optimizer state and step from the others.
Under torchrun, or with COHORT_LIVE_RECONFIG=0, it is an ordinary elastic script: every
membership change restarts it and it resumes from its checkpoint.

Every rank prints `rank R of W round N` when its group forms, rank 0 prints
`step S loss L` and, at the end, every rank `rank R digest D` (a CRC of its parameters:
equal on all ranks). With BENCH_TIMES_FILE set, each rank appends a JSON line
{"event": "first_step", "t": ..., "world": W} after the first step of each group it forms
(bench/node_loss_bench.py).
"""
import argparse
import json
import os
import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cohort_torch.live

IN_DIM, HIDDEN, GLOBAL_BATCH = 16, 64, 96


def bench_event(event, **extra):
    path = os.environ.get("BENCH_TIMES_FILE")
    if not path:
        return
    line = json.dumps(dict(event=event, t=time.time(), pid=os.getpid(), **extra)) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def batch(seed, step):
    """The global batch of `step`: the same on every rank, whatever the world size."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(GLOBAL_BATCH, IN_DIM, generator=g)
    return x, torch.tanh(x.sum(1, keepdim=True))


def digest(model):
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().cpu().contiguous().numpy().tobytes(), crc)
    return "%08x" % crc


class Trainer:
    def __init__(self, args):
        self.args = args
        torch.manual_seed(args.seed)
        self.model = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.step = 0
        self.ckpt = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_dir else None

    def state(self):
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load(self, state, step):
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.step = step

    def formed(self, live, had_state):
        """After the group formed (start or re-form): agree on the state, wrap DDP."""
        state, step = live.share(self.state() if had_state else None,
                                 self.step if had_state else -1) if live else (None, -1)
        if state is not None and (not had_state or step != self.step):
            self.load(state, step)  # a newcomer, or a survivor that missed the last step
        elif not had_state and self.ckpt and os.path.exists(self.ckpt):
            saved = torch.load(self.ckpt)  # nobody holds a state: the job (re)starts
            self.load(saved, saved["step"])
            if dist.get_rank() == 0:
                print("resumed at step %d" % self.step, flush=True)
        self.ddp = DDP(self.model)  # broadcasts rank 0's parameters: all agree already
        self.first = True
        rank, world = dist.get_rank(), dist.get_world_size()
        print("rank %d of %d round %s pid %d" % (rank, world, live.round if live else "-",
                                                  os.getpid()), flush=True)

    def one_step(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = batch(self.args.seed, self.step)
        self.opt.zero_grad()
        loss = nn.functional.mse_loss(self.ddp(x[rank::world]), y[rank::world])
        loss.backward()
        self.opt.step()
        self.step += 1  # with the parameters: a failure below leaves both consistent
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        if rank == 0:
            print("step %d loss %.6f" % (self.step, reported.item() / world), flush=True)
            if self.ckpt and self.step % self.args.ckpt_every == 0:
                tmp = self.ckpt + ".tmp"
                torch.save(dict(self.state(), step=self.step), tmp)
                os.replace(tmp, self.ckpt)
        if self.first:
            bench_event("first_step", rank=rank, world=world, step=self.step)
            self.first = False
        if self.args.step_sleep > 0:
            time.sleep(self.args.step_sleep)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--backend", default="cohort", help="cohort, gloo or nccl")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.ckpt_dir:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    dist.init_process_group(args.backend, init_method="env://")
    live = cohort_torch.live.start()  # None under torchrun or with COHORT_LIVE_RECONFIG=0
    t = Trainer(args)
    t.formed(live, had_state=False)
    while t.step < args.steps:
        try:
            if live is not None and live.pending():
                raise RuntimeError("a new membership was announced")
            t.one_step()
            continue
        except RuntimeError as error:
            if live is None:
                raise
            why = str(error)  # only the text: the traceback holds the failed step's tensors
        began = time.monotonic()
        # Nothing may keep the old group alive: with gloo, its connections close only when
        # the group is destroyed, and a peer blocked on them waits until then.
        t.ddp = None
        live.reform(why)
        t.formed(live, had_state=True)
        print("rank %d: re-formed live in %.0f ms at step %d" % (
            dist.get_rank(), 1000 * (time.monotonic() - began), t.step), flush=True)
    print("rank %d digest %s" % (dist.get_rank(), digest(t.model)), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
