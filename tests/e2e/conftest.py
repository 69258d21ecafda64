"""Fixtures for the end-to-end tests of `cohort run`.

Environment:
  COHORT_BIN   the cohort binary (default <repo>/build/dev/cohort/cli/cohort);
               tests that need it are skipped when it does not exist.
Torch-dependent tests are skipped when /usr/bin/python3 cannot import torch.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_util as U  # noqa: E402


@pytest.fixture
def cohort():
    b = U.cohort_bin()
    if not b.exists():
        pytest.skip("cohort binary not built: %s (set COHORT_BIN)" % b)
    return str(b)


@pytest.fixture
def need_torch():
    if not U.torch_available():
        pytest.skip("/usr/bin/python3 cannot import torch (or no /usr/bin/torchrun)")


@pytest.fixture
def marker():
    return U.new_marker()

Launcher = U.Launcher


@pytest.fixture
def launcher(tmp_path, marker):
    lw = Launcher(tmp_path, marker)
    try:
        yield lw
    finally:
        lw.cleanup()
