"""Self-test of argo_exec, the local stand-in for Argo's controller and executor (no cohort
binary needed): small Workflows of `sh -c` steps, checked against the Argo rules it mirrors."""
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import argo_exec as A  # noqa: E402


@pytest.fixture(autouse=True)
def need_binaries():
    """Overrides the conftest fixture of the same name: these tests run no cohort binary."""


def workflow(tasks, templates, params=None, **dag_template):
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "t-"},
            "spec": {"entrypoint": "main", "arguments": {"parameters": params or []},
                     "templates": [dict(name="main", dag={"tasks": tasks}, **dag_template)]
                     + templates}}


def sh(name, script, outputs=(), inputs=(), **extra):
    """A container template like cohort's export: OUT=/tmp/outputs, outputs read from there."""
    t = {"name": name, "container": {"name": "main", "image": "cohort:latest",
                                     "command": ["sh", "-c", script],
                                     "env": [{"name": "OUT", "value": "/tmp/outputs"}]}}
    if outputs:
        t["outputs"] = {"parameters": [{"name": o, "valueFrom": {"path": "/tmp/outputs/" + o}}
                                       for o in outputs]}
    if inputs:
        t["inputs"] = {"parameters": [{"name": i} for i in inputs]}
    t.update(extra)
    return t


def task(name, deps=(), when=None, **args):
    t = {"name": name, "template": name}
    if deps:
        t["dependencies"] = list(deps)
    if when:
        t["when"] = when
    if args:
        t["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in args.items()]}
    return t


def phases(results):
    return {k: r.phase for k, r in results.items()}


RUNTIME = {"name": "runtime", "value": "local", "enum": ["local", "slurm"]}


def test_parameters_override_and_enum(tmp_path):
    wf = workflow([task("a")], [sh("a", "mkdir -p $OUT; echo {{workflow.parameters.runtime}} > "
                                        "$OUT/r", outputs=["r"])], [RUNTIME])
    r = A.run_workflow(wf, workdir=tmp_path)["a"]
    assert (r.phase, r.outputs, r.exit_code, r.attempts) == ("Succeeded", {"r": "local"}, 0, 1)
    assert "echo local >" in r.command[2]
    assert A.run_workflow(wf, {"runtime": "slurm"}, tmp_path)["a"].outputs == {"r": "slurm"}
    # like `argo submit -p`, an override replaces the parameter, enum included
    assert A.run_workflow(wf, {"runtime": "k8s"}, tmp_path)["a"].outputs == {"r": "k8s"}
    bad = workflow([task("a")], [sh("a", "true")], [dict(RUNTIME, value="k8s")])
    with pytest.raises(A.ArgoError, match="enum"):
        A.run_workflow(bad, workdir=tmp_path)
    with pytest.raises(A.ArgoError, match="value is required"):
        A.run_workflow(workflow([task("a")], [sh("a", "true")], [{"name": "x"}]), workdir=tmp_path)


def test_outputs_pass_to_inputs_and_each_task_has_its_own_tmp(tmp_path):
    wf = workflow(
        [task("a"), task("c"),
         task("b", ["a", "c"], **{"a-n": "{{tasks.a.outputs.parameters.n}}",
                                  "c-n": "{{tasks.c.outputs.parameters.n}}"})],
        [sh("a", "mkdir -p $OUT; echo 5 > $OUT/n", outputs=["n"]),
         sh("c", "mkdir -p /tmp/outputs; printf '7\\n\\n' > /tmp/outputs/n", outputs=["n"]),
         sh("b", "mkdir -p $OUT; echo $(( {{inputs.parameters.a-n}} * 2 )) > $OUT/m; "
                 "echo \"$(GREETING) $$OUT\"", outputs=["m"], inputs=["a-n", "c-n"])])
    wf["spec"]["templates"][3]["container"]["env"].append({"name": "GREETING", "value": "hi"})
    path = tmp_path / "wf.yaml"  # a path to the YAML works as well as the dict
    path.write_text(yaml.safe_dump(wf))
    res = A.run_workflow(str(path), workdir=tmp_path)
    assert phases(res) == {"a": "Succeeded", "c": "Succeeded", "b": "Succeeded"}
    assert res["a"].outputs == {"n": "5"}          # one trailing newline dropped...
    assert res["c"].outputs == {"n": "7\n"}        # ...only one
    assert res["b"].outputs == {"m": "10"}
    assert res["b"].log.startswith("hi ") and res["b"].log.rstrip().endswith("/tmp/outputs")
    # c's own /tmp: the path in its command is rewritten to a per-attempt directory
    assert " /tmp/outputs" not in res["c"].command[2] and "c.1/tmp/outputs/n" in res["c"].command[2]


def test_image_filesystem_has_no_outputs_dir_unless_the_image_or_a_volume_provides_it(tmp_path):
    wf = workflow([task("a")], [sh("a", "echo 1 > $OUT/v", outputs=["v"])])
    r = A.run_workflow(wf, workdir=tmp_path)["a"]
    assert r.phase == "Failed" and r.exit_code != 0 and r.outputs == {}
    assert A.run_workflow(wf, workdir=tmp_path, image_dirs=["/tmp/outputs"])["a"].outputs == \
        {"v": "1"}
    tmpl = wf["spec"]["templates"][1]
    tmpl["volumes"] = [{"name": "o", "emptyDir": {}}]
    tmpl["container"]["volumeMounts"] = [{"name": "o", "mountPath": "/tmp/outputs"}]
    assert A.run_workflow(wf, workdir=tmp_path)["a"].phase == "Succeeded"


def test_when_false_skips_and_dependents_of_a_skipped_task_run(tmp_path):
    wf = workflow(
        [task("a", when="{{workflow.parameters.runtime}} == slurm"),
         task("b", ["a"]),
         task("c", ["a"], **{"a-v": "{{tasks.a.outputs.parameters.v}}"}),
         task("d", ["a"], when="{{tasks.a.outputs.parameters.v}} == 1"),
         task("e", ["a"], when="'{{workflow.parameters.runtime}}' == 'local' && 2 > 10"),
         task("f", ["c"])],
        [sh("a", "mkdir -p $OUT; echo 1 > $OUT/v", outputs=["v"]), sh("b", "true"),
         sh("c", "echo {{inputs.parameters.a-v}}", inputs=["a-v"]), sh("d", "true"),
         sh("e", "true"), sh("f", "true")], [RUNTIME])
    res = A.run_workflow(wf, workdir=tmp_path)
    # Argo: dependencies mean (Succeeded || Skipped); a skipped task's output is absent, and a
    # task needing it ends in Error; its dependents are Omitted.
    assert phases(res) == {"a": "Skipped", "b": "Succeeded", "c": "Error", "d": "Error",
                           "e": "Skipped", "f": "Omitted"}
    assert "absent optional" in res["c"].message and res["c"].attempts == 0
    assert res["a"].message == "when 'local == slurm' evaluated false"
    # a declared valueFrom.default stands in for the skipped task's output
    wf["spec"]["templates"][1]["outputs"]["parameters"][0]["valueFrom"]["default"] = "none"
    res = A.run_workflow(wf, workdir=tmp_path)
    assert (res["c"].phase, res["c"].log, res["d"].phase) == ("Succeeded", "none\n", "Skipped")
    assert A.run_workflow(wf, {"runtime": "slurm"}, tmp_path)["c"].log == "1\n"


def test_failure_omits_dependents_while_independent_branches_run(tmp_path):
    tasks = [task("a"), task("b", ["a"]), task("c", ["b"]), task("x"), task("y", ["x"])]
    templates = [sh("a", "echo broken; exit 3"), sh("b", "true"), sh("c", "true"),
                 sh("x", "true"), sh("y", "true")]
    res = A.run_workflow(workflow(tasks, templates), workdir=tmp_path)
    assert phases(res) == {"a": "Failed", "b": "Omitted", "c": "Omitted", "x": "Succeeded",
                           "y": "Succeeded"}
    assert (res["a"].exit_code, res["a"].log, res["a"].message) == (3, "broken\n",
                                                                   "Error (exit code 3)")
    # template-level failFast: no task starts after a failure; y gets no node at all
    res = A.run_workflow(workflow(tasks, templates, failFast=True), workdir=tmp_path)
    assert phases(res) == {"a": "Failed", "b": "Omitted", "c": "Omitted", "x": "Succeeded"}


def test_retries(tmp_path):
    flaky = "n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; [ $n -ge 3 ]"

    def run(**retry):
        (tmp_path / "count").unlink(missing_ok=True)
        return A.run_workflow(workflow([task("a")], [sh("a", flaky, **retry)]),
                              workdir=tmp_path)["a"]
    assert (run().phase, run().attempts) == ("Failed", 1)
    r = run(retryStrategy={"limit": 2})
    assert (r.phase, r.attempts, r.exit_code) == ("Succeeded", 3, 0)
    r = run(retryStrategy={"limit": "1"})
    assert (r.phase, r.attempts, r.exit_code) == ("Failed", 2, 1)
    assert run(retryStrategy={"limit": 5, "retryPolicy": "OnError"}).attempts == 1
    assert run(retryStrategy={}).attempts == 3  # no limit: until it succeeds


def test_missing_output_file_is_an_error(tmp_path):
    def run(**extra):
        wf = workflow([task("a"), task("b", ["a"])],
                      [sh("a", "mkdir -p $OUT", outputs=["v"], **extra), sh("b", "true")])
        return A.run_workflow(wf, workdir=tmp_path)
    res = run()
    assert phases(res) == {"a": "Error", "b": "Omitted"}
    assert res["a"].message == "open /tmp/outputs/v: no such file or directory"
    assert run(retryStrategy={"limit": 2})["a"].attempts == 1  # OnFailure: Errors not retried
    assert run(retryStrategy={"limit": 2, "retryPolicy": "Always"})["a"].attempts == 3


def test_deadline_kills_the_process_group(tmp_path):
    wf = workflow([task("a")], [sh("a", "sleep 30 & echo $! > pid; wait",
                                   activeDeadlineSeconds=1, retryStrategy={"limit": 1})])
    r = A.run_workflow(wf, workdir=tmp_path)["a"]
    assert (r.phase, r.attempts) == ("Failed", 2)
    assert r.message == "Pod was active on the node longer than the specified deadline"
    pid = int((tmp_path / "pid").read_text())
    try:
        state = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z")


def test_unresolved_references_are_refused(tmp_path):
    def run(tasks, templates):
        return A.run_workflow(workflow(tasks, templates, [RUNTIME]), workdir=tmp_path)
    with pytest.raises(A.ArgoError, match=r"failed to resolve \{\{workflow.parameters.nope\}\}"):
        run([task("a")], [sh("a", "echo {{workflow.parameters.nope}}")])
    with pytest.raises(A.ArgoError, match="not supplied"):
        run([task("a")], [sh("a", "echo {{inputs.parameters.x}}", inputs=["x"])])
    with pytest.raises(A.ArgoError, match=r"inputs.parameters.y"):
        run([task("a", x="1")], [sh("a", "echo {{inputs.parameters.y}}", inputs=["x"])])
    with pytest.raises(A.ArgoError, match=r"tasks.b.outputs.parameters.v"):  # b: no ancestor
        run([task("a", x="{{tasks.b.outputs.parameters.v}}"), task("b")],
            [sh("a", "true", inputs=["x"]), sh("b", "true", outputs=["v"])])
    with pytest.raises(A.ArgoError, match="dependency cycle"):
        run([task("a", ["b"]), task("b", ["a"])], [sh("a", "true"), sh("b", "true")])
    with pytest.raises(A.ArgoError, match="not defined"):
        run([task("a", ["z"])], [sh("a", "true")])
    with pytest.raises(NotImplementedError):
        run([dict(task("a"), depends="b")], [sh("a", "true")])


@pytest.mark.parametrize("expr,value", [
    ("local == slurm", False), ("slurm == slurm", True), ("a != b", True), ("", True),
    ("'x y' == 'x y'", True), ('"b" > "a"', True), ("B < a", True), ("10 > 9", True),
    ("'10' > '9'", False), ("1 == 1.0", True), ("'1' == 1", False), ("true == true", True),
    ("'true' == true", False), ("!(a == b) && (1 < 2 || x)", True), ("false && (a > 1)", False),
    ("2 + 3 * 4 == 14", True), ("-1 < 0", True),("'2024-01-01' < '2024-01-02'", True),
    ("[gpu-a100] == gpu_a100", False), ("1 == 1 == true", True)])
def test_when_like_govaluate(expr, value):
    assert A.evaluate_when(expr) is value


@pytest.mark.parametrize("expr", [
    "abc > 9", "a > 1 && true", "gpu-a100 == gpu-a100", "x", "v1.2 == v1.2", "a b", "_x == y",
    "'open == x", "(a == b", "!a", "1.2.3 == x"])
def test_when_errors_like_argo(expr):
    with pytest.raises(A.WhenError):
        A.evaluate_when(expr)


def test_k8s_expansion():
    assert A._k8s_expand("$(A)-$(B)-$$(A)-$$-$((1+2))-$", {"A": "x"}) == "x-$(B)-$(A)-$-$((1+2))-$"
