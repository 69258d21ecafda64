#!/usr/bin/env python3
"""What a worker can observe about how it was started, as one JSON line per rank.

    warm_probe.py [--exit N] [--raise] [--interrupt] [--print-lines K]
                  [--kill-first-attempt] [marker...]

Prints `probe {json}` with sys.argv, sys.orig_argv, __name__, __file__, sys.path[0], the
working directory, selected environment variables (os.environ and the C library's view),
signal dispositions, the parent pid, a random number, whether torch is already imported,
and whether this process was forked from cohort's warm interpreter (its /proc cmdline).
Then exits with --exit N, raises an uncaught exception (--raise), or interrupts itself
with SIGINT (--interrupt; --raise leaves a file unclosed and an atexit handler);
--kill-first-attempt SIGKILLs rank 1 on the first attempt.
"""
import ctypes
import json
import os
import random
import signal
import sys

torch_already = "torch" in sys.modules  # before this script imports anything of torch


def main():
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p

    def c_env(name):
        v = libc.getenv(name.encode())
        return v.decode() if v is not None else None

    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
             "PROBE_VAR", "PYTHONPATH", "OMP_NUM_THREADS", "TORCHELASTIC_USE_AGENT_STORE"]
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
    facts = {
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "name": __name__,
        "file": __file__,
        "main_file": sys.modules["__main__"].__file__,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "env": {n: os.environ.get(n) for n in names},
        "c_env": {n: c_env(n) for n in names},
        "signals": {s: str(signal.getsignal(getattr(signal, s)))
                    for s in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGUSR1", "SIGCHLD")},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "ppid": os.getppid(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "random": random.random(),
        "torch_preloaded": torch_already,
        "forked": any(b"cohort_zygote.py" in a for a in cmdline),
    }
    print("probe " + json.dumps(facts, sort_keys=True), flush=True)
    args = sys.argv[1:]
    if "--print-lines" in args:
        for i in range(int(args[args.index("--print-lines") + 1])):
            print(f"line {i}")
    if ("--kill-first-attempt" in args and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
            and os.environ.get("RANK") == "1"):
        os.kill(os.getpid(), signal.SIGKILL)
    if "--raise" in args:
        # What a failing script still expects written: a file it never closed, an atexit
        # handler's output.
        unclosed = open("unclosed.txt", "w")
        unclosed.write("written before the failure\n")
        import atexit
        atexit.register(lambda: print("probe atexit ran", flush=True))
        raise ValueError("probe raised on purpose")
    if "--interrupt" in args:
        os.kill(os.getpid(), signal.SIGINT)
    if "--exit" in args:
        sys.exit(int(args[args.index("--exit") + 1]))


if __name__ == "__main__":
    main()
