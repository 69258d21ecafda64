"""`cohort bench scaling --nodes` inside a Slurm allocation (the real Slurm 22.05 with 3 fake
nodes of slurm_cluster.py): `salloc -N 2 cohort bench scaling --nodes 1,2 -- cohort-train
...` runs one `srun` step per count, one agent per node, and reports the table and the plot;
the 2-node step forms one job of 2 ranks. Outside an allocation `--hosts slurm` is refused
with what to do. Skipped when not root or Slurm is not installed.
"""
import json
import re
import subprocess

import pytest

from slurm_jobs import describe, train_bin


def test_scaling_over_the_nodes_of_an_allocation(slurm, cohort, tmp_path):
    train = train_bin()
    if not train.exists():
        pytest.skip("cohort-train not built: %s" % train)
    out = tmp_path / "scaling"
    argv = ["salloc", "-N", "2", "--immediate=60", cohort, "bench", "scaling", "--nodes", "1,2",
            "--out", str(out), "--timeout", "240", "--", str(train), "--model", "mlp",
            "--dataset", "synthetic", "--batch-size", "32", "--max-steps", "200",
            "--log-every", "50"]
    env = slurm.env()
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    print(p.stdout)
    assert p.returncode == 0, describe(p) + slurm.describe()
    rows = json.loads((out / "scaling.json").read_text())
    assert [r["nodes"] for r in rows] == [1, 2], rows
    assert all(r["samples_per_s"] and r["samples_per_s"] > 0 for r in rows), rows
    two = (out / "nodes2/output.log").read_text()
    for r in range(2):
        assert re.search(r"rank %d of 2: transport \w+, round 0" % r, two), two[-3000:]
    assert sorted(f.name for f in (out / "nodes2/metrics").glob("rank*.json")) == \
        ["rank0.json", "rank1.json"]
    assert "samples/s against nodes" in (out / "scaling.svg").read_text()


def test_slurm_hosts_outside_an_allocation_are_refused(slurm, cohort, tmp_path):
    p = subprocess.run([cohort, "bench", "scaling", "--nodes", "1,2", "--hosts", "slurm",
                        "--out", str(tmp_path), "--", "/bin/true"], env=slurm.env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, describe(p)
    assert "salloc -N 2" in p.stderr, p.stderr
