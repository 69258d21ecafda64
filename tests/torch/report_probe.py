#!/usr/bin/env python3
"""A gloo DDP loop that reports its progress with cohort_torch.report (tests/torch/
test_report.py): trains a tiny model, reporting step, loss and samples every step, until
OUT_DIR/stop exists (bounded: 120 s), then prints `rank R done step S`.

Usage: report_probe.py OUT_DIR [marker]
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cohort_torch


def main():
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, deadline = 0, time.monotonic() + 120
    while True:
        # The ranks agree on stopping (MAX of what each sees): one rank leaving on its own
        # while the other is in the next step's allreduce fails that rank (peer closed).
        stop = torch.tensor([float(os.path.exists(os.path.join(out_dir, "stop")) or
                                   time.monotonic() >= deadline)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
        x = torch.randn(16, 8)
        loss = ((model(x) - 1.0) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        cohort_torch.report(step=step, loss=loss, samples=len(x))
        time.sleep(0.02)
    print("rank %d done step %d" % (rank, step), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
