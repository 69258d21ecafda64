#!/usr/bin/env python3
"""A PyTorch job on the "cohort" backend that keeps communicating: a small DDP model steps on
random data (its gradient allreduces) plus one explicit all_reduce per step, until the file
named by STOP_FILE exists (at most 120 s); the ranks agree on stopping (an all_reduce of
"seen it", so that none starts a step the other skips). Prints `rank R steps N` at the end.
"""
import os
import time

import torch
import torch.distributed as dist

import cohort_torch  # noqa: F401


def main():
    dist.init_process_group("cohort")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stop = os.environ["STOP_FILE"]
    steps, end = 0, time.monotonic() + 120
    while True:
        seen = torch.tensor([1.0 if os.path.exists(stop) or time.monotonic() > end else 0.0])
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if seen.item() > 0:
            break
        loss = model(torch.randn(32, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = torch.ones(1 << 16)
        dist.all_reduce(t)
        steps += 1
        time.sleep(0.005)
    print("rank %d steps %d" % (rank, steps), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
