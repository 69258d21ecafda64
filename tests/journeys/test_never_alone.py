"""Journey: a worker that cannot join its job says so and stops; it never trains alone.

A user starts cohort's worker programs the ways people do by mistake: with WORLD_SIZE=2 set
by hand, under torchrun (which gives no cohort store), or pointed at a store with the wrong
token. Each worker must exit with code 10 ("could not join its job", docs/exit-codes.md)
and a message that names what is missing and what to do, instead of training as a
one-rank job and printing a result as if nothing were wrong.
"""
import os
import uuid

import pytest

import journey_util as J

EXIT_CANNOT_JOIN = 10
TORCHRUN = "/usr/bin/torchrun"


def hand_env(**extra):
    return J.job_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", **extra)


@pytest.mark.parametrize("program", ["train", "bench"])
def test_world_size_two_without_a_store_is_refused(program, procs, tmp_path):
    argv = (J.train_args(tmp_path / "ckpt", 5) if program == "train"
            else [J.BIN, "bench", "allreduce", "-b", "8", "-e", "8"])
    p = procs.start(argv, env=hand_env(), name=program)
    assert p.wait(60) == EXIT_CANNOT_JOIN, p.describe()
    assert "WORLD_SIZE=2" in p.stderr and "cohort run" in p.stderr, p.describe()
    assert "param_digest" not in p.stdout and "nranks" not in p.stdout, p.describe()
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_wrong_token_is_refused(procs, tmp_path):
    port = J.e2e_util.free_port()
    store = procs.start([J.BIN, "store", "--host", "127.0.0.1", "--port", port],
                        env=J.job_env(COHORT_TOKEN="right" + uuid.uuid4().hex), name="store")
    J.wait_until(lambda: "listening" in store.stdout or store.poll() is not None, 30,
                 "the store listening")
    env = hand_env(COHORT_STORE_ADDR="127.0.0.1", COHORT_STORE_PORT=str(port),
                   COHORT_TOKEN="wrong")
    p = procs.start(J.train_args(tmp_path / "ckpt", 5), env=env, name="train")
    assert p.wait(90) == EXIT_CANNOT_JOIN, p.describe()
    assert "token" in p.stderr, p.describe()


@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="no torchrun (python3-torch)")
def test_cohort_train_under_torchrun_is_refused(procs, tmp_path):
    """torchrun gives RANK/WORLD_SIZE and its own TCPStore, but no cohort store: the workers
    refuse (naming `cohort run`) and torchrun reports the failure."""
    argv = [TORCHRUN, "--redirects", "2", "--tee", "2", "--nproc_per_node", "2",
            "--no_python", "--max_restarts", "0", "--log_dir", tmp_path / "tr",
            *J.train_args(tmp_path / "ckpt", 5)]
    p = procs.start(argv, name="torchrun")
    assert p.wait(120) != 0, p.describe()
    text = p.stdout + p.stderr
    assert "cohort run" in text and "param_digest" not in text, p.describe()


def test_agent_names_the_rank_that_could_not_join(procs, tmp_path):
    """Under cohort run, a worker that exits 10 is named in the job's summary."""
    script = tmp_path / "not_joining.sh"
    script.write_text("#!/bin/sh\nexec env -u COHORT_STORE_ADDR -u COHORT_STORE_PORT %s \"$@\"\n"
                      % J.TRAIN)
    script.chmod(0o755)
    argv = [J.BIN, "run", "--nproc-per-node", "2", "--", script,
            *J.train_args(tmp_path / "ckpt", 5)[1:]]
    p = procs.start(argv, name="run")
    assert p.wait(90) == 1, p.describe()
    assert "exited with code 10 (it could not join its job)" in p.stderr, p.describe()
