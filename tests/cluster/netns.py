"""Several hosts on one machine for cluster tests: network namespaces joined by a bridge.

Cluster(n) makes a bridge namespace and n host namespaces, each with one veth cable to the
bridge and an address 10.231.<net>.<i> that exists only inside these namespaces. Hosts can
be cut off (the cable's bridge end goes down, like a pulled cable) and healed. Everything
is removed by close(), which also SIGKILLs the process groups this cluster started.
Needs root and iproute2.
"""
import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path


def ip(*args):
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=30)


def available():
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    try:
        subprocess.run(["ip", "netns", "list"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "iproute2 'ip netns' unavailable"
    return None


class Proc:
    """A process started inside a host namespace, output to files."""

    def __init__(self, argv, ns, env, log_dir, name):
        self.name = name
        self.out_path = Path(log_dir) / (name + ".out")
        self.err_path = Path(log_dir) / (name + ".err")
        self.t_start = time.monotonic()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out,
                                      stderr=err, stdin=subprocess.DEVNULL, env=env,
                                      start_new_session=True)
        self.t_end = None

    @property
    def stdout(self):
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self):
        return self.err_path.read_text(errors="replace")

    def poll(self):
        rc = self.p.poll()
        if rc is not None and self.t_end is None:
            self.t_end = time.monotonic()
        return rc

    def wait(self, timeout):
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s still running after %ss\n%s" % (self.name, timeout,
                                                                    self.describe()))
        self.poll()
        return rc

    def kill(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def worker_pids(self, program="cohort-train"):
        """PIDs of the agent's direct children running `program` (its workers)."""
        pids = []
        try:
            children = Path("/proc/%d/task/%d/children" % (self.p.pid, self.p.pid)).read_text()
        except OSError:
            return pids
        for pid in children.split():
            try:
                argv = Path("/proc/%s/cmdline" % pid).read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].decode(errors="replace").endswith(program):
                pids.append(int(pid))
        return sorted(pids)

    def describe(self):
        return "--- %s rc=%s\nstdout (tail):\n%s\nstderr (tail):\n%s" % (
            self.name, self.p.poll(), self.stdout[-3000:], self.stderr[-3000:])


class Cluster:
    def __init__(self, hosts, log_dir):
        self.tag = "ck" + uuid.uuid4().hex[:5]
        self.net = random.randint(1, 250)
        self.hosts = ["%sh%d" % (self.tag, i) for i in range(hosts)]
        self.bridge = self.tag + "br"
        self.log_dir = Path(log_dir)
        self.procs = []
        ip("netns", "add", self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")
        ip("-n", self.bridge, "link", "set", "lo", "up")
        for i, h in enumerate(self.hosts):
            ip("netns", "add", h)
            host_end, bridge_end = "%sv%d" % (self.tag, i), "%sp%d" % (self.tag, i)
            ip("link", "add", host_end, "type", "veth", "peer", "name", bridge_end)
            ip("link", "set", host_end, "netns", h)
            ip("link", "set", bridge_end, "netns", self.bridge)
            ip("-n", h, "link", "set", host_end, "name", "eth0")
            ip("-n", h, "addr", "add", self.addr(i) + "/24", "dev", "eth0")
            ip("-n", h, "link", "set", "eth0", "up")
            ip("-n", h, "link", "set", "lo", "up")
            ip("-n", self.bridge, "link", "set", bridge_end, "master", "br0")
            ip("-n", self.bridge, "link", "set", bridge_end, "up")

    def name_hosts(self):
        """Gives host i the name node<i> inside the cluster: /etc/netns/<ns>/hosts (which
        `ip netns exec` mounts over /etc/hosts) lists every node. Run a program under
        `unshare --uts` with `hostname node<i>` to make it see its own name."""
        lines = "127.0.0.1 localhost\n" + "".join(
            "%s node%d\n" % (self.addr(i), i) for i in range(len(self.hosts)))
        for h in self.hosts:
            d = Path("/etc/netns") / h
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text(lines)

    def addr(self, i):
        return "10.231.%d.%d" % (self.net, i + 1)

    def start(self, i, argv, env, name):
        p = Proc(argv, self.hosts[i], env, self.log_dir, name)
        self.procs.append(p)
        return p

    def cut(self, i):
        ip("-n", self.bridge, "link", "set", "%sp%d" % (self.tag, i), "down")

    def heal(self, i):
        ip("-n", self.bridge, "link", "set", "%sp%d" % (self.tag, i), "up")

    def close(self):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            try:
                p.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.hosts + [self.bridge]:
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
            etc = Path("/etc/netns") / ns
            if etc.exists():
                for f in etc.iterdir():
                    f.unlink()
                etc.rmdir()


def wait_for(pred, timeout, what, step=0.05):
    """Bounded wait for a condition on files or processes (no fixed sleeps as sync)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(step)


ETCD = "/usr/bin/etcd"


def start_etcd(c, hosts):
    """One etcd member per host of cluster c (client port 2379, peer 2380 on the host's own
    address: these addresses exist only inside this cluster's namespaces, so nothing can
    collide). Returns the member processes; they are killed with the cluster."""
    initial = ",".join("e%d=http://%s:2380" % (i, c.addr(i)) for i in range(hosts))
    members = []
    for i in range(hosts):
        a = c.addr(i)
        argv = [ETCD, "--name", "e%d" % i, "--data-dir", str(c.log_dir / ("etcd%d" % i)),
                "--listen-client-urls", "http://%s:2379" % a,
                "--advertise-client-urls", "http://%s:2379" % a,
                "--listen-peer-urls", "http://%s:2380" % a,
                "--initial-advertise-peer-urls", "http://%s:2380" % a,
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--heartbeat-interval", "50", "--election-timeout", "500"]
        members.append(c.start(i, argv, dict(os.environ), "etcd%d" % i))
    return members


def etcd_leader(c, hosts):
    """Index of the host whose member is the leader (from /v3/maintenance/status), or
    None while there is none."""
    for i in range(hosts):
        try:
            out = subprocess.run(
                ["ip", "netns", "exec", c.hosts[i], "curl", "-sf", "-m", "2", "-X", "POST",
                 "-d", "{}", "http://%s:2379/v3/maintenance/status" % c.addr(i)],
                capture_output=True, timeout=10).stdout
            st = json.loads(out or b"{}")
        except (ValueError, subprocess.SubprocessError):
            continue
        if st.get("leader") and st.get("leader") == st.get("header", {}).get("member_id"):
            return i
    return None
