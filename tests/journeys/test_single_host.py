"""Journey: one machine, every way a user can type the rendezvous flags.

A user with one machine tries `cohort run` with each backend flag they know from torchrun
(`--standalone`, `--rdzv-backend c10d|static|etcd`, with and without an endpoint), with one
agent of two workers or two agents of one worker each (as two terminals would), with a
standalone `cohort store`, and with etcd behind TLS client certificates or a password.
Whatever they typed, the two workers must form ONE job of two ranks: every rank reports
world size 2 in the same rendezvous round, and the final parameters of both ranks have the
same digest as a reference two-rank run (same seed, same world size: cohort-train is
deterministic and bit-identical across transports for two ranks).

And one fault on etcd: a round's end claimed by a node that died before writing it (the
claim put with etcdctl) is taken over after the layout grace; the job restarts once and
finishes, with cohort-train and with a PyTorch script (examples/fashion_ddp.py).
"""
import os
import re
import signal
import subprocess
import uuid

import pytest

import journey_util as J

STEPS = 30
TIMEOUT = 120


def run_job(procs, tmp_path, name, agents, env=None):
    """Starts one `cohort run` per entry of `agents` (its extra flags), waits for all and
    returns their combined stdout."""
    ckpt = tmp_path / ("ckpt-" + name)
    started = []
    for i, flags in enumerate(agents):
        argv = [J.BIN, "run", *flags, "--", *J.train_args(ckpt, STEPS, tag=name)]
        started.append(procs.start(argv, env=J.job_env(**(env or {})), name="%s-%d" % (name, i)))
    for p in started:
        rc = p.wait(TIMEOUT)
        assert rc == 0, J.describe(started)
    return "".join(p.stdout for p in started), started


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The digest of the plainest two-rank run: `cohort run --nproc-per-node 2`."""
    if not J.BIN.exists() or not J.TRAIN.exists():
        pytest.skip("not built")
    tmp = tmp_path_factory.mktemp("reference")
    tracker = J.Processes(tmp)
    try:
        out, _ = run_job(tracker, tmp, "reference", [["--nproc-per-node", "2"]])
    finally:
        tracker.close()
    d = J.digests(out)
    assert sorted(d) == [0, 1] and d[0] == d[1], out
    return d[0]


def assert_one_job_of_two(out, reference, what):
    rnd = J.complete_round(out, 2)
    assert rnd is not None, "%s: the ranks did not report one world of 2:\n%s" % (what, out)
    d = J.digests(out)
    assert sorted(d) == [0, 1], "%s: expected a digest from ranks 0 and 1:\n%s" % (what, out)
    assert d[0] == d[1] == reference, (
        "%s: digests %s differ from the reference two-rank run %s" % (what, d, reference))


def ep():
    return "127.0.0.1:%d" % J.e2e_util.free_port()


ONE_AGENT = {
    "default": lambda: [],
    "standalone": lambda: ["--standalone"],
    "c10d": lambda: ["--rdzv-backend", "c10d"],
    "c10d-endpoint": lambda: ["--rdzv-backend", "c10d", "--rdzv-endpoint", ep()],
    "static-endpoint": lambda: ["--rdzv-backend", "static", "--rdzv-endpoint", ep(),
                                "--nnodes", "1"],
    "standalone-overrides-etcd": lambda: ["--standalone", "--rdzv-backend", "etcd",
                                          "--rdzv-endpoint", "127.0.0.1:9"],
}


@pytest.mark.parametrize("case", sorted(ONE_AGENT))
def test_one_agent_two_workers(case, procs, tmp_path, reference):
    out, _ = run_job(procs, tmp_path, case, [["--nproc-per-node", "2", *ONE_AGENT[case]()]])
    assert_one_job_of_two(out, reference, case)


def test_one_agent_on_etcd(procs, tmp_path, reference, etcd_factory):
    etcd = etcd_factory()
    flags = ["--nproc-per-node", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint",
             etcd.endpoint, "--rdzv-id", "j" + uuid.uuid4().hex[:8]]
    out, _ = run_job(procs, tmp_path, "etcd-one", [flags])
    assert_one_job_of_two(out, reference, "etcd, one agent")


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_two_agents_on_the_embedded_store(backend, procs, tmp_path, reference):
    endpoint = ep()
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend,
             "--rdzv-endpoint", endpoint, "--rdzv-id", "j" + uuid.uuid4().hex[:8]]
    out, _ = run_job(procs, tmp_path, "two-" + backend, [flags, flags],
                     env={"COHORT_TOKEN": uuid.uuid4().hex})
    assert_one_job_of_two(out, reference, "two agents, %s" % backend)


def test_two_agents_on_a_standalone_store(procs, tmp_path, reference):
    token = uuid.uuid4().hex
    port = J.e2e_util.free_port()
    store = procs.start([J.BIN, "store", "--host", "127.0.0.1", "--port", port],
                        env=J.job_env(COHORT_TOKEN=token), name="store")
    J.wait_until(lambda: J.e2e_util.port_listening(port) or store.poll() is not None, 30,
                 "the store listening")
    assert store.poll() is None, store.describe()
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
             "127.0.0.1:%d" % port, "--rdzv-id", "j" + uuid.uuid4().hex[:8],
             "--rdzv-conf", "is_host=false"]
    out, _ = run_job(procs, tmp_path, "store", [flags, flags], env={"COHORT_TOKEN": token})
    assert_one_job_of_two(out, reference, "two agents, standalone cohort store")
    assert store.poll() is None, "the standalone store must outlive the job"


@pytest.mark.parametrize("security", ["plain", "tls", "auth"])
def test_two_agents_on_etcd(security, procs, tmp_path, reference, etcd_factory):
    """The defect this journey was written for: two agents joined through etcd used to run
    their workers as two separate one-rank jobs."""
    etcd = etcd_factory(tls=security == "tls", auth=security == "auth")
    rdzv_id = "j" + uuid.uuid4().hex[:8]
    store_flags = ["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint, "--rdzv-id",
                   rdzv_id]
    if etcd.rdzv_conf():
        store_flags += ["--rdzv-conf", etcd.rdzv_conf()]
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--metrics-port", "0", *store_flags]
    out, _ = run_job(procs, tmp_path, "etcd-" + security, [flags, flags], env=etcd.env())
    assert_one_job_of_two(out, reference, "two agents on etcd (%s)" % security)
    # The job's directory in etcd (same TLS / auth): both agents published their endpoint and
    # recorded that they succeeded.
    top = subprocess.run([str(J.BIN), "top", "--once", *store_flags], capture_output=True,
                         text=True, timeout=60, env=J.job_env(**etcd.env()))
    assert top.returncode == 0, top.stderr
    assert "nodes 2 (running 0, lost 0, unreachable 0, finished 2, failed 0)" in top.stdout, \
        top.stdout


def test_an_end_claimed_by_a_node_that_died_is_taken_over(procs, tmp_path, etcd_factory):
    """A node that claims the end of a round and dies before writing it leaves its claim in
    etcd (put here with etcdctl, as such a node leaves it). The job must not wait on it for
    ever: two agents on etcd train (`--rdzv-conf layout_grace=2`), the claim of their round
    is put, and one worker is SIGKILLed. Its agent loses the claim, waits the layout grace
    for the end, takes it over and ends the round; both agents restart their workers from
    the checkpoint (one restart, counted once) and the job finishes as one job of two ranks
    with equal digests."""
    etcd = etcd_factory()
    rdzv_id = "j" + uuid.uuid4().hex[:8]
    ckpt = tmp_path / "ckpt"
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3",
             "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint, "--rdzv-id", rdzv_id,
             "--rdzv-conf", "layout_grace=2"]
    agents = [procs.start([J.BIN, "run", *flags, "--", *J.train_args(ckpt, 1000)],
                          name="agent%d" % i) for i in range(2)]
    out = lambda: "".join(p.stdout for p in agents)  # noqa: E731
    try:
        J.wait_until(lambda: J.complete_round(out(), 2) is not None and J.max_step(out()) >= 20,
                     TIMEOUT, "one job of two training")
    except AssertionError as e:
        raise AssertionError("%s\n%s" % (e, J.describe(agents)))
    rnd = J.complete_round(out(), 2)
    key = "/cohort/%s/rdzv/%s/r%d/ended_by" % (rdzv_id, rdzv_id, rnd)
    put = etcd.ctl("put", key, "dead:node 7 (a node that died)#0dead0")
    assert put.returncode == 0, put.stderr
    workers = [pid for pid, cmd in J.e2e_util.marker_pids(str(ckpt))
               if cmd.startswith(str(J.TRAIN))]
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    for p in agents:
        assert p.wait(TIMEOUT) == 0, J.describe(agents)
    err = "".join(p.stderr for p in agents)
    assert "wrote no `next` within the layout grace of 2 s; this node ends the round in " \
        "its place" in err, err[-4000:]
    text = out()
    after = J.complete_round(text, 2, after=rnd)
    assert after is not None, text[-4000:]
    d = J.digests(text)
    assert sorted(d) == [0, 1] and d[0] == d[1], d
    restarts = etcd.ctl("get", "--print-value-only", "/cohort/%s/rdzv/%s/restarts" % (
        rdzv_id, rdzv_id))
    assert restarts.stdout.strip() == "1@%d" % rnd, restarts.stdout


def test_a_pytorch_script_goes_on_after_a_stale_end_claim_is_taken_over(procs, tmp_path,
                                                                         etcd_factory):
    """The same fault with the user's own PyTorch script (examples/fashion_ddp.py: DDP on
    gloo, Fashion-MNIST, a checkpoint each epoch): two agents on etcd, the stale claim put
    once both workers train in one round of two, one worker SIGKILLed. The round is taken
    over after the layout grace, both agents restart their workers (restart 1, counted once
    in etcd) and the script resumes from its checkpoint; then the other node's worker is
    SIGKILLed in the round the takeover made (a second loss, as a long job meets): restart
    2, and both ranks end with equal parameters."""
    etcd = etcd_factory()
    rdzv_id = "j" + uuid.uuid4().hex[:8]
    ckpt = tmp_path / "fashion.pt"
    script = [J.REPO / "examples" / "fashion_ddp.py", "--epochs", "8", "--limit", "2000",
              "--batch", "16", "--ckpt", ckpt, "--step-sleep", "0.01"]
    # --no-preload: each worker execs the script itself, so that the test finds it by its
    # environment (a worker forked by the warm interpreter shows the interpreter's).
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3",
             "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint, "--rdzv-id", rdzv_id,
             "--rdzv-conf", "layout_grace=2", "--no-preload"]
    agents = [procs.start([J.BIN, "run", *flags, "--", *script], name="agent%d" % i)
              for i in range(2)]
    workers = {}

    def training(after):  # both ranks of one round of two after `after`, a checkpoint written
        workers.clear()
        workers.update(J.workers_of(rdzv_id))
        rounds = {int(e.get("COHORT_ROUND", -1)) for e in workers.values()}
        return ckpt.exists() and len(workers) == 2 and len(rounds) == 1 and \
            rounds.pop() > after and {e.get("WORLD_SIZE") for e in workers.values()} == {"2"}

    def kill_one_in_a_round_after(after, pick):
        try:
            J.wait_until(lambda: training(after), TIMEOUT, "one job of two training")
        except AssertionError as e:
            raise AssertionError("%s\n%s" % (e, J.describe(agents)))
        now = int(next(iter(workers.values()))["COHORT_ROUND"])
        return now, pick(workers)
    rnd, victim = kill_one_in_a_round_after(-1, min)
    key = "/cohort/%s/rdzv/%s/r%d/ended_by" % (rdzv_id, rdzv_id, rnd)
    put = etcd.ctl("put", key, "dead:node 7 (a node that died)#0dead0")
    assert put.returncode == 0, put.stderr
    os.kill(victim, signal.SIGKILL)
    rnd2, victim = kill_one_in_a_round_after(rnd, max)
    os.kill(victim, signal.SIGKILL)
    for p in agents:
        assert p.wait(TIMEOUT) == 0, J.describe(agents)
    err = "".join(p.stderr for p in agents)
    assert "wrote no `next` within the layout grace of 2 s; this node ends the round in " \
        "its place" in err, err[-4000:]
    restarted = [int(r) for r in re.findall(
        r"round (\d+): restarting the workers \(restart 1 of 3\), world size 2", err)]
    assert len(restarted) == 2 and restarted[0] == restarted[1] == rnd2 > rnd, err[-4000:]
    again = [int(r) for r in re.findall(
        r"round (\d+): restarting the workers \(restart 2 of 3\), world size 2", err)]
    assert len(again) == 2 and again[0] == again[1] > rnd2, err[-4000:]
    text = "".join(p.stdout for p in agents)
    d = dict(re.findall(r"^\[rank\d+\]: rank (\d) digest ([0-9a-f]{8})$", text, re.M))
    assert sorted(d) == ["0", "1"] and d["0"] == d["1"], text[-4000:]
    assert "epoch 7 loss" in text, text[-4000:]
    restarts = etcd.ctl("get", "--print-value-only", "/cohort/%s/rdzv/%s/restarts" % (
        rdzv_id, rdzv_id))
    assert restarts.stdout.strip() == "2@%d" % rnd2, restarts.stdout
