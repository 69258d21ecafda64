"""Journey: a hybrid pipeline, Kubeflow style (shared/JOURNEYS.md; docs/pipelines.md).

A Kubeflow Pipelines user picks the training runtime with a pipeline parameter,
`training_runtime` in {local, slurm, kubernetes}: a prepare step computes a value the training
reads, one branch per runtime trains (on this machine; on the test's Slurm; for Kubernetes the
manifests are rendered and must be valid against the PyTorchJob CRD in ../shared/k8s), and a
report step runs after whichever branch ran. Each parameter value takes only its branch.

Then the same pipeline exported with `cohort pipeline export --format argo` is executed the
way Argo would run it (tests/journeys/argo_exec.py: Argo's parameter substitution, `when`
evaluation, DAG order, output parameters from files): every step ends the same way as under
`cohort pipeline run`, and the training it submits is one job of two ranks with equal
parameter digests. Everything goes through cohort's command lines.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import journey_util as J

sys.path.insert(0, str(J.REPO / "tests" / "slurm"))
import argo_exec  # noqa: E402
import slurm_cluster  # noqa: E402

SHARED_K8S = J.REPO.parent / "shared" / "k8s"
NPM = J.REPO / "tests" / "k8s"
RUNTIMES = ("local", "slurm", "kubernetes")
# Step states of `cohort pipeline status` and the node phases Argo gives the same outcome.
ARGO_PHASE = {"succeeded": "Succeeded", "skipped": "Skipped", "failed": "Failed"}


@pytest.fixture(scope="module")
def slurm():
    """A real Slurm (munged, slurmctld, two fake nodes), or None where it cannot run."""
    if slurm_cluster.available() is not None:
        yield None
        return
    with slurm_cluster.SlurmCluster(nodes=2, cpus=2) as cluster:
        yield cluster


class Hybrid:
    """The user's pipeline directory and the commands they type."""

    def __init__(self, tmp_path, slurm):
        self.dir = tmp_path / "pipeline"
        self.dir.mkdir()
        self.home = tmp_path / "home"
        base = J.e2e_util.clean_env(COHORT_HOME=self.home)
        base["PATH"] = "%s:%s" % (J.BIN.parent, base.get("PATH", "/usr/bin:/bin"))
        self.env = slurm.env(base) if slurm else base
        train = [str(J.TRAIN), "--model", "mlp", "--dataset", "synthetic", "--epochs", "100",
                 "--batch-size", "{{steps.prepare.outputs.batch}}", "--max-steps",
                 "{{params.max_steps}}", "--lr", "{{params.lr}}", "--log-every", "10"]
        (self.dir / "train.yaml").write_text(textwrap.dedent("""\
            name: hybrid-train
            entrypoint: %s
            args: %s
            nproc_per_node: 2
            """) % (train[0], json.dumps(train[1:])))
        (self.dir / "k8s-train.yaml").write_text(textwrap.dedent("""\
            name: hybrid-train
            image: registry.example.com/ml/cohort-train:1.0
            entrypoint: cohort-train
            args: %s
            nnodes: 2
            nproc_per_node: 2
            kubernetes: {master: true, clean_pod_policy: Running}
            """) % json.dumps(train[1:]))
        self.spec = self.dir / "hybrid.yaml"
        self.spec.write_text(textwrap.dedent("""\
            name: hybrid
            parameters:
              training_runtime: {type: string, default: local, enum: [local, slurm, kubernetes]}
              lr: {type: float, default: 0.05}
              max_steps: {type: int, default: 20}
            steps:
              - name: prepare
                command: 'echo 16 > "$COHORT_OUTPUTS/batch"'
                outputs: [batch]
              - name: train-local
                job: train.yaml
                depends: [prepare]
                when: "{{params.training_runtime}} == 'local'"
              - name: train-slurm
                job: train.yaml
                backend: slurm
                depends: [prepare]
                when: "{{params.training_runtime}} == 'slurm'"
              - name: render-kubernetes
                command: >-
                  cohort submit k8s-train.yaml --backend kubernetes --dry-run
                  --set lr={{params.lr}} --set max_steps={{params.max_steps}}
                  --set steps.prepare.outputs.batch={{steps.prepare.outputs.batch}}
                  > manifests.yaml && grep -c '^kind:' manifests.yaml > "$COHORT_OUTPUTS/objects"
                outputs: [objects]
                depends: [prepare]
                when: "{{params.training_runtime}} == 'kubernetes'"
              - name: report
                command: 'echo "trained on {{params.training_runtime}}" > report.txt'
                depends: [train-local, train-slurm, render-kubernetes]
            """))

    def cohort(self, *args, timeout=300):
        return subprocess.run([str(J.BIN), *map(str, args)], env=self.env, cwd=self.dir,
                              capture_output=True, text=True, timeout=timeout)

    def run_pipeline(self, runtime):
        """`cohort pipeline run -p training_runtime=R`: {step: state}."""
        r = self.cohort("pipeline", "run", self.spec, "-p", "training_runtime=" + runtime)
        assert r.returncode == 0, r.stdout + r.stderr
        runs = json.loads(self.cohort("pipeline", "list", "--json").stdout)
        status = json.loads(self.cohort("pipeline", "status", str(runs[0]["id"]),
                                        "--json").stdout)
        return {s["name"]: s for s in status["steps"]}

    def newest_job_log(self):
        """The console of the newest job in the history (what `cohort logs` prints)."""
        jobs = json.loads(self.cohort("list", "--json").stdout)
        assert jobs, "no job was submitted"
        r = self.cohort("logs", str(jobs[0]["id"]))
        assert r.returncode == 0, r.stderr
        return jobs[0], r.stdout


def assert_one_job_of_two_ranks(log):
    """Both ranks joined one job of world 2 and ended with the same parameters."""
    rounds = J.rounds(log)
    assert rounds and J.complete_round(log, 2) is not None, log[-3000:]
    d = J.digests(log)
    assert sorted(d) == [0, 1] and len(set(d.values())) == 1, d


def crd_valid(manifests, crd):
    if not (SHARED_K8S / "crdvalidate.mjs").exists() or shutil.which("node") is None or \
            not (NPM / "node_modules").exists():
        return None  # the CRDs are test data of the workplace: skipped where absent
    r = subprocess.run(["node", "--import", str(NPM / "resolve-here.mjs"),
                        str(SHARED_K8S / "crdvalidate.mjs"), str(SHARED_K8S / crd),
                        str(manifests)], capture_output=True, text=True, timeout=120)
    return r


def check_kubernetes_manifests(manifests):
    """The rendered PyTorchJob is valid against its CRD and carries the pipeline's values."""
    text = manifests.read_text()
    assert "{{" not in text, text
    jobs = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "PyTorchJob"]
    assert len(jobs) == 1, text
    replicas = jobs[0]["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1, replicas
    assert jobs[0]["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    # The parameters and the prepare step's output reached the training command.
    command = replicas["Master"]["template"]["spec"]["containers"][0]["command"]
    program = command[command.index("--") + 1:]
    assert program[:2] == ["cohort-train", "--model"], command
    assert program[program.index("--lr") + 1] == "0.05", command
    assert program[program.index("--batch-size") + 1] == "16", command
    assert program[program.index("--max-steps") + 1] == "20", command
    pytorch = manifests.parent / "pytorchjob.yaml"
    pytorch.write_text(yaml.safe_dump(jobs[0]))
    r = crd_valid(pytorch, "kubeflow.org_pytorchjobs.yaml")
    if r is not None:
        assert r.returncode == 0, r.stdout + r.stderr


def test_each_runtime_takes_its_branch_and_the_argo_export_runs_the_same(tmp_path, slurm):
    h = Hybrid(tmp_path, slurm)
    runtimes = [rt for rt in RUNTIMES if rt != "slurm" or slurm is not None]
    outcomes = {}
    for runtime in runtimes:
        (h.dir / "manifests.yaml").unlink(missing_ok=True)
        steps = h.run_pipeline(runtime)
        states = {name: s["state"] for name, s in steps.items()}
        expected = {"prepare": "succeeded", "report": "succeeded",
                    "train-local": "skipped", "train-slurm": "skipped",
                    "render-kubernetes": "skipped"}
        expected[{"local": "train-local", "slurm": "train-slurm",
                  "kubernetes": "render-kubernetes"}[runtime]] = "succeeded"
        assert states == expected, (runtime, steps)
        assert (h.dir / "report.txt").read_text() == "trained on %s\n" % runtime
        if runtime == "kubernetes":
            check_kubernetes_manifests(h.dir / "manifests.yaml")
        else:
            job, log = h.newest_job_log()
            assert job["backend"] == runtime and job["state"] == "succeeded", job
            assert_one_job_of_two_ranks(log)
        outcomes[runtime] = states

    # The exported workflow, valid against Argo's schema, runs the same steps.
    wf = h.dir / "wf.yaml"
    r = h.cohort("pipeline", "export", h.spec, "--format", "argo", "-o", wf)
    assert r.returncode == 0, r.stderr
    if (NPM / "node_modules/@kubernetes-models/argo-workflows").exists():
        v = subprocess.run(["node", "validate-argo.mjs", str(wf)], cwd=NPM,
                           capture_output=True, text=True, timeout=120)
        assert v.returncode == 0, v.stdout + v.stderr
    for runtime in runtimes:
        (h.dir / "manifests.yaml").unlink(missing_ok=True)
        (h.dir / "report.txt").unlink(missing_ok=True)
        jobs_before = len(json.loads(h.cohort("list", "--json").stdout))
        env = {k: v for k, v in h.env.items() if k != "COHORT_OUTPUTS"}
        nodes = argo_exec.run_workflow(str(wf), {"training_runtime": runtime},
                                       workdir=str(h.dir), env=env, timeout=600)
        phases = {name: node.phase for name, node in nodes.items() if name != "cohort-dag"}
        assert phases == {name: ARGO_PHASE[s] for name, s in outcomes[runtime].items()}, (
            runtime, {n: (x.phase, x.message, x.log[-2000:]) for n, x in nodes.items()})
        assert nodes["prepare"].outputs == {"batch": "16"}
        assert (h.dir / "report.txt").read_text() == "trained on %s\n" % runtime
        if runtime == "kubernetes":
            assert nodes["render-kubernetes"].outputs["objects"].strip() != "0"
            check_kubernetes_manifests(h.dir / "manifests.yaml")
        else:
            # The job step's `cohort submit --wait --set ...` trained one two-rank job.
            assert len(json.loads(h.cohort("list", "--json").stdout)) == jobs_before + 1
            job, log = h.newest_job_log()
            assert job["backend"] == runtime and job["state"] == "succeeded", job
            assert_one_job_of_two_ranks(log)
    if slurm is None:
        pytest.skip("the slurm branch was not run: " + slurm_cluster.available())


def test_a_job_step_over_targets_runs_the_same_from_the_argo_export(tmp_path):
    """A pipeline step whose job spec fans out over two local targets: `cohort pipeline run`
    and the exported Argo workflow both submit one array over targets, every element
    succeeding on the target its row names."""
    d = tmp_path / "p"
    d.mkdir()
    home = tmp_path / "home"
    env = J.e2e_util.clean_env(COHORT_HOME=home)
    env["PATH"] = "%s:%s" % (J.BIN.parent, env.get("PATH", "/usr/bin:/bin"))
    (d / "rows.csv").write_text("east,a\nwest,b\neast,c\n")
    (d / "fan.yaml").write_text(textwrap.dedent("""\
        name: fan
        entrypoint: /bin/sh
        args: [-c, 'echo "row $COHORT_ARRAY_INDEX on $COHORT_ARRAY_TARGET tag={{params.tag}}"']
        array: {manifest: rows.csv, columns: [WHERE, WHAT], target_by: WHERE}
        targets:
          - {name: east, backend: local, concurrency: 1}
          - {name: west, backend: local}
        """))
    spec = d / "fan-pipeline.yaml"
    spec.write_text(textwrap.dedent("""\
        name: fan
        parameters: {tag: {type: string, default: t1}}
        steps:
          - {name: fan, job: fan.yaml}
        """))

    def cohort(*args):
        return subprocess.run([str(J.BIN), *map(str, args)], env=env, cwd=d,
                              capture_output=True, text=True, timeout=300)

    def check_newest_job():
        jobs = json.loads(cohort("list", "--json").stdout)
        st = json.loads(cohort("status", str(jobs[0]["id"]), "--json").stdout)
        assert st["backend"] == "targets" and st["state"] == "succeeded", st
        targets = [e["target"] for e in sorted(st["elements"], key=lambda e: e["index"])]
        assert targets == ["east", "west", "east"], st
        log = cohort("logs", str(jobs[0]["id"]), "--element", "1").stdout
        assert "row 1 on west tag=t1" in log, log

    r = cohort("pipeline", "run", spec)
    assert r.returncode == 0, r.stdout + r.stderr
    check_newest_job()
    wf = d / "wf.yaml"
    r = cohort("pipeline", "export", spec, "--format", "argo", "-o", wf)
    assert r.returncode == 0, r.stderr
    nodes = argo_exec.run_workflow(str(wf), {}, workdir=str(d), env=env, timeout=300)
    assert nodes["fan"].phase == "Succeeded", (nodes["fan"].message, nodes["fan"].log[-2000:])
    check_newest_job()
