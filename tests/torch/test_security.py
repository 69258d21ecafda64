"""Another user of the machine cannot steer a PyTorch job: reproductions of the hardening
review, each run as a real second, unprivileged user (nobody) against a real `cohort run`.

- The workers' torch store (MASTER_PORT): torch's own TCPStore client, run as nobody, is
  refused before it can read a key, add to the barrier or set one; the job then runs its
  all_reduce to the right sum and leaves no shared-memory segment behind.
- The live-reconfiguration channel: a private directory (mkdtemp, 0700) nobody cannot
  list or write, whose name carries neither the run id nor the agent's pid; a notice
  written there by a process without the agent's secret is refused, never acted on.
"""
import glob
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import e2e_util as U

PROBE = Path(__file__).resolve().parent / "security_probe.py"
NOBODY = 65534


@pytest.fixture
def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the attacker as another user (nobody)")


def as_nobody(code, timeout=60):
    """Runs python `code` as uid/gid 65534; its stdout."""
    def drop():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    r = subprocess.run([U.SYS_PY, "-c", code], preexec_fn=drop, cwd="/", capture_output=True,
                       text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin", "HOME": "/"})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def segments():
    return set(glob.glob("/dev/shm/cohort-*"))


def test_another_user_cannot_use_the_torch_store(cohort, need_torch, need_root, launcher,
                                                 tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    before = segments()
    p = launcher.start([cohort, "run", "--nproc-per-node", 2, "--log-dir", tmp_path / "logs",
                        PROBE, out, "cohort", launcher.marker])
    U.wait_for(lambda: len(re.findall(r"rank \d port \d+", p.stdout)) == 2 or p.poll() is not None,
               180, what="both ranks in their group")
    assert p.poll() is None, p.describe()
    port = int(re.search(r"rank \d port (\d+)", p.stdout).group(1))
    # Every action waits for the server's answer (torch's set does not: it is followed by
    # a get of the same key), so "served" means the store answered.
    attack = """
import datetime
import torch.distributed as dist
said = []
for action in ("get", "add", "set"):
    try:
        s = dist.TCPStore("127.0.0.1", %d, is_master=False,
                          timeout=datetime.timedelta(seconds=5))
        if action == "get":
            s.get("default_pg/0")
        elif action == "add":
            s.add("default_pg/store_based_barrier_key:1", 1)
        else:
            s.set("attack/key", "x")
            s.get("attack/key")
        said.append(action + ":served")
    except Exception:
        said.append(action + ":refused")
print(" ".join(said))
""" % port
    said = as_nobody(attack)
    assert said.split() == ["get:refused", "add:refused", "set:refused"], said
    (out / "go").write_text("1")
    assert p.wait(180) == 0, p.describe()
    assert "attack key absent" in p.stdout, p.describe()
    sums = re.findall(r"rank (\d) sum (\d+) world (\d)", p.stdout)
    assert sorted(sums) == [("0", "3", "2"), ("1", "3", "2")], p.describe()
    assert "refused a connection from 127.0.0.1: a process of this host run by uid 65534" in \
        p.stderr, p.describe()
    assert segments() - before == set(), "shared-memory segments left behind"


def test_another_user_cannot_steer_the_live_channel(cohort, need_torch, need_root, launcher,
                                                    tmp_path, marker):
    out = tmp_path / "out"
    out.mkdir()
    port = U.free_port()
    env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex())
    p = launcher.start([cohort, "run", "--nnodes", "1:2", "--nproc-per-node", 2,
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:%d" % port,
                        "--rdzv-id", marker, "--rdzv-conf", "last_call_timeout=0.2",
                        "--log-dir", tmp_path / "logs", PROBE, out, "cohort", "--live",
                        marker], env=env)
    U.wait_for(lambda: len(re.findall(r"rank \d channel /", p.stdout)) == 2 or
               p.poll() is not None, 180, what="both ranks on their live channel")
    assert p.poll() is None, p.describe()
    channel = re.search(r"rank 0 channel (\S+)", p.stdout).group(1)
    st = os.lstat(channel)
    assert st.st_uid == os.geteuid() and (st.st_mode & 0o777) == 0o700, oct(st.st_mode)
    # Nothing in the name can be guessed from `ps`: not the run id, not the agent's pid.
    name = os.path.basename(channel)
    assert marker not in name and str(p.pid) not in name, name
    attack = """
import os
said = []
for what, act in (("list", lambda: os.listdir(%r)),
                  ("write", lambda: open(os.path.join(%r, "notice.0"), "w"))):
    try:
        act()
        said.append(what + ":allowed")
    except PermissionError:
        said.append(what + ":denied")
print(" ".join(said))
""" % (channel, channel)
    assert as_nobody(attack).split() == ["list:denied", "write:denied"]
    # A notice from a process that is not the agent (it lacks the agent's secret): refused.
    forged = {"round": 99, "rank": 0, "world_size": 1, "group_rank": 0, "group_world_size": 1,
              "store_prefix": "x", "restart_count": 0, "master_addr": "127.0.0.1",
              "master_port": 1}
    tmp = os.path.join(channel, "forged.tmp")
    with open(tmp, "w") as f:
        json.dump(forged, f)
    os.replace(tmp, os.path.join(channel, "notice.0"))
    U.wait_for(lambda: "ignoring the membership notice" in p.stderr, 60,
               what="rank 0 to refuse the forged notice")
    assert "channel secret" in p.stderr, p.describe()
    (out / "go").write_text("1")
    assert p.wait(180) == 0, p.describe()
    sums = re.findall(r"rank (\d) sum (\d+) world (\d)", p.stdout)
    assert sorted(sums) == [("0", "3", "2"), ("1", "3", "2")], p.describe()
    assert not os.path.exists(os.path.dirname(channel)), "the channel outlived its agent"
