"""End-to-end tests of `cohort run` against its torchrun-compatible contract.

Run:  /usr/bin/python3 -m pytest -v tests/e2e
(COHORT_BIN overrides the binary; COHORT_PYTHON=/usr/bin/python3 is set for workers.)

Rules kept here: every wait is bounded, no fixed ports, no sleeping as synchronisation,
every process is reaped, leftovers are found by a marker on the worker command line and
killed in the fixture's finally.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import e2e_util as U

STEPS = 12
FAULT_STEP = 5
# Generous bounds: a worker importing torch takes ~1-3 s on the 2-core CI machine.
DDP_TIMEOUT = 180
QUICK_TIMEOUT = 60

# The torchrun contract's worker variables, that cohort must set.
CONTRACT_KEYS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
]
COHORT_KEYS = ["COHORT_TOKEN", "COHORT_STORE_ADDR", "COHORT_STORE_PORT"]

PREFIXED = re.compile(r"^\[[A-Za-z_]*\d+\]:")


def summary_lines(text):
    """Lines the launcher wrote itself: those not prefixed `[rankN]:` by worker capture."""
    return [l for l in text.splitlines() if not PREFIXED.match(l)]


def ddp_cmd(ckpt_dir, marker, steps=STEPS):
    return [str(U.DDP_TRAIN), "--steps", str(steps), "--ckpt-dir", str(ckpt_dir), marker]


def assert_no_leftovers(marker):
    """No process with marker in its command line survives the launcher (bounded wait)."""
    deadline = time.monotonic() + 3.0
    left = U.marker_pids(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = U.marker_pids(marker)
    assert not left, "leftover processes after cohort exited: %r" % left


@pytest.fixture(scope="session")
def reference_loss(tmp_path_factory):
    """final_loss of an uninterrupted 2-worker run of ddp_train.py under torchrun."""
    if not U.torch_available():
        pytest.skip("/usr/bin/python3 cannot import torch")
    tmp = tmp_path_factory.mktemp("reference")
    marker = U.new_marker()
    p = U.Proc([U.TORCHRUN, "--nproc_per_node", "2", *U.TORCHRUN_FIXED, "--standalone",
                *ddp_cmd(tmp / "ckpt", marker)], U.clean_env(), tmp, "torchrun_ref")
    try:
        rc = p.wait(DDP_TIMEOUT)
        assert rc == 0, p.describe()
        loss = U.final_loss(p.stdout)
        assert loss is not None, p.describe()
        return loss
    finally:
        p.kill()
        U.kill_marker_procs(marker)


# ---------------------------------------------------------------------------------------
# Training: same result as torchrun, restarts, failures


@pytest.mark.parametrize("flags", [
    ["--nproc-per-node", "2"],
    ["--nproc_per_node=2", "--standalone"],
    ["--nproc-per-node", "2", "--"],
], ids=["dash", "underscore-standalone", "double-dash"])
def test_ddp_same_final_loss_as_torchrun(cohort, need_torch, launcher, marker, tmp_path,
                                         reference_loss, flags):
    p = launcher.run([cohort, "run", *flags, *ddp_cmd(tmp_path / "ckpt", marker)],
                     DDP_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    loss = U.final_loss(p.stdout)
    assert loss is not None, "no final_loss line on cohort's stdout\n" + p.describe()
    assert abs(loss - reference_loss) <= 1e-6, (loss, reference_loss)
    # rank 0's lines reach the console with the rank prefix
    assert re.search(r"^\[rank0\]:.*final_loss", p.stdout, re.M), p.describe()
    assert_no_leftovers(marker)


def test_restart_after_sigkill_resumes_to_same_loss(cohort, need_torch, launcher, marker,
                                                    tmp_path, reference_loss):
    logs = tmp_path / "logs"
    env = U.clean_env(FAULT_RANK=1, FAULT_STEP=FAULT_STEP)
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--max-restarts", "2",
                      "--log-dir", logs, "--rdzv-id", "restartjob",
                      *ddp_cmd(tmp_path / "ckpt", marker)],
                     DDP_TIMEOUT, env=env, name="cohort")
    assert p.p.returncode == 0, p.describe()
    assert "injecting SIGKILL" in p.stdout, "fault was not injected\n" + p.describe()
    assert "resumed at step" in p.stdout, "attempt 1 did not resume\n" + p.describe()
    loss = U.final_loss(p.stdout)
    assert loss is not None, p.describe()
    assert abs(loss - reference_loss) <= 1e-6, (loss, reference_loss)
    for attempt in (0, 1):
        for rank in (0, 1):
            d = logs / "restartjob" / ("attempt_%d" % attempt) / str(rank)
            for f in ("stdout.log", "stderr.log"):
                assert (d / f).is_file(), "missing %s; log dir holds: %s" % (
                    d / f, sorted(str(x.relative_to(logs)) for x in logs.rglob("*")))
    a1 = (logs / "restartjob" / "attempt_1" / "0" / "stdout.log").read_text()
    assert "final_loss" in a1 and "resumed at step" in a1, a1
    a0 = (logs / "restartjob" / "attempt_0" / "1" / "stdout.log").read_text()
    assert "injecting SIGKILL" in a0, a0
    assert_no_leftovers(marker)


def test_restart_budget_spent_reports_killed_rank(cohort, need_torch, launcher, marker,
                                                  tmp_path):
    env = U.clean_env(FAULT_RANK=1, FAULT_STEP=2)
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--max-restarts", "0",
                      *ddp_cmd(tmp_path / "ckpt", marker)], DDP_TIMEOUT, env=env,
                     name="cohort")
    assert p.p.returncode == 1, p.describe()
    own = "\n".join(summary_lines(p.stderr))
    assert re.search(r"\brank 1\b", own), "summary does not name rank 1\n" + p.describe()
    assert re.search(r"SIGKILL|signal 9|\b-9\b|KILLED", own, re.I), (
        "summary does not name the signal\n" + p.describe())
    assert_no_leftovers(marker)


def test_record_error_file_in_summary(cohort, need_torch, launcher, marker):
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", U.RECORD_FAIL, marker],
                     DDP_TIMEOUT, name="cohort")
    assert p.p.returncode == 1, p.describe()
    own = "\n".join(summary_lines(p.stderr))
    # Not the worker's own traceback (that arrives prefixed [rank1]:) but cohort's summary;
    # "rank 1" must be named outside the quoted exception message.
    assert re.search(r"\brank 1\b", own.replace("boom from rank 1", "")), (
        "summary does not name rank 1\n" + p.describe())
    assert "boom from rank 1" in own, (
        "summary lacks the message from the error file\n" + p.describe())
    assert not re.search(r"\brank 0\b.*(fail|exit code)", own, re.I), p.describe()
    assert_no_leftovers(marker)


def test_worker_exit_code_in_summary(cohort, launcher, marker):
    script = 'if [ "$RANK" = 1 ]; then exit 3; fi'
    # `--` keeps this test independent of boolean-flag parsing (tested on its own below).
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--no-python", "--",
                      "/bin/sh", "-c", script, marker], QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 1, p.describe()
    own = "\n".join(summary_lines(p.stderr))
    assert re.search(r"\brank 1\b", own), p.describe()
    assert re.search(r"\b3\b", own), "summary lacks exit code 3\n" + p.describe()
    assert_no_leftovers(marker)


def test_two_jobs_at_once(cohort, need_torch, launcher, marker, tmp_path):
    a = launcher.start([cohort, "run", "--nproc-per-node", "2",
                        *ddp_cmd(tmp_path / "ckpt_a", marker, steps=8)], name="job_a")
    b = launcher.start([cohort, "run", "--nproc-per-node", "2",
                        *ddp_cmd(tmp_path / "ckpt_b", marker, steps=8)], name="job_b")
    ra = a.wait(DDP_TIMEOUT)
    rb = b.wait(DDP_TIMEOUT)
    assert ra == 0, a.describe()
    assert rb == 0, b.describe()
    la, lb = U.final_loss(a.stdout), U.final_loss(b.stdout)
    assert la is not None and lb is not None and abs(la - lb) <= 1e-6, (la, lb)
    assert_no_leftovers(marker)


# ---------------------------------------------------------------------------------------
# Signals


def _start_blockers(cohort, launcher, marker, tmp_path, extra=()):
    out = tmp_path / "pids"
    out.mkdir()
    p = launcher.start([cohort, "run", "--nproc-per-node", "2", U.BLOCK_WORKER, out,
                        marker, *extra], name="cohort")

    def ready():
        if p.poll() is not None:
            raise AssertionError("cohort exited before workers started\n" + p.describe())
        files = [out / "pid_0", out / "pid_1"]
        return all(f.exists() for f in files) and files

    files = U.wait_for(ready, 60, what="both pid files")
    return p, [int(f.read_text()) for f in files]


def test_sigint_stops_all_workers(cohort, launcher, marker, tmp_path):
    p, pids = _start_blockers(cohort, launcher, marker, tmp_path)
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    rc = p.wait(15)
    took = time.monotonic() - t0
    assert rc == 130, p.describe()
    assert took < 5, "cohort took %.2fs to exit after SIGINT" % took
    alive = [pid for pid in pids if not U.pid_gone(pid)]
    assert not alive, "workers still running after cohort exited: %r" % alive
    assert_no_leftovers(marker)


def test_sigint_escalates_when_workers_ignore_it(cohort, launcher, marker, tmp_path):
    p, pids = _start_blockers(cohort, launcher, marker, tmp_path,
                              extra=["--ignore-sigint"])
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    rc = p.wait(90)
    took = time.monotonic() - t0
    assert rc == 130, p.describe()
    alive = [pid for pid in pids if not U.pid_gone(pid)]
    assert not alive, "workers still running after cohort exited: %r" % alive
    assert_no_leftovers(marker)
    print("exit after SIGINT with SIGINT-ignoring workers: %.2fs" % took)


def test_sigterm_exit_code(cohort, launcher, marker, tmp_path):
    p, pids = _start_blockers(cohort, launcher, marker, tmp_path)
    os.kill(p.pid, signal.SIGTERM)
    rc = p.wait(60)
    assert rc == 128 + signal.SIGTERM, p.describe()
    alive = [pid for pid in pids if not U.pid_gone(pid)]
    assert not alive, "workers still running after cohort exited: %r" % alive
    assert_no_leftovers(marker)


# ---------------------------------------------------------------------------------------
# Bad input


def _listening_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", 0))
    s.listen(16)
    return s


def _closed_port():
    return U.free_port()


@pytest.mark.parametrize("case", [
    "unknown_flag", "nnodes_min_gt_max", "nproc_zero", "missing_py", "missing_program",
    "unreachable_endpoint", "port_in_use", "master_port_range", "metrics_port_range",
    "stop_grace_nan", "log_merge_negative", "join_timeout_inf", "join_timeout_nan",
    "join_timeout_huge", "keep_alive_zero", "keep_alive_huge", "carry_negative",
    "quiet_watch_negative", "quiet_start_zero", "layout_grace_zero", "monitor_interval_zero",
    "standby_one_node",
])
def test_bad_input(cohort, launcher, marker, tmp_path, case):
    echo = [str(U.ECHO_RANKS), marker]
    held = None
    max_time = 30
    try:
        if case == "unknown_flag":
            args, rc, needle = ["--no-such-flag-zz", "1", *echo], 2, "no-such-flag-zz"
        elif case == "nnodes_min_gt_max":
            args, rc, needle = ["--nnodes", "3:1", *echo], 3, "nnodes"
        elif case == "nproc_zero":
            args, rc, needle = ["--nproc-per-node", "0", *echo], 3, "nproc"
        elif case == "missing_py":
            missing = str(tmp_path / ("missing_%s.py" % marker))
            args, rc, needle = ["--nproc-per-node", "1", missing], 127, missing
        elif case == "missing_program":
            name = "no_such_program_%s" % marker
            args, rc, needle = ["--nproc-per-node", "1", "--no-python", "--", name], 127, name
        elif case == "unreachable_endpoint":
            port = _closed_port()
            join_timeout = 3
            args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", marker,
                    "--rdzv-conf", "join_timeout=%d" % join_timeout, *echo]
            rc, needle = 4, None
            max_time = join_timeout + 5
        elif case == "standby_one_node":  # a warm spare of a job that has one node
            args, rc, needle = ["--standby", "--nproc-per-node", "1", *echo], 3, "--standby"
        elif case == "master_port_range":
            args, rc, needle = ["--master-port", "70000", *echo], 3, "--master-port 70000"
        elif case == "metrics_port_range":
            args, rc, needle = ["--metrics-port", "70000", *echo], 3, "--metrics-port 70000"
        elif case == "stop_grace_nan":
            args, rc, needle = ["--stop-grace", "nan", *echo], 3, "--stop-grace"
        elif case == "log_merge_negative":
            args, rc, needle = ["--log-merge-ms", "-1", *echo], 3, "--log-merge-ms"
        elif case.startswith(("join_timeout", "keep_alive", "carry", "quiet_", "layout_")):
            # Before: inf/nan/1e300 timed out at once (a deadline overflowed into the past),
            # 0 or 1e300 beats were taken (agents spun, or never beat).
            conf = {"join_timeout_inf": "join_timeout=inf", "join_timeout_nan": "join_timeout=nan",
                    "join_timeout_huge": "join_timeout=1e300",
                    "keep_alive_zero": "keep_alive_interval=0",
                    "keep_alive_huge": "keep_alive_interval=1e300",
                    "carry_negative": "carry_start_nodes=-1",
                    "quiet_watch_negative": "quiet_watch_max_nodes=-1",
                    "quiet_start_zero": "quiet_start_nodes=0",
                    "layout_grace_zero": "layout_grace=0"}[case]
            args = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    "127.0.0.1:%d" % _closed_port(), "--rdzv-conf", conf, *echo]
            rc, needle = 3, conf
        elif case == "monitor_interval_zero":
            args, rc, needle = ["--monitor-interval", "0", *echo], 3, "--monitor-interval"
        elif case == "port_in_use":
            held = _listening_socket()
            port = held.getsockname()[1]
            args = ["--nproc-per-node", "1", "--master-port", str(port), *echo]
            rc, needle = 5, str(port)
        # A multi-node job needs the shared secret (cohort refuses to start without it).
        env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex())
        p = launcher.run([cohort, "run", *args], max_time + 30, env=env, name="cohort")
        assert p.p.returncode == rc, "expected exit %d\n%s" % (rc, p.describe())
        assert p.elapsed < max_time, "took %.2fs (limit %ss)\n%s" % (
            p.elapsed, max_time, p.describe())
        err = p.stderr
        assert err.strip(), "no message on stderr\n" + p.describe()
        if needle is not None:
            assert needle.lower() in err.lower(), (
                "stderr does not mention %r\n%s" % (needle, p.describe()))
        if case == "unreachable_endpoint":
            assert re.search(r"rendezvous|rdzv|%d" % port, err, re.I), p.describe()
        # Nothing was launched, or what was launched is gone.
        assert "hello-stdout" not in p.stdout or case in ("unreachable_endpoint",), (
            p.describe())
        assert_no_leftovers(marker)
    finally:
        if held is not None:
            held.close()


# ---------------------------------------------------------------------------------------
# Worker environment


def _read_envs(out, n):
    files = sorted(out.glob("env_*.json"))
    envs = {}
    for f in files:
        d = json.loads(f.read_text())
        envs[int(d["RANK"])] = d
    assert sorted(envs) == list(range(n)), "env files: %s" % [f.name for f in files]
    return envs


def test_worker_environment(cohort, launcher, marker, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--max-restarts", "3",
                      "--rdzv-id", "envjob", U.ENV_DUMP, out, marker], QUICK_TIMEOUT,
                     name="cohort")
    assert p.p.returncode == 0, p.describe()
    envs = _read_envs(out, 2)
    for rank, e in envs.items():
        missing = [k for k in CONTRACT_KEYS + COHORT_KEYS + ["OMP_NUM_THREADS"]
                   if k not in e]
        assert not missing, "rank %d lacks %s" % (rank, missing)
        assert e["RANK"] == str(rank)
        assert e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == "2"
        assert e["LOCAL_WORLD_SIZE"] == "2"
        assert e["GROUP_RANK"] == "0"
        assert e["GROUP_WORLD_SIZE"] == "1"
        assert e["ROLE_RANK"] == str(rank)
        assert e["ROLE_WORLD_SIZE"] == "2"
        assert e["ROLE_NAME"] == "default"
        assert e["OMP_NUM_THREADS"] == "1"
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["TORCHELASTIC_RUN_ID"] == "envjob"
        assert e["TORCHELASTIC_ERROR_FILE"]
        assert e["MASTER_ADDR"]
        assert int(e["MASTER_PORT"]) > 0
        assert e["COHORT_TOKEN"]
        assert int(e["COHORT_STORE_PORT"]) > 0
        assert e["COHORT_STORE_ADDR"]
    for k in ("MASTER_ADDR", "MASTER_PORT", "COHORT_TOKEN", "COHORT_STORE_PORT",
              "TORCHELASTIC_RUN_ID"):
        assert envs[0][k] == envs[1][k], k
    assert envs[0]["TORCHELASTIC_ERROR_FILE"] != envs[1]["TORCHELASTIC_ERROR_FILE"]
    # the job token must not leak into the console
    assert envs[0]["COHORT_TOKEN"] not in p.stdout + p.stderr
    assert_no_leftovers(marker)


def test_pet_env_sets_nproc(cohort, launcher, marker, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    env = U.clean_env(PET_NPROC_PER_NODE=3, PET_MAX_RESTARTS=2, OMP_NUM_THREADS=4)
    p = launcher.run([cohort, "run", U.ENV_DUMP, out, marker], QUICK_TIMEOUT, env=env,
                     name="cohort")
    assert p.p.returncode == 0, p.describe()
    envs = _read_envs(out, 3)
    for rank, e in envs.items():
        assert e["WORLD_SIZE"] == "3" and e["LOCAL_WORLD_SIZE"] == "3", e
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "2", e
        assert e["OMP_NUM_THREADS"] == "4", "a user's OMP_NUM_THREADS must be kept"
    assert_no_leftovers(marker)


def test_flag_overrides_pet_env(cohort, launcher, marker, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    env = U.clean_env(PET_NPROC_PER_NODE=3)
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", U.ENV_DUMP, out, marker],
                     QUICK_TIMEOUT, env=env, name="cohort")
    assert p.p.returncode == 0, p.describe()
    _read_envs(out, 2)


def test_single_worker_leaves_omp_unset(cohort, launcher, marker, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    p = launcher.run([cohort, "run", "--nproc-per-node", "1", U.ENV_DUMP, out, marker],
                     QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    e = _read_envs(out, 1)[0]
    assert "OMP_NUM_THREADS" not in e, "torchrun sets OMP_NUM_THREADS only for >1 worker"


def test_environment_matches_torchrun_keys(cohort, need_torch, launcher, marker, tmp_path):
    outs = {}
    for name, argv in (
            ("cohort", [cohort, "run", "--nproc-per-node", "2", "--standalone", "--"]),
            ("torchrun", [U.TORCHRUN, "--nproc_per_node", "2", *U.TORCHRUN_FIXED,
                          "--standalone"])):
        out = tmp_path / name
        out.mkdir()
        p = launcher.run([*argv, U.ENV_DUMP, out, marker], DDP_TIMEOUT, name=name)
        assert p.p.returncode == 0, p.describe()
        outs[name] = _read_envs(out, 2)
    for rank in (0, 1):
        c, t = outs["cohort"][rank], outs["torchrun"][rank]
        missing = [k for k in CONTRACT_KEYS if k in t and k not in c]
        assert not missing, "cohort lacks keys torchrun sets: %s" % missing
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                  "OMP_NUM_THREADS"):
            assert c.get(k) == t.get(k), (k, c.get(k), t.get(k))


# ---------------------------------------------------------------------------------------
# Console and logs


def test_console_prefix_and_log_layout(cohort, launcher, marker, tmp_path):
    logs = tmp_path / "logs"
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--log-dir", logs,
                      "--rdzv-id", "echojob", U.ECHO_RANKS, marker], QUICK_TIMEOUT,
                     name="cohort")
    assert p.p.returncode == 0, p.describe()
    for r in (0, 1):
        assert re.search(r"^\[rank%d\]: ?hello-stdout from rank %d$" % (r, r), p.stdout,
                         re.M), p.describe()
        assert re.search(r"^\[rank%d\]: ?hello-stderr from rank %d$" % (r, r), p.stderr,
                         re.M), p.describe()
        d = logs / "echojob" / "attempt_0" / str(r)
        assert "hello-stdout from rank %d" % r in (d / "stdout.log").read_text()
        assert "hello-stderr from rank %d" % r in (d / "stderr.log").read_text()


def test_local_ranks_filter(cohort, launcher, marker, tmp_path):
    logs = tmp_path / "logs"
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--local-ranks-filter", "1",
                      "--log-dir", logs, "--rdzv-id", "filterjob", U.ECHO_RANKS, marker],
                     QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    console = p.stdout + p.stderr
    assert re.search(r"^\[rank1\]: ?hello-stdout from rank 1$", p.stdout, re.M), p.describe()
    assert re.search(r"^\[rank1\]: ?hello-stderr from rank 1$", p.stderr, re.M), p.describe()
    assert "from rank 0" not in console, "rank 0 output shown despite the filter\n" + (
        p.describe())
    assert not re.search(r"^\[rank0\]", console, re.M), p.describe()
    # the full logs still hold both ranks
    for r in (0, 1):
        d = logs / "filterjob" / "attempt_0" / str(r)
        assert "hello-stdout from rank %d" % r in (d / "stdout.log").read_text()
        assert "hello-stderr from rank %d" % r in (d / "stderr.log").read_text()


# ---------------------------------------------------------------------------------------
# Entrypoint forms and prompt exit


def test_module_entrypoint(cohort, launcher, marker):
    # `-m platform` prints the platform string and exits 0; the marker is an ignored arg.
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "-m", "platform", marker],
                     QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    lines = U.rank_lines(p.stdout)  # the same line from both ranks may be merged
    for r in (0, 1):
        assert any(line.startswith("Linux") for line in lines.get(r, [])), p.describe()


SH_ECHO = ["/bin/sh", "-c", 'echo "hello-stdout from rank $RANK"']


@pytest.mark.parametrize("case", [
    "standalone-first", "standalone-last", "no-python-last", "no-python-first",
    "run-path", "module-first", "args-after-entrypoint",
])
def test_torchrun_style_flag_order(cohort, launcher, marker, case):
    """Boolean flags (--standalone, --no-python, --run-path, -m) anywhere before the
    entrypoint, without `--`, as torchrun accepts them; options after the entrypoint
    belong to the program."""
    echo = [str(U.ECHO_RANKS), marker]
    args = {
        "standalone-first": ["--standalone", "--nproc-per-node", "1", *echo],
        "standalone-last": ["--nproc-per-node", "1", "--standalone", *echo],
        "no-python-last": ["--nproc-per-node", "1", "--no-python", *SH_ECHO, marker],
        "no-python-first": ["--no-python", "--nproc-per-node", "1", *SH_ECHO, marker],
        "run-path": ["--nproc_per_node=1", "--run_path", *echo],
        "module-first": ["-m", "--nproc-per-node", "1", "platform", marker],
        "args-after-entrypoint": ["--nproc-per-node", "1", str(U.ECHO_RANKS), "--steps",
                                  "3", "-m", "--standalone", "--nproc-per-node", "7",
                                  marker],
    }[case]
    p = launcher.run([cohort, "run", *args], QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    if case == "module-first":
        assert re.search(r"^\[rank0\]: ?Linux", p.stdout, re.M), p.describe()
    else:
        assert re.search(r"^\[rank0\]: ?hello-stdout from rank 0$", p.stdout, re.M), (
            p.describe())
    if case == "args-after-entrypoint":
        m = re.search(r"argv from rank 0: (.*)$", p.stdout, re.M)
        assert m, p.describe()
        assert json.loads(m.group(1)) == args[3:], p.describe()
    assert_no_leftovers(marker)


def test_exits_promptly_when_workers_finish(cohort, launcher, marker):
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--no-python", "--",
                      "/bin/sh", "-c", "exit 0", marker], QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    assert p.elapsed < 2.0, "a no-op job took %.2fs" % p.elapsed


def test_two_nodes_on_one_machine(cohort, need_torch, launcher, marker, tmp_path,
                                  reference_loss):
    """Two agents (--nnodes 2, one worker each) meet through a c10d endpoint."""
    port = U.free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", marker,
              "--rdzv-conf", "join_timeout=30"]
    env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex())  # same secret on both nodes
    n0 = launcher.start([cohort, "run", *common, "--node-rank", "0",
                         *ddp_cmd(tmp_path / "ckpt", marker)], env=env, name="node0")
    n1 = launcher.start([cohort, "run", *common, "--node-rank", "1",
                         *ddp_cmd(tmp_path / "ckpt", marker)], env=env, name="node1")
    r0, r1 = n0.wait(DDP_TIMEOUT), n1.wait(DDP_TIMEOUT)
    assert r0 == 0, n0.describe()
    assert r1 == 0, n1.describe()
    loss = U.final_loss(n0.stdout + n1.stdout)
    assert loss is not None, n0.describe() + n1.describe()
    assert abs(loss - reference_loss) <= 1e-6, (loss, reference_loss)
    assert_no_leftovers(marker)


def test_store_host_waits_for_other_nodes(cohort, launcher, marker):
    """The node serving the rendezvous store must not take the store away while another
    node's workers still run: node 0 (started first, so it serves the store) has a worker
    that exits at once, node 1's worker runs about a second longer; both must exit 0."""
    port = U.free_port()
    env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", marker,
              "--rdzv-conf", "join_timeout=30"]
    n0 = launcher.start([cohort, "run", *common, "--node-rank", "0", "--no-python", "--",
                         "/bin/sh", "-c", "exit 0", marker], env=env, name="node0")

    def serving():
        if n0.poll() is not None:
            raise AssertionError("node 0 exited early\n" + n0.describe())
        return U.port_listening(port)

    U.wait_for(serving, 30, what="node 0 to serve the store on port %d" % port)
    n1 = launcher.start([cohort, "run", *common, "--node-rank", "1", "--no-python", "--",
                         "/bin/sh", "-c", "sleep 1; exit 0", marker], env=env, name="node1")
    r0, r1 = n0.wait(QUICK_TIMEOUT), n1.wait(QUICK_TIMEOUT)
    assert r1 == 0, n1.describe()
    assert r0 == 0, n0.describe()
    # node 0 should have waited for node 1 to finish
    assert n0.t_end >= n1.t_end - 0.5, (n0.t_end, n1.t_end)
    assert_no_leftovers(marker)


def test_a_killed_node_is_named_by_its_closed_connection(cohort, launcher, marker):
    """Two agents whose workers never talk to each other: only the rendezvous can tell that
    node 1 died. Its agent and worker are SIGKILLed; node 0 names it and says why (its
    store connection closed: the store's will, one liveness period of 5 s after the close,
    not the 15 s of silent heartbeats), re-forms alone and finishes."""
    port = U.free_port()
    env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex())
    common = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", marker,
              "--max-restarts", "1",
              "--rdzv-conf", "join_timeout=30,last_call_timeout=5,keep_alive_interval=1,"
                             "keep_alive_max_attempt=15",
              "--no-python", "--", "/bin/sh", "-c",
              'echo "world=$WORLD_SIZE"; [ "$WORLD_SIZE" = 1 ] && exit 0; exec sleep 120',
              marker]
    n0 = launcher.start([cohort, "run", *common], env=env, name="node0")
    U.wait_for(lambda: U.port_listening(port), 30, what="node 0 to serve the store")
    n1 = launcher.start([cohort, "run", *common], env=env, name="node1")
    U.wait_for(lambda: "world=2" in n0.stdout and "world=2" in n1.stdout, 60,
               what="both workers running in a job of world size 2")
    n1.kill()
    assert n0.wait(60) == 0, n0.describe()
    text = n0.stdout + n0.stderr
    assert re.search(r"node \d+ \([^)]*\): its store connection closed", text), n0.describe()
    assert "stopped sending heartbeats" not in text, n0.describe()
    assert "world=1" in n0.stdout, n0.describe()
    assert_no_leftovers(marker)


@pytest.mark.parametrize("redirects", ["3", "1"])
def test_redirects_to_log_files(cohort, launcher, marker, tmp_path, redirects):
    """--redirects 3: worker output only in the log files; 1: only stdout redirected."""
    logs = tmp_path / "logs"
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--redirects", redirects,
                      "--log-dir", logs, "--rdzv-id", "redirjob", U.ECHO_RANKS, marker],
                     QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    console = p.stdout + p.stderr
    assert "hello-stdout" not in console, p.describe()
    if redirects == "3":
        assert "hello-stderr" not in console, p.describe()
    else:
        for r in (0, 1):
            assert re.search(r"^\[rank%d\]: ?hello-stderr from rank %d$" % (r, r),
                             p.stderr, re.M), p.describe()
    for r in (0, 1):
        d = logs / "redirjob" / "attempt_0" / str(r)
        assert "hello-stdout from rank %d" % r in (d / "stdout.log").read_text()
        assert "hello-stderr from rank %d" % r in (d / "stderr.log").read_text()


def test_role_and_master_flags(cohort, launcher, marker, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    port = U.free_port()
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--role", "trainer",
                      "--master-addr", "127.0.0.1", "--master-port", str(port),
                      U.ENV_DUMP, out, marker], QUICK_TIMEOUT, name="cohort")
    assert p.p.returncode == 0, p.describe()
    for e in _read_envs(out, 2).values():
        assert e["ROLE_NAME"] == "trainer", e
        assert e["MASTER_ADDR"] == "127.0.0.1", e
        assert e["MASTER_PORT"] == str(port), e


def test_python_without_torch_on_path_names_the_interpreter(cohort, need_torch, launcher,
                                                            marker, tmp_path):
    """A `python3` first on PATH without torch (a venv, a newer Python): the failed job's
    summary says which interpreter ran the script and how to choose another; with
    COHORT_PYTHON pointing at the python that has torch the same command works."""
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "python3"
    shim.write_text("#!/bin/sh\nexec %s -S \"$@\"\n" % U.SYS_PY)  # -S: no dist-packages
    shim.chmod(0o755)
    script = tmp_path / "uses_torch.py"
    script.write_text("import sys\nimport torch\nprint('torch', torch.__version__)\n")
    env = U.clean_env(COHORT_PYTHON=None, PATH="%s:%s" % (shim_dir, os.environ["PATH"]))
    p = launcher.run([cohort, "run", "--nproc-per-node", "1", script, marker], QUICK_TIMEOUT,
                     env=env, name="no_torch")
    assert p.p.returncode == 1, p.describe()
    assert "ModuleNotFoundError" in p.stderr, p.describe()
    assert "the workers ran %s" % shim in p.stderr, p.describe()
    assert "python3 on PATH" in p.stderr and "COHORT_PYTHON" in p.stderr, p.describe()
    env["COHORT_PYTHON"] = U.SYS_PY
    p = launcher.run([cohort, "run", "--nproc-per-node", "1", script, marker], QUICK_TIMEOUT,
                     env=env, name="with_torch")
    assert p.p.returncode == 0, p.describe()
    assert "torch " in p.stdout, p.describe()


def _tagged_pids(tag):
    return U.pids_with_env("COHORT_TEST_TAG=%s" % tag)


WORKER_WITH_ESCAPEES = ("sleep 1000 & setsid sleep 1000 & "
                        "setsid sh -c 'sleep 1000 & wait' & echo started; wait")


def test_agent_sigkill_leaves_no_descendant(cohort, launcher, marker):
    """SIGKILL of `cohort run` itself: its workers, their children in the worker's group and
    descendants that left it with setsid all die (they used to survive with parent 1)."""
    env = U.clean_env(COHORT_TEST_TAG=marker)
    p = launcher.start([cohort, "run", "--nproc-per-node", "2", "--no-python", "--",
                        "/bin/sh", "-c", WORKER_WITH_ESCAPEES, marker], env=env, name="agent")
    U.wait_for(lambda: all("started" in U.rank_lines(p.stdout).get(r, []) for r in (0, 1)),
               QUICK_TIMEOUT, what="workers started")
    assert len(_tagged_pids(marker)) >= 8  # 2 x (sh + sleep + setsid sleep + sh + sleep)
    os.kill(p.pid, signal.SIGKILL)  # the agent alone, not its group
    U.wait_for(lambda: not _tagged_pids(marker), 20, what="every job process gone")


def test_descendants_outside_the_group_die_with_the_job(cohort, launcher, marker):
    """A worker that succeeds but left a `setsid` daemon behind: the job ends and so does
    the daemon (it held the store's port open for the next run before)."""
    env = U.clean_env(COHORT_TEST_TAG=marker)
    port = U.free_port()
    argv = [cohort, "run", "--nproc-per-node", "1", "--rdzv-endpoint", "127.0.0.1:%d" % port,
            "--no-python", "--", "/bin/sh", "-c", "setsid sleep 1000 & echo ok", marker]
    p = launcher.run(argv, QUICK_TIMEOUT, env=env, name="first")
    assert p.p.returncode == 0, p.describe()
    U.wait_for(lambda: not _tagged_pids(marker), 20, what="the setsid daemon gone")
    # The endpoint's port is free again: the same command runs.
    p = launcher.run(argv, QUICK_TIMEOUT, env=env, name="second")
    assert p.p.returncode == 0, p.describe()


def test_more_workers_than_open_files_is_refused_at_once(cohort, launcher, marker):
    """--nproc-per-node beyond what the open-file limit allows: exit 3 before any worker
    starts, naming the limit (it used to fail with EMFILE after minutes of starting)."""
    p = launcher.run(["prlimit", "--nofile=300:300", cohort, "run", "--nproc-per-node", "100",
                      "--no-python", "--", "/bin/sh", "-c", "echo started", marker],
                     QUICK_TIMEOUT, name="too_many")
    assert p.p.returncode == 3, p.describe()
    assert "ulimit -n" in p.stderr and "--nproc-per-node 100" in p.stderr, p.describe()
    assert "started" not in p.stdout and p.elapsed < 5, p.describe()


def test_users_flight_recorder_dir_is_honoured(cohort, launcher, marker, tmp_path):
    """A user's COHORT_FLIGHT_RECORDER_DIR reaches every worker (the agent used to replace it
    with the rank's log directory); without it each rank gets its own log directory."""
    mine = tmp_path / "records"
    for name, env, expect in (("user", U.clean_env(COHORT_FLIGHT_RECORDER_DIR=mine), str(mine)),
                              ("default", U.clean_env(), None)):
        out = tmp_path / name
        out.mkdir()
        p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--log-dir", tmp_path / "logs",
                          U.ENV_DUMP, out, marker], QUICK_TIMEOUT, env=env, name=name)
        assert p.p.returncode == 0, p.describe()
        envs = _read_envs(out, 2)
        dirs = [envs[r]["COHORT_FLIGHT_RECORDER_DIR"] for r in (0, 1)]
        if expect:
            assert dirs == [expect, expect], dirs
        else:
            assert dirs[0] != dirs[1] and all(str(tmp_path / "logs") in d for d in dirs), dirs


def test_print_config_shows_values_and_sources_and_the_settings_doc_is_generated(cohort):
    """`cohort run --print-config` says what is in force and where it came from; the
    reference table in docs/settings.md is the one the binary prints."""
    env = U.clean_env(COHORT_ALGO="ring", COHORT_METRICS_PORT="0", COHORT_SHM_SLOT_BYTES="x1")
    r = subprocess.run([cohort, "run", "--nnodes", "2", "--print-config"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()
            if line.startswith("  ") and len(line.split()) >= 3}
    assert rows["--nnodes"][1:3] == ["2", "flag"], rows["--nnodes"]
    assert rows["--nproc-per-node"][1:3] == ["1", "default"], rows["--nproc-per-node"]
    assert rows["--metrics-port"][1:4] == ["0", "env", "COHORT_METRICS_PORT"], rows["--metrics-port"]
    assert rows["COHORT_ALGO"][1:3] == ["ring", "env"], rows["COHORT_ALGO"]
    # A malformed value: the default, and one warning naming it.
    assert rows["COHORT_SHM_SLOT_BYTES"][1:3] == ["262144", "default"], rows
    assert "COHORT_SHM_SLOT_BYTES" in r.stderr and "not a valid value" in r.stderr, r.stderr
    table = subprocess.run([cohort, "run", "--print-settings-markdown"], env=U.clean_env(),
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    doc = (U.REPO / "docs" / "settings.md").read_text()
    assert table.stdout in doc, "docs/settings.md is not the generated table: regenerate it " \
        "with `cohort run --print-settings-markdown`"
