"""The `cluster` fixture of the network-namespace tests: `cluster(n)` builds n hosts
(netns.Cluster, logs under the test's tmp_path) and every cluster made is closed, its
processes stopped, when the test ends. Import it into a test module to use it.

Thread-safety: pytest's thread only.
"""
import pytest

import netns


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(n):
        c = netns.Cluster(n, tmp_path)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
