#!/usr/bin/env python3
"""What one request of each kind a rendezvous watcher may send costs etcd's members in CPU,
through etcd's v3 JSON gateway (the wire cohort's EtcdStore uses): three members on loopback
as bench/rdzv_scale.py starts them (data in a temporary directory, stopped by PID),
REQUESTS requests of each kind from eight client threads, one kept-alive HTTP connection
each (spread over the members), and the members' CPU seconds (user + system, /proc) over
each kind's run. Prints a table.

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
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rdzv_scale import EtcdStore, cpu_seconds  # noqa: E402  (bench/rdzv_scale.py)

KINDS = ["beat_txn", "keepalive", "range_serializable", "range_linearizable",
         "readonly_txn_serializable", "readonly_txn_linearizable"]
THREADS = 8


def b64(text):
    return base64.b64encode(text.encode()).decode()


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    answer = json.loads(conn.getresponse().read())
    if "error" in answer:
        raise RuntimeError("%s: %s" % (path, answer))
    return answer


def connect(endpoint):
    host, port = endpoint.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port))


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
    members = EtcdStore(3, [], "")
    try:
        conn = connect(members.endpoints[0])
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
                c = connect(members.endpoints[thread % len(members.endpoints)])
                for n in range(per_thread):
                    post(c, *request(kind, thread, n, leases))

            def etcd_cpu():
                return sum(cpu_seconds(pid) for pid in members.pids)

            cpu0, t0 = etcd_cpu(), time.monotonic()
            threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds, cpu = time.monotonic() - t0, etcd_cpu() - cpu0
            total = per_thread * THREADS
            print("| %s | %d | %.2f | %.0f | %.2f | %.0f us |"
                  % (kind, total, seconds, total / seconds, cpu, 1e6 * cpu / total), flush=True)
    finally:
        members.stop()


if __name__ == "__main__":
    main()
