#!/usr/bin/env python3
"""Writes its pid to OUT_DIR/pid_<RANK> then blocks until a signal ends it.

Usage: block_worker.py OUT_DIR [marker...]. With --ignore-sigint the worker ignores
SIGINT (to exercise the launcher's SIGTERM/SIGKILL escalation). Needs no torch.
"""
import os
import signal
import sys


def main():
    out_dir = sys.argv[1]
    if "--ignore-sigint" in sys.argv[2:]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    rank = os.environ.get("RANK", "unknown")
    final = os.path.join(out_dir, "pid_%s" % rank)
    tmp = final + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, final)
    print("rank %s blocking, pid %d" % (rank, os.getpid()), flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
