"""The slurm backend against a real Slurm 22.05 with 3 fake nodes on this machine
(slurm_cluster.py), driven through the cohort CLI like a user would:

- a 3-node data-parallel training job (cohort-train, MLP on synthetic data): one agent on
  each node, the rendezvous store on the first, the job succeeds and `cohort logs` shows it;
- cancelling a long job: the state becomes cancelled and no process of it is left;
- a job array 0-3 with at most 2 elements at once, element 2 failing: the others succeed
  and the status lists every element;
- a spec Slurm cannot run is refused with the problem named, nothing submitted.

Every wait polls with a deadline. Skipped when not root or Slurm is not installed.
"""
import re

import pytest

import e2e_util
import slurm_cluster
from slurm_jobs import describe, train_bin

JOB_TIMEOUT = 240


def field(scontrol_line, key):
    m = re.search(r"(?:^| )%s=(\S*)" % re.escape(key), scontrol_line)
    return m.group(1) if m else None


def test_three_node_training_job(jobs, slurm, marker):
    train = train_bin()
    if not train.exists():
        pytest.skip("cohort-train not built: %s (COHORT_BUILD_TRAIN=OFF?)" % train)
    spec = jobs.spec("train.yaml", """\
        name: ddp3
        entrypoint: %s
        args: [--dataset, synthetic, --model, mlp, --max-steps, "20", --log-every, "10",
               --tag, %s]
        nnodes: 3
        nproc_per_node: 1
        rdzv: {port: %d}
        """ % (train, marker, e2e_util.free_port()))
    r, job = jobs.submit(spec, "--wait", timeout=JOB_TIMEOUT)
    assert r.returncode == 0, describe(r) + slurm.describe()
    sid = job["backend_id"]
    assert job["backend"] == "slurm" and sid.isdigit(), job

    st = jobs.status(job["id"])
    assert st["state"] == "succeeded" and st["exit_code"] == 0, st

    # Slurm ran it on all three nodes, one task (one cohort agent) per node.
    line = jobs.scontrol_job(sid)
    assert field(line, "JobState") == "COMPLETED", line
    assert field(line, "NodeList") == "n[1-3]", line
    assert field(line, "NumNodes") == "3", line
    for node in slurm.nodes:
        assert "launch task StepId=%s.0 " % sid in slurm.log("slurmd-" + node), (
            "no agent started on %s\n%s" % (node, slurm.describe()))

    # Every node's agent started its worker: ranks 0..2 each have their log directory.
    ranks = jobs.home / "logs" / str(job["id"]) / "job" / "ranks" / sid / "attempt_0"
    assert sorted(p.name for p in ranks.iterdir()) == ["0", "1", "2"], list(ranks.iterdir())

    logs = jobs.run("logs", job["id"])
    assert logs.returncode == 0, describe(logs)
    assert "with 3 worker(s)" in logs.stdout, logs.stdout
    assert "done: 20 steps" in logs.stdout, logs.stdout
    rank0 = jobs.run("logs", job["id"], "--rank", "0")
    assert rank0.returncode == 0 and "test_accuracy" in rank0.stdout, describe(rank0)

    listed = jobs.run("list")
    assert listed.returncode == 0, describe(listed)
    assert re.search(r"\b%s\s+ddp3\s+slurm\s+succeeded\b" % job["id"], listed.stdout), (
        listed.stdout)
    assert not e2e_util.marker_pids(marker)


def test_cancel_leaves_no_process(jobs, slurm, marker):
    spec = jobs.spec("sleep.yaml", """\
        name: sleeper
        entrypoint: /bin/sh
        args: [-c, "sleep 600", %s]
        nnodes: 2
        rdzv: {port: %d}
        """ % (marker, e2e_util.free_port()))
    r, job = jobs.submit(spec)
    assert r.returncode == 0, describe(r)

    # Running, with the worker of each of the two nodes started.
    def workers_up():
        st = jobs.status(job["id"])
        assert st["state"] in ("pending", "running"), st
        workers = [p for p in e2e_util.marker_pids(marker) if p[1].startswith("/bin/sh -c sleep 600")]
        return st["state"] == "running" and len(workers) == 2

    slurm_cluster.wait_for(workers_up, JOB_TIMEOUT,
                           lambda: "both workers of job %s\n%s" % (job["id"], slurm.describe()))

    c = jobs.run("cancel", job["id"], timeout=JOB_TIMEOUT)
    assert c.returncode == 0, describe(c)
    assert "job %s: cancelled" % job["id"] in c.stdout, describe(c)
    st = jobs.status(job["id"])
    assert st["state"] == "cancelled", st
    assert field(jobs.scontrol_job(job["backend_id"]), "JobState") == "CANCELLED"

    # slurmstepd signals the job's processes and SIGKILLs what is left after KillWait (5 s).
    slurm_cluster.wait_for(lambda: not e2e_util.marker_pids(marker), 60,
                           lambda: "the cancelled job's processes to end: %s" % e2e_util.marker_pids(marker))

    # Cancelling again is refused: the job already ended.
    again = jobs.run("cancel", job["id"])
    assert again.returncode != 0 and "already" in again.stderr, describe(again)


def test_array_with_a_failing_element(jobs, slurm):
    spec = jobs.spec("sweep.yaml", """\
        name: sweep
        entrypoint: /bin/sh
        args:
          - -c
          - echo "element $COHORT_ARRAY_INDEX of $COHORT_ARRAY_SIZE"; test $COHORT_ARRAY_INDEX != 2
        array: {range: "0-3", concurrency: 2}
        """)
    r, job = jobs.submit(spec, "--wait", timeout=JOB_TIMEOUT)
    assert r.returncode == 1, describe(r)  # failed: one element failed
    assert job["array_size"] == 4, job

    st = jobs.status(job["id"])
    assert st["state"] == "failed", st
    states = {e["index"]: (e["state"], e["exit_code"]) for e in st["elements"]}
    assert states == {0: ("succeeded", 0), 1: ("succeeded", 0), 2: ("failed", 1),
                      3: ("succeeded", 0)}, st["elements"]
    assert "element 2 failed" in st["detail"], st

    text = jobs.run("status", job["id"])
    assert text.returncode == 0, describe(text)
    assert "elements: 4 (1 failed, 3 succeeded)" in text.stdout, text.stdout

    # One Slurm array with the throttle, every task under the array job id.
    out = jobs.scontrol_job(job["backend_id"])
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 4, out
    for ln in lines:
        assert field(ln, "ArrayJobId") == job["backend_id"], ln
        assert field(ln, "ArrayTaskThrottle") == "2", ln

    for i in range(4):
        logs = jobs.run("logs", job["id"], "--element", i)
        assert logs.returncode == 0, describe(logs)
        assert "element %d of 4" % i in logs.stdout, logs.stdout
    whole = jobs.run("logs", job["id"])
    assert whole.returncode != 0 and "--element" in whole.stderr, describe(whole)


def test_cancel_one_element_of_an_array(jobs, slurm, marker):
    """`cohort cancel JOB --element 1`: scancel of that array task only; it ends cancelled
    with its processes gone, the other elements run to their end."""
    spec = jobs.spec("three.yaml", """\
        name: three
        entrypoint: /bin/sh
        args: [-c, 'if [ "$COHORT_ARRAY_INDEX" = 1 ]; then sleep 600; fi; echo "done $COHORT_ARRAY_INDEX"', %s]
        array: {range: "0-2"}
        """ % marker)
    r, job = jobs.submit(spec)
    assert r.returncode == 0, describe(r)
    slurm_cluster.wait_for(
        lambda: any(p[1].startswith("/bin/sh -c if") for p in e2e_util.marker_pids(marker)),
        JOB_TIMEOUT, lambda: "element 1 running\n%s" % slurm.describe())
    c = jobs.run("cancel", job["id"], "--element", 1, timeout=JOB_TIMEOUT)
    assert c.returncode == 0, describe(c)
    assert "job %s element 1: cancelled" % job["id"] in c.stdout, describe(c)
    slurm_cluster.wait_for(lambda: not e2e_util.marker_pids(marker), 60,
                           lambda: "element 1's processes to end: %s" % e2e_util.marker_pids(marker))
    w = jobs.run("status", job["id"], "--wait", timeout=JOB_TIMEOUT)
    st = jobs.status(job["id"])
    states = {e["index"]: e["state"] for e in st["elements"]}
    assert states == {0: "succeeded", 1: "cancelled", 2: "succeeded"}, (st, describe(w))
    assert "JobState=CANCELLED" in jobs.scontrol_job("%s_1" % job["backend_id"])


def test_spec_slurm_cannot_run_is_refused(jobs, slurm):
    spec = jobs.spec("big.yaml", """\
        name: toobig
        entrypoint: /bin/true
        nnodes: "2:4"
        resources: {cpu: 3, gpu: 1}
        """)
    r = jobs.run("submit", spec, "--backend", "slurm")
    assert r.returncode == 6, describe(r)  # invalid spec, nothing submitted
    for needle in ("nnodes: '2:4' asks for up to 4 nodes; partition 'debug' has 3",
                   "resources.cpu:", "resources.gpu:"):
        assert needle in r.stderr, describe(r)
    assert jobs.run("list", "--json").stdout.strip() in ("[]", ""), "a job was recorded"

    # The same spec within the cluster's means renders as a script (--dry-run).
    ok = jobs.spec("ok.yaml", """\
        name: fits
        entrypoint: /bin/true
        nnodes: "2:3"
        """)
    d = jobs.run("submit", ok, "--backend", "slurm", "--dry-run")
    assert d.returncode == 0, describe(d)
    assert "#SBATCH --nodes=2-3" in d.stdout and "--nnodes 2:3" in d.stdout, d.stdout
