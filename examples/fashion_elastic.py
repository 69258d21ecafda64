#!/usr/bin/env python3
"""examples/fashion_ddp.py with cohort_torch.elastic (8 changed lines): under `cohort run`
across nodes the workers keep their processes through a node loss or join, with the
script's backend (gloo here; nccl or cohort alike), and continue the epoch where the group
left it; under torchrun, or with COHORT_LIVE_RECONFIG=0, it restarts from its checkpoint.

    cohort run --nnodes 2:3 --nproc-per-node 1 --rdzv-endpoint node0:29400 \\
        -- examples/fashion_elastic.py --ckpt /shared/fashion-ckpt

Every rank prints `rank R digest D` at the end (a CRC of its parameters: equal on all).
"""
import argparse
import gzip
import os
import struct
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import cohort_torch.elastic as elastic
from torch.utils.data import DataLoader, TensorDataset

DATA = "/usr/share/datasets/fashion-mnist"


def fashion_mnist(limit):
    with gzip.open(f"{DATA}/train-images-idx3-ubyte.gz") as f:
        _, _, rows, cols = struct.unpack(">IIII", f.read(16))
        images = torch.frombuffer(bytearray(f.read(limit * rows * cols)), dtype=torch.uint8)
    with gzip.open(f"{DATA}/train-labels-idx1-ubyte.gz") as f:
        f.read(8)
        labels = torch.frombuffer(bytearray(f.read(limit)), dtype=torch.uint8)
    return TensorDataset(images.float().div(255).view(limit, 1, rows, cols), labels.long())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def digest(model):
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().contiguous().numpy().tobytes(), crc)
    return "%08x" % crc


@elastic.run
def train(loader, model, opt, epoch, args):
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        elastic.commit(loss)
        time.sleep(args.step_sleep)
    if dist.get_rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--limit", type=int, default=6000, help="samples of the data set used")
    ap.add_argument("--ckpt", default="fashion-ckpt")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    data = fashion_mnist(args.limit)
    model = elastic.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = elastic.ElasticSampler(data, args.batch, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, checkpoint=args.ckpt)
    for epoch in range(state.epoch, args.epochs):
        sampler.set_epoch(epoch)
        train(loader, model, opt, epoch, args)
        state.save()
    print(f"rank {dist.get_rank()} digest {digest(model.module)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
