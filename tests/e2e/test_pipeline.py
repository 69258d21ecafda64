"""End-to-end tests of `cohort pipeline run | resume | status | list | export` through the
built binary, each against a private COHORT_HOME: parallel steps that provably overlap,
retries, timeouts that kill the step's process group, failure propagation next to a branch
that succeeds, resume from the failed step, caching, conditions, outputs between steps, bad
input (exit 6, every problem listed, nothing recorded), SIGINT, and the Fashion-MNIST
example pipeline on the local runtime.
"""
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

import e2e_util as U

EXAMPLE = U.REPO / "examples/pipelines/fmnist.yaml"
FMNIST = Path("/usr/share/datasets/fashion-mnist")


class Pipelines:
    def __init__(self, cohort, tmp_path):
        self.cohort = cohort
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.env = U.clean_env(COHORT_HOME=self.home)

    def spec(self, text, name="p.yaml"):
        p = self.dir / name
        p.write_text(textwrap.dedent(text))
        return p

    def run(self, *args, timeout=120):
        return subprocess.run([self.cohort, "pipeline", *map(str, args)], env=self.env,
                              capture_output=True, text=True, timeout=timeout, cwd=self.dir)

    def status(self, run_id):
        r = self.run("status", run_id, "--json")
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        s["by_name"] = {step["name"]: step for step in s["steps"]}
        return s

    def runs(self):
        r = self.run("list", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def pl(cohort, tmp_path):
    return Pipelines(cohort, tmp_path)


def run_id(result):
    for line in result.stdout.splitlines():
        if line.startswith("run ") and ":" in line:
            return int(line.split()[1].rstrip(":"))
    raise AssertionError("no run id in:\n" + result.stdout + result.stderr)


def test_parallel_steps_overlap_and_outputs_flow(pl):
    # a and b each wait (bounded) for the other's marker and record their interval.
    wait = ('date +%s.%N > {me}.start; touch {me}.mark; i=0; '
            'while [ ! -e {other}.mark ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; '
            'date +%s.%N > {me}.end; [ -e {other}.mark ]')
    spec = pl.spec("""\
        name: par
        steps:
          - name: a
            command: "%s; echo 20 > $COHORT_OUTPUTS/x"
            outputs: [x]
          - name: b
            command: "%s"
          - name: c
            depends: [a, b]
            command: "echo $(( {{steps.a.outputs.x}} + 1 )) > c.out"
        """ % (wait.format(me="a", other="b"), wait.format(me="b", other="a")))
    r = pl.run("run", spec, "--parallel", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    t = {n: float((pl.dir / n).read_text()) for n in ("a.start", "a.end", "b.start", "b.end")}
    assert max(t["a.start"], t["b.start"]) < min(t["a.end"], t["b.end"])
    assert (pl.dir / "c.out").read_text().strip() == "21"
    assert "[a] running" in r.stdout and "[c] succeeded" in r.stdout


def test_retries_then_success(pl):
    spec = pl.spec("""\
        name: retry
        steps:
          - name: flaky
            command: "n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; [ $n -ge 2 ]"
            retries: 2
        """)
    r = pl.run("run", spec)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[flaky] failed: exit code 1 (retry 1/2)" in r.stdout
    assert "[flaky] failed: exit code 1 (retry 2/2)" in r.stdout
    st = pl.status(run_id(r))
    assert st["by_name"]["flaky"]["attempts"] == 3
    assert st["by_name"]["flaky"]["state"] == "succeeded"


def test_timeout_kills_process_group_and_failure_spares_independent_branch(pl, marker):
    spec = pl.spec("""\
        name: timeout
        steps:
          - name: slow
            command: "sh -c 'sleep 60 # %s' & sleep 60 # %s"
            timeout: 1
          - name: after
            depends: [slow]
            command: "touch after.ran"
          - name: other
            command: "touch other.ran"
        """ % (marker, marker))
    r = pl.run("run", spec)
    assert r.returncode == 1, r.stdout + r.stderr
    st = pl.status(run_id(r))
    assert st["state"] == "failed"
    assert st["by_name"]["slow"]["state"] == "failed"
    assert "timed out" in st["by_name"]["slow"]["detail"]
    assert st["by_name"]["after"]["state"] == "not-run"
    assert st["by_name"]["other"]["state"] == "succeeded"
    assert not (pl.dir / "after.ran").exists() and (pl.dir / "other.ran").exists()
    assert U.marker_pids(marker) == []


def test_setsid_descendants_of_a_step_end_with_it(pl, marker):
    """A step that daemonizes something (setsid leaves its process group) and succeeds: the
    daemon ends with the step, while the next step runs, not only when the run ends."""
    pl.env["COHORT_TEST_TAG"] = marker
    spec = pl.spec("""\
        name: daemon
        steps:
          - name: leaves
            command: |
              setsid sleep 600 & echo $! > daemon.pid
          - name: checks
            depends: [leaves]
            command: |
              if grep -qv ') Z ' /proc/$(cat daemon.pid)/stat 2>/dev/null; then echo alive; else echo gone; fi > daemon.state
        """)
    r = pl.run("run", spec)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (pl.dir / "daemon.pid").read_text().strip().isdigit()
    assert (pl.dir / "daemon.state").read_text().strip() == "gone", "the daemon outlived its step"
    assert U.pids_with_env("COHORT_TEST_TAG=%s" % marker) == []


def test_resume_reruns_from_the_failed_step(pl):
    spec = pl.spec("""\
        name: resume
        steps:
          - name: first
            command: "echo x >> first.log"
          - name: gate
            depends: [first]
            command: "echo x >> gate.log; [ -e fixed ]"
          - name: last
            depends: [gate]
            command: "echo x >> last.log"
        """)
    r = pl.run("run", spec)
    assert r.returncode == 1
    rid = run_id(r)
    assert pl.status(rid)["by_name"]["last"]["state"] == "not-run"
    (pl.dir / "fixed").write_text("")
    r2 = pl.run("resume", rid)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "[first]" not in r2.stdout
    assert (pl.dir / "first.log").read_text() == "x\n"
    assert (pl.dir / "gate.log").read_text() == "x\nx\n"
    assert (pl.dir / "last.log").read_text() == "x\n"
    st = pl.status(rid)
    assert st["state"] == "succeeded"
    assert st["by_name"]["gate"]["attempts"] == 2


def test_cache_skips_unchanged_step_and_reruns_on_input_change(pl):
    (pl.dir / "input.txt").write_text("one")
    spec = pl.spec("""\
        name: cache
        steps:
          - name: work
            command: "cat input.txt >> work.log; wc -c < input.txt > $COHORT_OUTPUTS/size"
            inputs: [input.txt]
            outputs: [size]
            cache: true
          - name: use
            depends: [work]
            command: "echo {{steps.work.outputs.size}} >> use.log"
        """)
    assert pl.run("run", spec).returncode == 0
    r = pl.run("run", spec)
    assert r.returncode == 0 and "[work] cached" in r.stdout, r.stdout
    assert (pl.dir / "work.log").read_text() == "one"
    assert pl.status(run_id(r))["by_name"]["work"]["state"] == "cached"
    (pl.dir / "input.txt").write_text("three")
    r = pl.run("run", spec)
    assert r.returncode == 0 and "[work] running" in r.stdout, r.stdout
    assert (pl.dir / "work.log").read_text() == "onethree"
    assert (pl.dir / "use.log").read_text().split() == ["3", "3", "5"]


def test_when_false_skips_and_params_substitute(pl):
    spec = pl.spec("""\
        name: cond
        parameters:
          runtime: {type: string, default: local, enum: [local, slurm]}
          n: {type: int, default: 2}
        steps:
          - name: on-slurm
            when: "{{params.runtime}} == 'slurm'"
            command: "touch slurm.ran"
          - name: big
            when: "{{params.n}} >= 3 && !({{params.runtime}} == 'slurm')"
            command: "echo n={{params.n}} > big.out"
            env: {N: "{{params.n}}"}
        """)
    r = pl.run("run", spec)
    assert r.returncode == 0
    assert "[on-slurm] skipped (condition false)" in r.stdout
    assert "[big] skipped (condition false)" in r.stdout
    r = pl.run("run", spec, "-p", "n=5")
    assert r.returncode == 0
    assert (pl.dir / "big.out").read_text() == "n=5\n"
    assert not (pl.dir / "slurm.ran").exists()


BAD_SPECS = {
    "cycle": ("""\
        name: bad
        steps:
          - {name: a, command: echo, depends: [b]}
          - {name: b, command: echo, depends: [a]}
        """, [], ["dependency cycle: "]),
    "unknown-depends": ("""\
        name: bad
        steps:
          - {name: a, command: echo, depends: [nope]}
        """, [], ["steps[0].depends[0]: unknown step 'nope'"]),
    "condition-and-templates": ("""\
        name: bad
        parameters: {runtime: {type: string, default: local}}
        steps:
          - {name: a, command: "echo {{params.runtme}}"}
          - {name: b, command: echo, depends: [a]}
          - {name: c, command: echo, when: "{{params.runtim}} == 'slurm'"}
          - {name: d, command: echo, when: "{{steps.zz.outputs.o}} == 1"}
          - {name: e, command: echo, when: "{{params.runtime}} = 'x'"}
        """, [], ["steps[0].command: unknown parameter 'runtme' (did you mean 'runtime'?)",
                  "steps[2].when: unknown parameter 'runtim' (did you mean 'runtime'?)",
                  "steps[3].when: unknown step 'zz'",
                  "steps[4].when: malformed condition"]),
    "types": ("""\
        name: bad
        parameters:
          epochs: {type: int, default: 1}
          lr: {type: float, default: fast}
        steps:
          - {name: a, command: echo}
          - {name: a, command: echo}
        """, ["-p", "epochs=abc"],
        ["parameters.lr.default: 'fast' is not a float", "steps[1].name: duplicate step name 'a'"]),
    "param-override": ("""\
        name: bad
        parameters: {epochs: {type: int, default: 1}}
        steps:
          - {name: a, command: echo}
        """, ["-p", "epochs=abc"], ["-p epochs: 'abc' is not an int"]),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_input_lists_every_problem_and_runs_nothing(pl, case):
    text, extra, expected = BAD_SPECS[case]
    spec = pl.spec(text)
    r = pl.run("run", spec, *extra)
    assert r.returncode == 6, r.stdout + r.stderr
    for e in expected:
        assert e in r.stderr, r.stderr
    assert "nothing was run" in r.stderr
    assert pl.runs() == []


def test_sigint_cancels_running_steps(pl, marker):
    spec = pl.spec("""\
        name: cancel
        steps:
          - name: block
            command: "touch started; sleep 60 # %s"
          - name: later
            depends: [block]
            command: "touch later.ran"
        """ % marker)
    log = open(pl.dir / "run.log", "w")
    p = subprocess.Popen([pl.cohort, "pipeline", "run", str(spec)], env=pl.env, cwd=pl.dir,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (pl.dir / "started").exists():  # bounded wait for the step to be up
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 130
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    runs = pl.runs()
    assert runs[0]["state"] == "cancelled"
    st = pl.status(runs[0]["id"])
    assert st["by_name"]["block"]["state"] == "cancelled"
    assert st["by_name"]["later"]["state"] == "cancelled"
    assert U.marker_pids(marker) == []


def test_export_argo(pl):
    r = pl.run("export", EXAMPLE, "--format", "argo", "--image", "reg/cohort:1",
               "-p", "runtime=slurm")
    assert r.returncode == 0, r.stderr
    assert "kind: Workflow" in r.stdout
    assert "when: \"'{{workflow.parameters.runtime}}' == slurm\"" in r.stdout
    assert "image: reg/cohort:1" in r.stdout
    out = pl.dir / "wf.yaml"
    out.write_text(r.stdout)
    k8s = U.REPO / "tests/k8s"
    if not (k8s / "node_modules/@kubernetes-models/argo-workflows").exists():
        pytest.skip("tests/k8s/node_modules lacks @kubernetes-models/argo-workflows")
    v = subprocess.run(["node", "validate-argo.mjs", str(out)], cwd=k8s, capture_output=True,
                       text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr


def test_fmnist_example_local(pl):
    if not (FMNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST is not at %s" % FMNIST)
    trainer = Path(pl.cohort).parent / "cohort-train"
    if not trainer.exists():
        pytest.skip("cohort-train is not built")
    out = pl.dir / "fmnist"
    r = pl.run("run", EXAMPLE, "-p", "out=%s" % out, "-p", "trainer=%s" % trainer,
               "-p", "max_steps=200", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[train-slurm] skipped (condition false)" in r.stdout
    report = (out / "report.md").read_text()
    assert "test accuracy" in report
    acc = float(report.split("| test accuracy |")[1].split("|")[0])
    assert 0.5 < acc <= 1.0
    st = pl.status(run_id(r))
    assert st["by_name"]["prepare"]["outputs"]["train_samples"] == "60000"
    assert st["by_name"]["train-local"]["state"] == "succeeded"


def test_job_step_runs_in_the_steps_directory(pl, tmp_path):
    """A `job:` step's local job works where a command step of the same place would (the
    spec's directory, or its workdir), whatever directory `cohort pipeline run` started in."""
    sub = pl.dir / "project"
    sub.mkdir()
    (sub / "where.yaml").write_text(
        "name: where\nentrypoint: /bin/sh\nargs: [-c, 'pwd > job-cwd.txt']\n")
    (sub / "other").mkdir()
    spec = sub / "p.yaml"
    spec.write_text(textwrap.dedent("""\
        name: cwd
        steps:
          - {name: default, job: where.yaml}
          - {name: elsewhere, job: where.yaml, workdir: other, depends: [default]}
        """))
    r = subprocess.run([pl.cohort, "pipeline", "run", str(spec)], env=pl.env, cwd="/",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (sub / "job-cwd.txt").read_text().strip() == str(sub)
    assert (sub / "other" / "job-cwd.txt").read_text().strip() == str(sub / "other")
