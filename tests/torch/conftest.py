"""Fixtures for the tests of the torch.distributed backend "cohort" and the warm start.

They reuse the end-to-end helpers and fixtures of tests/e2e (processes in their own
sessions, bounded waits, leftovers found by a marker). Skipped without the cohort binary
or without torch.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from fixtures import cohort, launcher, marker, need_torch  # noqa: E402,F401


@pytest.fixture
def pydir(cohort):
    """The directory cohort puts on its python workers' PYTHONPATH (cohort_torch)."""
    d = Path(cohort).parent / "python"
    if not (d / "cohort_torch" / "__init__.py").exists():
        pytest.skip("cohort_torch not built in %s" % d)
    return d


@pytest.fixture
def in_process(pydir, need_torch):
    """cohort_torch importable in the test's own process: the build tree's package is on
    sys.path while the test runs (import its modules inside the test or a fixture)."""
    sys.path.insert(0, str(pydir))
    try:
        yield
    finally:
        sys.path.remove(str(pydir))
