"""End-to-end tests of the C++ trainer (`cohort-train`) under `cohort run`.

Run:  /usr/bin/python3 -m pytest -v tests/e2e/test_train.py
(COHORT_BIN overrides the launcher; COHORT_TRAIN_BIN the trainer, default: beside COHORT_BIN.)

* Rank 0 SIGKILLed right after a snapshot, half-way through writing it to disk (the
  trainer's COHORT_TRAIN_FAULT_WRITE_STEP hook, active on attempt 0 only), is restarted by
  the agent, resumes from the snapshot in the node's memory at that step and ends with
  parameters bit-identical to an uninterrupted run (same seed and world size): the
  `param_digest` lines (CRC32 of every parameter's bytes) must be equal.
* The same kill with no restart leaves the previous checkpoint valid on disk: a new job
  resumes from it, bit-identical again, and the half-written file is removed.
* Bad input gives distinct exit codes and a clear message, and overwrites nothing.

Uses the real Fashion-MNIST files (Debian dataset-fashion-mnist) when installed, else the
trainer's synthetic data set. Every wait is bounded; the worker command lines carry the
test's marker (`--tag`) so that leftovers are found and killed.
"""
import os
import re
import shutil
from pathlib import Path

import pytest

import e2e_util as U

FMNIST = Path("/usr/share/datasets/fashion-mnist")
TRAIN_TIMEOUT = 240
QUICK_TIMEOUT = 60

DIGEST_RE = re.compile(r"param_digest ([0-9a-f]{8})")
ACC_RE = re.compile(r"test_accuracy ([0-9.]+)")


def train_bin():
    env = os.environ.get("COHORT_TRAIN_BIN")
    if env:
        return Path(env)
    return U.cohort_bin().parent / "cohort-train"


@pytest.fixture
def trainer():
    b = train_bin()
    if not b.exists():
        pytest.skip("cohort-train not built: %s (set COHORT_TRAIN_BIN)" % b)
    return str(b)


def data_args():
    if (FMNIST / "train-images-idx3-ubyte.gz").exists():
        return ["--dataset", "fashion-mnist", "--data-dir", str(FMNIST)]
    return ["--dataset", "synthetic"]


def train_args(ckpt_dir, marker, *extra):
    return ["--model", "cnn", *data_args(), "--epochs", "2", "--max-steps", "300",
            "--batch-size", "32", "--lr", "0.05", "--checkpoint-every", "50", "--keep", "2",
            "--log-every", "50", "--checkpoint-dir", str(ckpt_dir), "--tag", marker, *extra]


def digest(text):
    m = DIGEST_RE.findall(text)
    return m[-1] if m else None


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir())}


def test_sigkill_mid_epoch_resumes_bit_identical(cohort, trainer, launcher, marker, tmp_path):
    ref = launcher.run([cohort, "run", "--nproc-per-node", "2", "--", trainer,
                        *train_args(tmp_path / "ref_ckpt", marker)],
                       TRAIN_TIMEOUT, name="reference")
    assert ref.p.returncode == 0, ref.describe()
    ref_digest = digest(ref.stdout)
    assert ref_digest is not None, ref.describe()
    assert ACC_RE.search(ref.stdout), ref.describe()

    logs = tmp_path / "logs"
    # Rank 0 dies right after the snapshot of step 150 (mid-epoch: 938 steps per epoch),
    # half-way through writing it to disk, where step 100 is the newest whole checkpoint.
    env = U.clean_env(COHORT_TRAIN_FAULT_WRITE_STEP=150)
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--max-restarts", "1",
                      "--log-dir", logs, "--rdzv-id", "trainjob", "--", trainer,
                      *train_args(tmp_path / "ckpt", marker)],
                     TRAIN_TIMEOUT, env=env, name="faulted")
    assert p.p.returncode == 0, p.describe()
    # Step 150's, or a later one's if a slow disk made the writer drop 150 for a newer one.
    fault = re.search(r"half-way through writing step (\d+)", p.stdout)
    assert fault, "fault not injected\n" + p.describe()
    a1 = (logs / "trainjob" / "attempt_1" / "0" / "stdout.log").read_text()
    assert re.search(r"resumed from the node's memory .* at step %s " % fault.group(1), a1), a1
    assert digest(p.stdout) == ref_digest, (
        "parameters differ after kill/resume: %s vs reference %s\n%s"
        % (digest(p.stdout), ref_digest, p.describe()))
    # The newest K=2 checkpoints are kept (the last is the final step's, written before
    # the job ended); the half-written file is gone.
    names = sorted(x.name for x in (tmp_path / "ckpt").iterdir())
    assert len(names) == 2 and names[-1] == "ckpt-000000000300.cohort", names

    # The same kill with no restart: the job fails, the disk keeps step 100 whole (the
    # node's memory went with the agent), and a new job resumes from it.
    ckpt = tmp_path / "ckpt2"
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--", trainer,
                      *train_args(ckpt, marker)], TRAIN_TIMEOUT, env=env, name="killed")
    assert p.p.returncode != 0, p.describe()
    torn = int(re.search(r"half-way through writing step (\d+)", p.stdout).group(1))
    names = sorted(x.name for x in ckpt.iterdir())
    whole = [int(n[5:17]) for n in names if n.startswith("ckpt-")]
    assert whole and max(whole) < torn, (torn, names)  # the previous checkpoints, whole
    assert any(".tmp." in n for n in names), names  # the torn write, never renamed
    p = launcher.run([cohort, "run", "--nproc-per-node", "2", "--", trainer,
                      *train_args(ckpt, marker)], TRAIN_TIMEOUT, name="resumed")
    assert p.p.returncode == 0, p.describe()
    assert re.search(r"resumed from .*ckpt-%012d\.cohort at step %d " % (max(whole), max(whole)),
                     p.stdout), p.describe()
    assert digest(p.stdout) == ref_digest, p.describe()
    names = sorted(x.name for x in ckpt.iterdir())
    assert not any(".tmp." in n for n in names), names


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root to mount a small file system")
def test_a_full_disk_is_reported_and_training_goes_on(trainer, launcher, marker, tmp_path):
    """The checkpoint directory on a file system of 1 MiB (a tmpfs in a private mount
    namespace) cannot hold a checkpoint: every write fails with ENOSPC, is reported and
    retried, training goes on to the end, and the final checkpoint's failure is the exit
    code (12) with the reason."""
    full = tmp_path / "full"
    full.mkdir()
    mount = 'mount -t tmpfs -o size=1m tmpfs "$0" && shift && exec "$@"'
    p = launcher.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount,
                      full, "x", trainer, "--model", "mlp", "--dataset", "synthetic",
                      "--max-steps", "40", "--checkpoint-every", "5", "--log-every", "10",
                      "--checkpoint-dir", full, "--tag", marker], QUICK_TIMEOUT, name="full")
    assert p.p.returncode == 12, p.describe()
    assert re.search(r"checkpoint of step \d+ could not be written: .*No space left on "
                     r"device; training goes on", p.stderr), p.describe()
    assert "test_accuracy" in p.stdout, p.describe()  # trained to the end
    assert "writing the final checkpoint" in p.stderr and "No space left" in p.stderr


def test_bad_input_exit_codes(trainer, launcher, marker, tmp_path):
    def run(args, name):
        return launcher.run([trainer, *args, "--tag", marker], QUICK_TIMEOUT, name=name)

    p = run(["--model", "vgg", "--dataset", "synthetic"], "bad_model")
    assert p.p.returncode == 2, p.describe()
    assert "unknown --model 'vgg'" in p.stderr, p.describe()

    p = run(["--model", "mlp", "--dataset", "imagenet", "--data-dir", str(tmp_path)],
            "bad_dataset")
    assert p.p.returncode == 2, p.describe()
    assert "unknown --dataset 'imagenet'" in p.stderr, p.describe()

    p = run(["--model", "mlp", "--dataset", "fashion-mnist", "--data-dir",
             str(tmp_path / "nothere")], "missing_dir")
    assert p.p.returncode == 11, p.describe()  # the data set (docs/exit-codes.md)
    assert "does not exist" in p.stderr, p.describe()

    # A checkpoint of the MLP, then the CNN pointed at it: refused, files untouched.
    ckpt = tmp_path / "ckpt"
    p = run(["--model", "mlp", "--dataset", "synthetic", "--max-steps", "3",
             "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"], "mlp")
    assert p.p.returncode == 0, p.describe()
    before = snapshot(ckpt)
    # Written in the background: the last is always there, the ones before it may have
    # been dropped for a newer one.
    assert "ckpt-000000000003.cohort" in before, sorted(before)
    p = run(["--model", "cnn", "--dataset", "synthetic", "--max-steps", "3",
             "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"], "cnn")
    assert p.p.returncode == 12, p.describe()  # a checkpoint of another model
    assert "is from model 'mlp', not 'cnn'" in p.stderr, p.describe()
    assert snapshot(ckpt) == before, "the checkpoint directory was modified"


def test_default_checkpoint_every_saves_at_the_end(trainer, launcher, marker, tmp_path):
    """--checkpoint-every defaults to 0, "only at the end": a run with just --checkpoint-dir
    leaves one checkpoint of its last step, and the next run resumes from it."""
    ckpt = tmp_path / "ckpt"
    def args(steps):
        return ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--max-steps",
                str(steps), "--checkpoint-dir", str(ckpt), "--tag", marker]
    p = launcher.run([trainer, *args(7)], QUICK_TIMEOUT, name="first")
    assert p.p.returncode == 0, p.describe()
    assert sorted(x.name for x in ckpt.iterdir()) == ["ckpt-000000000007.cohort"]
    p = launcher.run([trainer, *args(9)], QUICK_TIMEOUT, name="second")
    assert p.p.returncode == 0, p.describe()
    assert re.search(r"resumed from .*ckpt-000000000007\.cohort at step 7", p.stdout), p.describe()


def test_metrics_file_directories_are_created(trainer, launcher, marker, tmp_path):
    metrics = tmp_path / "a" / "b" / "m.jsonl"
    p = launcher.run([trainer, "--model", "mlp", "--dataset", "synthetic", "--max-steps", "3",
                      "--metrics-file", str(metrics), "--tag", marker], QUICK_TIMEOUT,
                     name="metrics")
    assert p.p.returncode == 0, p.describe()
    events = [e["event"] for e in U.read_json_lines(metrics)]
    assert events and events[-1] == "end", events
    # A path that cannot be a directory: a clear error, exit 2, nothing trained.
    (tmp_path / "file").write_text("x")
    p = launcher.run([trainer, "--model", "mlp", "--dataset", "synthetic", "--max-steps", "3",
                      "--metrics-file", str(tmp_path / "file" / "m.jsonl"), "--tag", marker],
                     QUICK_TIMEOUT, name="bad_metrics")
    assert p.p.returncode == 2, p.describe()
    assert "--metrics-file" in p.stderr and "param_digest" not in p.stdout, p.describe()
