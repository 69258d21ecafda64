"""pytest fixtures shared by tests/e2e and tests/torch (each conftest imports them).

  cohort      the cohort binary, absolute (COHORT_BIN, default
              <repo>/build/dev/cohort/cli/cohort); skips when it does not exist
  need_torch  skips unless /usr/bin/python3 imports torch and torchrun exists
  marker      a unique string a test puts on its command lines to find leftovers
  launcher    starts a test's processes; all of them (and their workers) are gone after
  postgres_server  a real PostgreSQL on 127.0.0.1 (free port, its URL), run as the
              postgres user and stopped by PID; skips without root or PostgreSQL
"""
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

import e2e_util as U


@pytest.fixture
def cohort():
    b = U.cohort_bin()
    if not b.exists():
        pytest.skip("cohort binary not built: %s (set COHORT_BIN)" % b)
    return str(b.resolve())


@pytest.fixture
def need_torch():
    if not U.torch_available():
        pytest.skip("/usr/bin/python3 cannot import torch (or no /usr/bin/torchrun)")


@pytest.fixture
def marker():
    return U.new_marker()


@pytest.fixture
def launcher(tmp_path, marker):
    lw = U.Launcher(tmp_path, marker)
    try:
        yield lw
    finally:
        lw.cleanup()


def _postgres_bin(name):
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    return shutil.which(name)


@pytest.fixture
def postgres_server():
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if os.geteuid() != 0 or not initdb or not pg_ctl or not shutil.which("runuser"):
        pytest.skip("needs root, runuser and PostgreSQL (apt-get install postgresql)")
    base = Path(tempfile.mkdtemp(prefix="cohort-pg-"))
    shutil.chown(base, "postgres", "postgres")
    data = base / "data"
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(as_pg + [initdb, "-D", str(data), "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True, timeout=120)
    port = U.free_port()
    server = subprocess.Popen(
        as_pg + [_postgres_bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(base),
                 "-c", "listen_addresses=127.0.0.1"],
        stdout=open(base / "server.log", "wb"), stderr=subprocess.STDOUT)
    url = "postgresql://postgres@127.0.0.1:%d/postgres" % port

    def ready():
        return subprocess.run(["psql", url, "-c", "select 1"], capture_output=True).returncode == 0
    try:
        U.wait_for(ready, 60, interval=0.1, what="PostgreSQL accepting connections")
        yield url
    finally:
        # Fast shutdown: SIGINT to the postmaster itself (its pid is in postmaster.pid);
        # runuser, its parent, ignores SIGINT and exits when the server does.
        try:
            os.kill(int((data / "postmaster.pid").read_text().split()[0]), signal.SIGINT)
        except (OSError, ValueError, IndexError):
            server.terminate()  # never got as far as writing its pid: runuser passes it on
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(base, ignore_errors=True)
