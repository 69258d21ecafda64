"""Journey 1 with the user's own PyTorch script (shared/JOURNEYS.md step 4: "image, script
and arguments"), on two network-namespace hosts, driven only through command lines:

    cohort run --nnodes 2 --nproc-per-node 2 --rdzv-endpoint h0:29400 ... script.py

1. tests/torch/collectives_worker.py with `init_process_group("cohort")`: torch's env://
   rendezvous goes through the TCPStore that host 0's agent serves (host 1's workers reach
   it across the network); every rank of the 4 reports world size 4 over shared memory and
   TCP, and every collective x dtype x op matches the hand-computed result and gloo;
2. tests/torch/ddp_fashion.py (DDP, Fashion-MNIST) across the two hosts: every rank ends
   with the same parameter digest.
Needs root (ip netns) and torch; skipped otherwise.
"""
import re

import pytest

import journey_util as J

TORCH_TESTS = J.REPO / "tests" / "torch"


def start_node(c, i, token, world_per_node, program, name):
    # Network-namespace hosts share one kernel: COHORT_HOST_ID gives each the identity a
    # real machine has, so ranks on different hosts use TCP. The script's gloo group (its
    # reference) needs the interface named, as on any cluster whose hostnames resolve to
    # loopback.
    env = J.job_env(COHORT_TOKEN=token, COHORT_HOST_ID="host%d" % i, GLOO_SOCKET_IFNAME="eth0")
    argv = [str(J.BIN), "run", "--nnodes", "2", "--nproc-per-node", str(world_per_node),
            "--rdzv-endpoint", "%s:29400" % c.addr(0), "--rdzv-id", c.tag + name,
            "--local-addr", c.addr(i), "--", *program]
    return c.start(i, argv, env, "%s-node%d" % (name, i))


def run_on_both(c, token, per_node, program, name, timeout=300):
    nodes = [start_node(c, i, token, per_node, program, name) for i in range(2)]
    for n in nodes:
        n.wait(timeout)
    for n in nodes:
        assert n.p.returncode == 0, n.describe()
    return "".join(n.stdout for n in nodes)


def test_pytorch_script_on_the_cohort_backend_across_hosts(cluster):
    if not J.e2e_util.torch_available():
        pytest.skip("/usr/bin/python3 cannot import torch")
    c = cluster(2)
    token = "tok" + c.tag

    out = run_on_both(c, token, 2, [TORCH_TESTS / "collectives_worker.py"], "coll")
    seen = re.findall(r"rank (\d) of (\d): backend cohort over (\S+)", out)
    assert sorted(seen) == [(str(r), "4", "shm+tcp") for r in range(4)], out[-3000:]
    results = re.findall(r"rank (\d) checks (\d+) failures (\d+)", out)
    assert sorted(r for r, _, _ in results) == ["0", "1", "2", "3"], out[-3000:]
    assert all(f == "0" and int(n) > 150 for _, n, f in results), out[-3000:]

    out = run_on_both(c, token, 1, [TORCH_TESTS / "ddp_fashion.py", "--backend", "cohort",
                                    "--steps", "15"], "ddp")
    digests = dict(re.findall(r"rank (\d) param_digest (\w+)", out))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, out[-3000:]
    losses = [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", out)]
    assert len(losses) == 15 and losses[-1] < losses[0], losses
