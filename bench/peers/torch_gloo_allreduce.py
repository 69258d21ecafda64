#!/usr/bin/python3
"""torch.distributed gloo float32 sum allreduce, nccl-tests output.

    /usr/bin/python3 bench/peers/torch_gloo_allreduce.py -p K -b 4K -e 256M -f 4 \
        -n 20 -w 5 -c 1 [-T timeout_s]

The script launches its ranks itself: K child processes of this script (Debian's
python3-torch 1.13), which rendezvous through a FileStore in a fresh temp dir
(init_method file://) and use the gloo backend (TCP on 127.0.0.1). Only rank 0
prints. torch has no out-of-place allreduce, so the out-of-place column is
recv.copy_(send) + all_reduce(recv) (what a caller must do); in-place is
all_reduce(recv). Each rank uses torch.set_num_threads(1) (2-core host, K ranks).

time = average per iteration over -n timed iterations, max over ranks.
Correctness: after timing, one more call on fresh inputs, every element compared
with the exact expected sum (#wrong, summed over ranks). The collective timeout
is -T seconds, and the launcher kills and reaps all ranks when the whole run
takes longer than -T seconds or one rank fails.
"""
import argparse
import ctypes
import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(float(s[:-1]) * mult[s[-1].lower()])
    return int(float(s))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-b", "--minbytes", type=parse_size, default=4096)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=4096)
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", type=int, default=5)
    ap.add_argument("-c", "--check", type=int, default=1)
    ap.add_argument("-p", "--nranks", type=int, default=2)
    ap.add_argument("-T", "--timeout", type=int, default=300)
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--store", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.stepfactor < 2 or a.iters < 1 or a.warmup_iters < 0 or a.nranks < 1:
        ap.error("need -f >= 2, -n >= 1, -w >= 0, -p >= 1")
    a.minbytes = max(4, a.minbytes)
    a.maxbytes = max(a.minbytes, a.maxbytes)
    return a


def sizes(a):
    s, out = a.minbytes, []
    while s <= a.maxbytes:
        out.append(s // 4 * 4)
        s *= a.stepfactor
    return out


def fmt_triple(nbytes, time_us, wrong, factor):
    algbw = nbytes / (time_us * 1e3) if time_us > 0 else 0.0
    busbw = algbw * factor
    if time_us >= 10000.0:
        t = "%7.0f" % time_us
    elif time_us >= 100.0:
        t = "%7.1f" % time_us
    else:
        t = "%7.2f" % time_us
    w = "N/A" if wrong is None else str(wrong)
    return "  %7s  %6.2f  %6.2f  %5s" % (t, algbw, busbw, w), busbw


def print_header(a, extra):
    print("# torch.distributed gloo allreduce")
    print("# nThread 1 nGpus 1 minBytes %d maxBytes %d step: %d(factor) warmup iters: %d "
          "iters: %d agg iters: 1 validation: %d graph: 0"
          % (a.minbytes, a.maxbytes, a.stepfactor, a.warmup_iters, a.iters, a.check))
    print("# nranks %d" % a.nranks)
    print(extra)
    print("#")
    print("#                                                              out-of-place"
          "                       in-place          ")
    print("#       size         count      type   redop    root     time   algbw   busbw"
          " #wrong     time   algbw   busbw #wrong")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
          "            (us)  (GB/s)  (GB/s)       ")
    sys.stdout.flush()


def worker(a):
    try:  # die with the launcher
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = a.rank, a.nranks
    dist.init_process_group("gloo", init_method="file://" + a.store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=a.timeout))

    def inputs(count, r):
        i = torch.arange(count, dtype=torch.int64)
        return ((i * 7 + r * 3) % 13 - 6).to(torch.float32)

    def expected(count):
        s = torch.zeros(count, dtype=torch.float32)
        for r in range(n):
            s += inputs(count, r)
        return s

    def global_sum(v, op):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.item()

    szs = sizes(a)
    maxc = szs[-1] // 4 if szs else 0
    send = inputs(maxc, rank)
    recv = inputs(maxc, rank)

    factor = 2.0 * (n - 1) / n if n > 1 else 1.0
    if rank == 0:
        print_header(a, "# torch %s, backend gloo, init file://, torch.set_num_threads(1); "
                        "out-of-place = copy_ + all_reduce" % torch.__version__)
    bus_sum, bus_n, wrong_total = 0.0, 0, 0
    for nbytes in szs:
        c = nbytes // 4
        s, r = send[:c], recv[:c]

        def oop():
            r.copy_(s)
            dist.all_reduce(r)

        def ip():
            dist.all_reduce(r)

        res = []
        for op in (oop, ip):
            for _ in range(a.warmup_iters):
                op()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                op()
            t = (time.perf_counter() - t0) / a.iters * 1e6
            res.append(global_sum(t, dist.ReduceOp.MAX))
        wrong = [None, None]
        if a.check:
            exp = expected(c)
            s.copy_(inputs(c, rank))
            r.zero_()
            dist.barrier()
            oop()
            wrong[0] = int(global_sum(float((r != exp).sum().item()), dist.ReduceOp.SUM))
            r.copy_(inputs(c, rank))
            dist.barrier()
            ip()
            wrong[1] = int(global_sum(float((r != exp).sum().item()), dist.ReduceOp.SUM))
            r.copy_(inputs(c, rank))
        if rank == 0:
            line = "%12d  %12d  %8s  %6s  %6d" % (nbytes, c, "float", "sum", -1)
            for k in range(2):
                txt, bus = fmt_triple(nbytes, res[k], wrong[k], factor)
                line += txt
                bus_sum += bus
                bus_n += 1
                wrong_total += wrong[k] or 0
            print(line)
            sys.stdout.flush()
    if rank == 0:
        print("# Out of bounds values : %d %s" % (wrong_total, "OK" if wrong_total == 0 else "FAILED"))
        print("# Avg bus bandwidth    : %g " % (bus_sum / bus_n if bus_n else 0.0))
        print("#")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def launch(a, argv):
    tmp = tempfile.mkdtemp(prefix="torch_gloo_allreduce.")
    store = os.path.join(tmp, "store")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    rc = 0
    try:
        for r in range(a.nranks):
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__)] + argv +
                ["--rank", str(r), "--store", store], env=env))
        deadline = time.monotonic() + a.timeout
        alive = list(procs)
        while alive:
            for p in list(alive):
                if p.poll() is not None:
                    alive.remove(p)
                    if p.returncode != 0 and rc == 0:
                        sys.stderr.write("torch_gloo_allreduce: a rank failed (rc %d); killing the "
                                         "others\n" % p.returncode)
                        rc = 1
                        for q in alive:
                            q.kill()
            if alive and time.monotonic() > deadline and rc != 124:
                sys.stderr.write("torch_gloo_allreduce: timeout after %d s; killing all ranks\n"
                                 % a.timeout)
                rc = 124
                for q in alive:
                    q.kill()
            time.sleep(0.005)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.rank >= 0:
        return worker(a)
    return launch(a, argv)


if __name__ == "__main__":
    sys.exit(main())
