"""Fixtures for the tests of the torch.distributed backend "cohort" and the warm start.

They reuse the end-to-end helpers of tests/e2e (processes in their own sessions, bounded
waits, leftovers found by a marker). Skipped without the cohort binary or without torch.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

import e2e_util as U  # noqa: E402


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
def pydir(cohort):
    """The directory cohort puts on its python workers' PYTHONPATH (cohort_torch)."""
    d = Path(cohort).parent / "python"
    if not (d / "cohort_torch" / "__init__.py").exists():
        pytest.skip("cohort_torch not built in %s" % d)
    return d


@pytest.fixture
def launcher(tmp_path):
    lx = U.Launcher(tmp_path, U.new_marker())
    try:
        yield lx
    finally:
        lx.cleanup()
