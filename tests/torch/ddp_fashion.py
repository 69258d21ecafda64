#!/usr/bin/env python3
"""DDP training of a small CNN on the real Fashion-MNIST (Debian dataset-fashion-mnist).

    ddp_fashion.py --backend cohort|gloo [--steps N] [--unused] [--bench]

Started by a launcher with the env:// variables. Every rank takes its shard of each global
batch (a fixed order, no shuffling), so the loss trajectory depends only on the arithmetic
of the gradient averaging. Rank 0 prints `step <i> loss <x>`; every rank prints
`rank R param_digest D` at the end. --unused adds a layer that forward() never uses
(find_unused_parameters=True). --bench prints `samples_per_s X comm_wait_share Y`: the
share of step time the training loop spent blocked on gradient communication, measured
per step as the time from the last bucket's all-reduce being issued (the backward
computation and the hook's division are done then) to its completion: the communication
backward() could not hide.
"""
import argparse
import datetime
import gzip
import hashlib
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DATA = "/usr/share/datasets/fashion-mnist"


def load(n):
    with gzip.open(f"{DATA}/train-images-idx3-ubyte.gz") as f:
        _, count, rows, cols = struct.unpack(">IIII", f.read(16))
        images = f.read(n * rows * cols)
    with gzip.open(f"{DATA}/train-labels-idx1-ubyte.gz") as f:
        f.read(8)
        labels = f.read(n)
    x = torch.frombuffer(bytearray(images), dtype=torch.uint8).float().div_(255)
    return x.view(n, 1, rows, cols), torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()


class Net(nn.Module):
    def __init__(self, unused, width):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 7 * 7, 8 * width)
        self.fc2 = nn.Linear(8 * width, 10)
        self.unused = nn.Linear(10, 10) if unused else None

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="cohort")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--unused", action="store_true")
    p.add_argument("--bench", action="store_true")
    args, _ = p.parse_known_args()
    if args.backend == "cohort":
        import cohort_torch  # noqa: F401  registers the backend
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net(args.unused, args.width)
    ddp = DDP(model, find_unused_parameters=args.unused)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    last = {"issued": 0.0, "done": 0.0}
    if args.bench:
        def timed_allreduce(state, bucket):
            # The default hook's arithmetic (divide, then sum), with timestamps around the
            # all-reduce itself.
            t = bucket.buffer().div_(world)
            last["issued"] = time.perf_counter()
            fut = dist.all_reduce(t, async_op=True).get_future()

            def done(f):
                last["done"] = time.perf_counter()
                return f.value()[0]
            return fut.then(done)
        ddp.register_comm_hook(None, timed_allreduce)
    per_rank = args.batch // world
    x, y = load(args.batch * args.steps)
    wait_s = 0.0
    start = None
    for step in range(args.steps):
        if step == 1:  # the first step builds buckets; time the rest
            start, wait_s = time.perf_counter(), 0.0
        lo = step * args.batch + rank * per_rank
        xb, yb = x[lo:lo + per_rank], y[lo:lo + per_rank]
        opt.zero_grad()
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        wait_s += max(0.0, last["done"] - last["issued"])
        opt.step()
        # the loss of the whole global batch, averaged like the gradients
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} loss {total.item() / world:.6f}", flush=True)
    if args.bench and start is not None:
        elapsed = time.perf_counter() - start
        print(f"samples_per_s {(args.steps - 1) * args.batch / elapsed:.1f} "
              f"comm_wait_share {wait_s / elapsed:.4f}", flush=True)
    digest = hashlib.sha256()
    for prm in model.parameters():
        digest.update(prm.detach().numpy().tobytes())
    print(f"rank {rank} param_digest {digest.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
