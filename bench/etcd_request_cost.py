#!/usr/bin/env python3
"""What one request of each kind a rendezvous watcher may send costs etcd's members in CPU,
through etcd's v3 JSON gateway (the wire cohort's EtcdStore uses): three members on loopback
(data in a temporary directory, stopped by PID), REQUESTS requests of each kind from eight
client threads, one kept-alive HTTP connection each (spread over the members), and the
members' CPU seconds (user + system, /proc) over each kind's run. Prints a table.

    python3 bench/etcd_request_cost.py [--requests 6000] [--kinds beat_txn,keepalive,...]

Kinds: beat_txn (a counter's compare-free put and two reads in one txn: what a beat costs
without a lease), keepalive (POST /v3/lease/keepalive: a lease renewal), range_serializable,
range_linearizable, readonly_txn_serializable (two serializable reads in one txn: what a
leased beat reads), readonly_txn_linearizable. The clients share the machine with etcd; only
etcd's own CPU is counted."""
import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

ETCD = "/usr/bin/etcd"
KINDS = ["beat_txn", "keepalive", "range_serializable", "range_linearizable",
         "readonly_txn_serializable", "readonly_txn_linearizable"]
THREADS = 8


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def b64(text):
    return base64.b64encode(text.encode()).decode()


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    answer = json.loads(conn.getresponse().read())
    if "error" in answer:
        raise RuntimeError("%s: %s" % (path, answer))
    return answer


class Members:
    def __init__(self, count=3):
        self.dir = tempfile.mkdtemp(prefix="etcd_request_cost-")
        ports = free_ports(2 * count)
        cluster = ",".join("m%d=http://127.0.0.1:%d" % (i, ports[2 * i + 1])
                           for i in range(count))
        self.client_ports = [ports[2 * i] for i in range(count)]
        self.procs = []
        for i in range(count):
            c = "http://127.0.0.1:%d" % ports[2 * i]
            p = "http://127.0.0.1:%d" % ports[2 * i + 1]
            self.procs.append(subprocess.Popen(
                [ETCD, "--name", "m%d" % i, "--data-dir", os.path.join(self.dir, "m%d" % i),
                 "--listen-client-urls", c, "--advertise-client-urls", c,
                 "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--logger", "zap", "--log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        for port in self.client_ports:
            while True:
                try:
                    post(http.client.HTTPConnection("127.0.0.1", port, timeout=2),
                         "/v3/kv/put", {"key": b64("probe"), "value": b64("1")})
                    break
                except (OSError, RuntimeError, ValueError):
                    if time.monotonic() > deadline:
                        raise RuntimeError("etcd did not start")
                    time.sleep(0.2)

    def cpu_seconds(self):
        total = 0
        for p in self.procs:
            with open("/proc/%d/stat" % p.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def request(kind, thread, n, leases):
    own, other = b64("hb%d" % thread), b64("hb%d" % ((thread + 1) % THREADS))
    if kind == "beat_txn":
        return "/v3/kv/txn", {"success": [
            {"request_put": {"key": own, "value": b64(str(n))}},
            {"request_range": {"key": other}}, {"request_range": {"key": b64("next")}}]}
    if kind == "keepalive":
        return "/v3/lease/keepalive", {"ID": leases[thread]}
    if kind.startswith("range_"):
        return "/v3/kv/range", {"key": other, "serializable": kind == "range_serializable"}
    serializable = kind == "readonly_txn_serializable"
    return "/v3/kv/txn", {"success": [
        {"request_range": {"key": other, "serializable": serializable}},
        {"request_range": {"key": b64("next"), "serializable": serializable}}]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    members = Members()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", members.client_ports[0])
        leases = [post(conn, "/v3/lease/grant", {"TTL": "600"})["ID"] for _ in range(THREADS)]
        for t in range(THREADS):
            post(conn, "/v3/kv/put", {"key": b64("hb%d" % t), "value": b64("0"),
                                      "lease": leases[t]})
        print("| request | requests | seconds | requests/s | etcd CPU s | etcd CPU per request |")
        print("|---|---:|---:|---:|---:|---:|")
        for kind in args.kinds.split(","):
            if kind not in KINDS:
                raise SystemExit("unknown kind %r (known: %s)" % (kind, ", ".join(KINDS)))
            per_thread = args.requests // THREADS

            def work(thread):
                port = members.client_ports[thread % len(members.client_ports)]
                c = http.client.HTTPConnection("127.0.0.1", port)
                for n in range(per_thread):
                    post(c, *request(kind, thread, n, leases))

            cpu0, t0 = members.cpu_seconds(), time.monotonic()
            threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds, cpu = time.monotonic() - t0, members.cpu_seconds() - cpu0
            total = per_thread * THREADS
            print("| %s | %d | %.2f | %.0f | %.2f | %.0f us |"
                  % (kind, total, seconds, total / seconds, cpu, 1e6 * cpu / total), flush=True)
    finally:
        members.stop()


if __name__ == "__main__":
    main()
