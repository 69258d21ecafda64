#!/usr/bin/python3
"""Rendezvous at scale: thousands of simulated nodes against a real store (issue 18).

    python3 bench/rdzv_scale.py [--nodes 1000,2000,5000,10000] [--etcd-nodes 1000,2000]
                                [--backends embedded,etcd1,etcd3] [--dead-ms 10000]

Each simulated node is a thread of build/dev/bench/rdzv_sim running the agent's real
rendezvous code (rendezvous::Rendezvous: Next, then WatchStep until the round ends, then
Next again) over its own store connection; up to 2,500 nodes per process. The store is a
separate process: `rdzv_sim serve` (cohort's embedded StoreServer), or etcd (/usr/bin/etcd,
one member or three, data in a temporary directory, SIGKILLed at the end).

For each backend and node count N, two jobs:
  static  (--nnodes N:N)  time from `go` to every node holding round 0; store requests per
          node for that join (server's count: StoreServer stats, etcd's
          grpc_server_started_total; and of those, the answers that were not a success,
          grpc_server_handled_total by code: "failed/join"); CPU seconds the store and the simulated nodes used
          during it (they share this machine's cores: the nodes' share is the harness's, a
          real node has its own machine); then the steady state (watchers only) for
          --steady-s seconds: store requests per node per second, store CPU (% of one core,
          utime+stime of the store processes over the window) and resident memory.
  elastic (--nnodes N-20:N+10) round 0 (includes the last call, MIN < MAX: --last-call-ms); then
          one node killed (its thread stops, its connection closes): time from its
          deadline to every survivor holding the next round, and from the kill; then 10
          nodes killed at once, the same; then one node hung (no more beats, connection
          kept: only the beats' staleness tells), from its last beat + --dead-ms; then one
          node joining the running job: time from its start to every node holding the
          round that includes it. A node's deadline:
          its last beat + --dead-ms, or on the embedded store (which keeps wills: the
          connection carries liveness) the end of its connection + the liveness period
          (max(heartbeat, dead / 3)), whichever comes first.
Every round's ranks are checked: group ranks 0..n-1 each once, global rank offsets dense
(each node runs --local-world-size workers), one world size. A failed check fails the run.

On etcd, --jobs floor first runs bench/etcd_join_floor on members of its own (cohort's jobs
then start on fresh ones too): the two-request join (one txn, one watch) with nodes of its
own and no rendezvous rules, the cost below which cohort's join cannot go; its round and
etcd CPU are the table's "floor" columns.
--etcd-cpu F slows etcd on purpose, reproducibly: every member runs in one cgroup (v1 cpu
controller, root) limited to F of one core (0.5: half a core for the three members).
--retry-budget LIST runs each configuration with COHORT_ETCD_RETRY_BUDGET set to each value
in turn (0: no budget), so the table shows the nodes' retries with and without it.
--repeat K runs each backend and size K times, each on a fresh store, and the table gives
each measurement's median and the round's range (this machine's speed moves between runs).

--check (CI): one backend, small sizes, the rank checks only; no times are asserted.
Times are CLOCK_MONOTONIC, shared by the processes of this machine.
"""
import argparse
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import etcd_profile  # noqa: E402  (bench/etcd_profile.py)

REPO = Path(__file__).resolve().parent.parent
ETCD = "/usr/bin/etcd"
# A simulated node holds up to about 16 descriptors (its agent's and its watcher's etcd
# connections, pooled: the winner of an end keeps one per request it sent at once; a held
# watch; its datagram socket): processes of 2,500 nodes ran out of this machine's 20,000
# at 5,000 nodes with held watches and told ends (2026-12-06), and a node that cannot
# connect fails like one that etcd does not answer. So each process gets what its
# descriptor limit (raised to the hard limit, which the processes inherit) allows.
FDS_PER_NODE = 16


def nodes_per_process():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft == resource.RLIM_INFINITY:
        return 2500
    return max(100, min(2500, soft // FDS_PER_NODE))


PER_PROCESS = nodes_per_process()


def limit_cpu(pids, fraction):
    """Puts `pids` in a new cgroup (v1 cpu controller) limited to `fraction` of one core;
    returns its directory (removed by release_cpu once they exited)."""
    root = "/sys/fs/cgroup/cpu"
    if not os.path.isdir(root) or os.geteuid() != 0:
        raise RuntimeError("--etcd-cpu needs root and the cgroup v1 cpu controller at %s" % root)
    path = os.path.join(root, "rdzv_scale-" + os.urandom(4).hex())
    os.mkdir(path)
    Path(path, "cpu.cfs_period_us").write_text("100000")
    Path(path, "cpu.cfs_quota_us").write_text(str(max(1000, int(fraction * 100000))))
    for pid in pids:
        Path(path, "cgroup.procs").write_text(str(pid))
    return path


def release_cpu(path):
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass


def free_ports(count):
    """`count` distinct free loopback ports: the sockets stay bound until all are chosen (a
    port freed at once can be handed out again: two etcd members once got the same one)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid, field="VmRSS"):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def niced(nice):
    """A preexec_fn for the simulated nodes' processes (rdzv_sim's agents, etcd_join_floor):
    --nodes-nice lowers their CPU priority (on a cluster they run on their own machines and
    do not take the store's CPU; here they share two cores with it; docs/scale.md,
    2026-12-06: at 19, an elastic round's stragglers missed its 1 s last call)."""
    return (lambda: os.nice(nice)) if nice else None


class Line:
    """A child process spoken to in JSON lines on stdin/stdout."""

    def __init__(self, argv, name, nice=0):
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=None, text=True, bufsize=1,
                                     preexec_fn=niced(nice))

    def send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("%s (pid %d) ended: exit %s" % (self.name, self.proc.pid,
                                                               self.proc.poll()))
        return json.loads(line)

    def ask(self, command):
        self.send(command)
        return self.read()

    def stop(self):
        """Asks the process to quit (kills it after 60 s); returns its exit status."""
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class EmbeddedStore:
    name = "embedded"
    keeps_wills = True  # StoreServer: a node's connection carries its liveness

    def __init__(self, sim):
        self.token = os.urandom(8).hex()
        self.server = Line([sim, "serve", "--token", self.token], "store")
        self.port = self.server.read()["port"]
        self.pids = [self.server.proc.pid]

    def agent_flags(self, job):
        return ["--store", "127.0.0.1:%d" % self.port, "--token", self.token]

    def requests(self, beats=True):
        """Requests served so far (without the heartbeats unless `beats`)."""
        stats = self.server.ask("stats")
        return stats["requests"] - (0 if beats else stats["beats"])

    def stop(self):
        self.server.stop()


class EtcdStore:
    """etcd members on loopback (data in a temporary directory), stopped by PID."""
    keeps_wills = False  # cohort's etcd client: heartbeats only

    def __init__(self, members, extra_flags, profile_dir, cpu=0.0, logs_dir=""):
        self.name = "etcd%d" % members
        self.logs_dir = logs_dir
        self.cgroup = None
        self.profile_dir, self.profiling, self.profile_paths = profile_dir, [], []
        self.dir = tempfile.mkdtemp(prefix="rdzv_scale-etcd-")
        free = free_ports(2 * members)
        ports = [(free[2 * i], free[2 * i + 1]) for i in range(members)]
        cluster = ",".join("m%d=http://127.0.0.1:%d" % (i, p) for i, (_, p) in enumerate(ports))
        self.procs, self.endpoints = [], []
        for i, (client, peer) in enumerate(ports):
            c, p = "http://127.0.0.1:%d" % client, "http://127.0.0.1:%d" % peer
            log = open(os.path.join(self.dir, "m%d.log" % i), "wb")
            self.procs.append(subprocess.Popen(
                [ETCD, "--name", "m%d" % i, "--data-dir", os.path.join(self.dir, "m%d" % i),
                 "--listen-client-urls", c, "--advertise-client-urls", c,
                 "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--quota-backend-bytes", str(8 << 30),
                 # etcd 3.4's default logger (capnslog) leaves a zap logger unset that a
                 # failed ReadIndex logs through: a member crashed so at 10,000 nodes
                 "--logger", "zap"]
                + (["--enable-pprof"] if profile_dir else []) + extra_flags,
                stdout=log, stderr=log))
            self.endpoints.append("127.0.0.1:%d" % client)
        self.pids = [p.pid for p in self.procs]
        deadline = time.monotonic() + 30
        for ep in self.endpoints:
            while True:
                try:
                    with urllib.request.urlopen("http://%s/health" % ep, timeout=1) as r:
                        if b"true" in r.read():
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("etcd did not become healthy (logs in %s)" % self.dir)
                time.sleep(0.1)
        if cpu > 0:
            self.cgroup = limit_cpu(self.pids, cpu)

    def agent_flags(self, job):
        return ["--etcd", ",".join(self.endpoints),
                "--prefix", "%s-%s" % (job, os.urandom(4).hex())]

    def start_profiles(self, tag, seconds):
        """With --etcd-profile: each member's CPU profile over the next `seconds`, saved as
        DIR/<tag>-m<i>.pb.gz (read them with bench/etcd_profile.py)."""
        if not self.profile_dir:
            return
        os.makedirs(self.profile_dir, exist_ok=True)

        def fetch(i, ep):
            path = os.path.join(self.profile_dir, "%s-m%d.pb.gz" % (tag, i))
            url = "http://%s/debug/pprof/profile?seconds=%d" % (ep, seconds)
            try:
                with urllib.request.urlopen(url, timeout=seconds + 120) as r:
                    data = r.read()
                with open(path, "wb") as f:
                    f.write(data)
                self.profile_paths.append(path)
            except OSError as e:
                print("  profile of member %d failed: %s" % (i, e), flush=True)
        for i, ep in enumerate(self.endpoints):
            t = threading.Thread(target=fetch, args=(i, ep))
            t.start()
            self.profiling.append(t)

    def finish_profiles(self):
        """Waits for the profiles; prints what etcd spent its CPU on (fails on an empty or
        undecodable profile: the CI check runs this against real members)."""
        for t in self.profiling:
            t.join()
        if not self.profiling:
            return
        self.profiling = []
        paths, self.profile_paths = sorted(self.profile_paths), []
        summary = etcd_profile.summarise(paths, top=1 << 20)
        if summary["cpu_s"] <= 0 or not any(name.startswith("go.etcd.io/etcd/")
                                             for name, _ in summary["cumulative"]):
            raise RuntimeError("etcd profiles in %s hold no etcd samples" % self.profile_dir)
        print("  etcd CPU profile: %.2f s over %d member(s); cumulative: %s" % (
            summary["cpu_s"], len(paths), ", ".join("%s %.0f%%" % (name, pct) for name, pct
                                                   in summary["cumulative"][:8])), flush=True)

    def requests(self, beats=True):
        """gRPC requests started on every member (a heartbeat is several on etcd: counted)."""
        return sum(self.requests_by_method().values())

    def requests_by_method(self):
        """{gRPC method: requests started}, summed over the members."""
        return self.grpc_counts()[0]

    def grpc_counts(self):
        """({gRPC method: requests started}, {gRPC code: requests answered with it}), summed
        over the members, from one read of each member's /metrics (ResourceExhausted: "too
        many requests", refused unapplied; Unavailable: "request timed out", ...)."""
        wanted = (("grpc_server_started_total", "grpc_method"),
                  ("grpc_server_handled_total", "grpc_code"))
        counts = tuple({} for _ in wanted)
        for ep in self.endpoints:
            with urllib.request.urlopen("http://%s/metrics" % ep, timeout=120) as r:
                for line in r.read().decode().splitlines():
                    for (metric, label), into in zip(wanted, counts):
                        if line.startswith(metric + "{"):
                            value = line.split(label + '="', 1)[1].split('"', 1)[0]
                            into[value] = into.get(value, 0) + int(float(line.rsplit(" ", 1)[1]))
        return counts

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        release_cpu(self.cgroup)
        if self.logs_dir:
            os.makedirs(self.logs_dir, exist_ok=True)
            for i in range(len(self.procs)):
                shutil.copy(os.path.join(self.dir, "m%d.log" % i),
                            os.path.join(self.logs_dir, "%s-%s-m%d.log"
                                         % (self.name, os.path.basename(self.dir), i)))
        shutil.rmtree(self.dir, ignore_errors=True)


class Job:
    """N simulated nodes in processes of up to PER_PROCESS each."""

    def __init__(self, sim, store, n, nnodes, args, run_id):
        self.sim, self.store, self.args, self.run_id = sim, store, args, run_id
        self.nnodes, self.store_flags = nnodes, store.agent_flags(run_id)
        self.groups = []  # (first index, count, Line)
        first = 0
        while first < n:
            count = min(PER_PROCESS, n - first)
            self.add(first, count)
            first += count
        for _, _, line in self.groups:
            line.read()  # {"ready": count}
        self.n = n
        self.live = list(range(n))

    def add(self, first, count):
        argv = [self.sim, "agents", "--first", str(first), "--count", str(count),
                "--nodes", self.nnodes, "--run-id", self.run_id,
                "--local-world-size", str(self.args.local_world_size),
                "--heartbeat-ms", str(self.args.heartbeat_ms),
                "--dead-ms", str(self.args.dead_ms),
                "--last-call-ms", str(self.args.last_call_ms)] + self.store_flags
        if self.args.quiet_start_nodes is not None:
            argv += ["--quiet-start-nodes", str(self.args.quiet_start_nodes)]
        if self.args.carry_start_nodes is not None:
            argv += ["--carry-start-nodes", str(self.args.carry_start_nodes)]
        if self.args.quiet_watch_max_nodes is not None:
            argv += ["--quiet-watch-max-nodes", str(self.args.quiet_watch_max_nodes)]
        if self.args.tell_start_nodes is not None:
            argv += ["--tell-start-nodes", str(self.args.tell_start_nodes)]
        line = Line(argv, "agents", nice=self.args.nodes_nice)
        self.groups.append((first, count, line))
        return line

    def go(self, groups=None):
        t0 = time.monotonic()
        for _, _, line in groups or self.groups:
            line.send("go")
        for _, _, line in groups or self.groups:
            line.read()
        return t0

    def wait_round(self, round_, timeout=300.0):
        """Every live node holds `round_`: returns (first, last) times it got there."""
        replies = []
        for first, count, line in self.groups:
            live = sum(1 for i in self.live if first <= i < first + count)
            line.send("wait %d %d %f" % (round_, live, timeout))
        for first, count, line in self.groups:
            r = line.read()
            live = sum(1 for i in self.live if first <= i < first + count)
            if r["errors"]:
                raise RuntimeError("%s: %s" % (self.run_id, r["errors"][:3]))
            if r["done"] != live:
                raise RuntimeError("%s: %d of %d nodes of processes from %d hold round %d "
                                   "(%d reached a later one)" % (self.run_id, r["done"], live,
                                                                 first, round_, r["reached"]))
            replies.append(r)
        return min(r["first"] for r in replies), max(r["last"] for r in replies)

    def wait_stepped(self, round_, timeout=300.0):
        """Every live node took a watch step in `round_` (so it beats, and its round's dead
        timeout is known): a failure is then the steady state's, not one in a node's first
        step, before which it has not beaten (on etcd a large round's first step rests for
        up to a beat period, 20 s at 10,000 nodes)."""
        deadline = time.monotonic() + timeout
        while True:
            stepped = sum(line.ask("stepped %d" % round_)["stepped"]
                          for _, _, line in self.groups)
            if stepped >= len(self.live):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("%s: %d of %d nodes took a step in round %d within %.0f s"
                                   % (self.run_id, stepped, len(self.live), round_, timeout))
            time.sleep(0.2)

    def check_ranks(self, round_):
        ranks = []
        for _, _, line in self.groups:
            ranks += line.ask("ranks %d" % round_)["ranks"]
        n, lws = len(self.live), self.args.local_world_size
        group_ranks = sorted(r[0] for r in ranks)
        if group_ranks != list(range(n)):
            raise RuntimeError("round %d: group ranks are not 0..%d each once" % (round_, n - 1))
        for g, offset, world, gws in ranks:
            if offset != g * lws or world != n * lws or gws != n:
                raise RuntimeError("round %d: node %d has rank offset %d, world %d, %d nodes; "
                                   "expected %d, %d, %d" % (round_, g, offset, world, gws,
                                                            g * lws, n * lws, n))
        return n

    def kill(self, indices):
        """Kills the nodes; returns (when the kill began, the latest of their deadlines).

        A node's deadline is when the survivors may first take it for dead: its last beat
        plus the dead timeout, or, on a store that keeps wills (the embedded one), the end
        of its connection plus the will's grace (the liveness period), whichever is first."""
        deadlines, t0 = [], time.monotonic()
        grace = max(self.args.heartbeat_ms, self.args.dead_ms / 3.0) / 1000.0
        for first, count, line in self.groups:
            mine = [i for i in indices if first <= i < first + count]
            if mine:
                r = line.ask("kill " + " ".join(map(str, mine)))
                # dead_s: the round's dead timeout as its watchers apply it (a quiet round's
                # on etcd is longer than --dead-ms).
                for beat, closed, dead in zip(r["last_beat"], r["closed"], r["dead_s"]):
                    d = beat + dead
                    if self.store.keeps_wills:
                        d = min(d, closed + grace)
                    deadlines.append(d)
        self.live = [i for i in self.live if i not in indices]
        return t0, max(deadlines)

    def hang(self, indices):
        """The nodes stop beating but keep their connections; returns the latest of their
        deadlines (last beat + their round's dead timeout)."""
        deadlines = []
        for first, count, line in self.groups:
            mine = [i for i in indices if first <= i < first + count]
            if mine:
                r = line.ask("hang " + " ".join(map(str, mine)))
                deadlines += [b + d for b, d in zip(r["last_beat"], r["dead_s"])]
        self.live = [i for i in self.live if i not in indices]
        return max(deadlines)

    def stop(self):
        """Stops every process of the job; one that did not exit cleanly (a crash while
        quitting) is an error, unless one is already being raised."""
        bad = [(line.name, rc) for _, _, line in self.groups for rc in [line.stop()] if rc]
        if bad and sys.exc_info()[0] is None:
            raise RuntimeError("%s: processes exited badly: %s" % (self.run_id, bad))


def per_join(before, after, n):
    """{method: requests per join} between two counts of requests by method."""
    return {m: round((c - before.get(m, 0)) / n, 3) for m, c in sorted(after.items())
            if c > before.get(m, 0)}


def failed_per_join(by_code):
    """Answers per join that were not a success: etcd refused the request ("too many
    requests", ResourceExhausted) or did not apply it in time ("request timed out",
    Unavailable), the gateway gave up (Unknown, DeadlineExceeded). A watch ends Canceled
    when its client closes it: not a failure."""
    return round(sum(v for code, v in by_code.items() if code not in ("OK", "Canceled")), 3)


def static_job(sim, store, n, args, out):
    job = Job(sim, store, n, "%d:%d" % (n, n), args, "static%d" % n)
    try:
        req0 = store.requests(beats=False)
        counts0 = store.grpc_counts() if hasattr(store, "grpc_counts") else None
        agents = [line.proc.pid for _, _, line in job.groups]
        cpu0 = sum(cpu_seconds(p) for p in store.pids)
        acpu0 = sum(cpu_seconds(p) for p in agents)
        if hasattr(store, "start_profiles"):
            store.start_profiles("static%d" % n, args.etcd_profile_s)
        t0 = job.go()
        first, last = job.wait_round(0)
        out["round_s"] = last - t0
        out["first_node_s"] = first - t0  # the first node that held the round (slot 1's)
        out["req_per_join"] = (store.requests(beats=False) - req0) / n
        if counts0 is not None:  # etcd: which requests a join is made of, and what they got
            by_method, by_code = store.grpc_counts()
            out["req_per_join_by_method"] = per_join(counts0[0], by_method, n)
            out["answers_per_join_by_code"] = per_join(counts0[1], by_code, n)
            out["failed_per_join"] = failed_per_join(out["answers_per_join_by_code"])
        out["round_store_cpu_s"] = sum(cpu_seconds(p) for p in store.pids) - cpu0
        out["round_agents_cpu_s"] = sum(cpu_seconds(p) for p in agents) - acpu0
        job.check_ranks(0)
        if hasattr(store, "finish_profiles"):
            store.finish_profiles()
        if args.check:
            return
        print("  round: " + json.dumps(out), flush=True)
        if args.steady_s <= 0:  # the round only (etcd at sizes whose beats it cannot carry)
            return
        time.sleep(2 * args.heartbeat_ms / 1000.0)  # every node is past its first watch step
        cpu0 = sum(cpu_seconds(p) for p in store.pids)
        try:
            req0, w0 = store.requests(), time.monotonic()
            time.sleep(args.steady_s)
            wall = time.monotonic() - w0
            reqs = store.requests() - req0
        except OSError as e:  # etcd too busy to answer its /metrics
            print("  steady state: the store's request count could not be read (%s)" % e,
                  flush=True)
            wall, reqs = time.monotonic() - w0, None
        cpu = sum(cpu_seconds(p) for p in store.pids) - cpu0
        if reqs is not None:
            out["steady_req_per_node_s"] = reqs / wall / n
        out["steady_cpu_pct"] = 100.0 * cpu / wall
        out["store_rss_mb"] = sum(rss_mb(p) for p in store.pids)
        out["store_peak_mb"] = sum(rss_mb(p, "VmHWM") for p in store.pids)
        r = job.wait_round(0)  # every node still holds round 0...
        job.check_ranks(0)
        for _, _, line in job.groups:  # ...and none got a later one (no false deaths)
            if line.ask("wait 1 1 0")["reached"]:
                raise RuntimeError("a round ended during the steady state")
    finally:
        job.stop()


def elastic_job(sim, store, n, args, out):
    lo, hi = max(1, n - 20), n + 10
    job = Job(sim, store, n, "%d:%d" % (lo, hi), args, "elastic%d" % n)
    try:
        t0 = job.go()
        _, last = job.wait_round(0)
        out["elastic_round0_s"] = last - t0
        job.check_ranks(0)
        job.wait_stepped(0)
        killed, deadline = job.kill([n // 2])
        # (The deadline by the wall clock too, to read the logs' times against it.)
        out["loss1_deadline_utc"] = time.strftime(
            "%H:%M:%S", time.gmtime(time.time() - (time.monotonic() - deadline))) + (
            "%.3f" % ((time.time() - (time.monotonic() - deadline)) % 1))[1:]
        first, last = job.wait_round(1)
        out["loss1_s"] = last - deadline
        out["loss1_first_s"] = first - deadline  # the round's end found and carried
        out["loss1_kill_s"] = last - killed
        job.check_ranks(1)
        victims = [n // 3 + 7 * k for k in range(10)] if n >= 100 else []
        if victims:
            job.wait_stepped(1)
            _, deadline = job.kill(victims)
            first, last = job.wait_round(2)
            out["loss10_s"] = last - deadline
            out["loss10_first_s"] = first - deadline
            job.check_ranks(2)
        round_ = 3 if victims else 2
        # A hung node: connected, no more beats; only the beats' staleness tells.
        job.wait_stepped(round_ - 1)
        deadline = job.hang([n // 4])
        first, last = job.wait_round(round_)
        out["hang1_s"] = last - deadline
        out["hang1_first_s"] = first - deadline
        job.check_ranks(round_)
        round_ += 1
        line = job.add(n, 1)
        line.read()
        job.live.append(n)
        t0 = job.go([job.groups[-1]])
        _, last = job.wait_round(round_)
        out["join_s"] = last - t0
        job.check_ranks(round_)
    finally:
        job.stop()


def floor_job(args, store, n, out):
    """etcd only: bench/etcd_join_floor's two-request join of n nodes (a design's cost, not
    cohort's rendezvous; docs/scale.md), PER_PROCESS nodes per process."""
    binary = os.path.join(os.path.dirname(args.sim), "etcd_join_floor")
    prefix = "floor-%s" % os.urandom(4).hex()
    procs = []
    try:
        for first in range(0, n, PER_PROCESS):
            procs.append(subprocess.Popen(
                [binary, "--etcd", ",".join(store.endpoints), "--nodes", str(n),
                 "--first", str(first), "--count", str(min(PER_PROCESS, n - first)),
                 "--prefix", prefix, "--timeout-s", "120"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                preexec_fn=niced(args.nodes_nice)))
        for p in procs:
            ready = json.loads(p.stdout.readline() or "{}")
            if "ready" not in ready:
                raise RuntimeError("etcd_join_floor did not connect: %s" % ready)
        req0, code0 = store.grpc_counts()
        cpu0 = sum(cpu_seconds(p) for p in store.pids)
        store.start_profiles("floor%d" % n, args.etcd_profile_s)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline() or "{}") for p in procs]
        errors = [e for r in results for e in r.get("errors", ["no answer"])]
        slots = sorted(s for r in results for s in r.get("slots", []))
        if errors or slots != list(range(1, n + 1)):
            kinds = {}
            for e in errors:
                kind = e.split(": ", 1)[-1][:80]
                kinds[kind] = kinds.get(kind, 0) + 1
            raise RuntimeError("etcd_join_floor: %d slots of %d (1..n once each: %s); "
                               "errors (the first 10 of each process) by kind: %s"
                               % (len(slots), n, slots == list(range(1, n + 1)), kinds))
        by_method, by_code = store.grpc_counts()
        floor = {"round_s": max(r["last"] for r in results) - min(r["go"] for r in results),
                 "req_per_join": (sum(by_method.values()) - sum(req0.values())) / n,
                 "req_per_join_by_method": per_join(req0, by_method, n),
                 "answers_per_join_by_code": per_join(code0, by_code, n),
                 "round_store_cpu_s": sum(cpu_seconds(p) for p in store.pids) - cpu0,
                 "round_agents_cpu_s": sum(r["nodes_cpu_s"] for r in results)}
        store.finish_profiles()
        floor["failed_per_join"] = failed_per_join(floor["answers_per_join_by_code"])
        out.update({"floor_" + k: v for k, v in floor.items()})
        print("  two-request join: " + json.dumps(floor), flush=True)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def make_store(name, sim, args):
    if name == "embedded":
        return EmbeddedStore(sim)
    if name in ("etcd1", "etcd3"):
        if not os.path.exists(ETCD):
            raise RuntimeError("%s missing (apt-get install etcd-server)" % ETCD)
        return EtcdStore(int(name[-1]), args.etcd_flags.split(), args.etcd_profile,
                         args.etcd_cpu, args.etcd_logs)
    raise ValueError("unknown backend %r" % name)


def fit_exponent(points):
    """Least-squares slope of log(t) against log(n)."""
    pts = [(math.log(n), math.log(t)) for n, t in points if t and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def cell(v, fmt="%.2f"):
    return "-" if v is None else fmt % v


def print_table(results, args):
    print()
    print("rendezvous at scale: heartbeat %d ms, dead after %d ms, %d workers per node%s"
          % (args.heartbeat_ms, args.dead_ms, args.local_world_size,
             "; each cell the median of %d runs" % args.repeat if args.repeat > 1 else ""))
    cols = [("backend", "backend", "%s"), ("nodes", "n", "%d"),
            ("etcd cores", "etcd_cpu", "%s"), ("retry budget", "retry_budget", "%s"),
            ("round s", "round_s", "%.3f"),
            ("round s (min-max)", "round_s_range", "%s"),
            ("req/join", "req_per_join", "%.1f"),
            ("failed/join", "failed_per_join", "%.2f"),
            ("store CPU s (round)", "round_store_cpu_s", "%.2f"),
            ("nodes' CPU s (round)", "round_agents_cpu_s", "%.2f"),
            ("steady req/node/s", "steady_req_per_node_s", "%.2f"),
            ("store CPU % (steady)", "steady_cpu_pct", "%.1f"),
            ("store RSS MB", "store_rss_mb", "%.0f"),
            ("elastic round 0 s", "elastic_round0_s", "%.3f"),
            ("1 lost: first node in next round, after deadline s", "loss1_first_s", "%.3f"),
            ("1 lost: closed after deadline s", "loss1_s", "%.3f"),
            ("1 lost: kill to next round s", "loss1_kill_s", "%.3f"),
            ("10 lost: first, after deadline s", "loss10_first_s", "%.3f"),
            ("10 lost: closed after deadline s", "loss10_s", "%.3f"),
            ("1 hung: first, after deadline s", "hang1_first_s", "%.3f"),
            ("1 hung: closed after deadline s", "hang1_s", "%.3f"),
            ("1 joins: round s", "join_s", "%.3f"),
            ("floor: round s", "floor_round_s", "%.3f"),
            ("floor: req/join", "floor_req_per_join", "%.1f"),
            ("floor: failed/join", "floor_failed_per_join", "%.2f"),
            ("floor: store CPU s", "floor_round_store_cpu_s", "%.2f")]
    # Columns no run measured (the floor on the embedded store, one run each) are left out.
    cols = cols[:2] + [c for c in cols[2:] if any(c[1] in r for r in results)]
    print("| " + " | ".join(c[0] for c in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(cell(r.get(k), f) for _, k, f in cols) + " |")
    for r in results:
        if "error" in r:
            print("%s, %d nodes: stopped early: %s" % (r["backend"], r["n"], r["error"]))
    for backend in dict.fromkeys(r["backend"] for r in results):
        pts = [(r["n"], r.get("round_s")) for r in results if r["backend"] == backend]
        e = fit_exponent(pts)
        if e is not None:
            print("%s: round time grows as N^%.2f (least squares over N = %s)"
                  % (backend, e, ",".join(str(n) for n, _ in pts)))
    sys.stdout.flush()


def on_fresh_store(backend, args, out, run, what=""):
    """run(store) on a store of its own, stopped after; its error goes to out["error"]
    (raised under --check)."""
    store = make_store(backend, args.sim, args)
    try:
        run(store)
    except (RuntimeError, OSError) as e:
        if args.check:
            raise
        # Reported under the table; the run goes on (a job's error after another's joins it).
        error = what + str(e)[:300]
        out["error"] = out["error"] + "; " + error if "error" in out else error
    finally:
        store.stop()


def one_run(backend, n, args):
    """The jobs of --jobs, each kind on fresh stores; their measurements ({"error"} when one
    failed)."""
    out = {"backend": backend, "n": n}
    if backend != "embedded":
        out["etcd_cpu"] = "%g" % args.etcd_cpu if args.etcd_cpu > 0 else "all"
    if args.retry_budget:
        out["retry_budget"] = os.environ.get("COHORT_ETCD_RETRY_BUDGET", "")
    print("%s, %d nodes ..." % (backend, n), flush=True)
    if "floor" in args.jobs and backend != "embedded":
        # On members of its own: cohort's job then starts on an etcd as fresh as the floor's.
        on_fresh_store(backend, args, out, lambda store: floor_job(args, store, n, out),
                       "floor: ")

    def cohort_jobs(store):
        if "static" in args.jobs:
            static_job(args.sim, store, n, args, out)
        if "elastic" in args.jobs:
            elastic_job(args.sim, store, n, args, out)
    on_fresh_store(backend, args, out, cohort_jobs)
    print("  " + json.dumps(out), flush=True)
    return out


def median_of(runs):
    """One row from repeated runs: each number the median of the runs that measured it, the
    round's range ("min-max"), and the first error."""
    out = {"backend": runs[0]["backend"], "n": runs[0]["n"], "runs": len(runs)}
    for key in ("etcd_cpu", "retry_budget"):
        if key in runs[0]:
            out[key] = runs[0][key]
    for key in dict.fromkeys(k for r in runs for k in r):
        values = sorted(r[key] for r in runs if isinstance(r.get(key), (int, float)))
        if values and key not in out:
            mid = len(values) // 2
            out[key] = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    rounds = sorted(r["round_s"] for r in runs if "round_s" in r)
    if rounds:
        out["round_s_range"] = "%.2f-%.2f" % (rounds[0], rounds[-1])
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        out["error"] = "%d of %d runs: %s" % (len(errors), len(runs), errors[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1000,2000,5000,10000", help="node counts (embedded)")
    ap.add_argument("--etcd-nodes", default="1000,2000",
                    help="node counts for etcd (the elastic job's losses at 5,000 and 10,000 "
                         "take minutes there: quiet rounds' dead timeouts are 40 s and 80 s; "
                         "the round alone: --jobs floor,static --steady-s 0)")
    ap.add_argument("--backends", default="embedded,etcd1,etcd3")
    ap.add_argument("--etcd-flags", default="",
                    help="more flags for every etcd member, e.g. raft timing: "
                         "'--heartbeat-interval 500 --election-timeout 5000'")
    ap.add_argument("--etcd-profile", metavar="DIR", default="",
                    help="save each etcd member's CPU profile during the static round in DIR "
                         "(summarise: python3 bench/etcd_profile.py DIR/*.pb.gz)")
    ap.add_argument("--nodes-nice", type=int, default=0,
                    help="niceness of the simulated nodes' processes (the store's stays 0)")
    ap.add_argument("--etcd-logs", metavar="DIR", default="",
                    help="keep each etcd member's log in DIR when it stops")
    ap.add_argument("--etcd-profile-s", type=int, default=10,
                    help="length of those profiles, from the round's start")
    ap.add_argument("--etcd-cpu", type=float, default=0.0,
                    help="limit the etcd members together to this share of one core (cgroup "
                         "v1, root): etcd slowed on purpose; 0: no limit")
    ap.add_argument("--retry-budget", default="",
                    help="COHORT_ETCD_RETRY_BUDGET values to run each configuration with, "
                         "e.g. 0.2,0 (0: none); default: the nodes' environment")
    ap.add_argument("--sim", default=str(REPO / "build/dev/bench/rdzv_sim"))
    ap.add_argument("--local-world-size", type=int, default=8)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--dead-ms", type=int, default=10000)
    ap.add_argument("--last-call-ms", type=int, default=1000,
                    help="the elastic job's last call (rendezvous default 1 s): how long slot 1 "
                         "waits for more nodes once MIN joined")
    ap.add_argument("--quiet-start-nodes", type=int,
                    help="rounds of at least this many nodes start quiet on etcd (no watch "
                         "before a node's first beat; default: the rendezvous default, 500)")
    ap.add_argument("--carry-start-nodes", type=int,
                    help="rounds of at least this many nodes that lose one are carried: the "
                         "survivors form the next round without joining it (default: the "
                         "rendezvous default, 500; 0: never)")
    ap.add_argument("--quiet-watch-max-nodes", type=int,
                    help="quiet rounds of at most this many nodes rest on a watch of their end "
                         "held for the round (one per node); larger ones learn it at their "
                         "next beat (default: the rendezvous default, 5000; 0: never)")
    ap.add_argument("--tell-start-nodes", type=int,
                    help="quiet rounds of at least this many nodes are told their end by "
                         "datagram from the node that ends them (default: the rendezvous "
                         "default, 500; 0: never, and the nodes open no datagram socket)")
    ap.add_argument("--steady-s", type=float, default=10.0,
                    help="steady-state window; 0: measure the round only")
    ap.add_argument("--jobs", default="static,elastic",
                    help="static, elastic, and for etcd floor: the two-request join's cost "
                         "(bench/etcd_join_floor; a design, not cohort's rendezvous)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per backend and size, each on a fresh store; the table gives "
                         "each measurement's median and the round's range")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--check", action="store_true",
                    help="correctness only (CI): rank checks, no steady-state window")
    args = ap.parse_args()
    if args.repeat < 1:
        sys.exit("rdzv_scale: --repeat must be at least 1")
    if not os.path.exists(args.sim):
        sys.exit("rdzv_scale: %s not built (ninja -C build/dev)" % args.sim)
    if args.etcd_cpu > 0 and (os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/cpu")):
        print("rdzv_scale: skipped: --etcd-cpu needs root and the cgroup v1 cpu controller "
              "(/sys/fs/cgroup/cpu)", flush=True)
        sys.exit(77)
    results = []
    budgets = args.retry_budget.split(",") if args.retry_budget else [None]
    for backend in args.backends.split(","):
        sizes = args.nodes if backend == "embedded" else args.etcd_nodes
        for n in map(int, sizes.split(",")):
            for budget in budgets:
                if budget is not None:
                    os.environ["COHORT_ETCD_RETRY_BUDGET"] = budget  # the nodes inherit it
                runs = [one_run(backend, n, args) for _ in range(args.repeat)]
                out = runs[0] if len(runs) == 1 else median_of(runs)
                if len(runs) > 1:
                    print("  median of %d runs: %s" % (len(runs), json.dumps(out)), flush=True)
                results.append(out)
    print_table(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
