"""The torch.distributed backend "cohort" with real PyTorch (Debian's 1.13).

Every collective x dtype x op against the hand-computed result and gloo; DDP on the real
Fashion-MNIST with the loss trajectory of gloo; new_group; a peer killed mid-collective; the
same checks under torchrun. Each run asserts the world size every rank saw.
"""
import os
import json
import re
from pathlib import Path

import pytest

import e2e_util as U

HERE = Path(__file__).resolve().parent
WORKER = HERE / "collectives_worker.py"
DDP = HERE / "ddp_fashion.py"
PEER_DEATH = HERE / "peer_death.py"
COMM_LOOP = HERE / "comm_loop.py"
EXIT_WHILE_HELD = HERE / "exit_while_held.py"


def rank_results(text, world):
    got = {int(m.group(1)): (int(m.group(2)), int(m.group(3)))
           for m in re.finditer(r"rank (\d+) checks (\d+) failures (\d+)", text)}
    assert sorted(got) == list(range(world)), text[-3000:]
    return got


def metric(snapshot, name, **labels):
    """The value of `name` with exactly `labels` in a rank<R>.json snapshot (None if absent)."""
    for m in snapshot["metrics"]:
        if m["name"] == name and m.get("labels", {}) == {k: str(v) for k, v in labels.items()}:
            return m.get("value")
    return None


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_under_cohort_run(cohort, need_torch, launcher, tmp_path, world):
    metrics_dir = tmp_path / "metrics"
    p = launcher.run([cohort, "run", "--nproc-per-node", world, "--log-dir", tmp_path / "logs",
                      WORKER, launcher.marker], timeout=600,
                     env=U.clean_env(COHORT_METRICS_DIR=str(metrics_dir)))
    assert p.p.returncode == 0, p.describe()
    out = p.stdout
    # Every rank exported what its collectives did, as cohort-train's do (the agent serves
    # these files on /metrics and the dashboards).
    for r in range(world):
        snap = json.loads((metrics_dir / ("rank%d.json" % r)).read_text())
        assert snap["rank"] == r
        ops = metric(snap, "cohort_comm_operations_total", op="allreduce")
        assert ops is not None and ops >= 20, (r, ops)
        assert metric(snap, "cohort_comm_bytes_total", op="allreduce") > 0
        assert metric(snap, "cohort_comm_seconds_total", op="allreduce") > 0
        assert metric(snap, "cohort_comm_operations_total", op="broadcast") >= 1
        wait = metric(snap, "cohort_comm_wait_seconds_total")
        assert wait is not None and wait > 0, (r, wait)
    for r in range(world):
        assert re.search(rf"rank {r} of {world}: backend cohort over shm", out), out[-2000:]
    for r, (checks, failures) in rank_results(out, world).items():
        assert failures == 0, out[-4000:]
        assert checks > 150, (r, checks)
    assert "FAIL" not in out


def test_every_collective_under_torchrun(cohort, pydir, need_torch, launcher, tmp_path):
    env = U.clean_env(PYTHONPATH=pydir)
    p = launcher.run([U.TORCHRUN, *U.TORCHRUN_FIXED, "--nproc_per_node", "2",
                      "--log_dir", tmp_path / "tr", WORKER, launcher.marker],
                     timeout=600, env=env)
    assert p.p.returncode == 0, p.describe()
    text = p.stdout + p.stderr
    # One job of two ranks (torchrun's own TCPStore, not the agent's), over shared memory.
    seen = re.findall(r"rank (\d) of (\d): backend cohort over (\S+)", text)
    assert sorted(seen) == [("0", "2", "shm"), ("1", "2", "shm")], text[-3000:]
    for r, (checks, failures) in rank_results(text, 2).items():
        assert failures == 0, text[-4000:]
        assert checks > 150, (r, checks)


def losses(text):
    return [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", text)]


def digests(text, world):
    d = dict(re.findall(r"rank (\d+) param_digest (\w+)", text))
    assert sorted(int(r) for r in d) == list(range(world)), text[-2000:]
    return set(d.values())


@pytest.mark.parametrize("unused", [False, True], ids=["cnn", "unused-params"])
def test_ddp_fashion_mnist_matches_gloo(cohort, need_torch, launcher, tmp_path, unused):
    """Same script, same data: the loss trajectory under "cohort" is gloo's within float
    tolerance, and each run ends with identical parameters on every rank."""
    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists():
        pytest.skip("dataset-fashion-mnist is not installed")
    runs = {}
    for backend in ("cohort", "gloo"):
        argv = [cohort, "run", "--nproc-per-node", 2, "--log-dir", tmp_path / backend,
                DDP, "--backend", backend, "--steps", 25, launcher.marker]
        if unused:
            argv.append("--unused")
        p = launcher.run(argv, timeout=600, name=backend)
        assert p.p.returncode == 0, p.describe()
        assert len(digests(p.stdout, 2)) == 1, p.stdout[-2000:]
        runs[backend] = losses(p.stdout)
        assert len(runs[backend]) == 25, p.stdout[-2000:]
    for i, (a, b) in enumerate(zip(runs["cohort"], runs["gloo"])):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (i, runs)
    assert runs["cohort"][-1] < runs["cohort"][0], runs["cohort"]  # it learns


@pytest.mark.parametrize("mode,timeout", [("kill", 20), ("hang", 4)])
def test_a_dead_or_stuck_peer_fails_the_survivor(cohort, pydir, need_torch, launcher, mode,
                                                 timeout):
    """No launcher to stop the survivor. kill: rank 1 SIGKILLs itself during an all_reduce
    of 64 MiB; rank 0's all_reduce raises, naming rank 1, well before the 20 s timeout.
    hang: rank 1 never calls it; rank 0's raises after init_process_group's 4 s timeout."""
    port = U.free_port()
    procs = []
    for rank in range(2):
        env = U.clean_env(PYTHONPATH=pydir, RANK=rank, WORLD_SIZE=2, LOCAL_RANK=rank,
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port, PEER_MODE=mode,
                          PEER_DEATH_TIMEOUT=timeout)
        procs.append(launcher.start([U.SYS_PY, PEER_DEATH, launcher.marker], env=env,
                                    name="rank%d" % rank))
    procs[0].wait(120)
    assert procs[0].p.returncode == 0, procs[0].describe()
    m = re.search(r"error after ([0-9.]+) s: (.*)", procs[0].stdout)
    assert m, procs[0].describe()
    elapsed = float(m.group(1))
    if mode == "kill":
        assert elapsed < timeout, m.group(0)
    else:
        assert timeout - 0.5 <= elapsed < timeout + 10, m.group(0)
    assert "rank 0" in m.group(2) and re.search(r"\b(rank|peer) 1\b", m.group(2)), m.group(2)
    assert "then:" in procs[0].stdout, procs[0].stdout
    procs[1].kill()


def test_a_script_that_leaves_while_the_backend_holds_its_tensor_exits_at_once(
        pydir, need_torch, launcher, tmp_path):
    """A script that issued an all_reduce, dropped it and left: the backend's thread held
    the tensor's last reference and waited for the GIL to free it while the interpreter
    exited. Rank 0 ends with status 0 at once (it hung, or aborted with "terminate called
    without an active exception")."""
    flag = tmp_path / "flag"
    flag.write_bytes(b"\0")
    port = U.free_port()
    procs = [launcher.start([U.SYS_PY, EXIT_WHILE_HELD, launcher.marker], name="rank%d" % rank,
                            env=U.clean_env(PYTHONPATH=pydir, RANK=rank, WORLD_SIZE=2,
                                            LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port, FLAG_FILE=flag))
             for rank in range(2)]
    for p in procs:
        p.wait(30)
    assert [p.p.returncode for p in procs] == [0, 0], "\n".join(p.describe() for p in procs)
    assert "rank 0 leaving" in procs[0].stdout and "rank 1 done" in procs[1].stdout
    assert "terminate called" not in procs[0].stderr, procs[0].describe()


def test_a_python_jobs_communication_shows_in_the_job_view(cohort, need_torch, launcher,
                                                           tmp_path):
    """A PyTorch DDP job on the cohort backend under `cohort run --metrics-port 0`: the job
    view (/api/job) shows each rank's collectives and communication wait, as for
    cohort-train."""
    import urllib.request
    stop = tmp_path / "stop"
    p = launcher.start([cohort, "run", "--nproc-per-node", "2", "--metrics-port", "0",
                        "--log-dir", tmp_path / "logs", COMM_LOOP, launcher.marker],
                       env=U.clean_env(STOP_FILE=str(stop)))
    try:
        url = U.wait_for(lambda: (re.search(r"dashboard on (http://\S+/)", p.stderr)
                                  or [None, None])[1], 60, what="the dashboard URL")

        def communicating():
            with urllib.request.urlopen(url + "api/job", timeout=10) as r:
                job = json.loads(r.read().decode())
            ranks = [r for n in job["nodes"] for r in n["ranks"]]
            ok = len(ranks) == 2 and all((r["comm_operations"] or 0) >= 20 and
                                         (r["comm_bytes"] or 0) > 0 and
                                         r["comm_wait"] is not None for r in ranks)
            return ranks if ok else None
        ranks = U.wait_for(communicating, 120, interval=0.3, what="both ranks' collectives")
        assert sorted(r["rank"] for r in ranks) == [0, 1], ranks
        assert all(0 <= r["comm_wait"] <= 1 for r in ranks), ranks
    finally:
        stop.write_text("")
    assert p.wait(120) == 0, p.describe()
    assert len(re.findall(r"rank \d steps \d+", p.stdout)) == 2, p.stdout


def test_a_group_destroyed_after_its_last_collective_is_not_an_abort(cohort, pydir, need_torch,
                                                                     launcher, tmp_path):
    """The usual end of a script (an all_reduce, then destroy_process_group) is not a
    failure: no rank dumps its flight recorder as aborted (it did, when the group went away
    while its executor was still marking the finished operation done)."""
    script = tmp_path / "allreduce_then_destroy.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist\n"
        "import cohort_torch\n"
        "dist.init_process_group('cohort')\n"
        "for _ in range(3):\n"
        "    t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "    dist.all_reduce(t)\n"
        "print('rank %d sum %g' % (dist.get_rank(), t.item()), flush=True)\n"
        "dist.destroy_process_group()\n")
    for attempt in range(3):
        p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--log-dir",
                          tmp_path / ("logs%d" % attempt), script, launcher.marker],
                         timeout=300, env=U.clean_env())
        assert p.p.returncode == 0, p.describe()
        text = p.stdout + p.stderr
        assert sorted(re.findall(r"rank (\d) sum 3", text)) == ["0", "1"], text[-2000:]
        assert "flight recorder dump: abort" not in text, text[-3000:]
