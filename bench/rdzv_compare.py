#!/usr/bin/python3
"""Side-by-side rendezvous benchmark: cohort (embedded store, etcd) against torch c10d.

Run with Debian's python (it has torch 1.13):
    /usr/bin/python3 bench/rdzv_compare.py [--agents 8,64,512] [--reps 5] [--torch-reps 3]

For each agent count N, one rendezvous round with min = max = N, agents as threads in one
process, each agent with its own connection to the store, the same join timeout (= the
per-run limit, 300 s by default) and last-call timeout (1 s; unused with min = max):
  cohort embedded  build/dev/bench/rdzv_bench --backend embedded (StoreServer + TcpStore)
  cohort etcd      build/dev/bench/rdzv_bench --backend etcd (EtcdStore, JSON gateway) against a
                   single-member etcd that this script starts (/usr/bin/etcd, free loopback
                   ports, data dir in a temp dir) and SIGKILLs at the end; left out when
                   rdzv_bench was built without the etcd backend or /usr/bin/etcd is missing
  torch c10d       bench/torch_c10d_rdzv.py: DynamicRendezvousHandler + C10dRendezvousBackend
                   over one TCPStore server, a TCPStore client per agent thread
Time: start of the first agent thread -> every agent's rendezvous call returned (connections
made before). Cells are medians over reps; cohort's reps run inside one rdzv_bench process,
torch's each in a fresh process (no further torch reps once a cell has run --max-cell-seconds). A run past --timeout is killed and reported as "timeout";
later reps of that cell are then skipped. A run whose agents fail (an error from the store)
is reported as "failed" with the error above the table, and fails the target. Ratio = torch time / cohort time.
Target (issue 4): cohort >= 10x faster than torch c10d from 64 agents.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ETCD = "/usr/bin/etcd"
TIMEOUT = "timeout"
FAILED = "failed"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A single-member etcd on loopback, stopped by PID with SIGKILL."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rdzv_compare-etcd-")
        self.client_port, self.peer_port = free_port(), free_port()
        c = "http://127.0.0.1:%d" % self.client_port
        p = "http://127.0.0.1:%d" % self.peer_port
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "s1", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", c, "--advertise-client-urls", c,
             "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
             "--initial-cluster", "s1=" + p],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint = "127.0.0.1:%d" % self.client_port
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(c + "/health", timeout=1) as r:
                    if r.status == 200 and b"true" in r.read():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("etcd did not become healthy (log in %s)" % self.dir)
            time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def run_json(argv, timeout):
    """Runs argv; returns (json or None, "timeout" / error text or None)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=str(REPO), start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        lines = [l for l in err.splitlines() if l.strip()]
        if lines:  # torch_c10d_rdzv.py --progress: where it stood when killed
            print("    last progress: %s" % lines[-1], flush=True)
        return None, TIMEOUT
    found = last_json(out)
    if p.returncode != 0 or not found or "seconds" not in found:
        return None, "rc=%s %s" % (p.returncode, (err.strip() or out.strip())[-300:])
    return found, None


def cohort_cell(bench, backend, n, args, etcd):
    reps = args.etcd_reps if backend == "etcd" else args.reps
    argv = [bench, "--agents", str(n), "--reps", str(reps), "--backend", backend,
            "--join-timeout", str(args.timeout), "--last-call", str(args.last_call)]
    if backend == "etcd":
        argv += ["--endpoints", etcd.endpoint]
    # One process runs all reps: allow each its full limit.
    found, err = run_json(argv, args.timeout * reps + 30)
    if err:
        print("  cohort %-8s N=%-4d %s" % (backend, n, err), flush=True)
        return (TIMEOUT if err == TIMEOUT else FAILED), []
    print("  cohort %-8s N=%-4d %s" % (backend, n, json.dumps(found)), flush=True)
    return float(found["seconds"]), found.get("all", [found["seconds"]])


def torch_cell(n, args):
    samples = []
    cell_start = time.monotonic()
    for rep in range(args.torch_reps):
        if samples and time.monotonic() - cell_start > args.max_cell_seconds:
            print("  torch  c10d     N=%-4d %d of %d reps (cell over %gs)" % (
                n, len(samples), args.torch_reps, args.max_cell_seconds), flush=True)
            break
        found, err = run_json(
            [sys.executable, str(HERE / "torch_c10d_rdzv.py"), "--agents", str(n),
             "--join-timeout", str(args.timeout), "--last-call", str(args.last_call),
             "--run-id", "bench%d" % rep, "--progress", "30"], args.timeout)
        if err:
            print("  torch  c10d     N=%-4d rep %d: %s" % (n, rep + 1, err), flush=True)
            if err == TIMEOUT:
                return TIMEOUT, samples
            continue
        print("  torch  c10d     N=%-4d rep %d: %s" % (n, rep + 1, json.dumps(found)),
              flush=True)
        samples.append(float(found["seconds"]))
    return (statistics.median(samples) if samples else FAILED), samples


def fmt_cell(v):
    if v is None:
        return "n/a"
    if v == TIMEOUT:
        return "timeout (> %gs)" % ARGS.timeout
    if v == FAILED:
        return "failed (see log)"
    return "%.2f ms" % (v * 1e3) if v < 1 else "%.3f s" % v


def ratio(torch_v, cohort_v):
    if not isinstance(cohort_v, float) or cohort_v <= 0:
        return "n/a"
    if torch_v == TIMEOUT:
        return "> %.0fx" % (ARGS.timeout / cohort_v)
    if not isinstance(torch_v, float):
        return "n/a"
    r = torch_v / cohort_v
    return ("%.0fx" if r >= 10 else "%.2fx") % r


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="8,64,512", help="comma list of agent counts")
    ap.add_argument("--reps", type=int, default=5, help="cohort reps per cell (median)")
    ap.add_argument("--torch-reps", type=int, default=3, help="torch reps per cell (median)")
    ap.add_argument("--etcd-reps", type=int, default=3, help="cohort etcd reps per cell")
    ap.add_argument("--max-cell-seconds", type=float, default=150,
                    help="no further torch reps once a cell has run this long")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="per-run limit and join timeout, seconds")
    ap.add_argument("--last-call", type=float, default=1.0, help="last-call timeout, seconds")
    ap.add_argument("--rdzv-bench", default=os.environ.get(
        "RDZV_BENCH", str(REPO / "build/dev/bench/rdzv_bench")))
    ap.add_argument("--no-etcd", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", help="also write the raw samples and medians here")
    ARGS = args = ap.parse_args()
    counts = [int(x) for x in args.agents.split(",") if x.strip()]

    bench = args.rdzv_bench
    if not Path(bench).exists():
        sys.exit("rdzv_compare: %s not built (nice ninja -C build/dev rdzv_bench)" % bench)
    etcd_note = None
    if args.no_etcd:
        etcd_note = "--no-etcd"
    elif not os.access(ETCD, os.X_OK):
        etcd_note = "%s missing (apt-get install etcd-server)" % ETCD
    else:
        probe = subprocess.run([bench, "--backend", "etcd"], capture_output=True, text=True)
        if "--endpoints" not in probe.stderr:
            etcd_note = "rdzv_bench has no etcd backend"
    torch_ok = not args.no_torch
    if torch_ok:
        try:
            subprocess.run([sys.executable, "-c", "import torch.distributed.elastic"],
                           check=True, capture_output=True, timeout=120)
        except (subprocess.SubprocessError, OSError):
            torch_ok = False
            print("rdzv_compare: %s cannot import torch; torch column left out" %
                  sys.executable, file=sys.stderr)

    etcd = None
    if etcd_note is None:
        etcd = Etcd()
        print("etcd %s (pid %d) at %s" % (ETCD, etcd.proc.pid, etcd.endpoint), flush=True)
    else:
        print("cohort etcd column left out: %s" % etcd_note, flush=True)

    results = {}
    t0 = time.time()
    try:
        for n in counts:
            r = results[n] = {}
            r["embedded"], r["embedded_all"] = cohort_cell(bench, "embedded", n, args, None)
            if etcd is not None:
                r["etcd"], r["etcd_all"] = cohort_cell(bench, "etcd", n, args, etcd)
            if torch_ok:
                r["torch"], r["torch_all"] = torch_cell(n, args)
    finally:
        if etcd is not None:
            etcd.stop()

    hdr = ("agents", "cohort embedded", "cohort etcd", "torch c10d", "ratio (torch/embedded)",
           "ratio (torch/etcd)")
    rows = []
    for n in counts:
        r = results[n]
        rows.append((str(n), fmt_cell(r.get("embedded")),
                     fmt_cell(r.get("etcd")) if etcd_note is None else "n/a",
                     fmt_cell(r.get("torch")), ratio(r.get("torch"), r.get("embedded")),
                     ratio(r.get("torch"), r.get("etcd"))))
    widths = [max(len(x[i]) for x in rows + [hdr]) for i in range(len(hdr))]
    line = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"
    print()
    print("rendezvous, min = max = N, agents as threads; medians (cohort embedded %d reps, "
          "etcd %d, torch up to %d); join timeout %gs; %.0f s total" % (
              args.reps, args.etcd_reps, args.torch_reps, args.timeout, time.time() - t0))
    print(line(hdr))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))
    for col in ("embedded", "etcd"):
        verdicts = []
        for n in counts:
            if n < 64:
                continue
            c, t = results[n].get(col), results[n].get("torch")
            if c in (FAILED, TIMEOUT):
                verdicts.append("FAIL")
            elif not isinstance(c, float) or not isinstance(t, (float, str)) or t == FAILED:
                verdicts.append("n/a")
            elif t == TIMEOUT:
                verdicts.append("PASS" if args.timeout / c >= 10 else "n/a")
            else:
                verdicts.append("PASS" if t / c >= 10 else "FAIL")
        if col == "etcd" and etcd_note is not None:
            continue
        ok = ("FAIL" if "FAIL" in verdicts else "n/a" if not verdicts or "n/a" in verdicts
              else "PASS")
        print("target cohort %s >= 10x faster than torch c10d from 64 agents: %s" % (col, ok))
    if etcd_note:
        print("(cohort etcd: %s)" % etcd_note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": {str(k): v for k, v in results.items()},
                       "reps": args.reps, "torch_reps": args.torch_reps,
                       "timeout": args.timeout}, f, indent=1)


if __name__ == "__main__":
    main()
