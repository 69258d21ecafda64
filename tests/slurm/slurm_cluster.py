"""A throwaway Slurm cluster on this machine: one munged, one slurmctld and N slurmd daemons
("fake nodes" n1..nN that all live on this host), everything under one temporary directory.

Ports (slurmctld, one per slurmd) are picked free at start; munged listens on its own socket
in the directory, so a munged or slurmctld already running on the machine is not touched.
Every daemon is started in the foreground as a child of this process, leading its own
process group, remembered by PID and stopped by PID in stop() (SIGTERM, then SIGKILL after a
grace period), also when start() fails half-way. stop() first cancels the jobs still in the
cluster, and afterwards kills job processes that outlived slurmd (slurmstepd detaches from
it); they are found by this cluster's SLURM_CONF in their environment. Nodes are reported
idle before start() returns.

Usage from tests: `with SlurmCluster(nodes=3) as c: subprocess.run(["sbatch", ...],
env=c.env())`. Run by hand: `python3 tests/slurm/slurm_cluster.py [--nodes 3]` prints the
SLURM_CONF to export and keeps the cluster up until Ctrl-C.

Needs root (slurmd runs jobs as the submitting user and the daemons need their privileges)
and the Debian packages slurmctld, slurmd, slurm-client and munge; available() says why
not when something is missing.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel",
           "sinfo", "srun")
START_TIMEOUT = 60.0


def _which(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")


def available():
    """None when a cluster can be started here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root to run slurmd and munged"
    missing = [d for d in DAEMONS if _which(d) is None]
    if missing:
        return "not installed: %s (apt-get install slurmctld slurmd slurm-client munge)" % (
            ", ".join(missing))
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (install the munge package)"
    return None


def free_ports(n):
    """n distinct TCP ports that were free a moment ago (all held open while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("0.0.0.0", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(pred, timeout, what, interval=0.1):
    """Polls pred() until it returns a true value or the deadline passes. `what` names the
    condition in the error: a string, or a function called at the time of the failure (to
    show the state then, such as daemon logs)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.0fs waiting for %s" % (
                timeout, what() if callable(what) else what))
        time.sleep(interval)


def _meminfo_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def _group_pids(pgid):
    """Live processes in process group pgid (from /proc/<pid>/stat)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def _pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _kill_pids(pids, grace):
    """SIGTERM, then SIGKILL after grace, each of pids; waits until they are gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            wait_for(lambda: not any(_pid_alive(p) for p in pids), grace, "pids %s to end" % pids)
            return
        except TimeoutError:
            continue


def _stop_group(p, grace):
    """Stops the Popen p and everything in its process group (it leads one)."""
    members = _group_pids(p.pid)
    if p.poll() is None or members:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        left = _group_pids(p.pid)
        if left:
            _kill_pids(left, grace)
    if p.poll() is None:
        p.kill()
        p.wait(timeout=grace)


class SlurmCluster:
    """munged + slurmctld + `nodes` slurmd daemons; see the module comment."""

    def __init__(self, nodes=3, cpus=2, partition="debug", root=None):
        self.nodes = ["n%d" % (i + 1) for i in range(nodes)]
        self.cpus = cpus
        self.partition = partition
        # Leave room on the machine; the fake nodes all report this host's memory.
        self.memory_mib = max(256, min(4096, _meminfo_mib() // 2))
        self._own_root = root is None
        # Not under pytest's tmp_path: the munge user must be able to reach its directory,
        # and pytest's base directory is private to root.
        self.root = Path(root or tempfile.mkdtemp(prefix="cohort-slurm-"))
        os.chmod(self.root, 0o755)
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs = {}  # name -> Popen
        self.started = False

    # -- environment -------------------------------------------------------------------
    def env(self, base=None):
        """An environment whose Slurm commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        for k in list(env):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_", "SINFO_")):
                del env[k]
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/usr/bin"
        return env

    def log(self, name):
        """Text of a daemon's log file ("slurmctld", "slurmd-n1", "munged")."""
        p = self.root / "log" / (name + ".log")
        return p.read_text(errors="replace") if p.exists() else ""

    def describe(self):
        """Tails of every daemon log, for assertion messages."""
        parts = []
        for name in ["munged", "slurmctld"] + ["slurmd-" + n for n in self.nodes]:
            parts.append("--- %s.log (tail)\n%s" % (name, self.log(name)[-2000:]))
        return "\n".join(parts)

    # -- start/stop ----------------------------------------------------------------------
    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started = True
        return self

    def _start(self):
        munge = pwd.getpwnam("munge")
        for d in ("state", "log", "spool", "tmp"):
            (self.root / d).mkdir(exist_ok=True)
        for n in self.nodes:
            (self.root / "spool" / n).mkdir(exist_ok=True)
            (self.root / "tmp" / n).mkdir(exist_ok=True)
        mdir = self.root / "munge"
        mdir.mkdir(exist_ok=True)
        os.chmod(mdir, 0o755)  # munged wants its socket directory reachable by all
        key = mdir / "munge.key"
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o600)
        for p in (mdir, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        munge_log = self.root / "log" / "munged.log"
        munge_log.touch()
        os.chown(munge_log, munge.pw_uid, munge.pw_gid)

        ports = free_ports(1 + len(self.nodes))
        self.ctld_port, self.node_ports = ports[0], ports[1:]
        self.conf.write_text(self._slurm_conf())

        self._spawn("munged", [_which("munged"), "-F",
                               "--socket=%s" % self.munge_socket,
                               "--key-file=%s" % key,
                               "--pid-file=%s" % (mdir / "munged.pid"),
                               "--seed-file=%s" % (mdir / "munged.seed"),
                               "--log-file=%s" % munge_log], user=munge)
        wait_for(lambda: self._alive("munged") and self.munge_socket.exists(), START_TIMEOUT,
                 lambda: "munged's socket %s\n%s" % (self.munge_socket, self.log("munged")))
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i"])
        wait_for(lambda: self._alive("slurmctld") and self._scontrol_ping(), START_TIMEOUT,
                 lambda: "slurmctld to answer\n" + self.describe())
        for n in self.nodes:
            self._spawn("slurmd-" + n, [_which("slurmd"), "-D", "-N", n])
        wait_for(self._all_idle, START_TIMEOUT,
                 lambda: "every node to be idle\n" + self.describe())

    def _slurm_conf(self):
        r = self.root
        host = socket.gethostname().split(".")[0]
        lines = [
            "# Generated by tests/slurm/slurm_cluster.py for one test run.",
            "ClusterName=cohorttest",
            "SlurmctldHost=%s(127.0.0.1)" % host,
            "SlurmctldPort=%d" % self.ctld_port,
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "StateSaveLocation=%s/state" % r,
            "SlurmdSpoolDir=%s/spool/%%n" % r,
            "TmpFS=%s/tmp/%%n" % r,
            "SlurmctldPidFile=%s/slurmctld.pid" % r,
            "SlurmdPidFile=%s/slurmd-%%n.pid" % r,
            "SlurmctldLogFile=%s/log/slurmctld.log" % r,
            "SlurmdLogFile=%s/log/slurmd-%%n.log" % r,
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            # Finished jobs stay visible to `scontrol show job` for the whole test run.
            "MinJobAge=86400",
            "KillWait=5",
            "InactiveLimit=0",
            "SlurmdTimeout=300",
            "SlurmctldTimeout=300",
        ]
        for n, port in zip(self.nodes, self.node_ports):
            lines.append("NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=%d "
                         "RealMemory=%d State=UNKNOWN" % (n, host, port, self.cpus,
                                                         self.memory_mib))
        lines.append("PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP" % (
            self.partition, ",".join(self.nodes)))
        return "\n".join(lines) + "\n"

    def _spawn(self, name, argv, user=None):
        """Starts a daemon in the foreground, leading its own process group; `user` (a pwd
        entry) runs it as that user."""
        out = open(self.root / "log" / (name + ".console"), "wb")
        ids = {} if user is None else dict(user=user.pw_uid, group=user.pw_gid,
                                           extra_groups=[])
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env(),
                                                start_new_session=True, **ids)
        finally:
            out.close()

    def _alive(self, name):
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            console = self.root / "log" / (name + ".console")
            raise RuntimeError("%s exited (%s)\n%s\n%s" % (
                name, None if p is None else p.returncode,
                console.read_text(errors="replace") if console.exists() else "",
                self.describe()))
        return True

    def run(self, *argv, timeout=30, check=False):
        """Runs a Slurm client command against this cluster; returns CompletedProcess."""
        return subprocess.run(list(argv), env=self.env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout,
                              check=check)

    def _scontrol_ping(self):
        r = self.run("scontrol", "ping")
        return r.returncode == 0 and "UP" in r.stdout

    def _all_idle(self):
        for n in self.nodes:
            self._alive("slurmd-" + n)
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        if r.returncode != 0:
            return False
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def stop(self, grace=10.0):
        """Cancels what still runs, then stops every daemon this cluster started by PID
        (slurmd first, munged last), and kills job processes that outlived them."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            self._cancel_all_jobs(timeout=30)
        order = ["slurmd-" + n for n in self.nodes] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p is None:
                continue
            _stop_group(p, grace)
        self.procs.clear()
        # slurmstepd and the job's processes leave slurmd's process group; they carry this
        # cluster's SLURM_CONF in their environment.
        _kill_pids(self._pids_with_env("SLURM_CONF=%s" % self.conf), grace)
        if self._own_root and not os.environ.get("COHORT_KEEP_SLURM_DIR"):
            shutil.rmtree(self.root, ignore_errors=True)

    def _cancel_all_jobs(self, timeout):
        try:
            r = self.run("squeue", "-h", "-o", "%A")
            ids = sorted(set(r.stdout.split())) if r.returncode == 0 else []
            if not ids:
                return
            self.run("scancel", *ids)
            wait_for(lambda: not self.run("squeue", "-h", "-o", "%A").stdout.strip(), timeout,
                     "the cancelled jobs to end")
        except (OSError, subprocess.SubprocessError, TimeoutError):
            pass  # the sweep below still kills what is left

    def _pids_with_env(self, entry):
        import e2e_util  # tests/e2e is on sys.path (conftest)
        return e2e_util.pids_with_env(entry)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    why = available()
    if why:
        sys.exit("cannot start a Slurm cluster: " + why)
    c = SlurmCluster(nodes=args.nodes, cpus=args.cpus)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with c:
        print("export SLURM_CONF=%s" % c.conf, flush=True)
        try:
            while not stop:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
