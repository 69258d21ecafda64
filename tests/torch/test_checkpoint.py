"""cohort_torch.checkpoint in PyTorch scripts: a worker SIGKILLed right after a snapshot
resumes, under `cohort run`, from the node's memory at that step, with parameters equal to
an uninterrupted run; with no directory at all the memory is all there is; under torchrun
(no agent) a new run resumes from the checkpoint directory; a file that is not such a
checkpoint is refused. The same through cohort_torch.elastic.State, whose checkpoints are
these snapshots."""
import re
from pathlib import Path

import pytest

import e2e_util as U

SCRIPT = Path(__file__).resolve().parent / "checkpoint_train.py"
STEPS = 40


def digests(text):
    d = dict(re.findall(r"rank (\d+) param_digest (\w+)", text))
    assert sorted(d) == ["0", "1"], text[-3000:]
    assert len(set(d.values())) == 1, d
    return d["0"]


def run(launcher, cohort, tmp_path, name, directory, *extra, restarts=1):
    return launcher.run([cohort, "run", "--nproc-per-node", "2", "--max-restarts", restarts,
                         "--log-dir", tmp_path / ("logs-" + name), "/usr/bin/python3", SCRIPT,
                         launcher.marker, directory, STEPS, *extra],
                        timeout=300, env=U.clean_env(), name=name)


@pytest.mark.parametrize("with_dir,api", [(True, "checkpoint"), (False, "checkpoint"),
                                          (True, "elastic")],
                         ids=["dir", "memory-only", "elastic-state"])
def test_a_killed_worker_resumes_from_the_nodes_memory(cohort, need_torch, launcher,
                                                       tmp_path, with_dir, api):
    ref = run(launcher, cohort, tmp_path, "ref", tmp_path / "ref")
    assert ref.p.returncode == 0, ref.describe()
    directory = tmp_path / "ckpt" if with_dir else "-"
    p = run(launcher, cohort, tmp_path, "killed", directory, 17, api)
    assert p.p.returncode == 0, p.describe()
    out = p.stdout
    assert "SIGKILL after the snapshot of step 17" in out, p.describe()
    label = 18 if api == "elastic" else 17  # State's step: the commits done
    assert re.search(r"resumed from the node's memory .*(at )?step %d\b" % label, out), out
    assert "rank 0 restored step 17" in out and "rank 1 restored step 17" in out, out
    assert digests(out) == digests(ref.stdout)
    if with_dir:  # the newest written before the job ended (elastic: by the exit flush)
        names = sorted(x.name for x in (tmp_path / "ckpt").iterdir())
        last = STEPS if api == "elastic" else STEPS - 1
        assert names[-1] == "ckpt-%012d.cohort" % last, names
        assert len(names) <= 3, names


def test_torchrun_resumes_from_the_directory(cohort, pydir, need_torch, launcher, tmp_path):
    env = U.clean_env(PYTHONPATH=pydir)

    def torchrun(name, steps):
        return launcher.run([U.TORCHRUN, *U.TORCHRUN_FIXED, "--nproc_per_node", "2",
                             "--log_dir", tmp_path / name, SCRIPT, launcher.marker,
                             tmp_path / "ckpt", steps], timeout=300, env=env, name=name)

    first = torchrun("first", 12)
    assert first.p.returncode == 0, first.describe()
    second = torchrun("second", 20)
    assert second.p.returncode == 0, second.describe()
    text = second.stdout + second.stderr
    assert re.search(r"cohort_torch: resumed from \S*ckpt-000000000011\.cohort at step 11", text), \
        text[-3000:]
    assert "rank 1 restored step 11" in text, text[-3000:]


def test_a_cohort_train_checkpoint_is_refused_clearly(cohort, in_process, tmp_path):
    import cohort_torch.checkpoint as ckpt
    from cohort_torch import _C
    # A checkpoint file whose metadata is not cohort_torch's (as cohort-train's are).
    store = _C.Snapshots("", str(tmp_path), 3, 0)
    import torch
    store.take(5, '{"format":"raw1"}', [torch.zeros(8, dtype=torch.uint8)])
    store.flush(60)
    with pytest.raises(ValueError, match="not a cohort_torch checkpoint"):
        ckpt.Checkpointer(tmp_path).load()


def test_a_last_checkpoint_that_cannot_be_written_fails_the_exit(pydir, need_torch, tmp_path):
    # The directory's parent is a file: every write fails. The script ends right after
    # save(); the exit flush finds the failure and the process exits 12, saying why.
    import subprocess
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    code = ("import torch, cohort_torch.checkpoint as c\n"
            "c.save({'w': torch.ones(4)}, 3, %r)\n" % str(blocker / "ckpt"))
    p = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                       timeout=120, env=U.clean_env(PYTHONPATH=pydir))
    assert p.returncode == 12, (p.returncode, p.stderr[-2000:])
    assert "the last checkpoint could not be written to %s" % (blocker / "ckpt") in p.stderr, \
        p.stderr[-2000:]
    assert blocker.read_text() == "not a directory\n"


def test_elastic_state_refuses_a_checkpoint_file_and_leaves_it(in_process, tmp_path):
    import torch
    import cohort_torch.elastic as elastic
    old = tmp_path / "state.pt"
    torch.save({"step": 3}, old)
    before = old.read_bytes()
    with pytest.raises(ValueError, match="is a file, but it names a directory"):
        elastic.State(model=torch.nn.Linear(2, 2), checkpoint=old)
    assert old.read_bytes() == before
