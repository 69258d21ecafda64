"""Fixtures for the tests of the slurm backend against a real Slurm (tests/slurm/).

  slurm   one SlurmCluster (munged + slurmctld + 3 slurmd fake nodes) for the whole module;
          the tests are skipped when it cannot run here (not root, Slurm not installed)
  jobs    runs `cohort submit|status|logs|cancel|list` with a private --home, talking to
          that cluster through SLURM_CONF (slurm_jobs.Jobs)

Environment: COHORT_BIN (default <repo>/build/dev/cohort/cli/cohort), COHORT_TRAIN (default
cohort-train beside it). COHORT_KEEP_SLURM_DIR=1 keeps the cluster's directory (daemon logs)
after the run.
"""
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Shared helpers of the end-to-end tests (marker processes, free ports).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

import slurm_cluster  # noqa: E402
import slurm_jobs  # noqa: E402


@pytest.fixture(scope="module")
def slurm():
    why = slurm_cluster.available()
    if why:
        pytest.skip("no Slurm cluster here: " + why)
    with slurm_cluster.SlurmCluster(nodes=3, cpus=2) as cluster:
        yield cluster


@pytest.fixture
def cohort():
    b = slurm_jobs.cohort_bin()
    if not b.exists():
        pytest.skip("cohort binary not built: %s (set COHORT_BIN)" % b)
    return str(b)


@pytest.fixture
def marker():
    return "cohortSlurm" + uuid.uuid4().hex[:12]


@pytest.fixture
def jobs(cohort, slurm, tmp_path):
    return slurm_jobs.Jobs(cohort, slurm, tmp_path)
