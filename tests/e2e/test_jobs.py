"""End-to-end tests of `cohort submit | status | logs | cancel | list` on the local backend:
job history in SQLite across commands, arrays (range, CSV, SQLite, a real PostgreSQL started
here), cancellation without leftovers, a runner killed outright, and bad input that is
listed in full with nothing submitted.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import pytest

import e2e_util as U


class Jobs:
    """Runs cohort job commands against a private COHORT_HOME."""

    def __init__(self, cohort, tmp_path):
        self.cohort = cohort
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.env = U.clean_env(COHORT_HOME=self.home)

    def spec(self, name, text):
        p = self.dir / name
        p.write_text(textwrap.dedent(text))
        return p

    def run(self, *args, timeout=120, cwd=None):
        return subprocess.run([self.cohort, *map(str, args)], env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=cwd)

    def status(self, job):
        r = self.run("status", job, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def history(self):
        r = self.run("list", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def jobs(cohort, tmp_path):
    return Jobs(cohort, tmp_path)


def test_submit_wait_status_logs_list(jobs):
    spec = jobs.spec("hello.yaml", """\
        name: hello
        entrypoint: /bin/sh
        args: [-c, 'echo "hello from rank $RANK of $WORLD_SIZE, GREETING=$GREETING"']
        nproc_per_node: 2
        env: {GREETING: hi}
        """)
    r = jobs.run("submit", spec, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "succeeded" in r.stdout
    # A later command (the submitter is gone) reads the history.
    st = jobs.status("hello")
    assert st["state"] == "succeeded" and st["exit_code"] == 0, st
    assert st["started_at"] > 0 and st["ended_at"] >= st["started_at"]
    logs = jobs.run("logs", st["id"])
    assert logs.returncode == 0, logs.stderr
    assert "hello from rank 0 of 2, GREETING=hi" in logs.stdout
    assert "hello from rank 1 of 2, GREETING=hi" in logs.stdout
    rank1 = jobs.run("logs", st["id"], "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    assert "hello from rank 1 of 2" in rank1.stdout and "rank 0" not in rank1.stdout
    text = jobs.run("status", st["id"])
    assert "succeeded" in text.stdout and str(st["log_dir"]) in text.stdout
    listed = jobs.run("list")
    assert listed.returncode == 0 and "hello" in listed.stdout and "succeeded" in listed.stdout
    assert (jobs.home / "jobs.db").exists()


def test_failed_job_names_the_rank_and_code(jobs):
    spec = jobs.spec("fail.yaml", """\
        name: fails
        entrypoint: /bin/sh
        args: [-c, 'if [ "$RANK" = 1 ]; then echo broken >&2; exit 3; fi']
        nproc_per_node: 2
        """)
    r = jobs.run("submit", spec, "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    st = jobs.status("fails")
    assert st["state"] == "failed" and st["exit_code"] == 1, st
    assert "rank 1" in st["detail"], st


def test_array_range_with_a_failing_element(jobs):
    marker = U.new_marker()
    spec = jobs.spec("arr.yaml", """\
        name: sweep
        entrypoint: /bin/sh
        args: [-c, 'echo "element $COHORT_ARRAY_INDEX task $COHORT_ARRAY_TASK_ID {m}"; test "$COHORT_ARRAY_INDEX" != 2']
        array: {{range: "10-13", concurrency: 2}}
        """.format(m=marker))
    r = jobs.run("submit", spec, "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    st = jobs.status("sweep")
    assert st["state"] == "failed" and st["array_size"] == 4, st
    states = {e["index"]: e["state"] for e in st["elements"]}
    assert states == {0: "succeeded", 1: "succeeded", 2: "failed", 3: "succeeded"}, st
    assert "1 of 4 elements failed" in st["detail"], st
    out = jobs.run("logs", st["id"], "--element", "3")
    assert "element 3 task 13" in out.stdout, out.stdout + out.stderr
    whole = jobs.run("logs", st["id"])
    assert whole.returncode == 2 and "--element" in whole.stderr
    assert U.marker_pids(marker) == []


def test_array_from_csv_manifest(jobs):
    manifest = jobs.dir / "regions.csv"
    manifest.write_text('REGION,LR\nus-east,0.1\n"eu, west",0.2\n')
    spec = jobs.spec("csv.yaml", """\
        name: regions
        entrypoint: /bin/sh
        args: [-c, 'echo "region=$REGION lr=$LR index=$COHORT_ARRAY_INDEX"']
        array: {manifest: regions.csv}
        """)
    r = jobs.run("submit", spec, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    st = jobs.status("regions")
    assert [e["state"] for e in st["elements"]] == ["succeeded", "succeeded"]
    out = jobs.run("logs", st["id"], "--element", "1").stdout
    assert "region=eu, west lr=0.2 index=1" in out, out


def test_cancel_stops_every_process(jobs):
    marker = U.new_marker()
    spec = jobs.spec("long.yaml", """\
        name: long
        entrypoint: /bin/sh
        args: [-c, 'echo started; sleep 600; true', {m}]
        nproc_per_node: 2
        """.format(m=marker))
    r = jobs.run("submit", spec)
    assert r.returncode == 0, r.stderr
    job_id = jobs.history()[0]["id"]
    U.wait_for(lambda: len(U.marker_pids(marker)) >= 2, 30, what="workers running")
    assert jobs.status(job_id)["state"] == "running"
    c = jobs.run("cancel", job_id)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "cancelled" in c.stdout
    U.wait_for(lambda: U.marker_pids(marker) == [], 10, what="workers gone")
    assert jobs.status(job_id)["state"] == "cancelled"
    again = jobs.run("cancel", job_id)
    assert again.returncode == 3 and "already ended" in again.stderr


def test_killed_runner_is_reported_lost_and_leaves_nothing(jobs):
    marker = U.new_marker()
    spec = jobs.spec("lost.yaml", """\
        name: lost
        entrypoint: /bin/sh
        args: [-c, 'sleep 600; true', {m}]
        """.format(m=marker))
    assert jobs.run("submit", spec).returncode == 0
    st = jobs.history()[0]
    U.wait_for(lambda: U.marker_pids(marker), 30, what="worker running")
    runner_pid = int(st["backend_id"].split(":")[0])
    os.kill(runner_pid, signal.SIGKILL)
    U.wait_for(lambda: U.marker_pids(marker) == [], 15, what="worker gone with its runner")
    now = jobs.status(st["id"])
    assert now["state"] == "lost", now
    assert "runner" in now["detail"]


def test_bad_specs_list_every_problem_and_submit_nothing(jobs):
    bad = jobs.spec("bad.yaml", """\
        name: Bad_Name
        entrypoint: ""
        nnodes: "3:1"
        nproc_per_node: 0
        resources: {memory: lots}
        mounts: [{volume: data, path: /data}]
        """)
    r = jobs.run("submit", bad)
    assert r.returncode == 6, r.stdout + r.stderr
    for fragment in ["name:", "entrypoint:", "nnodes:", "nproc_per_node:", "resources.memory:",
                     "mounts[0].volume:", "nothing was submitted"]:
        assert fragment in r.stderr, (fragment, r.stderr)

    impossible = jobs.spec("impossible.yaml", """\
        name: huge
        entrypoint: no-such-program-{m}
        resources: {{cpu: 4096, memory: 900Ti, gpu: 8}}
        volumes: [{{name: data, host_path: /no/such/dir}}]
        mounts: [{{volume: data, path: /no/such/dir}}]
        """.format(m=U.new_marker()))
    r = jobs.run("submit", impossible)
    assert r.returncode == 6, r.stdout + r.stderr
    for fragment in ["entrypoint: 'no-such-program", "resources.cpu:", "resources.memory:",
                     "resources.gpu:", "volumes[0].host_path:"]:
        assert fragment in r.stderr, (fragment, r.stderr)

    missing = jobs.run("submit", jobs.dir / "nope.yaml")
    assert missing.returncode == 6 and "nope.yaml" in missing.stderr

    ok = jobs.spec("ok.yaml", "name: ok\nentrypoint: /bin/true\n")
    both = jobs.run("submit", ok, "--array", "0-3", "--array-manifest", "x.csv")
    assert both.returncode == 6 and "only one" in both.stderr
    unknown = jobs.run("submit", ok, "--backend", "mesos")
    assert unknown.returncode == 2 and "unknown backend" in unknown.stderr
    assert jobs.history() == []
    assert jobs.run("status", "12345").returncode == 8


def test_dry_run_prints_the_commands(jobs):
    spec = jobs.spec("dry.yaml", "name: dry\nentrypoint: /bin/echo\nargs: [a b]\nnproc_per_node: 3\n")
    r = jobs.run("submit", spec, "--dry-run", "--array", "0-1")
    assert r.returncode == 0, r.stderr
    assert "--nproc-per-node 3" in r.stdout and "'a b'" in r.stdout
    assert "COHORT_ARRAY_INDEX=1" in r.stdout
    assert jobs.history() == []


def test_a_set_value_is_one_value_never_a_new_field(jobs):
    """A --set value lands in the field that names it, whatever it holds: before, the text
    was pasted into the YAML and "1\nmax_restarts: 50" added a field."""
    spec = jobs.spec("tpl.yaml", 'name: tpl\nentrypoint: /bin/echo\nargs: ["{{params.lr}}"]\n'
                                 'max_restarts: 0\n')
    r = jobs.run("submit", spec, "--dry-run", "--set", "lr=0.1\nmax_restarts: 50")
    assert r.returncode == 0, r.stderr
    assert "--max-restarts 0" in r.stdout and "--max-restarts 50" not in r.stdout, r.stdout
    assert "max_restarts: 50" in r.stdout, r.stdout  # the argument, as one (quoted) word
    assert jobs.history() == []


@pytest.fixture
def postgres(postgres_server):
    """The server with a table of shards."""
    subprocess.run(["psql", postgres_server, "-v", "ON_ERROR_STOP=1", "-c",
                    "CREATE TABLE shards(name text, size int, split text);"
                    "INSERT INTO shards VALUES ('s0', 100, 'train'), ('s1', 200, 'train'),"
                    " ('s2', 50, 'test');"],
                   check=True, capture_output=True, timeout=60)
    return postgres_server


def test_array_from_postgresql_query(jobs, postgres):
    spec = jobs.spec("sql.yaml", """\
        name: shards
        entrypoint: /bin/sh
        args: [-c, 'echo "shard=$SHARD size=$SIZE"; test "$SHARD" != s1']
        """)
    r = jobs.run("submit", spec, "--wait", "--concurrency", "1", "--array-from-sql",
                 "SELECT name AS \"SHARD\", size AS \"SIZE\" FROM shards WHERE split = 'train' ORDER BY name",
                 "--db", postgres)
    assert r.returncode == 1, r.stdout + r.stderr  # element 1 (s1) fails on purpose
    st = jobs.status("shards")
    assert [e["state"] for e in st["elements"]] == ["succeeded", "failed"], st
    out = jobs.run("logs", st["id"], "--element", "0").stdout
    assert "shard=s0 size=100" in out, out

    bad = jobs.run("submit", spec, "--array-from-sql", "SELECT nme FROM shards", "--db", postgres)
    assert bad.returncode == 6, bad.stdout + bad.stderr
    assert "array.from_sql (character 8)" in bad.stderr and "nme" in bad.stderr, bad.stderr
    write = jobs.run("submit", spec, "--array-from-sql", "DELETE FROM shards", "--db", postgres)
    assert write.returncode == 6, write.stderr
    rows = subprocess.run(["psql", postgres, "-tAc", "select count(*) from shards"],
                          capture_output=True, text=True)
    assert rows.stdout.strip() == "3"  # the read-only transaction refused the DELETE
    unreachable = jobs.run("submit", spec, "--array-from-sql", "SELECT 1 AS x", "--db",
                           "postgresql://postgres@127.0.0.1:%d/postgres" % U.free_port())
    assert unreachable.returncode == 6 and "cannot connect" in unreachable.stderr
    assert len(jobs.history()) == 1


def test_concurrent_submits_keep_every_result(jobs):
    """20 `cohort submit --wait` at once of a job that succeeds at once: every command exits
    0 and every row of the history ends `succeeded` (a submitter that wrote its stale copy
    of the row after the runner had recorded the end used to leave rows `pending`)."""
    spec = jobs.spec("quick.yaml", """\
        name: quick
        entrypoint: /bin/true
        """)
    procs = [subprocess.Popen([jobs.cohort, "submit", str(spec), "--wait"], env=jobs.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(20)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        results.append((p.returncode, out + err))
    failed = [text for rc, text in results if rc != 0]
    assert not failed, "%d of 20 submits failed:\n%s" % (len(failed), "\n".join(failed[:3]))
    rows = [j for j in jobs.history() if j["name"] == "quick"]
    assert len(rows) == 20, rows
    assert all(j["state"] == "succeeded" and j["exit_code"] == 0 for j in rows), rows


def test_submitted_job_serves_metrics(jobs):
    """`metrics: {port: 0}` in a spec: the job's agent serves Prometheus /metrics while the
    job runs (the URL is in its log); the job ends when the test lets it."""
    release = jobs.dir / "release"
    spec = jobs.spec("metrics.yaml", """\
        name: metered
        entrypoint: /bin/sh
        args: [-c, 'while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo released']
        nproc_per_node: 2
        env: {RELEASE: %s}
        metrics: {port: 0}
        """ % release)
    r = jobs.run("submit", spec)
    assert r.returncode == 0, r.stdout + r.stderr
    job = jobs.history()[0]
    log = Path(job["log_dir"]) / "job" / "output.log"
    url = []

    def served():
        text = log.read_text() if log.exists() else ""
        m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", text)
        if m:
            url.append(m.group(1))
        return bool(m)
    try:
        U.wait_for(served, 60, interval=0.1, what="the job's agent to print its metrics URL")
        body = []

        def both_ranks_up():
            body[:] = [urllib.request.urlopen(url[0], timeout=10).read().decode()]
            return all('cohort_agent_worker_up{rank="%d"} 1' % r in body[0] for r in (0, 1))
        # What a Prometheus scraping the job sees: both ranks of the job, running.
        U.wait_for(both_ranks_up, 60, interval=0.1, what="/metrics to show ranks 0 and 1 up")
        assert "cohort_agent_workers_running 2" in body[0], body[0][:3000]
        assert "# TYPE cohort_agent_worker_up gauge" in body[0], body[0][:3000]
    finally:
        release.write_text("")
    r = jobs.run("status", job["id"], "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    logs = jobs.run("logs", job["id"]).stdout
    assert "released" in logs, logs  # both ranks: one merged console line


def test_submit_without_its_companion_program_says_what_to_build(cohort, tmp_path):
    # The quickstart's first command builds only cohort and cohort-train: `cohort submit`
    # then names the missing program and how to build it (exit 127), and submits nothing.
    alone = tmp_path / "bin"
    alone.mkdir()
    shutil.copy2(cohort, alone / "cohort")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: alone\nentrypoint: /bin/true\n")
    home = tmp_path / "home"
    r = subprocess.run([alone / "cohort", "submit", spec], env=U.clean_env(COHORT_HOME=home),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 127, r.stderr
    assert "needs the program cohort-jobs" in r.stderr and "--target cohort-jobs" in r.stderr
    assert not home.exists() or not any(home.iterdir())


def test_an_array_flag_replaces_the_specs_array_as_a_whole(jobs):
    # Issue 37: the spec's manifest and columns were kept beside the command line's range;
    # the runner then refused the stored spec and left every element pending in a failed job.
    (jobs.dir / "m.csv").write_text("us\neu\n")
    spec = jobs.spec("over.yaml", """\
        name: over
        entrypoint: /bin/sh
        args: [-c, 'echo "element $COHORT_ARRAY_INDEX task $COHORT_ARRAY_TASK_ID"']
        array: {manifest: m.csv, columns: [REGION]}
        """)
    dry = jobs.run("submit", spec, "--array", "0-1", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    r = jobs.run("submit", spec, "--array", "0-1", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    st = jobs.status("over")
    assert st["state"] == "succeeded" and st["array_size"] == 2, st
    assert [e["state"] for e in st["elements"]] == ["succeeded", "succeeded"], st
    out = jobs.run("logs", st["id"], "--element", "1").stdout
    assert "element 1 task 1" in out, out
    # From SQL instead: the spec's columns do not come along either.
    db = jobs.dir / "shards.db"
    import sqlite3
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE shards (SHARD TEXT)")
        c.executemany("INSERT INTO shards VALUES (?)", [("a",), ("b",), ("c",)])
    spec2 = jobs.spec("over2.yaml", """\
        name: over2
        entrypoint: /bin/sh
        args: [-c, 'echo "shard $SHARD"']
        array: {manifest: m.csv, columns: [REGION]}
        """)
    r = jobs.run("submit", spec2, "--array-from-sql", "SELECT SHARD FROM shards ORDER BY SHARD",
                 "--db", "sqlite:///%s" % db, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    st = jobs.status("over2")
    assert [e["state"] for e in st["elements"]] == ["succeeded"] * 3, st
    assert "shard b" in jobs.run("logs", st["id"], "--element", "1").stdout  # its row's value


def test_a_manifest_header_equal_to_the_declared_columns_is_skipped(jobs):
    # Issue 37: with array.columns, a header row became element 0 (REGION=REGION).
    (jobs.dir / "regions.csv").write_text("REGION,LR\nus-east,0.1\neu-west,0.2\n")
    spec = jobs.spec("hdr.yaml", """\
        name: hdr
        entrypoint: /bin/sh
        args: [-c, 'echo "region=$REGION lr=$LR"']
        array: {manifest: regions.csv, columns: [REGION, LR]}
        """)
    r = jobs.run("submit", spec, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "taken as a header row" in r.stderr, r.stderr
    st = jobs.status("hdr")
    assert st["array_size"] == 2, st
    out0 = jobs.run("logs", st["id"], "--element", "0").stdout
    assert "region=us-east lr=0.1" in out0 and "region=REGION" not in out0, out0


def test_cancel_one_element_lets_the_others_finish(jobs):
    marker = U.new_marker()
    spec = jobs.spec("elems.yaml", """\
        name: elems
        entrypoint: /bin/sh
        args: [-c, 'if [ "$COHORT_ARRAY_INDEX" = 0 ]; then sleep 600; fi; echo "done $COHORT_ARRAY_INDEX"', {m}]
        array: {{range: "0-2", concurrency: 1}}
        """.format(m=marker))
    r = jobs.run("submit", spec)
    assert r.returncode == 0, r.stderr
    job_id = jobs.history()[0]["id"]
    U.wait_for(lambda: len(U.marker_pids(marker)) >= 1, 30, what="element 0 running")
    # Element 2 has not started (concurrency 1): it never will.
    c = jobs.run("cancel", job_id, "--element", "2")
    assert c.returncode == 0, c.stdout + c.stderr
    assert "element 2: cancelled" in c.stdout, c.stdout
    # Element 0 runs: it is stopped, with its processes.
    c = jobs.run("cancel", job_id, "--element", "0")
    assert c.returncode == 0, c.stdout + c.stderr
    assert "element 0: cancelled" in c.stdout, c.stdout
    U.wait_for(lambda: U.marker_pids(marker) == [], 10, what="element 0's processes gone")
    # Element 1 then runs to its end; the job succeeds, saying what was cancelled.
    w = jobs.run("status", job_id, "--wait")
    assert w.returncode == 0, w.stdout + w.stderr
    st = jobs.status(job_id)
    states = {e["index"]: e["state"] for e in st["elements"]}
    assert states == {0: "cancelled", 1: "succeeded", 2: "cancelled"}, st
    assert st["state"] == "succeeded" and "2 element(s) cancelled" in st["detail"], st
    assert "done 1" in jobs.run("logs", job_id, "--element", "1").stdout
    again = jobs.run("cancel", job_id, "--element", "1")
    assert again.returncode == 3 and "already ended (succeeded)" in again.stderr, again.stderr
    outside = jobs.run("cancel", job_id, "--element", "7")
    assert outside.returncode == 3 and "elements 0..2" in outside.stderr, outside.stderr


def test_a_target_that_refuses_its_share_fails_its_elements_and_is_not_asked_again(jobs):
    # Issue 37: an element whose target failed at submit stayed `pending` for ever, and
    # status/logs called kubectl for a job it never received. A stand-in kubectl that fails
    # as a missing context does, and records every call.
    bindir = jobs.dir / "bin"
    bindir.mkdir()
    calls = jobs.dir / "kubectl-calls"
    kubectl = bindir / "kubectl"
    kubectl.write_text('#!/bin/sh\necho "$*" >> %s\n'
                       'echo "error: context \\"gone-ctx\\" does not exist" >&2\nexit 1\n' % calls)
    kubectl.chmod(0o755)
    jobs.env["PATH"] = "%s:%s" % (bindir, jobs.env.get("PATH", "/usr/bin:/bin"))
    spec = jobs.spec("two.yaml", """\
        name: two
        image: registry.example.com/train:1
        entrypoint: /bin/sh
        args: [-c, 'echo "element $COHORT_ARRAY_INDEX on $COHORT_ARRAY_TARGET"']
        array: {range: "0-3"}
        targets:
          - {name: here, backend: local}
          - {name: away, backend: kubernetes, context: gone-ctx}
        """)
    r = jobs.run("submit", spec, "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    assert calls.exists(), "the kubernetes target was tried"
    calls.unlink()
    st = jobs.status("two")
    assert st["state"] == "failed", st
    by_target = {}
    for e in st["elements"]:
        by_target.setdefault(e["target"], []).append(e)
    assert {e["state"] for e in by_target["here"]} == {"succeeded"}, st
    assert {e["state"] for e in by_target["away"]} == {"failed"}, st
    assert all("not submitted" in e["detail"] and "gone-ctx" in e["detail"]
               for e in by_target["away"]), st
    away = by_target["away"][0]["index"]
    logs = jobs.run("logs", st["id"], "--element", away)
    assert logs.returncode == 8 and "never submitted" in logs.stderr, logs.stdout + logs.stderr
    text = jobs.run("status", st["id"])
    assert text.returncode == 0 and "not submitted" in text.stdout, text.stdout + text.stderr
    assert not calls.exists(), "status/logs asked kubectl about a job it never got: %s" % (
        calls.read_text())


TRAIN_PY = """\
import os, sys
print("rank %s of %s args %s" % (os.environ["RANK"], os.environ["WORLD_SIZE"], sys.argv[1:]))
"""


def test_one_line_submit_of_a_script_and_the_spec_it_prints(jobs):
    work = jobs.dir / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN_PY)  # no exec bit: run by the job's Python
    r = jobs.run("submit", "--nproc-per-node", 2, "--wait", "--", "train.py", "--epochs", 3,
                 cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    st = jobs.status("train")
    assert st["state"] == "succeeded", st
    out = jobs.run("logs", st["id"]).stdout
    assert "rank 0 of 2 args ['--epochs', '3']" in out, out
    assert "rank 1 of 2 args ['--epochs', '3']" in out, out
    # --dry-run prints the spec it built; kept as a file, it submits the same job.
    dry = jobs.run("submit", "--nproc-per-node", 2, "--name", "kept", "--dry-run", "--",
                   "train.py", "--epochs", 3, cwd=work)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    spec_text = dry.stdout.split("# What would be submitted:")[0]
    assert "name: kept" in spec_text and "nproc_per_node: 2" in spec_text, dry.stdout
    kept = jobs.dir / "kept.yaml"
    kept.write_text(spec_text)
    again = jobs.run("submit", kept, "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "rank 1 of 2 args ['--epochs', '3']" in jobs.run("logs", "kept").stdout
    # A script given where a spec goes is refused as such; flags of the one-liner need it.
    refused = jobs.run("submit", "train.py", cwd=work)
    assert refused.returncode == 6 and "is a program, not a job spec" in refused.stderr, \
        refused.stderr
    assert "cohort submit --nnodes 2 --nproc-per-node 4 -- train.py" in refused.stderr
    stray = jobs.run("submit", kept, "--nnodes", 2)
    assert stray.returncode == 2 and "one-line submit" in stray.stderr, stray.stderr
    bad = jobs.run("submit", "--nnodes", "3:1", "--", "train.py", cwd=work)
    assert bad.returncode == 6 and "--nnodes: '3:1'" in bad.stderr, bad.stderr


def test_spec_entrypoints_run_as_cohort_run_runs_them(jobs):
    # A .py entrypoint relative to the spec (submitted from elsewhere, no exec bit), and a
    # module, both run by the job's Python.
    proj = jobs.dir / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN_PY)
    (proj / "trainmod.py").write_text(TRAIN_PY)
    script = jobs.spec("proj/script.yaml", """\
        name: script
        entrypoint: train.py
        args: [--lr, "0.1"]
        nproc_per_node: 2
        """)
    module = jobs.spec("proj/module.yaml", """\
        name: module
        module: trainmod
        args: [--lr, "0.2"]
        env: {{PYTHONPATH: "{p}"}}
        """.format(p=proj))
    for spec, want in ((script, "rank 1 of 2 args ['--lr', '0.1']"),
                       (module, "rank 0 of 1 args ['--lr', '0.2']")):
        r = jobs.run("submit", spec, "--wait", cwd="/")
        assert r.returncode == 0, r.stdout + r.stderr
        name = spec.stem
        assert want in jobs.run("logs", name).stdout, jobs.run("logs", name).stdout
    both = jobs.spec("proj/both.yaml", "name: both\nentrypoint: x.py\nmodule: m\n")
    r = jobs.run("submit", both)
    assert r.returncode == 6 and "entrypoint or module, not both" in r.stderr, r.stderr


def test_an_unknown_set_and_machine_limits_are_listed_with_the_rest(jobs):
    spec = jobs.spec("tpl2.yaml", 'name: tpl2\nentrypoint: /bin/echo\nargs: ["{{params.lr}}"]\n')
    r = jobs.run("submit", spec, "--set", "lr=0.1", "--set", "lrr=0.2")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "--set lrr: " in r.stderr and "has no {{params.lrr}}" in r.stderr, r.stderr
    assert "{{params.lr}}" in r.stderr, r.stderr  # the templates it has
    # A field problem and a machine limit, in one answer.
    both = jobs.spec("both2.yaml", """\
        name: both2
        entrypoint: /bin/true
        max_restarts: many
        resources: {gpu: 64}
        """)
    r = jobs.run("submit", both)
    assert r.returncode == 6, r.stdout + r.stderr
    assert "max_restarts:" in r.stderr and "resources.gpu:" in r.stderr, r.stderr
    assert jobs.history() == []
