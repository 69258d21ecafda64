"""Journey 1 (shared/JOURNEYS.md): elastic multi-node training on a cluster, with the local
stand-ins: network-namespace hosts, a shared checkpoint directory, and the rendezvous on a
3-member etcd across the hosts, on the store embedded in node 0's agent, or on a
standalone `cohort store` on a host of its own.

The walk, driven only through command lines:
1. start `cohort run --nnodes 2:3` on two hosts: every rank reports world size 2 in one round;
2. start it on a third host mid-run: the job grows, every rank reports world size 3;
3. SIGKILL one node (agent and worker): the survivors re-form, every rank reports 2 (on
   etcd the rounds run as rounds of 500 nodes and more do by default: quiet,
   `--rdzv-conf quiet_start_nodes=2`, each node resting between its beats on a watch of the
   round's end held across them; and the round of three is carried,
   `carry_start_nodes=3`: the survivors form it without joining, from the end they were
   told. Rounds below 500 nodes on etcd, with leases, are driven through `cohort run` by
   tests/cluster's etcd leader test and tests/journeys/test_single_host.py);
4. the job finishes on the survivors; every rank's final parameter digest is the same;
5. `cohort bench allreduce` across the three hosts reports nranks 3 and #wrong 0.
Needs root (ip netns); skipped otherwise.
"""
import os

import pytest

import journey_util as J

STEPS = 1000          # long enough for the joins and the kill to land mid-run
PHASE_TIMEOUT = 90    # for one membership change to show in every rank's output
FINISH_TIMEOUT = 300
RDZV_CONF = ("join_timeout=60,last_call_timeout=2,keep_alive_interval=0.5,"
             "keep_alive_max_attempt=6")
ETCD_CONF = ",quiet_start_nodes=2,carry_start_nodes=3"


def node_env(c, i, token):
    # Network-namespace hosts share one kernel (hostname and boot id): COHORT_HOST_ID
    # gives each the identity a real machine has, so ranks on different hosts use TCP.
    env = J.job_env(COHORT_COMM_TIMEOUT="8", COHORT_HOST_ID="host%d" % i)
    if token:
        env["COHORT_TOKEN"] = token
    return env


def rdzv_flags(kind, c, store_host):
    if kind == "etcd":
        return ["--rdzv-backend", "etcd", "--rdzv-endpoint",
                ",".join("%s:2379" % c.addr(i) for i in range(3))]
    return ["--rdzv-endpoint", "%s:29400" % c.addr(store_host)]


def start_node(c, i, kind, store_host, token, ckpt, nnodes, program, name):
    argv = [str(J.BIN), "run", "--nnodes", nnodes, "--nproc-per-node", "1",
            *rdzv_flags(kind, c, store_host), "--rdzv-id", c.tag + name.split("-")[0],
            "--local-addr", c.addr(i), "--max-restarts", "3", "--rdzv-conf",
            RDZV_CONF + (ETCD_CONF if kind == "etcd" else ""),
            "--", *program]
    return c.start(i, argv, node_env(c, i, token), name)


def output(nodes):
    return "".join(p.stdout for p in nodes)


def wait_world(nodes, world, after, what):
    """Waits until every rank of a new round reports `world` and rank 0 then made
    progress in it; returns the round."""
    def formed():
        rnd = J.complete_round(output(nodes), world, after)
        return None if rnd is None else (rnd,)  # round 0 is a valid answer
    rnd, = J.netns.wait_for(formed, PHASE_TIMEOUT, what)
    transports = {t for _, t in J.rounds(output(nodes))[rnd].values()}
    assert transports == {"tcp"}, "ranks on different hosts must use TCP: %s" % transports
    step = J.max_step(output(nodes))
    J.netns.wait_for(lambda: J.max_step(output(nodes)) > step + 20, PHASE_TIMEOUT,
                     "training progress after: " + what)
    return rnd


@pytest.mark.parametrize("kind", ["etcd", "embedded", "standalone-store"])
def test_elastic_training_across_hosts(kind, cluster, tmp_path):
    if kind == "etcd" and not os.path.exists(J.ETCD):
        pytest.skip("etcd-server not installed")
    c = cluster(4 if kind == "standalone-store" else 3)
    token = None if kind == "etcd" else "tok" + c.tag
    store_host = 3 if kind == "standalone-store" else 0
    if kind == "etcd":
        J.start_etcd_members(c, 3)
    elif kind == "standalone-store":
        env = J.job_env(COHORT_TOKEN=token)
        store = c.start(3, [str(J.BIN), "store", "--host", c.addr(3), "--port", "29400"], env,
                        "store")
        J.netns.wait_for(lambda: "listening" in store.stderr + store.stdout
                         or store.poll() is not None, 30, "the standalone store")
        assert store.poll() is None, store.describe()
    ckpt = tmp_path / "ckpt"
    program = J.train_args(ckpt, STEPS, tag=c.tag)

    def start(i):
        return start_node(c, i, kind, store_host, token, ckpt, "2:3", program,
                          "train-node%d" % i)

    # 1. two nodes: one job of two ranks.
    nodes = [start(0), start(1)]
    r2 = wait_world(nodes, 2, -1, "every rank reporting world size 2")
    # 2. a third node joins mid-run: one job of three ranks.
    nodes.append(start(2))
    r3 = wait_world(nodes, 3, r2, "every rank reporting world size 3 after the join")
    # 3. SIGKILL of node 1 (its agent and worker): the survivors form a job of two.
    at_kill = J.max_step(output(nodes))
    assert at_kill < STEPS - 300, "the kill must land mid-run: step %d of %d" % (at_kill, STEPS)
    nodes[1].kill()
    survivors = [nodes[0], nodes[2]]
    r2b = wait_world(survivors, 2, r3, "every rank reporting world size 2 after the kill")
    if kind == "etcd":
        # Carried: the node that ended the round closed the next one for the survivors.
        logs = "".join(p.stderr + p.stdout for p in survivors)
        assert "carried its 2 surviving node(s) into round" in logs, logs[-3000:]
    # 4. the survivors finish with identical parameters.
    for p in survivors:
        rc = p.wait(FINISH_TIMEOUT)
        assert rc == 0, J.describe(nodes)
    digests = J.digests(output(survivors))
    assert sorted(digests) == [0, 1], output(survivors)
    assert len(set(digests.values())) == 1, "ranks ended with different parameters: %s" % digests
    if kind == "etcd":
        # Quiet rounds of three and of two, each node resting on a held watch of the end.
        logs = "".join(p.stderr + p.stdout for p in survivors)
        for rnd, world in ((r3, 3), (r2b, 2)):
            line = "round %d: %d nodes, quiet: this node beats every" % (rnd, world)
            assert line in logs, logs[-3000:]
    print("\n%s: rounds %d -> %d -> (kill at step %d of %d) -> 2 ranks; final digest %s" % (
        kind, r2, r3, at_kill, STEPS, digests[0]))

    # 5. the network check across the three hosts: one job of three ranks, no wrong values.
    bench = [J.BIN, "bench", "allreduce", "-b", "1K", "-e", "1M", "-f", "32", "-n", "5",
             "-w", "1"]
    bench_nodes = [start_node(c, i, kind, store_host, token, ckpt, "3", bench,
                              "bench-node%d" % i) for i in range(3)]
    for p in bench_nodes:
        rc = p.wait(120)
        assert rc == 0, J.describe(bench_nodes)
    text = output(bench_nodes)
    nranks, rows = J.bench_table(text)
    assert nranks == 3, text
    assert rows and all(w_out == 0 and w_in == 0 for _, w_out, w_in in rows), text
    assert "Out of bounds values : 0 OK" in text, text
    rank_lines = [line for line in text.splitlines() if "#  Rank" in line]
    assert len(rank_lines) == 3 and all(" tcp " in line for line in rank_lines), text
