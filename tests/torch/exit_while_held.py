#!/usr/bin/env python3
"""Rank 0 leaves while the backend's thread still holds the last reference to the tensor of
an all_reduce it issued (and then dropped), and that thread waits for the GIL to free it.

Rank 0 keeps the GIL (a long switch interval, a loop that calls nothing that lets go of it)
until rank 1 has finished the same all_reduce, so its own executor has finished too and is
waiting for the GIL; then it returns and the interpreter exits. The process must end at
once with status 0. (It hung in the group's destructor, which joined the executor while
holding the GIL, or aborted with "terminate called without an active exception" when the
executor got the GIL after the interpreter began finalizing.)

Started directly by the test (env:// variables). FLAG_FILE: one byte, mapped by both ranks;
rank 1 sets it after its all_reduce (a read of a mapping does not let go of the GIL).
"""
import datetime
import mmap
import os
import sys
import time

import torch
import torch.distributed as dist

import cohort_torch  # noqa: F401


def issue_and_drop():
    t = torch.ones(1 << 20)
    dist.all_reduce(t, async_op=True)  # neither the tensor nor the work is kept


def main():
    dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    with open(os.environ["FLAG_FILE"], "r+b") as f:
        flag = mmap.mmap(f.fileno(), 1)
    dist.barrier()
    if rank == 1:
        dist.all_reduce(torch.ones(1 << 20))
        flag[0] = 1
        print("rank 1 done", flush=True)
        return 0
    sys.setswitchinterval(1000)  # the executor gets no GIL from here to the exit
    issue_and_drop()
    deadline = time.monotonic() + 30
    while flag[0] != 1:
        if time.monotonic() > deadline:
            print("rank 1 never finished", flush=True)
            return 1
    # Rank 1's all_reduce finished, so ours has or is about to: let the executor reach the
    # GIL (nothing observable marks it without letting go of the GIL).
    margin = time.monotonic() + 0.5
    while time.monotonic() < margin:
        pass
    print("rank 0 leaving", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
