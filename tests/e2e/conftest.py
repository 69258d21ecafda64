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


class Launcher:
    """Starts processes for one test and guarantees they (and their workers) are gone."""

    def __init__(self, tmp_path, marker):
        self.tmp_path = tmp_path
        self.marker = marker
        self.procs = []

    def start(self, argv, env=None, name=None):
        name = name or "proc%d" % len(self.procs)
        p = U.Proc(argv, env if env is not None else U.clean_env(), self.tmp_path / "io",
                   name)
        self.procs.append(p)
        return p

    def run(self, argv, timeout, env=None, name=None):
        p = self.start(argv, env=env, name=name)
        p.wait(timeout)
        return p

    def cleanup(self):
        for p in self.procs:
            p.kill()
        return U.kill_marker_procs(self.marker)


@pytest.fixture
def launcher(tmp_path, marker):
    lw = Launcher(tmp_path, marker)
    try:
        yield lw
    finally:
        lw.cleanup()
