#!/usr/bin/env python3
"""Side-by-side float32 sum allreduce: cohort vs torch.distributed gloo, Gloo C++,
OpenMPI, and the memory-bandwidth bound, on this host.

    bench/allreduce_compare.py                      # world sizes 2 and 4, 4K..256M x4, 3 reps
    bench/allreduce_compare.py --nprocs 2 -e 16M --reps 1      # quick look

Every system prints nccl-tests lines (cohort's `cohort bench allreduce` does, and
so do the peers in bench/peers/), which this script parses the same way for all.
Per repetition the systems run one after another in a rotated order (so that
drift in machine load hits each of them alike); the table shows medians over
the repetitions. Sizes up to --split bytes run with --iters-small timed
iterations, larger ones with --iters-large (one process launch per segment).
The column used is out-of-place unless --inplace. --per-call times every call after a
barrier and takes the median (what a training step sees; cohort and OpenMPI only):
    bench/allreduce_compare.py --nprocs 2 -b 1M -e 64M --inplace --per-call --systems cohort,mpi

Peers are built first with bench/peers/build.sh (idempotent). Raw outputs go to
--log-dir (default build/peers/compare-<time>/). Every run has a timeout and
runs in its own process group, which is killed on timeout or Ctrl-C.
"""
import argparse
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "build", "peers")
COHORT = os.path.join(ROOT, "build", "dev", "cohort", "cli", "cohort")
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
SYSTEMS = ["cohort", "torch", "gloo", "mpi", "membw"]
LABEL = {"cohort": "cohort", "torch": "torch-gloo", "gloo": "gloo C++", "mpi": "OpenMPI",
         "membw": "membw"}


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip()
    if s and s[-1].lower() in mult:
        return int(float(s[:-1]) * mult[s[-1].lower()])
    return int(float(s))


def human(n):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return "%d%s" % (n // m, unit)
    return str(n)


def parse_nccl(text):
    """nccl-tests data lines -> {size: (oop_time_us, oop_busbw, oop_wrong,
    ip_time_us, ip_busbw, ip_wrong)}; wrong is None for N/A."""
    out = {}
    for line in text.splitlines():
        m = RANK_PREFIX.match(line)  # `cohort run` prefixes worker output with "[rankN]: "
        if m:
            if m.group(1) != "0":
                continue
            line = line[m.end():]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = line.split()
        if len(f) < 13:
            continue
        try:
            size = int(f[0])

            def w(x):
                return None if x == "N/A" else int(x)
            out[size] = (float(f[5]), float(f[7]), w(f[8]), float(f[9]), float(f[11]), w(f[12]))
        except ValueError:
            continue
    return out


class Runner:
    def __init__(self, args):
        self.args = args
        self.log_dir = args.log_dir or os.path.join(
            PEERS, "compare-" + time.strftime("%Y%m%d-%H%M%S"))
        os.makedirs(self.log_dir, exist_ok=True)
        self.n_runs = 0

    def run(self, name, cmd, timeout):
        """Runs cmd in its own process group; returns (rc, stdout, stderr)."""
        self.n_runs += 1
        env = dict(os.environ, OMP_NUM_THREADS="1")
        log = os.path.join(self.log_dir, "%03d-%s.log" % (self.n_runs, name))
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env=env, cwd=ROOT)
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            self._kill(p)
            out, err = p.communicate()
            rc = 124
            err += "\nallreduce_compare: timeout after %d s\n" % timeout
        except BaseException:
            self._kill(p)
            p.communicate()
            raise
        finally:
            self._kill(p)  # anything left in its group (a rank that outlived its launcher)
        with open(log, "w") as f:
            f.write("$ %s\n# rc %d, %.1f s\n%s\n# --- stderr\n%s" % (
                " ".join(shlex.quote(c) for c in cmd), rc, time.monotonic() - t0, out, err))
        if self.args.verbose:
            sys.stderr.write("  %-7s rc=%d %5.1fs  %s\n" % (name, rc, time.monotonic() - t0, log))
        return rc, out, err

    @staticmethod
    def _kill(p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def commands(system, k, b, e, a, n, w):
    f = str(a.factor)
    common = ["-b", str(b), "-e", str(e), "-f", f, "-n", str(n), "-w", str(w), "-c", "1"]
    if a.per_call:
        if system not in ("cohort", "mpi"):
            raise ValueError("--per-call: only cohort and mpi time every call")
        common.append("-z")
    t = str(a.timeout)
    if system == "cohort":
        return [a.cohort, "run", "--nproc-per-node", str(k), a.cohort, "bench", "allreduce"] + common
    if system == "torch":
        return ["/usr/bin/python3", os.path.join(ROOT, "bench", "peers", "torch_gloo_allreduce.py"),
                "-p", str(k), "-T", t] + common
    if system == "gloo":
        cmd = [os.path.join(PEERS, "gloo_allreduce"), "-p", str(k), "-T", t] + common
        return cmd + (["-a", a.gloo_algos] if a.gloo_algos else [])
    if system == "mpi":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(k),
                "--mca", "btl", "self,vader", "--timeout", t,
                os.path.join(PEERS, "mpi_allreduce"), "-T", t] + common
    raise ValueError(system)


def membw_cmd(a, threads):
    return [os.path.join(PEERS, "membw"), "-b", str(a.membw_bytes), "-e", str(a.membw_bytes),
            "-n", "5", "-w", "1", "-t", str(threads), "-c", "1"]


def median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=4096)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--split", type=parse_size, default=1 << 20,
                    help="sizes <= split use the -small iteration counts (default 1M)")
    ap.add_argument("--iters-small", type=int, default=50)
    ap.add_argument("--warmup-small", type=int, default=10)
    ap.add_argument("--iters-large", type=int, default=5)
    ap.add_argument("--warmup-large", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, help="timed iterations for all sizes (overrides)")
    ap.add_argument("-w", "--warmup", type=int, help="warmup iterations for all sizes (overrides)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="subset of %s (default all)" % ",".join(SYSTEMS))
    ap.add_argument("--gloo-algos", default="",
                    help="gloo_allreduce -a list (default: ring,ring_chunked,halving_doubling)")
    ap.add_argument("--membw-bytes", type=parse_size, default=256 << 20)
    ap.add_argument("--inplace", action="store_true", help="use the in-place columns")
    ap.add_argument("--per-call", action="store_true",
                    help="a barrier before every timed call and the median per-call time "
                         "(cohort and mpi only: use with --systems cohort,mpi)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per launched run")
    ap.add_argument("--cohort", default=COHORT)
    ap.add_argument("--log-dir", default="")
    ap.add_argument("--no-build", action="store_true", help="do not run bench/peers/build.sh")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.iters is not None:
        a.iters_small = a.iters_large = a.iters
    if a.warmup is not None:
        a.warmup_small = a.warmup_large = a.warmup
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error("unknown system %r" % s)
    nprocs = [int(x) for x in a.nprocs.split(",") if x]
    if a.factor < 2 or a.reps < 1 or not nprocs:
        ap.error("need -f >= 2, --reps >= 1, --nprocs")

    sizes = []
    s = max(4, a.minbytes)
    while s <= a.maxbytes:
        sizes.append(s // 4 * 4)
        s *= a.factor
    segments = []  # (b, e, iters, warmup)
    small = [x for x in sizes if x <= a.split]
    large = [x for x in sizes if x > a.split]
    if small:
        segments.append((small[0], small[-1], a.iters_small, a.warmup_small))
    if large:
        segments.append((large[0], large[-1], a.iters_large, a.warmup_large))

    if not a.no_build and any(x != "cohort" for x in systems):
        r = subprocess.run([os.path.join(ROOT, "bench", "peers", "build.sh")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout)
            sys.stderr.write("allreduce_compare: building the peers failed\n")
            return 1

    runner = Runner(a)
    col = 3 if a.inplace else 0
    cohort_state = "ok"
    cohort_note = ""
    if "cohort" in systems and not (os.path.isfile(a.cohort) and os.access(a.cohort, os.X_OK)):
        cohort_state = "not built"
        cohort_note = "%s does not exist" % a.cohort
    ncpu = os.cpu_count() or 1

    print("# allreduce_compare: float32 sum allreduce, one host, %s columns, medians of %d reps"
          % ("in-place" if a.inplace else "out-of-place", a.reps))
    print("# sizes %s..%s x%d; iters/warmup %d/%d for sizes <= %s, %d/%d above; logs in %s"
          % (human(sizes[0]), human(sizes[-1]), a.factor, a.iters_small, a.warmup_small,
             human(a.split), a.iters_large, a.warmup_large, runner.log_dir))
    sys.stdout.flush()

    failed_runs = []
    for k in nprocs:
        # data[system][size] -> list of (time_us, busbw, wrong) over reps
        data = {x: {} for x in systems}
        membw1, membwN = [], []
        for rep in range(a.reps):
            order = systems[rep % len(systems):] + systems[:rep % len(systems)]
            if a.verbose:
                sys.stderr.write("nprocs %d rep %d: %s\n" % (k, rep + 1, " ".join(order)))
            for system in order:
                if system == "membw":
                    for threads, acc in ((1, membw1), (min(k, ncpu), membwN)):
                        if threads != 1 or acc is membw1:
                            rc, out, err = runner.run("membw-t%d" % threads, membw_cmd(a, threads),
                                                      a.timeout + 30)
                            res = parse_nccl(out)
                            if res:
                                acc.append(list(res.values())[-1][1])  # copy busbw = B_mem
                            else:
                                failed_runs.append("membw -t %d rc %d: %s" % (threads, rc, err.strip()[-300:]))
                    continue
                if system == "cohort" and cohort_state != "ok":
                    continue
                for b, e, n, w in segments:
                    rc, out, err = runner.run("%s-np%d" % (system, k),
                                              commands(system, k, b, e, a, n, w), a.timeout + 30)
                    res = parse_nccl(out)
                    if system == "cohort" and not res and not data["cohort"]:
                        cohort_state = "not built" if rc != 0 else "no output"
                        cohort_note = "`cohort bench allreduce` printed no data lines (rc %d): %s" % (
                            rc, (err.strip() or out.strip())[-300:])
                        break
                    if rc != 0:
                        failed_runs.append("%s np %d %s..%s rc %d: %s" % (
                            LABEL[system], k, human(b), human(e), rc, err.strip()[-300:]))
                    for size, v in res.items():
                        data[system].setdefault(size, []).append((v[col], v[col + 1], v[col + 2]))

        print_table(a, k, sizes, systems, data, membw1, membwN, cohort_state, cohort_note, ncpu)
    if failed_runs:
        print("# failed runs (see logs):")
        for f in failed_runs:
            print("#   " + f.replace("\n", " | "))
    return 0


def print_table(a, k, sizes, systems, data, membw1, membwN, cohort_state, cohort_note, ncpu):
    factor = 2.0 * (k - 1) / k

    def stat(system, size):
        """-> (median time us, busbw from median time, wrong) or None."""
        v = data.get(system, {}).get(size)
        if not v:
            return None
        t = statistics.median(x[0] for x in v)
        wrongs = [x[2] for x in v if x[2] is not None]
        return t, size / (t * 1e3) * factor if t > 0 else 0.0, (max(wrongs) if wrongs else None)

    def cell(system, size):
        if system not in systems:
            return "%17s" % "-"
        if system == "cohort" and cohort_state != "ok":
            return "%17s" % cohort_state
        st = stat(system, size)
        if st is None:
            return "%17s" % "failed"
        t, bw, wrong = st
        tag = " WRONG" if wrong else ""
        ts = ("%.0f" % t) if t >= 1000 else ("%.1f" % t)
        return "%9s %7.2f%s" % (ts, bw, tag)

    def ratio(x, y, size):
        sx, sy = stat(x, size), stat(y, size)
        if not sx or not sy or sy[1] <= 0 or (x == "cohort" and cohort_state != "ok"):
            return None
        return sx[1] / sy[1]

    b_mem = median_or_none(membw1)
    b_memN = median_or_none(membwN)
    bound = b_mem * (k - 1) / (k * k) if b_mem else None

    print()
    print("## world size %d (%d ranks on one host, %d CPU cores)" % (k, k, ncpu))
    print("# cells: median time (us) and busbw (GB/s) = size/time * 2(n-1)/n; GB = 1e9")
    if b_mem:
        print("# memory bound: membw copy of %s, single thread: B_mem = (read+write bytes)/time = "
              "%.2f GB/s (median; %d threads: %.2f GB/s)."
              % (human(a.membw_bytes), b_mem, min(k, ncpu), b_memN or float("nan")))
        print("#   A shared-memory allreduce of S bytes on n ranks reads every rank's input and"
              " writes every rank's output at least once: traffic >= 2nS bytes, so")
        print("#   time >= 2nS/B_mem, algbw <= B_mem/(2n), busbw <= B_mem/(2n) * 2(n-1)/n"
              " = B_mem (n-1)/n^2 = %.2f GB/s for n = %d." % (bound, k))
        print("#   (Sizes that fit in cache can exceed it; the bound is meant for the large sizes.)")
    else:
        print("# memory bound: membw did not run")
    hdr = "%10s | %17s | %17s | %17s | %17s | %8s | %8s | %7s %7s" % (
        "size", "cohort us  busbw", "torch-gloo", "gloo C++ (best)", "OpenMPI", "coh/mpi",
        "coh/torch", "bound", "coh %")
    print(hdr)
    print("-" * len(hdr))
    for size in sizes:
        rm, rt = ratio("cohort", "mpi", size), ratio("cohort", "torch", size)
        st = stat("cohort", size) if cohort_state == "ok" else None
        pct = "%6.0f%%" % (100 * st[1] / bound) if st and bound else "%7s" % "-"
        print("%10s | %s | %s | %s | %s | %8s | %8s | %7s %s" % (
            human(size), cell("cohort", size), cell("torch", size), cell("gloo", size),
            cell("mpi", size), "%.2fx" % rm if rm else "-", "%.2fx" % rt if rt else "-",
            "%.2f" % bound if bound else "-", pct))
    if cohort_note:
        print("# cohort: %s" % " | ".join(x for x in cohort_note.splitlines() if x.strip()))

    # Latency at the smallest size (4 KiB by default) and the targets from the issue.
    small = sizes[0]
    sc, sm = (stat("cohort", small) if cohort_state == "ok" else None), stat("mpi", small)
    lat = ("%s latency: cohort %s us, OpenMPI %s us, cohort/OpenMPI time = %s" % (
        human(small), "%.1f" % sc[0] if sc else "n/a", "%.1f" % sm[0] if sm else "n/a",
        "%.2f" % (sc[0] / sm[0]) if sc and sm else "n/a"))
    print("# " + lat)

    def verdict(ok):
        return "n/a" if ok is None else ("PASS" if ok else "FAIL")

    mid = [s for s in sizes if (1 << 20) <= s <= (256 << 20)]
    r_mpi = [ratio("cohort", "mpi", s) for s in mid]
    r_torch = [ratio("cohort", "torch", s) for s in mid]
    min_mpi = min(r_mpi) if mid and all(r_mpi) else None
    min_torch = min(r_torch) if mid and all(r_torch) else None
    big = 256 << 20
    sb = stat("cohort", big) if (cohort_state == "ok" and big in sizes) else None
    frac = sb[1] / bound if sb and bound else None
    print("# targets (from the issue):")
    print("#   4 KiB latency <= OpenMPI's                      : %s (%s)" % (
        verdict(sc[0] <= sm[0] if sc and sm and small == 4096 else None),
        "cohort/mpi %.2f" % (sc[0] / sm[0]) if sc and sm else "n/a"))
    print("#   busbw 1 MiB..256 MiB >= 1.2x OpenMPI            : %s (min ratio %s)" % (
        verdict(min_mpi >= 1.2 if min_mpi else None), "%.2fx" % min_mpi if min_mpi else "n/a"))
    print("#   busbw 1 MiB..256 MiB >= 4x torch gloo           : %s (min ratio %s)" % (
        verdict(min_torch >= 4.0 if min_torch else None), "%.2fx" % min_torch if min_torch else "n/a"))
    print("#   256 MiB busbw >= 70%% of the memory bound        : %s (%s)" % (
        verdict(frac >= 0.7 if frac is not None else None),
        "%.0f%% of %.2f GB/s" % (100 * frac, bound) if frac is not None else "n/a"))
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
