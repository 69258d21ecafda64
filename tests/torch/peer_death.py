#!/usr/bin/env python3
"""Rank 1 is SIGKILLed in the middle of an all_reduce (PEER_MODE=kill, the default), or
never enters it (PEER_MODE=hang: it sleeps past the timeout); rank 0 must get an error,
not a hang.

Started directly by the test (env:// variables, no launcher, so nobody stops rank 0 for
us). Rank 0 prints `error after <s> s: <message>` and exits 0 when its all_reduce fails, or
`no error` and exits 1.
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import cohort_torch  # noqa: F401

TIMEOUT_S = float(os.environ.get("PEER_DEATH_TIMEOUT", "20"))


def main():
    dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    t = torch.ones(16 << 20)  # 64 MiB: many chunks, the peer dies between them
    dist.barrier()
    if rank == 1 and os.environ.get("PEER_MODE") == "hang":
        time.sleep(TIMEOUT_S * 3)
        return 0
    if rank == 1:
        work = dist.all_reduce(t, async_op=True)
        time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGKILL)
        work.wait()
    start = time.monotonic()
    try:
        for _ in range(50):
            dist.all_reduce(t)
    except RuntimeError as e:
        print(f"error after {time.monotonic() - start:.2f} s: {e}", flush=True)
        # Later operations fail at once with the first error.
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError as again:
            print(f"then: {again}", flush=True)
        return 0
    print("no error", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
