"""Journey: a TorchX / Volcano / Kubeflow-training-operator user brings a training job for
AWS Trainium nodes to cohort.

What they had: a Volcano job with a queue and a gang size, `aws.amazon.com/neuron` and
`vpc.amazonaws.com/efa` resources, a node selector for the trn1 instance type and a toleration
for the Neuron taint; a PyTorchJob with a Master replica; and a two-step pipeline that
precompiles the model into a shared compile cache and then trains, where a second run skips
the precompile because the cache is warm.

What they walk through, with cohort's command lines only (`cohort submit`, `cohort list`,
`cohort logs`, `cohort pipeline run | status | list`) and the files cohort writes:

1. `cohort submit --backend kubernetes --kube-flavor volcano --dry-run`: the Volcano Job is
   gang-scheduled in their queue with their devices, node selector, tolerations, metrics port
   and scrape annotations and TTL, and the API server would accept it (Volcano's CRD, core
   objects against Kubernetes' schemas).
2. The PyTorchJob flavor with `kubernetes.master`: one Master and three Workers, no elastic
   policy, `cleanPodPolicy: Running`, valid against Kubeflow's CRD; an elastic size with a
   Master is refused.
3. The same spec elsewhere: the local backend refuses it (exit 6, the field named, nothing
   recorded); Slurm renders the Neuron/EFA devices as `--gres` without a running Slurm, and
   refuses the node selector.
4. The precompile-then-train pipeline: the first run compiles and trains, the second finds
   the compile cached (the compiler did not run again) and trains on the same artifact, a
   changed model compiles again, and a wiped cache directory compiles again.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import journey_util as J

K8S_NPM = J.REPO / "tests" / "k8s"
SHARED_K8S = J.REPO.parent / "shared" / "k8s"
VOLCANO_CRD = "batch.volcano.sh_jobs.yaml"
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"

NEURON = "aws.amazon.com/neuron"
EFA = "vpc.amazonaws.com/efa"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"

# The job as the user wrote it for their Trainium node group.
NEURON_SPEC = """\
name: neuron-train
image: registry.example.com/team/train:1.0
entrypoint: python3
args: [train.py, --epochs, "3"]
nnodes: {nnodes}
nproc_per_node: 2
queue: training
resources:
  cpu: 8
  memory: 32Gi
  extended: {{aws.amazon.com/neuron: 16, vpc.amazonaws.com/efa: 8}}
{placement}metrics: {{port: 9400}}
kubernetes: {{ttl_seconds_after_finished: 3600{kube_extra}}}
"""
PLACEMENT = """\
placement:
  node_selector: {node.kubernetes.io/instance-type: trn1.32xlarge}
  tolerations:
    - {key: aws.amazon.com/neuron, operator: Exists, effect: NoSchedule}
"""
TOLERATION_ONLY = """\
placement:
  tolerations:
    - {key: aws.amazon.com/neuron, operator: Exists, effect: NoSchedule}
"""


class User:
    """A user's shell: a private COHORT_HOME, their project folder, cohort on the command line."""

    def __init__(self, tmp_path):
        self.dir = Path(tmp_path)
        self.home = self.dir / "home"
        self.project = self.dir / "project"
        self.project.mkdir()
        self.env = J.job_env(COHORT_HOME=self.home)

    def write(self, name, text, where=None):
        p = (where or self.project) / name
        p.write_text(textwrap.dedent(text))
        return p

    def cohort(self, *args, timeout=60):
        return subprocess.run([str(J.BIN), *map(str, args)], env=self.env, cwd=self.project,
                              capture_output=True, text=True, timeout=timeout)

    def ok(self, *args, timeout=60):
        r = self.cohort(*args, timeout=timeout)
        assert r.returncode == 0, "cohort %s: exit %d\n%s%s" % (
            " ".join(map(str, args)), r.returncode, r.stdout, r.stderr)
        return r

    def jobs(self):
        return json.loads(self.ok("list", "--json").stdout)

    def neuron_spec(self, name="neuron.yaml", nnodes="4", placement=PLACEMENT, kube_extra=""):
        return self.write(name, NEURON_SPEC.format(nnodes=nnodes, placement=placement,
                                                   kube_extra=kube_extra))


@pytest.fixture
def user(tmp_path):
    return User(tmp_path)


# --- reading manifests the way kubectl does -------------------------------------------------

def have_node_tools():
    return shutil.which("node") is not None and (K8S_NPM / "node_modules" / "js-yaml").exists()


def split_documents(stream):
    """The documents of a multi-document YAML stream, as text (split at '---' lines)."""
    docs, current = [], []
    for line in stream.splitlines(keepends=True):
        if line.rstrip("\n") == "---":
            if "".join(current).strip():
                docs.append("".join(current))
            current = []
        else:
            current.append(line)
    if "".join(current).strip():
        docs.append("".join(current))
    return docs


def load_documents(stream, tmp_path):
    """Every object of the stream, read by a YAML 1.2 reader (js-yaml, as kubectl reads YAML)
    when the project's npm packages are installed, else by PyYAML."""
    if have_node_tools():
        f = Path(tmp_path) / "stream-for-json.yaml"
        f.write_text(stream)
        r = subprocess.run(["node", str(K8S_NPM / "to-json.mjs"), str(f)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    import yaml
    return [d for d in yaml.safe_load_all(stream) if d is not None]


def validate(stream, tmp_path, crd, label):
    """Validates the CRD documents of `stream` against `crd` (../shared/k8s) and every other
    document against Kubernetes' own schemas, as the C++ render tests do. Skips (at the end of
    the test's other checks) what cannot be checked here."""
    if not have_node_tools():
        pytest.skip("node or tests/k8s/node_modules missing (tools/install-npm-deps.sh): "
                    "manifests not validated")
    crd_docs, core_docs = [], []
    for doc in split_documents(stream):
        routed = re.search(r"^apiVersion: (kubeflow\.org/v1|batch\.volcano\.sh/v1alpha1)$",
                           doc, re.M)
        (crd_docs if routed else core_docs).append("---\n" + doc)
    assert crd_docs, "no %s document in:\n%s" % (crd, stream)
    if core_docs:
        f = Path(tmp_path) / ("%s-core.yaml" % label)
        f.write_text("".join(core_docs))
        r = subprocess.run(["node", str(K8S_NPM / "validate-core.mjs"), str(f)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "core objects invalid:\n" + r.stdout + r.stderr
    if not (SHARED_K8S / "crdvalidate.mjs").exists():
        pytest.skip("%s is absent: CRD validation skipped" % SHARED_K8S)
    f = Path(tmp_path) / ("%s-crd.yaml" % label)
    f.write_text("".join(crd_docs))
    r = subprocess.run(["node", "--import", str(K8S_NPM / "resolve-here.mjs"),
                        str(SHARED_K8S / "crdvalidate.mjs"), str(SHARED_K8S / crd), str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "%s rejects the manifest:\n%s%s" % (crd, r.stdout, r.stderr)


def by_kind(objects, kind):
    found = [o for o in objects if o.get("kind") == kind]
    assert len(found) == 1, "expected one %s, got %s" % (kind, [o.get("kind") for o in objects])
    return found[0]


def assert_trainium_pod(template, container_name, what):
    """What every pod of the job must carry to land on a trn1 node with its devices, be
    scraped by Prometheus, and run the user's program under the agent."""
    spec = template["spec"]
    assert spec.get("nodeSelector") == {INSTANCE_TYPE: "trn1.32xlarge"}, what
    assert spec.get("tolerations") == [
        {"key": NEURON, "operator": "Exists", "effect": "NoSchedule"}], what
    (c,) = spec["containers"]
    assert c["name"] == container_name, what
    assert c["image"] == "registry.example.com/team/train:1.0", what
    limits = c["resources"]["limits"]
    assert limits == {"cpu": "8", "memory": "32Gi", NEURON: "16", EFA: "8"}, (what, limits)
    # Kubernetes requires requests == limits for extended resources.
    assert c["resources"].get("requests", limits) == limits, (what, c["resources"])
    metrics = [p for p in c.get("ports", []) if p.get("name") == "metrics"]
    assert metrics and metrics[0]["containerPort"] == 9400, (what, c.get("ports"))
    annotations = template["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/scrape") == "true", (what, annotations)
    assert annotations.get("prometheus.io/port") == "9400", (what, annotations)
    argv = c["command"] + c.get("args", [])
    # The agent serves /metrics on the declared port, reachable from outside the pod.
    i = argv.index("--metrics-port")
    assert argv[i + 1] == "9400", argv
    if "--metrics-host" in argv:
        assert argv[argv.index("--metrics-host") + 1] == "0.0.0.0", argv
    assert argv[argv.index("--nnodes") + 1] == "4", argv
    assert argv[argv.index("--nproc-per-node") + 1] == "2", argv
    sep = argv.index("--")
    assert argv[sep + 1:] == ["python3", "train.py", "--epochs", "3"], argv
    return argv


# --- 1. Volcano ----------------------------------------------------------------------------

def test_volcano_gang_job_on_trainium_nodes(user, tmp_path):
    spec = user.neuron_spec()
    r = user.ok("submit", spec, "--backend", "kubernetes", "--kube-flavor", "volcano",
                "--dry-run")
    objects = load_documents(r.stdout, tmp_path)
    job = by_kind(objects, "Job")
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1", job["apiVersion"]
    assert job["metadata"]["name"] == "neuron-train"
    s = job["spec"]
    assert s["schedulerName"] == "volcano"
    assert s["queue"] == "training"
    assert s["minAvailable"] == 4, "the gang is the whole job"
    assert s["ttlSecondsAfterFinished"] == 3600
    (task,) = s["tasks"]
    assert task["replicas"] == 4
    assert task.get("minAvailable", 4) == 4
    assert_trainium_pod(task["template"], "worker", "volcano task")
    # A dry run submits and records nothing.
    assert user.jobs() == []
    validate(r.stdout, tmp_path, VOLCANO_CRD, "volcano")


# --- 2. PyTorchJob with a Master ------------------------------------------------------------

def test_pytorchjob_with_master_and_elastic_master_refused(user, tmp_path):
    spec = user.neuron_spec(kube_extra=", master: true, clean_pod_policy: Running")
    r = user.ok("submit", spec, "--backend", "kubernetes", "--kube-flavor", "pytorchjob",
                "--dry-run")
    objects = load_documents(r.stdout, tmp_path)
    job = by_kind(objects, "PyTorchJob")
    assert job["apiVersion"] == "kubeflow.org/v1"
    s = job["spec"]
    assert "elasticPolicy" not in s, "a job with a Master has a fixed size: %s" % s
    replicas = s["pytorchReplicaSpecs"]
    assert sorted(replicas) == ["Master", "Worker"], sorted(replicas)
    assert replicas["Master"]["replicas"] == 1
    assert replicas["Worker"]["replicas"] == 3, "4 nodes = 1 Master + 3 Workers"
    run_policy = s["runPolicy"]
    assert run_policy["cleanPodPolicy"] == "Running"
    assert run_policy["ttlSecondsAfterFinished"] == 3600
    assert run_policy["schedulingPolicy"]["queue"] == "training"
    assert run_policy["schedulingPolicy"]["minAvailable"] == 4
    endpoints = set()
    for role in ("Master", "Worker"):
        argv = assert_trainium_pod(replicas[role]["template"], "pytorch", role)
        endpoints.add(argv[argv.index("--rdzv-endpoint") + 1])
    # Every pod meets at the Master (the operator's Service <name>-master-0).
    assert len(endpoints) == 1 and endpoints.pop().startswith("neuron-train-master-0:"), endpoints
    validate(r.stdout, tmp_path, PYTORCHJOB_CRD, "pytorchjob")

    elastic = user.neuron_spec("elastic.yaml", nnodes='"2:4"',
                               kube_extra=", master: true, clean_pod_policy: Running")
    r = user.cohort("submit", elastic, "--backend", "kubernetes", "--kube-flavor", "pytorchjob",
                    "--dry-run")
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert "kubernetes.master" in r.stderr and "2:4" in r.stderr, r.stderr
    assert "apiVersion" not in r.stdout, "a refused spec renders nothing:\n" + r.stdout
    assert user.jobs() == []


# --- 3. Local and Slurm ---------------------------------------------------------------------

def test_local_refuses_neuron_devices_and_slurm_maps_them_to_gres(user):
    spec = user.neuron_spec()
    r = user.cohort("submit", spec, "--backend", "local")
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert "nothing was submitted" in r.stderr, r.stderr
    assert re.search(r"^\s*resources\.extended: .*aws\.amazon\.com/neuron", r.stderr, re.M), \
        r.stderr
    # Even a one-node, laptop-sized version is refused for the devices alone.
    small = user.write("small.yaml", """\
        name: neuron-small
        entrypoint: /bin/true
        resources: {extended: {aws.amazon.com/neuron: 1}}
        """)
    r = user.cohort("submit", small, "--backend", "local", "--wait")
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    problems = [l.strip() for l in r.stderr.splitlines() if l.startswith("  ")]
    assert len(problems) == 1 and problems[0].startswith("resources.extended:"), r.stderr
    assert user.jobs() == [], "a refused spec is not recorded"

    # Slurm: the node selector cannot be honoured...
    r = user.cohort("submit", spec, "--backend", "slurm", "--dry-run")
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert "placement.node_selector" in r.stderr, r.stderr
    assert "#SBATCH" not in r.stdout, r.stdout
    # ...without it (the toleration stays: Slurm has no taints to tolerate), the devices
    # become generic resources, rendered without a running Slurm.
    no_selector = user.neuron_spec("slurm.yaml", placement=TOLERATION_ONLY)
    r = user.ok("submit", no_selector, "--backend", "slurm", "--dry-run")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("#!"), lines[:3]
    sbatch = [l for l in lines if l.startswith("#SBATCH ")]
    assert "#SBATCH --gres=neuron:16,efa:8" in sbatch, sbatch
    assert "#SBATCH --nodes=4" in sbatch, sbatch
    assert "#SBATCH --partition=training" in sbatch, sbatch
    assert re.search(r"cohort run .*--nproc-per-node 2", r.stdout), r.stdout
    assert user.jobs() == [], "a dry run is not recorded"


def test_one_spec_with_overrides_per_backend_runs_on_slurm_and_kubernetes(user, tmp_path):
    """One spec for both clusters: the node selector only for Kubernetes (Slurm rightly
    refuses it), another partition for Slurm; --dry-run shows the spec each backend runs."""
    overrides = ("overrides:\n  kubernetes:\n" +
                 textwrap.indent(PLACEMENT, "    ") +
                 "  slurm:\n    queue: trn-partition\n")
    spec = user.write("both.yaml", NEURON_SPEC.format(nnodes=4, placement="", kube_extra="") +
                      overrides)
    r = user.ok("submit", spec, "--backend", "slurm", "--dry-run")
    assert "# The job spec for slurm (overrides.slurm merged):" in r.stdout, r.stdout
    sbatch = [l for l in r.stdout.splitlines() if l.startswith("#SBATCH ")]
    assert "#SBATCH --partition=trn-partition" in sbatch, sbatch
    assert "#SBATCH --gres=neuron:16,efa:8" in sbatch, sbatch
    assert INSTANCE_TYPE not in r.stdout, r.stdout
    r = user.ok("submit", spec, "--backend", "kubernetes", "--dry-run")
    assert "# The job spec for kubernetes (overrides.kubernetes merged):" in r.stdout, r.stdout
    assert re.search(r"nodeSelector:\s*\n\s*%s: trn1\.32xlarge" % re.escape(INSTANCE_TYPE),
                     r.stdout), r.stdout
    manifests = r.stdout.split("# What would be submitted:")[1]
    assert "trn-partition" not in manifests, r.stdout
    # Every pod of the PyTorchJob carries the selector and the devices.
    replicas = by_kind(load_documents(manifests, tmp_path), "PyTorchJob")["spec"][
        "pytorchReplicaSpecs"]
    for role, replica in replicas.items():
        assert_trainium_pod(replica["template"], "pytorch", role)
    # An override is checked as the spec it makes, its problems named by where they are.
    bad = user.write("bad-override.yaml", NEURON_SPEC.format(nnodes=4, placement="",
                                                             kube_extra="") +
                     "overrides:\n  slurm: {resources: {cpu: lots}}\n  mesos: {queue: x}\n")
    r = user.cohort("submit", bad, "--backend", "slurm", "--dry-run")
    assert r.returncode == 6, (r.returncode, r.stdout, r.stderr)
    assert "overrides.slurm.resources.cpu" in r.stderr and "mesos" in r.stderr, r.stderr
    assert user.jobs() == [], "nothing recorded"
    validate(manifests, tmp_path, PYTORCHJOB_CRD, "overrides")  # last: may skip


# --- 4. Precompile into a shared cache, then train -------------------------------------------

PIPELINE = """\
name: neuron-precompile-train
parameters:
  cache_dir: {type: string}
steps:
  - name: precompile
    command: [sh, precompile.sh, "{{params.cache_dir}}"]
    inputs: [model.py, precompile.sh]
    outputs: [{file: "{{params.cache_dir}}/model.neff"}]
    cache: true
  - name: train
    job: train.yaml
    depends: [precompile]
"""
# The "compiler": writes an artifact derived from the model, and counts its runs.
PRECOMPILE = """\
set -e
mkdir -p "$1"
echo "neff-$(sha256sum model.py | cut -c1-16)" > "$1/model.neff"
echo compiled >> compiles.log
"""
# Two local ranks load the compiled artifact from the shared cache (no extended resources:
# the local backend refuses them); a missing artifact fails the job.
TRAIN_JOB = """\
name: neuron-train-local
entrypoint: /bin/sh
args: [-c, 'neff=$(cat "$NEURON_COMPILE_CACHE_URL/model.neff") && echo "rank $RANK of $WORLD_SIZE loaded $neff"']
nproc_per_node: 2
env: {NEURON_COMPILE_CACHE_URL: "{{params.cache_dir}}"}
"""


def expected_neff(model_text):
    return "neff-" + hashlib.sha256(model_text.encode()).hexdigest()[:16]


def test_precompile_cache_hit_then_train(user):
    shared = user.dir / "shared" / "neuron-cache"
    pipeline = user.write("pipeline.yaml", PIPELINE)
    user.write("precompile.sh", PRECOMPILE)
    user.write("train.yaml", TRAIN_JOB)
    model = user.project / "model.py"
    model.write_text("layers = 12\n")
    compiles = user.project / "compiles.log"

    def run_pipeline(expect_precompile):
        r = user.ok("pipeline", "run", pipeline, "-p", "cache_dir=%s" % shared, timeout=120)
        m = re.search(r"^pipeline neuron-precompile-train: run (\d+) ", r.stdout, re.M)
        assert m, r.stdout
        run = int(m.group(1))
        assert ("[precompile] %s" % expect_precompile) in r.stdout, r.stdout
        assert "[train] succeeded" in r.stdout, r.stdout
        status = json.loads(user.ok("pipeline", "status", run, "--json").stdout)
        assert status["state"] == "succeeded", status
        states = {s["name"]: s["state"] for s in status["steps"]}
        assert states == {"precompile": expect_precompile, "train": "succeeded"}, states
        # The train step's log names the job it submitted; its ranks' output is in cohort logs.
        log = (user.home / "pipelines" / str(run) / "train" / "output.log").read_text()
        jm = re.search(r"^submitted job (\d+) \(neuron-train-local\) to local", log, re.M)
        assert jm, log
        out = user.ok("logs", jm.group(1)).stdout
        loaded = dict(re.findall(r"^\[rank\d\]: rank (\d) of 2 loaded (\S+)$", out, re.M))
        return run, loaded

    def compile_count():
        return compiles.read_text().count("compiled") if compiles.exists() else 0

    # First run: compile, then both ranks train on the compiled artifact.
    run1, loaded = run_pipeline("succeeded")
    neff1 = expected_neff("layers = 12\n")
    assert (shared / "model.neff").read_text().strip() == neff1
    assert compile_count() == 1
    assert loaded == {"0": neff1, "1": neff1}, loaded

    # Second run: the cache is warm; the compiler does not run, training uses the artifact.
    run2, loaded = run_pipeline("cached")
    assert compile_count() == 1, "the cached precompile ran again"
    assert loaded == {"0": neff1, "1": neff1}, loaded

    # The model changes: compile again, and train on the new artifact, not the stale one.
    model.write_text("layers = 24\n")
    run3, loaded = run_pipeline("succeeded")
    neff3 = expected_neff("layers = 24\n")
    assert neff3 != neff1
    assert compile_count() == 2
    assert loaded == {"0": neff3, "1": neff3}, loaded

    # A fresh node with an empty cache directory: the artifact is gone, so compile again.
    shutil.rmtree(shared)
    run4, loaded = run_pipeline("succeeded")
    assert compile_count() == 3
    assert loaded == {"0": neff3, "1": neff3}, loaded

    runs = json.loads(user.ok("pipeline", "list", "--json").stdout)
    assert sorted(r["id"] for r in runs) == sorted([run1, run2, run3, run4]), runs
    assert all(r["state"] == "succeeded" and r["pipeline"] == "neuron-precompile-train"
               for r in runs), runs
    trained = [j for j in user.jobs() if j["name"] == "neuron-train-local"]
    assert len(trained) == 4 and all(j["state"] == "succeeded" and j["backend"] == "local"
                                     for j in trained), trained


def test_the_argo_export_passes_the_compiled_file_through_the_workspace(user, tmp_path):
    """The same precompile -> train pipeline exported for Argo: each step is its own pod, so
    the compiled file reaches training only through the workspace claim mounted in both;
    with --rbac the export carries the ServiceAccount, Role and RoleBinding its pods use."""
    sys.path.insert(0, str(J.REPO / "tests" / "journeys"))
    import argo_exec
    import yaml
    pipeline = user.write("pipeline.yaml", PIPELINE)
    user.write("precompile.sh", PRECOMPILE)
    user.write("train.yaml", TRAIN_JOB)
    (user.project / "model.py").write_text("layers = 12\n")
    wf = user.project / "wf.yaml"
    r = user.ok("pipeline", "export", pipeline, "--format", "argo", "--workspace-claim",
                "neuron-cache", "--rbac", "-p", "cache_dir=/workspace/neuron-cache", "-o", wf)
    docs = [d for d in yaml.safe_load_all(wf.read_text()) if d]
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "Workflow"], docs
    account = "neuron-precompile-train-cohort"
    assert all(d["metadata"]["name"] == account for d in docs[:3]), docs[:3]
    workflow = docs[3]["spec"]
    assert workflow["serviceAccountName"] == account, workflow
    assert {"name": "cohort-workspace", "persistentVolumeClaim": {"claimName": "neuron-cache"}} \
        in workflow["volumes"], workflow["volumes"]
    steps = [t for t in workflow["templates"] if "container" in t]
    assert [t["name"] for t in steps] == ["precompile", "train"], steps
    for t in steps:
        assert {"name": "cohort-workspace", "mountPath": "/workspace"} in \
            t["container"]["volumeMounts"], t
    role = docs[1]
    assert {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"]}.items() <= \
        role["rules"][0].items(), role
    if have_node_tools():  # the RBAC objects as the API server's schema has them
        rbac = tmp_path / "rbac.yaml"
        rbac.write_text(yaml.safe_dump_all(docs[:3]))
        v = subprocess.run(["node", str(K8S_NPM / "validate-core.mjs"), str(rbac)],
                           capture_output=True, text=True, timeout=60)
        assert v.returncode == 0, v.stdout + v.stderr
    if (K8S_NPM / "node_modules/@kubernetes-models/argo-workflows").exists():
        only = tmp_path / "workflow.yaml"
        only.write_text(yaml.safe_dump(docs[3]))
        v = subprocess.run(["node", "validate-argo.mjs", str(only)], cwd=K8S_NPM,
                           capture_output=True, text=True, timeout=120)
        assert v.returncode == 0, v.stdout + v.stderr
    # Run it as Argo would: each step in its own filesystem, the claim shared.
    env = dict(user.env, PATH="%s:%s" % (J.BIN.parent, user.env.get("PATH", "/usr/bin:/bin")))
    nodes = argo_exec.run_workflow(str(wf), {}, workdir=str(user.project), env=env, timeout=300)
    phases = {n: x.phase for n, x in nodes.items()}
    assert phases == {"precompile": "Succeeded", "train": "Succeeded"}, {
        n: (x.phase, x.message, x.log[-2000:]) for n, x in nodes.items()}
    trained = [j for j in user.jobs() if j["name"] == "neuron-train-local"]
    assert len(trained) == 1 and trained[0]["state"] == "succeeded", trained
    out = user.ok("logs", trained[0]["id"]).stdout
    loaded = dict(re.findall(r"^\[rank\d\]: rank (\d) of 2 loaded (\S+)$", out, re.M))
    assert loaded == {"0": expected_neff("layers = 12\n"), "1": expected_neff("layers = 12\n")}, \
        out
    # Without --rbac, a step that submits to Kubernetes is pointed out.
    k8s = user.write("k8s-pipeline.yaml", PIPELINE.replace("job: train.yaml",
                                                           "job: train.yaml\n    backend: kubernetes"))
    r = user.ok("pipeline", "export", k8s, "--format", "argo", "-p", "cache_dir=/c")
    assert "step(s) train submit jobs to Kubernetes" in r.stderr and "--rbac" in r.stderr, \
        r.stderr
