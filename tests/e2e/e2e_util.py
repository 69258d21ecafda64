"""Helpers shared by the end-to-end tests (tests/e2e/test_run.py) and bench/launch_bench.py.

Processes are started in their own session with stdout/stderr going to files (no pipe
can fill up), every wait is bounded, and leftovers are found by a unique marker string
that the test puts on the worker command line.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parent.parent
SYS_PY = "/usr/bin/python3"
TORCHRUN = "/usr/bin/torchrun"
# Debian's torchrun crashes unless given these.
TORCHRUN_FIXED = ["--redirects", "2", "--tee", "2"]

DDP_TRAIN = E2E_DIR / "ddp_train.py"
RECORD_FAIL = E2E_DIR / "record_fail.py"
ENV_DUMP = E2E_DIR / "env_dump.py"
BLOCK_WORKER = E2E_DIR / "block_worker.py"
ECHO_RANKS = E2E_DIR / "echo_ranks.py"


def cohort_bin():
    return Path(os.environ.get("COHORT_BIN", REPO / "build/dev/cohort/cli/cohort"))


_torch_ok = None


def torch_available():
    global _torch_ok
    if _torch_ok is None:
        try:
            r = subprocess.run([SYS_PY, "-c", "import torch.distributed"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=120)
            _torch_ok = r.returncode == 0 and os.path.exists(TORCHRUN)
        except (OSError, subprocess.TimeoutExpired):
            _torch_ok = False
    return _torch_ok


def new_marker():
    return "cohortE2E" + uuid.uuid4().hex[:12]


def clean_env(**extra):
    """The test's environment: no launcher variables inherited, COHORT_PYTHON set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "COHORT_"))
           and k not in ("OMP_NUM_THREADS", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                         "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                         "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE")}
    env["COHORT_PYTHON"] = SYS_PY
    if "COHORT_BIN" in os.environ:
        env["COHORT_BIN"] = os.environ["COHORT_BIN"]
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def free_port():
    """A port that was free a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_listening(port):
    """True when some socket on this machine listens on TCP port (from /proc/net/tcp*)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


def marker_pids(marker):
    """Live (non-zombie) processes whose command line contains marker."""
    needle = marker.encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if needle in cmd:  # zombies have an empty cmdline
            found.append((int(name), cmd.replace(b"\0", b" ").decode(errors="replace")))
    return found


def pids_with_env(entry):
    """Live processes whose environment holds `entry` ("NAME=value"): every descendant of a
    process inherits it, whatever its process group or session."""
    needle = entry.encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read() + b"\0"
        except OSError:
            continue
        if (env.startswith(needle) or b"\0" + needle in env) and \
                pid_state(int(name)) not in (None, "Z"):
            found.append(int(name))
    return found


def pid_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
        return data[data.rindex(")") + 2]
    except (OSError, ValueError):
        return None


def pid_gone(pid):
    """True when pid no longer runs (no such process, or only a zombie left)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return pid_state(pid) in (None, "Z", "X")


def wait_for(pred, timeout, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def kill_marker_procs(marker, timeout=5.0):
    """SIGKILL every process carrying marker; return what was found alive."""
    left = marker_pids(marker)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and marker_pids(marker):
        time.sleep(0.05)
    return left


_RANK_PREFIX = re.compile(r"^\[(?:rank(\d+)|ranks ([0-9,\-]+))\]: ?(.*)$")


def rank_lines(text):
    """{rank: [line, ...]} from console text; a merged line "[ranks 0-2,5]: x" counts for
    each of its ranks."""
    out = {}
    for raw in text.splitlines():
        m = _RANK_PREFIX.match(raw)
        if not m:
            continue
        ranks = []
        if m.group(1) is not None:
            ranks = [int(m.group(1))]
        else:
            for part in m.group(2).split(","):
                lo, _, hi = part.partition("-")
                ranks.extend(range(int(lo), int(hi or lo) + 1))
        for r in ranks:
            out.setdefault(r, []).append(m.group(3))
    return out


def tail(text, n=40):
    lines = text.splitlines()
    return "\n".join(lines[-n:])


class Proc:
    """A launched command with stdout/stderr captured to files."""

    def __init__(self, argv, env, out_dir, name, cwd=None):
        self.argv = [str(a) for a in argv]
        self.name = name
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = out_dir / ("%s.stdout" % name)
        self.stderr_path = out_dir / ("%s.stderr" % name)
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        self.t_start = time.monotonic()
        self.t_end = None
        self.p = subprocess.Popen(self.argv, env=env, cwd=cwd or str(REPO),
                                  stdin=subprocess.DEVNULL, stdout=self._out,
                                  stderr=self._err, start_new_session=True)
        self.pid = self.p.pid

    @property
    def stdout(self):
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    @property
    def elapsed(self):
        end = self.t_end if self.t_end is not None else time.monotonic()
        return end - self.t_start

    def poll(self):
        rc = self.p.poll()
        if rc is not None and self.t_end is None:
            self.t_end = time.monotonic()
        return rc

    def describe(self):
        return ("command: %s\nexit: %s after %.2fs\n--- stdout (tail) ---\n%s\n"
                "--- stderr (tail) ---\n%s" % (" ".join(self.argv), self.p.returncode,
                                               self.elapsed, tail(self.stdout),
                                               tail(self.stderr)))

    def wait(self, timeout):
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not exit within %ss\n%s"
                                 % (self.name, timeout, self.describe()))
        if self.t_end is None:
            self.t_end = time.monotonic()
        self._close()
        return rc

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.p.kill()
            except OSError:
                pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.t_end is None:
            self.t_end = time.monotonic()
        self._close()

    def _close(self):
        for f in (self._out, self._err):
            try:
                f.close()
            except OSError:
                pass


FINAL_RE = re.compile(r"final_loss (\S+)")


def final_loss(text):
    """The float of the last `final_loss <x>` line in text (None when absent)."""
    m = FINAL_RE.findall(text)
    return float(m[-1]) if m else None


def read_json_lines(path):
    """The JSON objects of a JSON-lines file; other lines, and a missing file, give nothing."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


class Launcher:
    """Starts processes for one test and guarantees they (and their workers) are gone."""

    def __init__(self, tmp_path, marker):
        self.tmp_path = tmp_path
        self.marker = marker
        self.procs = []

    def start(self, argv, env=None, name=None, cwd=None):
        name = name or "proc%d" % len(self.procs)
        p = Proc(argv, env if env is not None else clean_env(), self.tmp_path / "io", name,
                 cwd=cwd)
        self.procs.append(p)
        return p

    def run(self, argv, timeout, env=None, name=None, cwd=None):
        p = self.start(argv, env=env, name=name, cwd=cwd)
        p.wait(timeout)
        return p

    def cleanup(self):
        for p in self.procs:
            p.kill()
        return kill_marker_procs(self.marker)
