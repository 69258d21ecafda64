"""Fixtures of the journey tests: every process a test starts is tracked and killed (with
its process group) at the end, network-namespace clusters are removed, and the binaries
must exist (built by tools/build.sh)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import journey_util as J  # noqa: E402
from fixtures import postgres_server  # noqa: E402,F401  (tests/e2e/fixtures.py)


@pytest.fixture(autouse=True)
def need_binaries():
    for b in (J.BIN, J.TRAIN):
        if not b.exists():
            pytest.skip("not built: %s (set COHORT_BIN)" % b)


@pytest.fixture
def procs(tmp_path):
    ps = J.Processes(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


@pytest.fixture
def cluster(tmp_path):
    why = J.netns.available()
    if why is not None:
        pytest.skip(why)
    made = []

    def make(n):
        c = J.netns.Cluster(n, tmp_path)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def etcd_factory(tmp_path):
    import os
    if not os.path.exists(J.ETCD):
        pytest.skip("etcd-server not installed")
    started = []

    def make(**kw):
        e = J.Etcd(tmp_path / ("etcd%d" % len(started)), **kw)
        started.append(e)
        return e

    yield make
    for e in started:
        e.stop()
