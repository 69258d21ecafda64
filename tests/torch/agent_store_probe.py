#!/usr/bin/env python3
"""Exercises the store torch's env:// rendezvous gets under `cohort run`.

Prints `agent_store <flag>` (TORCHELASTIC_USE_AGENT_STORE), `init_s <seconds>` (the time
init_process_group took), then drives every TCPStore call torch 1.13 makes through the
store torch built (set, get, add, compare_set, wait with and without timeout, num_keys,
delete_key), checks the results, and prints `rank R store ok world W restart C`.
On the first attempt, with --fail-first-attempt, rank 1 then exits 3 (the group restarts
and the next attempt must find a fresh store).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    print(f"agent_store {os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}", flush=True)
    t0 = time.monotonic()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    print(f"init_s {time.monotonic() - t0:.3f}", flush=True)
    world = dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"k{rank}", f"v{rank}")
    for r in range(world):
        assert store.get(f"k{r}") == f"v{r}".encode(), r
    # Every rank's add is counted once, in this attempt only (a fresh store per round).
    total = store.add("counter", rank + 1)
    assert 1 <= total <= sum(range(1, world + 1)), total
    dist.barrier()
    assert store.add("counter", 0) == sum(range(1, world + 1)), store.add("counter", 0)
    if rank == 0:
        assert store.compare_set("cas", "", "first") == b"first"
        assert store.compare_set("cas", "wrong", "second") == b"first"
        assert store.compare_set("cas", "first", "second") == b"second"
        assert store.compare_set("missing", "x", "y") == b"x"  # torch's answer
        store.set("ready", "1")
    store.wait(["ready"])
    store.wait(["ready", "k0"], datetime.timedelta(seconds=5))
    try:
        store.wait(["never"], datetime.timedelta(milliseconds=300))
        raise AssertionError("wait for a missing key returned")
    except RuntimeError:
        pass
    assert store.num_keys() >= world + 3
    dist.barrier()
    if rank == 0:
        assert store.delete_key("cas") is True
        assert store.delete_key("cas") is False
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    assert t.item() == world
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"rank {rank} store ok world {world} restart {restart}", flush=True)
    dist.barrier()
    if "--fail-first-attempt" in sys.argv and restart == "0" and rank == 1:
        sys.exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
