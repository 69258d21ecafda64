#!/usr/bin/env python3
"""The training script of bench/node_loss_bench.py's elastic kinds: an MLP on synthetic data
like examples/torch_live_reconfig.py's (whose event and digest helpers it uses), written
with cohort_torch.elastic (ElasticSampler, State, run, commit) on the backend of --backend
(nccl: on the GPU of LOCAL_RANK; tests/gpu runs it so).

Under `cohort run` across nodes it keeps its processes through a loss or join; under
torchrun it restarts from its checkpoint (State loads it). Rank 0 prints `step S loss L`;
each rank appends {"event": "first_step", "t", "world", "step"} to BENCH_TIMES_FILE after
its first step of every group it trains in, and prints `rank R digest D` at the end.

Thread-safety: a script; one thread.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import cohort_torch.elastic as elastic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from torch_live_reconfig import bench_event, digest  # noqa: E402

IN_DIM, HIDDEN = 64, 256


@elastic.run
def train(state, loader, args):
    first = True
    for x, y in loader:
        x, y = x.to(args.device), y.to(args.device)
        state.optimizer.zero_grad()
        loss = nn.functional.mse_loss(state.model(x), y)
        loss.backward()
        state.optimizer.step()
        state.commit(loss)
        if dist.get_rank() == 0:
            print("step %d loss %.6f" % (state.step, loss.item()), flush=True)
        if first:
            bench_event("first_step", rank=dist.get_rank(), world=dist.get_world_size(),
                        step=state.step)
            first = False
        if state.step >= args.steps:
            return
        time.sleep(args.step_sleep)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--ckpt-every", type=int, default=1)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--backend", default="gloo", help="cohort, gloo or nccl")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.device = torch.device("cpu")
    if args.backend == "nccl":  # one GPU per process: CUDA_VISIBLE_DEVICES, else LOCAL_RANK
        args.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(args.device)
    dist.init_process_group(args.backend)
    torch.manual_seed(1234)
    x = torch.randn(4096, IN_DIM, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(x, torch.tanh(x.sum(1, keepdim=True)))
    model = elastic.DistributedDataParallel(
        nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)).to(args.device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = elastic.ElasticSampler(data, args.batch, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    ckpt = os.path.join(args.ckpt_dir, "elastic") if args.ckpt_dir else None
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, checkpoint=ckpt,
                          checkpoint_every=args.ckpt_every)
    epoch = state.epoch
    while state.step < args.steps:
        sampler.set_epoch(epoch)
        train(state, loader, args)
        epoch += 1
    print("rank %d digest %s" % (dist.get_rank(), digest(model.module)), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
