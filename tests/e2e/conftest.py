"""Fixtures for the end-to-end tests of `cohort run` (defined in fixtures.py, shared with
tests/torch).

Environment:
  COHORT_BIN   the cohort binary (default <repo>/build/dev/cohort/cli/cohort);
               tests that need it are skipped when it does not exist.
Torch-dependent tests are skipped when /usr/bin/python3 cannot import torch.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures import cohort, launcher, marker, need_torch, postgres_server  # noqa: E402,F401
