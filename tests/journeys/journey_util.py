"""What the journey tests share: where the binaries are, the training command a user types,
services a user would start (etcd, with TLS and auth), and readers of what cohort prints.

The journeys drive cohort only through its command lines and the files it writes: every
assertion reads console output or files, never an internal API.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import e2e_util  # noqa: E402,F401  (re-exported: Proc, free_port, clean_env, wait_for)
import netns  # noqa: E402,F401

BIN = Path(os.environ.get("COHORT_BIN", REPO / "build/dev/cohort/cli/cohort"))
TRAIN = BIN.parent / "cohort-train"
ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"

# The per-rank lines of cohort-train (cohort/train/cohort_train_main.cc):
#   [rank<R>]: rank R of W: transport T, round N
#   [rank<R>]: rank R param_digest D
JOINED_RE = re.compile(r"^\[rank(\d+)\]: rank (\d+) of (\d+): transport (\S+), round (\d+)$",
                       re.M)
DIGEST_RE = re.compile(r"^\[rank(\d+)\]: rank (\d+) param_digest ([0-9a-f]{8})$", re.M)
STEP_RE = re.compile(r"^\[rank0\]: epoch \d+/\d+ step (\d+)/", re.M)


def train_args(ckpt, max_steps, tag=""):
    """cohort-train as the journeys run it: the MLP on synthetic data (fast on 2 cores),
    checkpoints every 10 steps in a directory every node shares."""
    return [str(TRAIN), "--model", "mlp", "--dataset", "synthetic", "--epochs", "100",
            "--batch-size", "16", "--max-steps", str(max_steps), "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "10", "--log-every", "10"] + (["--tag", tag] if tag else [])


def rounds(text):
    """{round: {rank: (world, transport)}} from every `rank R of W` line in text."""
    out = {}
    for m in JOINED_RE.finditer(text):
        prefix_rank, rank, world, transport, rnd = m.groups()
        assert prefix_rank == rank, "console prefix and printed rank differ: %s" % m.group(0)
        out.setdefault(int(rnd), {})[int(rank)] = (int(world), transport)
    return out


def complete_round(text, world, after=-1):
    """The newest round > after in which ranks 0..world-1 each reported world `world`, or
    None. A round where any rank reported another world size fails the test at once."""
    found = None
    for rnd, ranks in sorted(rounds(text).items()):
        if rnd <= after:
            continue
        worlds = {w for w, _ in ranks.values()}
        assert len(worlds) == 1, "round %d: ranks disagree on the world size: %s" % (rnd, ranks)
        if worlds == {world} and sorted(ranks) == list(range(world)):
            found = rnd
    return found


def digests(text):
    """{rank: digest} of the final `rank R param_digest D` lines."""
    return {int(m.group(2)): m.group(3) for m in DIGEST_RE.finditer(text)}


def max_step(text):
    steps = [int(s) for s in STEP_RE.findall(text)]
    return max(steps) if steps else -1


def bench_table(text):
    """(nranks, [(size, wrong_out, wrong_in)]) from `cohort bench` rank 0 output."""
    m = re.search(r"nranks (\d+)", text)
    rows = []
    for line in text.splitlines():
        line = re.sub(r"^\[rank\d+\]: ", "", line)
        parts = line.split()
        if len(parts) == 13 and parts[0].isdigit():
            rows.append((int(parts[0]), int(parts[8]), int(parts[12])))
    return (int(m.group(1)) if m else None), rows


class Etcd:
    """A one-member etcd on loopback (free ports) for single-host journeys, optionally with
    TLS client certificates or a user and password; stopped by PID."""

    def __init__(self, work, tls=False, auth=False):
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.client_port = e2e_util.free_port()
        self.peer_port = e2e_util.free_port()
        scheme = "https" if tls else "http"
        self.tls = self._certificates() if tls else None
        url = "%s://127.0.0.1:%d" % (scheme, self.client_port)
        peer = "http://127.0.0.1:%d" % self.peer_port
        argv = [ETCD, "--name", "j0", "--data-dir", str(self.work / "data"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", "j0=" + peer, "--initial-cluster-state", "new",
                "--logger", "zap", "--log-level", "error"]
        if self.tls:
            argv += ["--cert-file", self.tls["server.crt"], "--key-file", self.tls["server.key"],
                     "--trusted-ca-file", self.tls["ca.crt"], "--client-cert-auth"]
        self.endpoint = "127.0.0.1:%d" % self.client_port
        self.proc = e2e_util.Proc(argv, dict(os.environ), self.work, "etcd")
        e2e_util.wait_for(lambda: self.ctl("endpoint", "health").returncode == 0, 30,
                          what="etcd healthy")
        self.password = None
        if auth:
            self.password = "pw-" + os.urandom(4).hex()
            self.ctl("role", "add", "root")  # exists already on some etcd versions
            for args in (("user", "add", "root:" + self.password),
                         ("user", "grant-role", "root", "root"), ("auth", "enable")):
                password, self.password = self.password, None  # auth is not on yet
                r = self.ctl(*args)
                self.password = password
                assert r.returncode == 0, "etcdctl %s: %s" % (" ".join(args), r.stderr)

    def _certificates(self):
        d = self.work / "tls"
        d.mkdir(exist_ok=True)
        script = (
            "set -e; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=journey-ca "
            "-keyout ca.key -out ca.crt; "
            "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n'"
            " > ext; for n in server client; do "
            "openssl req -newkey rsa:2048 -nodes -subj /CN=$n -keyout $n.key -out $n.csr; "
            "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
            "-extfile ext -out $n.crt; done")
        subprocess.run(["bash", "-c", script], cwd=d, check=True, capture_output=True,
                       timeout=120)
        return {n: str(d / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt",
                                        "client.key")}

    def ctl(self, *args):
        """etcdctl against this member (its TLS files and user): the CompletedProcess."""
        argv = [ETCDCTL, "--endpoints", ("https://" if self.tls else "http://") + self.endpoint,
                "--command-timeout", "5s"]
        if self.tls:
            argv += ["--cacert", self.tls["ca.crt"], "--cert", self.tls["client.crt"],
                     "--key", self.tls["client.key"]]
        if getattr(self, "password", None):
            argv += ["--user", "root:" + self.password]
        return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, ETCDCTL_API="3"))

    def rdzv_conf(self):
        """The --rdzv-conf a user passes for this etcd (TLS files, user)."""
        items = []
        if self.tls:
            items += ["cacert=" + self.tls["ca.crt"], "cert=" + self.tls["client.crt"],
                      "key=" + self.tls["client.key"]]
        if self.password:
            items.append("user=root")
        return ",".join(items)

    def env(self):
        """What the user exports for cohort run (the password stays off the command line)."""
        return {"COHORT_ETCD_PASSWORD": self.password} if self.password else {}

    def stop(self):
        self.proc.kill()


def start_etcd_members(c, hosts):
    """A 3-member etcd across the cluster's hosts (netns.start_etcd), once it has a leader."""
    members = netns.start_etcd(c, hosts)
    netns.wait_for(lambda: (netns.etcd_leader(c, hosts),)
                   if netns.etcd_leader(c, hosts) is not None else None, 30, "an etcd leader")
    return members


class Processes:
    """Starts commands on this host like a user's shell would; kills what is left."""

    def __init__(self, tmp_path):
        self.dir = Path(tmp_path) / "io"
        self.procs = []

    def start(self, argv, env=None, name=None):
        p = e2e_util.Proc([str(a) for a in argv], env or job_env(), self.dir,
                          name or "p%d" % len(self.procs))
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            p.kill()


def workers_of(run_id):
    """{pid: environment} of the live worker processes of the job `run_id`: those whose
    environment has TORCHELASTIC_RUN_ID=run_id and a RANK (what `cohort run` gives each
    worker; its agent has neither). Workers forked by the warm interpreter show its
    environment, not theirs: run with --no-preload to find them."""
    found = {}
    for pid in e2e_util.pids_with_env("TORCHELASTIC_RUN_ID=%s" % run_id):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                raw = f.read()
        except OSError:
            continue
        env = dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)
        if "RANK" in env:
            found[pid] = env
    return found


def wait_until(pred, timeout, what):
    return e2e_util.wait_for(pred, timeout, what=what)


def job_env(**extra):
    """A user's shell: no launcher variables left over from anything else."""
    env = e2e_util.clean_env(**extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def describe(procs):
    out = []
    for p in procs:
        out.append(p.describe())
    return "\n".join(out)


def now():
    return time.monotonic()
