"""Runs an Argo Workflow's DAG on this machine, standing in for Argo's controller and executor.

`run_workflow` takes a Workflow (as `cohort pipeline export --format argo` writes it) and runs
each DAG task's container command as a local process, by the rules of argoproj/argo-workflows
(read at f016ad8, with govaluate 7625b7f):

- Submission (util.go overrideParameters, validate.go): `parameters` replace or add parameters
  like `argo submit -p` (a replaced one loses its enum); each needs a value, a declared value
  must be in its enum, dependencies exist without cycles, {{workflow.parameters.X}},
  {{inputs.parameters.X}} and {{tasks.T.outputs.parameters.O}} (T an ancestor) resolve, inputs
  without default are supplied. Otherwise ArgoError.
- `dependencies` (ancestry.go): a task runs if each dependency Succeeded or was Skipped (or
  Failed/Error under continueOn), else it is Omitted. A skipped/omitted task's outputs are their
  valueFrom.default, else absent: a task needing one ends in Error (scope.go, util.go).
- `when` (steps.go shouldExecute, govaluate): bare words are strings; numbers, quoted strings,
  true/false, == != < <= > >= (two numbers, or two strings compared bytewise), && || ! + - * / %
  and parentheses. False => Skipped; what govaluate rejects (e.g. `gpu-a100`: a minus) => Error.
- Pods (inferFailedReason, executor SaveParameters): exit code != 0 or activeDeadlineSeconds (per
  attempt; the process group is killed) => Failed; an output file missing without
  valueFrom.default => Error; one trailing newline of an output file is dropped. Kubernetes
  expands $(VAR) of the container env in command, args and env, and $$ to $.
- retryStrategy (processNodeRetries): `limit` retries after the first attempt (none: until
  `timeout`); retryPolicy OnFailure (default) retries Failed, OnError Error, Always both.
- `failFast: true` on the DAG template starts no task after an attempt failed; `dag.failFast`
  does not stop scheduling in Argo's code (argo issues #5223, #10312).

Each attempt runs as in a fresh pod: the directories of valueFrom.path, `image_dirs` and emptyDir
mounts are rewritten in command, args, env and workingDir to ROOT+dir (ROOT new per attempt);
only image_dirs and emptyDir mounts exist at start, as a stock image has no /tmp/outputs. A
persistentVolumeClaim volume is one directory per claim (its claimName resolved) for the whole
run, shared by every task that mounts it: its mountPath is rewritten to that directory. A file
of several documents (RBAC objects beside the Workflow) runs its Workflow. Tasks
run one at a time, in waves (the tasks ready at a wave's start, in listed order). A task that
never starts (failFast, `timeout`) has no node in Argo and no entry in the result.
Not emulated (NotImplementedError): `depends`, withItems/withParam/withSequence, hooks, non-
container templates, artifacts, {{=expr}}, env valueFrom/envFrom, volumes but emptyDir and PVCs,
retryStrategy.expression, other variables ({{workflow.name}}, ...), the `in`, regex, ternary and
bitwise operators; backoff is not waited for; date-like strings stay strings (govaluate: times).
"""
import math
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import yaml


class ArgoError(Exception):
    """The Workflow is one Argo would refuse at submission."""


class WhenError(ValueError):
    """A `when` Argo fails to parse or evaluate (its task ends in Error)."""


class _Unresolved(Exception):
    pass


@dataclass
class TaskResult:
    phase: str  # Succeeded, Failed, Error, Skipped or Omitted
    outputs: dict = field(default_factory=dict)
    exit_code: int = None
    attempts: int = 0
    command: list = field(default_factory=list)
    log: str = ""  # stdout+stderr of every attempt, in order
    message: str = ""


# ---- `when`: govaluate, whose VARIABLE tokens Argo turns into strings ------------------------
_TOKEN = re.compile(r"""\s*(?:(?P<num>[\d.]+)|\[(?P<bracket>[^\]]*)(?P<bclose>\])?|
    (?P<word>[^\W\d_][\w.]*)|(?P<q>['"])(?P<str>(?:\\.|[^'"\\])*)(?P<qclose>['"])?|
    (?P<paren>[()])|(?P<sym>(?:[^\w\s()\[\]'"]|_)+))""", re.X | re.S)
_OPS = {"==", "!=", ">", ">=", "<", "<=", "&&", "||", "!", "+", "-", "*", "/", "%"}
_LEVELS = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%")]


def _lex(s):
    toks, pos, s = [], 0, s.rstrip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            raise WhenError("Invalid token: '%s'" % s[pos:].split()[0])
        pos, g = m.end(), m.groupdict()
        if g["num"]:
            try:
                toks.append(("val", float(g["num"])))
            except ValueError:
                raise WhenError("Unable to parse numeric value '%s' to float64" % g["num"])
        elif g["bclose"]:  # [escaped variable]: a string for Argo
            toks.append(("val", g["bracket"]))
        elif g["word"]:
            w = g["word"]
            if w in ("in", "IN"):
                raise NotImplementedError("when operator 'in' is not emulated")
            if "." in w:  # a govaluate ACCESSOR, which Argo leaves as it is
                raise WhenError("'%s' reads as a field access (quote it)" % w)
            toks.append(("val", w == "true" if w in ("true", "false") else w))
        elif g["qclose"]:  # either quote ends a string; a backslash escapes any character
            text = re.sub(r"\\(.)", r"\1", g["str"], flags=re.S)
            toks.append(("val", text))
        elif g["paren"]:
            toks.append((g["paren"], g["paren"]))
        elif g["sym"] in _OPS:
            toks.append(("op", g["sym"]))
        elif g["sym"] in ("=~", "!~", "?", ":", "??", "**", "&", "|", "^", ">>", "<<", "~", ","):
            raise NotImplementedError("when operator %r is not emulated" % g["sym"])
        else:
            raise WhenError("Invalid token: '%s'" % (g["sym"] or "unclosed bracket or string"))
    return toks


def _go(v):  # Go's %v, near enough (floats: 1e+06 in Go is 1000000 here)
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v).removesuffix(".0") if isinstance(v, float) else v


def _apply(op, a, b):
    def fail(what, kind):
        bad = b if type(a) is kind else a
        raise WhenError("Value '%s' cannot be used with the %s '%s', it is not a %s"
                        % (_go(bad), what, op, "bool" if kind is bool else "number"))
    if op in ("==", "!="):
        return (type(a) is type(b) and a == b) == (op == "==")  # reflect.DeepEqual
    if op in ("<", "<=", ">", ">="):
        if not (type(a) is type(b) and type(a) in (float, str)):
            fail("comparator", float)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op in ("&&", "||"):
        if not (type(a) is type(b) is bool):
            fail("logical operator", bool)
        return a and b if op == "&&" else a or b
    if op == "+" and str in (type(a), type(b)):
        return _go(a) + _go(b)
    if not (type(a) is type(b) is float):
        fail("modifier", float)
    if op in ("/", "%") and b == 0:
        return math.nan if op == "%" or a == 0 else math.copysign(math.inf, a)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "%": math.fmod(a, b or 1)}[op]


def evaluate_when(expr):
    """What Argo's shouldExecute decides for `expr` (already substituted): True or False, or
    WhenError where Argo fails the task."""
    if expr == "":
        return True
    toks, pos = _lex(expr), [0]

    def take():
        pos[0] += 1
        return toks[pos[0] - 1] if pos[0] <= len(toks) else (None, "end")

    def binary(k):  # left-associative, as govaluate's reorderStages makes it
        if k == len(_LEVELS):
            return unary()
        node = binary(k + 1)
        while pos[0] < len(toks) and toks[pos[0]][0] == "op" and toks[pos[0]][1] in _LEVELS[k]:
            node = ("bin", take()[1], node, binary(k + 1))
        return node

    def unary():
        kind, v = take()
        if kind == "op" and v in ("!", "-"):
            return ("un", v, unary())
        if kind == "(":
            node = binary(0)
            if take()[0] != ")":
                raise WhenError("Unbalanced parenthesis")
            return node
        if kind != "val":
            raise WhenError("Unexpected '%s' in '%s'" % (v, expr))
        return ("val", v)

    def ev(node):
        if node[0] == "val":
            return node[1]
        if node[0] == "un":
            v = ev(node[2])
            if type(v) is not (bool if node[1] == "!" else float):
                raise WhenError("Value '%s' cannot be used with the prefix '%s'"
                                % (_go(v), node[1]))
            return (not v) if node[1] == "!" else -v
        a = ev(node[2])
        if (node[1], a) in (("&&", False), ("||", True)):  # short circuit, before type checks
            return a
        return _apply(node[1], a, ev(node[3]))

    tree = binary(0)
    if pos[0] != len(toks):
        raise WhenError("Cannot transition to token '%s' in '%s'" % (toks[pos[0]][1], expr))
    result = ev(tree)
    if type(result) is not bool:
        raise WhenError("Expected boolean evaluation for '%s'. Got %s" % (expr, _go(result)))
    return result


# ---- {{...}} and $(...) substitution ---------------------------------------------------------
_TAG = re.compile(r"\{\{(.*?)\}\}", re.S)
_ABSENT = object()  # the output of a skipped/omitted task without a valueFrom.default
_EMULATED = re.compile(r"(workflow|inputs)\.parameters\..+|tasks\.[^.]+\.outputs\.parameters\..+")
_ARGO_VARS = ("item.", "steps.", "inputs.", "outputs.", "pod.", "workflow.", "tasks.")


def _subst(text, scope):
    def one(m):
        tag = m.group(1).strip()
        v = scope.get(tag)
        if v is _ABSENT:
            raise _Unresolved("{{%s}} is the output of a skipped or omitted task" % tag)
        if v is not None:
            return v
        if _EMULATED.fullmatch(tag):
            raise _Unresolved("failed to resolve {{%s}}" % tag)
        if tag.startswith(_ARGO_VARS + ("=",)):
            raise NotImplementedError("{{%s}} is not emulated" % tag)
        return m.group(0)  # not an Argo variable: left as it is
    return _TAG.sub(one, _str(text))


def _k8s_expand(text, env):  # $(VAR) from the container env, $$ -> $, the rest unchanged
    def one(m):
        return "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([^)]*)\)", one, text)


def _str(v):
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _params(obj, key):  # obj[key].parameters
    return (obj.get(key) or {}).get("parameters") or []


# ---- submission -----------------------------------------------------------------------------
def _parameters(spec, overrides):
    params = [{"name": k, "value": _str(v)} for k, v in overrides.items()]  # -p keeps no enum
    params += [p for p in _params(spec, "arguments") if p["name"] not in overrides]
    scope = {}
    for p in params:
        where = "spec.arguments.parameters." + p["name"]
        if "valueFrom" in p:
            raise NotImplementedError(where + ".valueFrom")
        if p.get("value") is None:
            raise ArgoError(where + ".value is required")
        if p.get("enum") is not None and _str(p["value"]) not in map(_str, p["enum"]):
            raise ArgoError("%s.value should be present in %s.enum list" % (where, where))
        scope["workflow.parameters." + p["name"]] = _str(p["value"])
    return scope


def _resolves(texts, scope, where):
    for text in texts:
        try:
            _subst(text, scope)
        except _Unresolved as e:
            raise ArgoError("%s: %s" % (where, e))


def _check_template(t, global_scope):
    c, rs, where = t.get("container") or {}, t.get("retryStrategy") or {}, "templates." + t["name"]
    env, outs = c.get("env") or [], _params(t, "outputs")
    unsupported = [
        ("a non-container template", not c or set(t) & {"steps", "dag", "script", "resource",
                                                         "suspend", "data", "http", "plugin"}),
        ("a container without command (the image's entrypoint)", not c.get("command")),
        ("env valueFrom/envFrom", c.get("envFrom") or any("valueFrom" in e for e in env)),
        ("artifacts", any((t.get(k) or {}).get("artifacts") for k in ("inputs", "outputs"))),
        ("an output without an absolute valueFrom.path",
         any(not (p.get("valueFrom") or {}).get("path", "").startswith("/") for p in outs)),
        ("retryStrategy %s" % rs, rs.get("expression") or rs.get("retryPolicy", "OnFailure")
         not in ("OnFailure", "OnError", "Always"))]
    for what, found in unsupported:
        if found:
            raise NotImplementedError("%s: %s" % (where, what))
    scope = dict(global_scope)
    scope.update({"inputs.parameters." + p["name"]: "" for p in _params(t, "inputs")})
    _resolves(c["command"] + (c.get("args") or []) + [c.get("workingDir") or "",
              t.get("activeDeadlineSeconds", ""), rs.get("limit", "")] +
              [e.get("value") or "" for e in env], scope, where)


def _check_dag(tasks, templates, global_scope):
    ancestors = {}

    def ancestry(name, trail=()):
        if name in trail:
            raise ArgoError("dependency cycle: %s" % " -> ".join(trail + (name,)))
        if name not in ancestors:
            deps = tasks[name].get("dependencies") or []
            ancestors[name] = set(deps).union(*[ancestry(d, trail + (name,)) for d in deps])
        return ancestors[name]

    for name, t in tasks.items():
        where = "tasks." + name
        if set(t) & {"depends", "withItems", "withParam", "withSequence", "hooks", "onExit",
                     "templateRef", "inline"}:
            raise NotImplementedError("%s: %s" % (where, sorted(t)))
        if t.get("template") not in templates:
            raise ArgoError("%s: template %r not found" % (where, t.get("template")))
        for d in t.get("dependencies") or []:
            if d not in tasks:
                raise ArgoError("%s dependency '%s' not defined" % (where, d))
        if t.get("dependencies") and name[:1].isdigit():
            raise ArgoError("%s name cannot begin with a digit" % where)
        args = {p["name"]: p.get("value") for p in _params(t, "arguments")}
        for p in _params(templates[t["template"]], "inputs"):
            if all(x is None for x in (args.get(p["name"]), p.get("default"), p.get("value"))):
                raise ArgoError("%s: inputs.parameters.%s was not supplied" % (where, p["name"]))
        scope = dict(global_scope)
        for a in ancestry(name):
            for p in _params(templates[tasks[a]["template"]], "outputs"):
                scope["tasks.%s.outputs.parameters.%s" % (a, p["name"])] = ""
        _resolves([v for v in args.values() if v is not None] + [t.get("when") or ""], scope, where)


# ---- running --------------------------------------------------------------------------------
def _spawn(argv, cwd, env, limit, log_path):
    """(exit code, deadline exceeded). The process group is killed once the main process ends,
    as a pod's processes end with it."""
    with open(log_path, "wb") as log:
        try:
            p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            log.write(("failed to start %s: %s\n" % (argv[0], e)).encode())
            return 128, False
        try:
            p.wait(timeout=max(limit, 0.001))
            hit = False
        except subprocess.TimeoutExpired:
            hit = True
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            _wait_group_dead(p.pid)
    return p.returncode, hit


def _wait_group_dead(pgid, timeout=10):
    """Until no process of group `pgid` runs (SIGKILL takes effect asynchronously)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/stat" % pid) as f:
                    state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
            except OSError:
                continue
            alive |= int(pgrp) == pgid and state not in "ZX"
        if not alive:
            return
        time.sleep(0.01)


def _prepare(task, tmpl, scope):
    """The template with the task's arguments: (argv, env, workingDir, deadline, retry limit)."""
    args = {p["name"]: _str(p["value"]) for p in _params(task, "arguments")}
    tscope = {k: v for k, v in scope.items() if k.startswith("workflow.")}
    for p in _params(tmpl, "inputs"):
        value, ref = args.get(p["name"]), _TAG.fullmatch(args.get(p["name"], "").strip())
        if ref and scope.get(ref.group(1).strip()) is _ABSENT:  # the input's default applies
            value = None
            if p.get("value") is None and p.get("default") is None:
                raise _Unresolved("inputs.parameters.%s: argument references an absent optional "
                                  "(skipped/omitted node output with no default)" % p["name"])
        if value is None:
            value = p["value"] if p.get("value") is not None else p.get("default")
        tscope["inputs.parameters." + p["name"]] = _subst(value, scope)
    c, env = tmpl["container"], {}
    for e in c.get("env") or []:
        env[e["name"]] = _k8s_expand(_subst(e.get("value", ""), tscope), env)
    argv = [_k8s_expand(_subst(a, tscope), env) for a in c["command"] + (c.get("args") or [])]
    ads, rs = tmpl.get("activeDeadlineSeconds"), tmpl.get("retryStrategy") or {}
    return (argv, env, _subst(c.get("workingDir") or "", tscope),
            float(_subst(ads, tscope)) if ads is not None else None,
            int(_subst(rs["limit"], tscope)) if "limit" in rs else None)


def _run_task(task, tmpl, scope, run_dir, deadline, base_env, workdir, image_dirs, volumes):
    """(TaskResult, whether an attempt failed)."""
    r = TaskResult("Error")
    try:
        argv, cenv, wdir, ads, limit = _prepare(task, tmpl, scope)
    except _Unresolved as e:
        r.message = str(e)
        return r, True
    rs, outs = tmpl.get("retryStrategy"), _params(tmpl, "outputs")
    retried = {"Failed": ("Always", "OnFailure"), "Error": ("Always", "OnError")}
    volumes = dict(volumes, **{v["name"]: v for v in tmpl.get("volumes") or []})
    made, shared = set(image_dirs), {}  # shared: mountPath -> the claim's directory
    for m in tmpl["container"].get("volumeMounts") or []:
        v = volumes.get(m["name"], {})
        if "persistentVolumeClaim" in v:
            claim = _subst(v["persistentVolumeClaim"]["claimName"], scope)
            shared[m["mountPath"].rstrip("/")] = os.path.join(run_dir, "pvc-" + claim)
            os.makedirs(shared[m["mountPath"].rstrip("/")], exist_ok=True)
            continue
        if "emptyDir" not in v:
            raise NotImplementedError("volume %r: only emptyDir and persistentVolumeClaim "
                                      "volumes are emulated" % m["name"])
        made.add(m["mountPath"].rstrip("/"))
    dirs = sorted(made | set(shared) | {os.path.dirname(p["valueFrom"]["path"]) for p in outs},
                  key=len)[::-1]
    prefix = re.compile(r"(?<![\w.-])(%s)(?=/|$|[^\w.-])" % "|".join(map(re.escape, dirs)))
    failed, logs = False, []
    while True:
        r.attempts += 1
        root = os.path.join(run_dir, "%s.%d" % (task["name"], r.attempts))
        for d in dirs:  # a mapped directory's parent exists in the image (like /tmp)
            if d not in shared:
                os.makedirs(root + (d if d in made else os.path.dirname(d)), exist_ok=True)

        def fs(s):
            return prefix.sub(lambda m: shared.get(m.group(0), root + m.group(0)), s) \
                if dirs else s
        r.command = [fs(a) for a in argv]
        cwd = os.path.join(workdir, fs(wdir))
        os.makedirs(cwd, exist_ok=True)
        left = deadline - time.monotonic()
        rc, hit = _spawn(r.command, cwd, dict(base_env, **{k: fs(v) for k, v in cenv.items()}),
                         min(left, ads or left), root + ".log")
        with open(root + ".log", "rb") as f:
            logs.append(f.read().decode(errors="replace"))
        r.exit_code, r.outputs, missing = rc, {}, []
        for p in outs:
            path, default = root + p["valueFrom"]["path"], p["valueFrom"].get("default")
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    r.outputs[p["name"]] = f.read().removesuffix("\n")
            elif default is not None:
                r.outputs[p["name"]] = _str(default)
            else:
                missing.append(p["valueFrom"]["path"])
        if hit:
            r.phase, r.message = "Failed", (
                "Pod was active on the node longer than the specified deadline"
                if ads and ads <= left else "run_workflow timeout")
        elif rc != 0:
            r.phase, r.message = "Failed", "Error (exit code %d)" % rc
        elif missing:
            r.phase, r.message = "Error", "open %s: no such file or directory" % missing[0]
        else:
            r.phase, r.message = "Succeeded", ""
        failed |= r.phase != "Succeeded"
        if r.phase == "Succeeded" or rs is None or rs.get("retryPolicy", "OnFailure") not in \
                retried[r.phase] or (limit is not None and r.attempts > limit) or \
                time.monotonic() >= deadline:
            break
    r.log = "".join(logs)
    return r, failed


def run_workflow(workflow, parameters=None, workdir=".", env=None, timeout=600, image_dirs=()):
    """Runs `workflow` (a dict, or the path of its YAML) as Argo would; returns {task name:
    TaskResult} for every task that got a node. `parameters` act as `argo submit -p`; each
    task's process gets os.environ + `env` + its container's env and runs in `workdir` (or its
    workingDir, relative to `workdir`). `image_dirs`: directories the image provides (created
    empty in each attempt's filesystem). Raises ArgoError for a Workflow Argo would refuse."""
    if not isinstance(workflow, dict):
        with open(workflow) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        workflows = [d for d in docs if d.get("kind") == "Workflow"]
        if len(workflows) != 1:
            raise ArgoError("%s holds %d Workflows" % (workflow, len(workflows)))
        workflow = workflows[0]
    spec = workflow.get("spec") or {}
    templates = {t["name"]: t for t in spec.get("templates") or []}
    scope = _parameters(spec, parameters or {})
    dag_tmpl = templates.get(spec.get("entrypoint"))
    if dag_tmpl is None:
        raise ArgoError("spec.entrypoint: template %r not found" % spec.get("entrypoint"))
    if "dag" not in dag_tmpl:
        raise NotImplementedError("the entrypoint must be a dag template")
    tasks = {t["name"]: t for t in dag_tmpl["dag"].get("tasks") or []}
    for name in {t.get("template") for t in tasks.values()} & set(templates):
        _check_template(templates[name], scope)
    _check_dag(tasks, templates, scope)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    base_env = dict(os.environ, **(env or {}))
    workdir, deadline = os.path.abspath(workdir), time.monotonic() + timeout
    results, no_node, halted, pending = {}, set(), False, list(tasks.values())

    def decided(name, phase, message="", result=None):
        results[name] = result or TaskResult(phase, message=message)
        for p in _params(templates[tasks[name]["template"]], "outputs"):
            v = results[name].outputs.get(p["name"], (p.get("valueFrom") or {}).get("default"))
            scope["tasks.%s.outputs.parameters.%s" % (name, p["name"])] = \
                _ABSENT if v is None else _str(v)

    with tempfile.TemporaryDirectory(prefix="argo-exec-") as run_dir:
        while pending:  # a wave: the tasks whose dependencies are decided, in listed order
            ready = [t for t in pending if all(d in results or d in no_node
                                               for d in t.get("dependencies") or [])]
            pending = [t for t in pending if t not in ready]
            failed_in_wave = False
            for t in ready:
                name, deps = t["name"], t.get("dependencies") or []
                if any(d in no_node for d in deps):
                    no_node.add(name)
                    continue
                if not all(results[d].phase in _allowed(tasks[d]) for d in deps):
                    decided(name, "Omitted", "omitted: depends condition not met")
                    continue
                try:
                    when = _subst(t.get("when") or "", scope)
                    if not evaluate_when(when):
                        decided(name, "Skipped", "when '%s' evaluated false" % when)
                        continue
                except (_Unresolved, WhenError) as e:
                    results[name] = TaskResult("Error", message=str(e))
                    continue
                if halted or time.monotonic() >= deadline:
                    no_node.add(name)
                    continue
                r, failed = _run_task(t, templates[t["template"]], scope, run_dir, deadline,
                                      base_env, workdir, image_dirs, volumes)
                decided(name, r.phase, result=r)
                failed_in_wave |= failed
            halted |= failed_in_wave and bool(dag_tmpl.get("failFast"))
    return results


def _allowed(dep):  # the phases of a dependency that let its dependents run
    cont = dep.get("continueOn") or {}
    return {"Succeeded", "Skipped"} | {p for p in ("Failed", "Error") if cont.get(p.lower())}
