#!/usr/bin/python3
"""One rendezvous round of PyTorch's c10d dynamic rendezvous with N agents as threads.

Run with Debian's python (it has torch 1.13):
    /usr/bin/python3 bench/torch_c10d_rdzv.py --agents 64 [--join-timeout 300] [--last-call 1]

What it measures (the peer of build/dev/bench/rdzv_bench): one TCPStore server in this
process, then N agents, each with its own TCPStore client connection, its own
C10dRendezvousBackend over it and its own DynamicRendezvousHandler (min = max = N, the given
join / last-call timeouts). Stores and handlers are created before the clock starts
("setup_seconds"); "seconds" runs from starting the first agent thread until every agent's
next_rendezvous() has returned. This is exactly what torchrun's agent calls at start with
`--rdzv_backend c10d`, including torch's own 0-0.3 s random delay before round 0 and its
1 s poll interval while waiting for the others.

Prints one JSON line: {"agents": N, "seconds": S, "setup_seconds": C, "ok": true}
and exits 0; on a failed agent it prints the error and exits 1. No timeout of its own beyond
the join timeout: the driver (bench/rdzv_compare.py) kills it after its per-run limit.
"""
import argparse
import json
import os
import resource
import sys
import threading
import time
from datetime import timedelta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--join-timeout", type=float, default=300.0, help="seconds")
    ap.add_argument("--last-call", type=float, default=1.0, help="seconds")
    ap.add_argument("--run-id", default="bench")
    ap.add_argument("--progress", type=float, default=0,
                    help="every this many seconds, print to stderr how many agents have "
                         "returned and how many the shared state lists as participants")
    args = ap.parse_args()
    n = args.agents

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend)
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler, RendezvousTimeout)

    store_timeout = timedelta(seconds=args.join_timeout + 30)
    setup_start = time.monotonic()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=store_timeout)
    timeout = RendezvousTimeout(join=timedelta(seconds=args.join_timeout),
                                last_call=timedelta(seconds=args.last_call))
    handlers = []
    for _ in range(n):
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                               timeout=store_timeout)
        backend = C10dRendezvousBackend(client, args.run_id)
        handlers.append(DynamicRendezvousHandler.from_backend(
            args.run_id, client, backend, min_nodes=n, max_nodes=n, timeout=timeout))
    setup_s = time.monotonic() - setup_start

    results = [None] * n
    errors = []
    lock = threading.Lock()

    def agent(i):
        try:
            _, rank, world = handlers[i].next_rendezvous()
            results[i] = (rank, world)
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append("agent %d: %s: %s" % (i, type(e).__name__, e))

    def progress():
        import pickle
        from base64 import b64decode
        while True:
            time.sleep(args.progress)
            try:
                raw = server.get("torch.rendezvous." + args.run_id)
                state = pickle.loads(b64decode(raw))
                parts, size = len(state.participants), len(raw)
            except Exception:  # noqa: BLE001 - sentinel or a state mid-write
                parts, size = -1, 0
            print("torch_c10d_rdzv: t=%.0fs returned=%d participants=%d state=%d bytes" % (
                time.monotonic() - start, sum(1 for r in results if r), parts, size),
                file=sys.stderr, flush=True)

    if args.progress > 0:
        threading.Thread(target=progress, daemon=True).start()
    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(n)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - start

    ok = not errors and sorted(r[0] for r in results if r) == list(range(n)) and all(
        r and r[1] == n for r in results)
    if not ok:
        print("torch_c10d_rdzv: %d agents failed; first: %s" % (
            len(errors), errors[0] if errors else "wrong ranks/world sizes"), file=sys.stderr)
    print(json.dumps({"agents": n, "seconds": round(seconds, 6),
                      "setup_seconds": round(setup_s, 6), "ok": ok}), flush=True)
    # The handlers' keep-alive timers (threads) would keep syncing; skip their shutdown.
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
