"""pytest fixtures shared by tests/e2e and tests/torch (each conftest imports them).

  cohort      the cohort binary, absolute (COHORT_BIN, default
              <repo>/build/dev/cohort/cli/cohort); skips when it does not exist
  need_torch  skips unless /usr/bin/python3 imports torch and torchrun exists
  marker      a unique string a test puts on its command lines to find leftovers
  launcher    starts a test's processes; all of them (and their workers) are gone after
"""
import pytest

import e2e_util as U


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
def marker():
    return U.new_marker()


@pytest.fixture
def launcher(tmp_path, marker):
    lw = U.Launcher(tmp_path, marker)
    try:
        yield lw
    finally:
        lw.cleanup()
