"""cohort_torch.elastic with nccl through a node loss and a join, on three
network-namespace hosts of one machine, each host's worker on its own GPU
(CUDA_VISIBLE_DEVICES), NCCL over the hosts' veth links (NCCL_SOCKET_IFNAME=eth0).

Skipped without root (network namespaces) or with fewer than 3 CUDA devices: NCCL puts one
rank per GPU. What it asserts is what the CPU sequence tests (tests/cluster/
test_torch_sequences.py) assert: after node 2 is SIGKILLed every rank reports world 2 and
the survivors keep their PIDs; a new node 2 joins and every rank reports 3, the survivors
still the same processes and the newcomer reading no checkpoint; the job ends with exit 0
on every node, no worker-group restart and equal digests on every rank.
"""
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))
import netns  # noqa: E402
import test_torch_sequences as seq  # noqa: E402
from cluster_fixture import cluster  # noqa: E402,F401 - the fixture

WORKER = seq.REPO / "bench" / "elastic_worker.py"


def cuda_devices():
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


pytestmark = [
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
    pytest.mark.skipif(cuda_devices() < 3, reason="needs 3 CUDA devices (one rank per GPU)"),
]


def start(c, i, ckpt, name=None):
    argv = [str(seq.BIN), "run", "--nnodes", "2:3", "--nproc-per-node", "1",
            "--rdzv-endpoint", "%s:29400" % c.addr(0), "--rdzv-id", c.tag,
            "--local-addr", c.addr(i), "--max-restarts", "3",
            "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.5,"
                           "keep_alive_max_attempt=6",
            "--", str(WORKER), "--backend", "nccl", "--steps", "1500", "--step-sleep", "0.01",
            "--ckpt-dir", str(ckpt)]
    env = seq.node_env(c, i)
    env.update(CUDA_VISIBLE_DEVICES=str(i), NCCL_SOCKET_IFNAME="eth0",
               NCCL_ASYNC_ERROR_HANDLING="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    return c.start(i, argv, env, name or "node%d" % i)


def test_nccl_loss_then_join(cluster, tmp_path):
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    nodes = [start(c, i, ckpt) for i in range(3)]
    r3, pids3 = seq.wait_group(nodes, 3, after=-1)
    seq.wait_training(nodes, r3)
    nodes[2].kill()
    survivors = nodes[:2]
    r2, pids2 = seq.wait_group(survivors, 2, after=r3)
    assert pids2 <= pids3, (pids2, pids3)
    seq.wait_training(survivors, r2)
    newcomer = start(c, 2, ckpt, "node2-again")
    procs = survivors + [newcomer]
    r3b, _ = seq.wait_group(procs, 3, after=r2, keep=frozenset(pids2))
    assert "resumed from /" not in newcomer.stdout, newcomer.stdout[-2000:]
    seq.assert_clean_end(procs, 3)
