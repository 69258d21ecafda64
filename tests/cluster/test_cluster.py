"""Multi-node scenarios on network-namespace hosts (one `cohort run` agent per host, the
embedded store served by host 0), each training a small C++ DDP job (cohort-train, MLP on
synthetic data, checkpoints on the shared file system):

- SIGKILL of a node's agent and workers: the survivors keep their processes and state and
  re-form with a smaller world (live reconfiguration, docs/multinode.md);
- a node added mid-run: the world grows, the running workers stay, the newcomer receives
  the state by broadcast; no restart is counted;
- a loss below MIN: the survivor stops its worker and waits; a new node brings the job
  back and it resumes from the checkpoint;
- a second loss while the group re-forms: the survivor re-forms again, alone;
- a survivor whose worker hangs: the group restarts from the checkpoint (fallback);
- a cut link, healed later: the cut node's peers time out, the rest go on; once healed the
  node rejoins;
- the node hosting the embedded store is killed: the others stop with a clear error.
Each prints the time to recover. Needs root; skipped otherwise.
"""
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402
from cluster_fixture import cluster  # noqa: E402,F401 - the fixture

REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(os.environ.get("COHORT_BIN", REPO / "build/dev/cohort/cli/cohort"))
TRAIN = BIN.parent / "cohort-train"
JOB_TIMEOUT = 180

pytestmark = pytest.mark.skipif(netns.available() is not None,
                                reason=str(netns.available()))


def node_argv(c, i, ckpt, nnodes, max_steps, extra=()):
    return [str(BIN), "run", "--nnodes", nnodes, "--nproc-per-node", "1",
            "--rdzv-endpoint", "%s:29400" % c.addr(0), "--rdzv-id", c.tag,
            "--local-addr", c.addr(i), "--max-restarts", "3",
            "--rdzv-conf", "join_timeout=60,last_call_timeout=2,keep_alive_interval=0.5,"
                           "keep_alive_max_attempt=6", *extra,
            "--", str(TRAIN), "--model", "mlp", "--dataset", "synthetic", "--epochs", "100",
            "--batch-size", "16", "--max-steps", str(max_steps), "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "10", "--log-every", "10", "--tag", c.tag]


def node_env(c, i):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PET_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE"):
            del env[k]
    env.update(COHORT_TOKEN="t" + c.tag, COHORT_HOST_ID="host%d" % i,
               COHORT_COMM_TIMEOUT="8", OMP_NUM_THREADS="1")
    return env


def all_out(procs):
    return "".join(p.stdout for p in procs)


def steps_seen(procs):
    return [int(m) for m in re.findall(r"\[rank0\]: epoch \d+/\d+ step (\d+)/", all_out(procs))]


JOINED_RE = re.compile(r"^\[rank\d+\]: rank (\d+) of (\d+): transport \S+, round (\d+)$", re.M)


def rounds_seen(procs):
    """{round: {rank: world}} from every rank's `rank R of W: ..., round N` line (rounds are
    numbered job-wide, so they order the attempts of all nodes)."""
    out = {}
    for m in JOINED_RE.finditer(all_out(procs)):
        out.setdefault(int(m.group(3)), {})[int(m.group(1))] = int(m.group(2))
    return out


def latest_round(procs):
    seen = rounds_seen(procs)
    return max(seen) if seen else -1


def latest_world(procs):
    """The world size every rank of the newest complete round reported (None if none)."""
    for rnd, ranks in sorted(rounds_seen(procs).items(), reverse=True):
        worlds = set(ranks.values())
        if len(worlds) == 1 and sorted(ranks) == list(range(worlds.pop())):
            return ranks[0]
    return None


def wait_progress(procs, beyond, timeout, what):
    return netns.wait_for(lambda: any(s > beyond for s in steps_seen(procs)), timeout, what)


def wait_new_attempt(procs, round_before, world, timeout):
    """Waits until a round after `round_before` has every rank 0..world-1 reporting world
    size `world`, and its rank 0 then made progress."""
    def ok():
        for rnd, ranks in rounds_seen(procs).items():
            if rnd <= round_before or sorted(ranks) != list(range(world)):
                continue
            if set(ranks.values()) != {world}:
                continue
            line = re.compile(r"^\[rank0\]: rank 0 of %d: transport \S+, round %d$" % (
                world, rnd), re.M)
            for p in procs:
                text = p.stdout
                m = line.search(text)
                if m and re.search(r"\[rank0\]: epoch \d+/\d+ step", text[m.end():]):
                    return True
        return False
    netns.wait_for(ok, timeout, "a round of %d ranks making progress" % world)


def assert_finished(procs, everyone=None):
    """The given nodes exit 0 and rank 0 (on any of `everyone`) reports the final model."""
    for p in procs:
        rc = p.wait(JOB_TIMEOUT)
        assert rc == 0, p.describe()
    out = all_out(everyone or procs)
    assert "test_accuracy" in out and "param_digest" in out, "".join(
        p.describe() for p in procs)


DIGEST_RE = re.compile(r"^\[rank\d+\]: rank (\d+) param_digest (\w+)$", re.M)


def assert_one_job(procs, world):
    """Every rank 0..world-1 of the final group printed its digest, and all are equal: the
    ranks trained as one job to the same parameters."""
    digests = {int(r): d for r, d in DIGEST_RE.findall(all_out(procs))}
    assert sorted(digests) == list(range(world)), digests
    assert len(set(digests.values())) == 1, digests


def wait_for_workers(node, timeout=60):
    return netns.wait_for(node.worker_pids, timeout, "%s's worker to start" % node.name)


def test_node_loss_survivors_keep_their_processes(cluster, tmp_path):
    """Live reconfiguration: a node's SIGKILL costs the survivors the step in flight, not
    their processes; they re-form as 2 ranks and finish with equal parameters."""
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 400), node_env(c, i), "node%d" % i)
             for i in range(3)]
    wait_progress(nodes, 50, 90, "training on 3 nodes")
    assert latest_world(nodes) == 3
    pids = [wait_for_workers(n) for n in nodes[:2]]
    before = latest_round(nodes)
    t_fault = time.monotonic()
    nodes[2].kill()  # the agent's whole process group: agent and worker
    wait_new_attempt(nodes[:2], before, 2, 60)
    print("\nnode loss -> survivors training on 2 ranks (live): %.2f s" % (
        time.monotonic() - t_fault))
    assert [n.worker_pids() for n in nodes[:2]] == pids, "a survivor's worker was restarted"
    out = all_out(nodes[:2])
    assert out.count("re-formed live") >= 2, out[-3000:]
    assert_finished(nodes[:2], nodes)
    assert_one_job(nodes[:2], 2)
    assert "restarting the workers" not in "".join(p.stderr for p in nodes[:2])


def test_node_join_newcomer_receives_the_state(cluster, tmp_path):
    """A node added mid-run: the running workers stay, the newcomer gets parameters,
    optimizer state and position by broadcast (no checkpoint read), the world grows to 3
    without spending the restart budget."""
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 400), node_env(c, i), "node%d" % i)
             for i in range(2)]
    wait_progress(nodes, 50, 90, "training on 2 nodes")
    assert latest_world(nodes) == 2
    pids = [wait_for_workers(n) for n in nodes]
    before = latest_round(nodes)
    t_join = time.monotonic()
    nodes.append(c.start(2, node_argv(c, 2, ckpt, "2:3", 400), node_env(c, 2), "node2"))
    wait_new_attempt(nodes, before, 3, 60)
    print("\nnode start -> training on 3 ranks (live): %.2f s" % (time.monotonic() - t_join))
    assert [n.worker_pids() for n in nodes[:2]] == pids, "a running worker was restarted"
    out = all_out(nodes)
    assert re.search(r"training state of step \d+ sent by rank \d+", out), out[-3000:]
    assert "resumed from" not in out, "the newcomer read a checkpoint instead"
    assert_finished(nodes)
    assert_one_job(nodes, 3)
    # A membership change is not a failure: no restart was counted.
    assert "restart 1 of" not in "".join(p.stderr for p in nodes)


def test_loss_below_min_waits_then_restarts_from_the_checkpoint(cluster, tmp_path):
    """Below --nnodes MIN the job cannot go on: the survivor stops its worker and waits (as
    torchrun); a new node brings it back to MIN and both resume from the checkpoint."""
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 300), node_env(c, i), "node%d" % i)
             for i in range(2)]
    wait_progress(nodes, 30, 90, "training on 2 nodes")
    old = wait_for_workers(nodes[0])
    nodes[1].kill()
    netns.wait_for(lambda: not nodes[0].worker_pids(), 60,
                   "the survivor to stop its worker below MIN")
    before = latest_round(nodes)
    nodes.append(c.start(2, node_argv(c, 2, ckpt, "2:3", 300), node_env(c, 2), "node2"))
    wait_new_attempt([nodes[0], nodes[2]], before, 2, 60)
    assert nodes[0].worker_pids() not in ([], old)
    assert "resumed from" in all_out([nodes[0], nodes[2]])
    assert_finished([nodes[0], nodes[2]])
    assert_one_job([nodes[0], nodes[2]], 2)


def test_a_node_lost_without_shared_storage_resumes_from_a_survivors_memory(cluster, tmp_path):
    """No checkpoint directory at all: every node keeps the newest snapshot in its own
    memory (the agent's snapshot directory). A node is SIGKILLed below --nnodes MIN; its
    replacement, which has nothing, resumes at the survivor's snapshot, sent by broadcast:
    the job goes on from that step, not from step 0."""
    c = cluster(3)

    def argv(i):
        a = node_argv(c, i, "", "2:3", 300)
        k = a.index("--checkpoint-dir")
        return a[:k] + a[k + 2:]

    nodes = [c.start(i, argv(i), node_env(c, i), "node%d" % i) for i in range(2)]
    wait_progress(nodes, 30, 90, "training on 2 nodes")
    nodes[1].kill()
    netns.wait_for(lambda: not nodes[0].worker_pids(), 60,
                   "the survivor to stop its worker below MIN")
    before = latest_round(nodes)
    nodes.append(c.start(2, argv(2), node_env(c, 2), "node2"))
    wait_new_attempt([nodes[0], nodes[2]], before, 2, 60)
    assert_finished([nodes[0], nodes[2]])
    out = all_out([nodes[0], nodes[2]])
    m = re.search(r"resumed from the node's memory \(.*\) at step (\d+) ", nodes[0].stdout)
    assert m and int(m.group(1)) >= 30, out[-3000:]
    assert re.search(r"training state of step %s sent by rank \d .* did not hold a copy as new"
                     % m.group(1), out), out[-3000:]
    assert "resumed from" not in nodes[2].stdout, nodes[2].stdout[-3000:]
    assert_one_job([nodes[0], nodes[2]], 2)


def test_second_loss_during_reconfiguration(cluster, tmp_path):
    """A node is lost while the group re-forms after a first loss: the survivor abandons
    the group that cannot form and re-forms again, alone (--nnodes 1:3), same process."""
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    nodes = [c.start(i, node_argv(c, i, ckpt, "1:3", 300), node_env(c, i), "node%d" % i)
             for i in range(3)]
    wait_progress(nodes, 30, 90, "training on 3 nodes")
    pid = wait_for_workers(nodes[0])
    # Node 2's worker freezes, so the next group cannot form before node 2 is lost too.
    for w in nodes[2].worker_pids():
        os.kill(w, signal.SIGSTOP)
    nodes[1].kill()
    netns.wait_for(lambda: "keeping the workers, world size 2" in nodes[0].stderr, 60,
                   "the survivors to re-form as 2")
    t_fault = time.monotonic()
    nodes[2].kill()
    netns.wait_for(lambda: "[rank0]: rank 0 of 1: transport self" in nodes[0].stdout, 60,
                   "the survivor to re-form alone")
    print("\nsecond loss during a reconfiguration -> survivor re-formed alone: %.2f s "
          "(dead-node timeout 3 s)" % (time.monotonic() - t_fault))
    nodes[0].wait(JOB_TIMEOUT)
    out = nodes[0].stdout
    assert "[rank0]: rank 0 of 1: transport self" in out, out[-3000:]
    assert nodes[0].p.returncode == 0, nodes[0].describe()
    assert "restarting the workers" not in nodes[0].stderr, nodes[0].describe()
    assert re.search(r"rank 0: re-formed live in \d+ ms at step \d+ \(pid %d\)" % pid[0],
                     out), out[-3000:]
    assert_one_job(nodes[:1], 1)


def test_hung_survivor_falls_back_to_restart(cluster, tmp_path):
    """A survivor's worker that does not re-form (frozen) within COHORT_RECONFIG_TIMEOUT:
    the agents restart the group from the checkpoint, as without live reconfiguration."""
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    env = lambda i: dict(node_env(c, i), COHORT_RECONFIG_TIMEOUT="4")  # noqa: E731
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 300), env(i), "node%d" % i)
             for i in range(3)]
    wait_progress(nodes, 30, 90, "training on 3 nodes")
    old = wait_for_workers(nodes[0])
    for w in nodes[2].worker_pids():
        os.kill(w, signal.SIGSTOP)
    before = latest_round(nodes)
    nodes[1].kill()
    survivors = [nodes[0], nodes[2]]
    wait_new_attempt(survivors, before, 2, 90)
    errs = "".join(p.stderr for p in survivors)
    assert "did not re-form in round" in errs, errs[-3000:]
    assert nodes[0].worker_pids() not in ([], old), "the group was not restarted"
    assert_finished(survivors)
    assert_one_job(survivors, 2)


def test_a_script_without_support_is_restarted_after_a_node_loss(cluster, tmp_path):
    """A torchrun-style script (gloo, no cohort_torch.live) never declares that it re-forms
    in place: after a node loss the survivors' workers are restarted and resume from the
    checkpoint, as under torchrun."""
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    script = REPO / "tests/e2e/ddp_train.py"
    nodes = []
    for i in range(3):
        argv = node_argv(c, i, ckpt, "2:3", 0)
        argv[argv.index("--") + 1:] = [str(script), "--steps", "300", "--ckpt-dir", str(ckpt),
                                       "--step-sleep", "0.02"]
        env = dict(node_env(c, i), COHORT_PYTHON="/usr/bin/python3", GLOO_SOCKET_IFNAME="eth0")
        nodes.append(c.start(i, argv, env, "node%d" % i))
    netns.wait_for(lambda: re.search(r"step [2-9]\d loss", all_out(nodes)), 120,
                   "the script training on 3 nodes")
    nodes[2].kill()
    for p in nodes[:2]:
        assert p.wait(JOB_TIMEOUT) == 0, p.describe()
    out, err = all_out(nodes[:2]), "".join(p.stderr for p in nodes[:2])
    assert "restarting the workers" in err, err[-3000:]
    assert "keeping the workers" not in err, err[-3000:]
    assert re.search(r"resumed at step \d+ \(restart [1-9]", out), out[-3000:]
    assert "final_loss" in out


def test_killing_the_store_host_is_a_clear_error(cluster, tmp_path):
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 100000), node_env(c, i), "node%d" % i)
             for i in range(3)]
    wait_progress(nodes, 30, 90, "training on 3 nodes")
    t_fault = time.monotonic()
    nodes[0].kill()
    for p in nodes[1:]:
        rc = p.wait(60)
        assert rc != 0, p.describe()
        assert "store" in p.stderr, p.describe()
        print("\n" + p.name + ": " + p.stderr.strip().splitlines()[-1])
    print("\nnodes stopped %.2f s after the store host died" % (time.monotonic() - t_fault))


def test_cut_link_then_heal(cluster, tmp_path):
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 800), node_env(c, i), "node%d" % i)
             for i in range(3)]
    wait_progress(nodes, 50, 90, "training on 3 nodes")
    before = latest_round(nodes)
    t_fault = time.monotonic()
    c.cut(2)
    wait_new_attempt(nodes[:2], before, 2, 90)
    print("\nrecovery after cutting a node's link: %.2f s" % (time.monotonic() - t_fault))
    c.heal(2)
    rc = nodes[2].wait(JOB_TIMEOUT)
    assert_finished(nodes[:2], nodes)
    # The cut node either rejoined and finished, or stopped with an error that says why.
    assert rc == 0 or re.search(r"store|rendezvous|rank", nodes[2].stderr), nodes[2].describe()
    print("cut node: exit %d; %s" % (rc, (nodes[2].stderr.strip().splitlines() or [""])[-1]))


ETCD = netns.ETCD
start_etcd = netns.start_etcd
etcd_leader = netns.etcd_leader


@pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server not installed")
def test_etcd_leader_killed_job_goes_on(cluster, tmp_path):
    c = cluster(3)
    start_etcd(c, 3)
    leader = netns.wait_for(lambda: etcd_leader(c, 3) is not None and (etcd_leader(c, 3),),
                            30, "an etcd leader")[0]
    ckpt = tmp_path / "ckpt"
    endpoints = ",".join("%s:2379" % c.addr(i) for i in range(3))
    nodes = []
    for i in range(3):
        argv = node_argv(c, i, ckpt, "2:3", 700)
        at = argv.index("--rdzv-endpoint")
        argv[at + 1] = endpoints
        argv[at:at] = ["--rdzv-backend", "etcd"]
        nodes.append(c.start(i, argv, node_env(c, i), "node%d" % i))
    wait_progress(nodes, 50, 90, "training on 3 nodes over etcd")
    assert latest_world(nodes) == 3, "the nodes did not form one job of 3 ranks"
    t_fault = time.monotonic()
    etcd_procs = [p for p in c.procs if p.name.startswith("etcd")]
    etcd_procs[leader].kill()
    new_leader = netns.wait_for(lambda: (etcd_leader(c, 3),) if etcd_leader(c, 3) not in
                                (None, leader) else None, 30, "a new etcd leader")[0]
    print("\netcd leader e%d killed; e%d elected after %.2f s" % (
        leader, new_leader, time.monotonic() - t_fault))
    assert_finished(nodes)
    restarts = sum(p.stderr.count("restarting the workers") for p in nodes)
    print("worker-group restarts caused by the leader loss: %d" % restarts)
