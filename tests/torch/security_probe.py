#!/usr/bin/env python3
"""A worker for tests/torch/test_security.py: joins a group through torch's env://
rendezvous (the agent's torch store), says where its store and channel are, waits for
OUT_DIR/go (bounded), all-reduces its rank + 1 and prints the sum.

Usage: security_probe.py OUT_DIR BACKEND [--live] [marker]. Prints `rank R port P`,
`rank R channel DIR` (with --live, after cohort_torch.live.start()), then, rank 0 only,
`attack key present|absent` (whether the store holds the key `attack/key`, which only a
stranger would set), then `rank R sum S world W`.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    out_dir, backend = sys.argv[1], sys.argv[2]
    if backend == "cohort":
        import cohort_torch  # noqa: F401  (registers the backend)
    rank = int(os.environ["RANK"])
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    live = None
    if "--live" in sys.argv[3:]:
        import cohort_torch.live
        live = cohort_torch.live.start()
        print("rank %d channel %s" % (rank, live.directory if live else "none"), flush=True)
    print("rank %d port %s" % (rank, os.environ["MASTER_PORT"]), flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out_dir, "go")):
        if time.monotonic() > deadline:
            sys.exit("no go file within 120 s")
        time.sleep(0.05)  # the test's signal: a file it creates
    if live is not None and live.pending():
        sys.exit("rank %d: a membership notice was accepted: %r" % (rank, live.pending()))
    if rank == 0:
        root = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                             is_master=False, timeout=datetime.timedelta(seconds=30))
        try:
            root.wait(["attack/key"], datetime.timedelta(milliseconds=300))
            print("attack key present", flush=True)
        except RuntimeError:  # torch's wait timed out: the key does not exist
            print("attack key absent", flush=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print("rank %d sum %d world %d" % (rank, int(t.item()), dist.get_world_size()), flush=True)
    if live is not None:
        live.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
