#!/usr/bin/env python3
"""A plain PyTorch DDP script, as users write them: a small CNN on Fashion-MNIST, a
DistributedSampler, a checkpoint after every epoch. It runs under torchrun or `cohort run`
unchanged (a failure restarts it from its last checkpoint).

    cohort run --nproc-per-node 2 -- examples/fashion_ddp.py --ckpt /tmp/fashion.pt

examples/fashion_elastic.py is the same script with cohort_torch.elastic: its workers keep
their processes through a node loss or join (docs/torch-backend.md, section 6, shows the
diff). Every rank prints `rank R digest D` at the end (a CRC of its parameters).
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
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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


def train(loader, model, opt, epoch, args):
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
    if dist.get_rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--limit", type=int, default=6000, help="samples of the data set used")
    ap.add_argument("--ckpt", default="fashion.pt")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    data = fashion_mnist(args.limit)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    start = 0
    if os.path.exists(args.ckpt):
        saved = torch.load(args.ckpt)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["epoch"]
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        train(loader, model, opt, epoch, args)
        if dist.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "epoch": epoch + 1}, args.ckpt)
    print(f"rank {dist.get_rank()} digest {digest(model.module)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
