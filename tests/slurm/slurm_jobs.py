"""Helpers of the slurm backend tests: the cohort binaries under test and `Jobs`, which runs
`cohort submit|status|logs|cancel|list` with a private --home against a SlurmCluster.
"""
import json
import os
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def cohort_bin():
    return Path(os.environ.get("COHORT_BIN", REPO / "build/dev/cohort/cli/cohort"))


def train_bin():
    return Path(os.environ.get("COHORT_TRAIN", cohort_bin().parent / "cohort-train"))


def clean_env(base):
    """base without launcher variables a developer's shell might carry into the jobs."""
    return {k: v for k, v in base.items()
            if not k.startswith(("PET_", "TORCHELASTIC_", "COHORT_"))
            and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                          "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")}


class Jobs:
    """cohort job commands against a private --home and the test's Slurm cluster."""

    def __init__(self, cohort, slurm, tmp_path):
        self.cohort = cohort
        self.slurm = slurm
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.env = clean_env(slurm.env())

    def spec(self, name, text):
        p = self.dir / name
        p.write_text(textwrap.dedent(text))
        return p

    def run(self, *args, timeout=120):
        return subprocess.run([self.cohort, *map(str, args), "--home", str(self.home)],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def submit(self, spec, *flags, timeout=120):
        """Submits with --json; returns (CompletedProcess, the job's JSON record)."""
        r = self.run("submit", spec, "--backend", "slurm", "--json", *flags, timeout=timeout)
        first = r.stdout.splitlines()[0] if r.stdout.strip() else ""
        assert first.startswith("{"), describe(r)
        return r, json.loads(first)

    def status(self, job):
        r = self.run("status", job, "--json")
        assert r.returncode == 0, describe(r)
        return json.loads(r.stdout)

    def scontrol_job(self, slurm_id):
        r = self.slurm.run("scontrol", "show", "job", "-o", str(slurm_id))
        assert r.returncode == 0, r.stderr
        return r.stdout


def describe(r):
    return "rc=%s\n--- stdout\n%s\n--- stderr\n%s" % (r.returncode, r.stdout[-4000:],
                                                      r.stderr[-4000:])
