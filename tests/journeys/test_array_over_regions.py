"""Journey: an AWS Batch user fans one job out over regions.

The user keeps a header-less manifest, one element per line (`us-east-1, s3://bucket/path`),
declares each region as a target with its own concurrency, and walks:
  1. `cohort submit` without naming the manifest's columns: refused (exit 6, the message
     says to use --array-manifest-columns), nothing recorded; again with
     `--array-manifest-columns REGION,DATA --wait`: every element runs on the target its
     region names, no target runs more elements at once than its concurrency, and
     `cohort status --json` / `cohort logs --element I` show each element's region, data
     path and index (submit-time ${DATA} substitution and the element's environment);
  2. the same manifest plus regions on two Kubernetes contexts, `--dry-run`: one section per
     target, each Kubernetes section holds valid core objects (tests/k8s/validate-core.mjs)
     for its own elements only, nothing recorded;
  3. the array from a PostgreSQL metadata table (`array.from_sql`) over the same targets;
  4. a manifest line whose region names no target: refused with the list of targets,
     nothing recorded.

Everything goes through the cohort command line and the files it writes, with a private
COHORT_HOME per test.
"""
import json
import re
import shutil
import subprocess
import textwrap
from collections import Counter

import pytest

import journey_util as J

K8S_DIR = J.REPO / "tests" / "k8s"

# 3 x us-east-1 and 2 x us-west-2, without a header row, as users write them.
MANIFEST = [("us-east-1", "s3://shards/east/part-0"),
            ("us-west-2", "s3://shards/west/part-0"),
            ("us-east-1", "s3://shards/east/part-1"),
            ("us-east-1", "s3://shards/east/part-2"),
            ("us-west-2", "s3://shards/west/part-1")]
CONCURRENCY = {"us-east-1": 2, "us-west-2": 1}

# The element's work: prints what it got (the index, region and target substituted at
# submit; `$$REGION` stays `$REGION` for the shell, read from the element's environment;
# $1 is the data path passed as an argument), and records start/end with short appends.
SCRIPT = ('echo "element $COHORT_ARRAY_INDEX of $COHORT_ARRAY_SIZE region=$REGION data=$1 '
          'target=$COHORT_ARRAY_TARGET env_region=$$REGION"; '
          'echo "start $COHORT_ARRAY_TARGET $COHORT_ARRAY_INDEX" >> "$EVENTS"; sleep 0.3; '
          'echo "end $COHORT_ARRAY_TARGET $COHORT_ARRAY_INDEX" >> "$EVENTS"')

LOCAL_TARGETS = """\
      - {name: us-east-1, backend: local, concurrency: 2}
      - {name: us-west-2, backend: local, concurrency: 1}
"""


class User:
    """A user's shell in tmp_path with a private COHORT_HOME."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.env = J.job_env(COHORT_HOME=self.home)

    def write(self, name, text):
        p = self.dir / name
        p.write_text(textwrap.dedent(text))
        return p

    def manifest(self, name, rows):
        return self.write(name, "".join("%s, %s\n" % row for row in rows))

    def spec(self, name, array, targets, env=None, extra=""):
        env_line = "env: %s\n" % json.dumps(env) if env else ""
        return self.write(name, "name: regions\n"
                          "entrypoint: sh\n"
                          "args: [-c, %s, element, '${DATA}']\n"
                          "nproc_per_node: 1\n"
                          "%s%s"
                          "array: %s\n"
                          "targets:\n%s" % (json.dumps(SCRIPT), env_line, extra, array,
                                            textwrap.dedent(targets)))

    def cohort(self, *args, timeout=90):
        return subprocess.run([str(J.BIN), *map(str, args)], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def status(self, job):
        r = self.cohort("status", job, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)

    def history(self):
        r = self.cohort("list", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def user(tmp_path):
    return User(tmp_path)


def max_running(events_text):
    """{target: most elements running at once} from `start|end TARGET INDEX` lines, and
    {(target, index): [events]} to check each element ran exactly once."""
    running, most, seen = Counter(), Counter(), {}
    for line in events_text.splitlines():
        what, target, index = line.split()
        seen.setdefault((target, int(index)), []).append(what)
        running[target] += 1 if what == "start" else -1
        most[target] = max(most[target], running[target])
    return dict(most), seen


def check_finished_array(user, job, rows, events):
    """Every element of `job` succeeded on the target its region names, its log shows its
    own region, data path and index, and no target ran more than its concurrency at once."""
    st = user.status(job)
    assert st["backend"] == "targets" and st["array_size"] == len(rows), st
    assert st["state"] == "succeeded" and st["exit_code"] == 0, st
    assert 0 < st["started_at"] <= st["ended_at"], st
    elements = sorted(st["elements"], key=lambda e: e["index"])
    assert [e["index"] for e in elements] == list(range(len(rows))), st
    for e, (region, data) in zip(elements, rows):
        assert e["state"] == "succeeded" and e["exit_code"] == 0, e
        assert e["target"] == region, e
        log = user.cohort("logs", job, "--element", e["index"])
        assert log.returncode == 0, log.stdout + log.stderr
        want = ("[rank0]: element %d of %d region=%s data=%s target=%s env_region=%s"
                % (e["index"], len(rows), region, data, region, region))
        assert want in log.stdout.splitlines(), (want, log.stdout)
        others = {d for _, d in rows} - {data}
        assert not any(d in log.stdout for d in others), log.stdout

    most, seen = max_running(events.read_text())
    want_seen = {(region, i): ["start", "end"] for i, (region, _) in enumerate(rows)}
    assert seen == want_seen, "each element starts and ends once, on its region: %s" % seen
    for target, limit in CONCURRENCY.items():
        if target in most:
            assert 1 <= most[target] <= limit, (target, most, events.read_text())
    return st


def test_header_less_manifest_over_two_local_regions(user):
    user.manifest("regions.csv", MANIFEST)
    events = user.dir / "events"
    spec = user.spec("regions.yaml", "{manifest: regions.csv, target_by: REGION}",
                     LOCAL_TARGETS, env={"EVENTS": str(events)})

    # The manifest has no header and the spec names no columns: refused, nothing recorded.
    r = user.cohort("submit", spec, "--wait")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "--array-manifest-columns" in r.stderr, r.stderr
    assert "nothing was submitted" in r.stderr, r.stderr
    assert user.history() == []
    assert not events.exists()

    r = user.cohort("submit", spec, "--array-manifest-columns", "REGION,DATA", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "succeeded" in r.stdout, r.stdout

    # `cohort list` shows the one parent job, not its per-target children.
    jobs = user.history()
    assert len(jobs) == 1, jobs
    parent = jobs[0]
    assert parent["name"] == "regions" and parent["backend"] == "targets", parent
    assert parent["array_size"] == len(MANIFEST) and parent["state"] == "succeeded", parent

    st = check_finished_array(user, parent["id"], MANIFEST, events)
    # The job's name finds the same parent (the children share the name).
    assert user.status("regions")["id"] == st["id"]
    by_name = user.cohort("logs", "regions", "--element", "4")
    assert by_name.returncode == 0 and "data=s3://shards/west/part-1" in by_name.stdout, \
        by_name.stdout + by_name.stderr


def split_dry_run(text):
    """[(header match, body text)] for each `# ---- target ...` section of a dry run."""
    header = re.compile(r"^# ---- target (\S+) \((\w+)(?:, context (\S+), namespace (\S+))?\): "
                        r"(\d+) element\(s\), array indices (\d+(?:,\d+)*)(.*)$", re.M)
    starts = list(header.finditer(text))
    return [(m, text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)])
            for i, m in enumerate(starts)]


def validate_core(path):
    """tests/k8s/validate-core.mjs on `path`; False when node or its modules are absent."""
    modules = K8S_DIR / "node_modules" / "kubernetes-models"
    if shutil.which("node") is None or not modules.is_dir():
        return False
    r = subprocess.run(["node", str(K8S_DIR / "validate-core.mjs"), str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "validate-core %s:\n%s%s" % (path, r.stdout, r.stderr)
    return True


def test_dry_run_over_local_and_kubernetes_regions(user):
    yaml = pytest.importorskip("yaml")
    rows = MANIFEST + [("eu-central-1", "s3://shards/eu/part-0"),
                       ("ap-northeast-1", "s3://shards/ap/part-0"),
                       ("eu-central-1", "s3://shards/eu/part-1")]
    user.manifest("regions.csv", rows)
    spec = user.spec("regions.yaml",
                     "{manifest: regions.csv, columns: [REGION, DATA], target_by: REGION}",
                     LOCAL_TARGETS + """\
      - {name: eu-central-1, backend: kubernetes, context: eu-ctx, namespace: ml, flavor: indexed,
         concurrency: 1}
      - {name: ap-northeast-1, backend: kubernetes, context: ap-ctx, namespace: ml-ap,
         flavor: indexed}
""", env={"EVENTS": str(user.dir / "events")}, extra="image: registry.example/cohort:1\n")

    r = user.cohort("submit", spec, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    sections = split_dry_run(r.stdout)
    want = {"us-east-1": ("local", None, None), "us-west-2": ("local", None, None),
            "eu-central-1": ("kubernetes", "eu-ctx", "ml"),
            "ap-northeast-1": ("kubernetes", "ap-ctx", "ml-ap")}
    assert [m.group(1) for m, _ in sections] == list(want), r.stdout

    validated = False
    for m, body in sections:
        target, backend, context, namespace, count, indices, rest = m.groups()
        mine = [i for i, (region, _) in enumerate(rows) if region == target]
        assert (backend, context, namespace) == want[target], m.group(0)
        assert int(count) == len(mine) and indices == ",".join(map(str, mine)), m.group(0)
        others = {region for region, _ in rows} - {target}
        assert not any(o in body for o in others), "%s's section names another region:\n%s" \
            % (target, body)
        if backend == "local":
            assert rest == ", at most %d at once" % CONCURRENCY[target], m.group(0)
            commands = [l for l in body.splitlines() if l and not l.startswith("#")]
            assert len(commands) == len(mine), body
            for i, line in zip(mine, commands):
                assert "COHORT_ARRAY_INDEX=%d " % i in line and "REGION=%s " % target in line \
                    and rows[i][1] in line, line
            continue

        # Kubernetes: valid core objects; the ConfigMap has one entry per element, with the
        # element's variables, and the Indexed Job runs that many completions.
        manifest = user.dir / ("%s.yaml" % target)
        manifest.write_text(body)
        validated = validate_core(manifest) or validated
        docs = [d for d in yaml.safe_load_all(body) if d]
        kinds = Counter(d["kind"] for d in docs)
        assert kinds == Counter({"ConfigMap": 1, "Job": 1}), kinds
        cm = next(d for d in docs if d["kind"] == "ConfigMap")
        job = next(d for d in docs if d["kind"] == "Job")
        assert sorted(cm["data"], key=int) == [str(k) for k in range(len(mine))], cm["data"]
        for k, i in enumerate(mine):
            # What the pod's shell gets from the element's entry (it sources the file).
            entry = user.dir / ("%s-%d.sh" % (target, k))
            entry.write_text(cm["data"][str(k)])
            got = subprocess.run(
                ["/bin/sh", "-c", '. "$0"; printf "%s\\n" "$REGION" "$DATA" '
                 '"$COHORT_ARRAY_INDEX" "$COHORT_ARRAY_TARGET"', str(entry)],
                capture_output=True, text=True, timeout=30)
            assert got.returncode == 0, got.stderr
            assert got.stdout.split("\n")[:4] == [target, rows[i][1], str(i), target], (
                got.stdout, cm["data"][str(k)])
        assert job["apiVersion"] == "batch/v1", job
        assert job["spec"]["completionMode"] == "Indexed", job
        assert job["spec"]["completions"] == len(mine), job
        # The target's concurrency (eu-central-1: 1) bounds the pods at once.
        limit = {"eu-central-1": 1}.get(target, len(mine))
        assert job["spec"]["parallelism"] == limit, job
        volumes = job["spec"]["template"]["spec"]["volumes"]
        assert {"name": cm["metadata"]["name"]} in [v.get("configMap") for v in volumes], volumes
    if not validated:
        print("validate-core skipped: node or tests/k8s/node_modules absent")
    assert user.history() == []


@pytest.fixture
def shards_table(postgres_server):
    """The user's metadata table: one row per shard with its region."""
    r = subprocess.run(
        ["psql", postgres_server, "-v", "ON_ERROR_STOP=1", "-c",
         "CREATE TABLE shards(id serial PRIMARY KEY, region text NOT NULL, path text NOT NULL);"
         "INSERT INTO shards(region, path) VALUES"
         " ('us-west-2', 's3://meta/west/a'), ('us-east-1', 's3://meta/east/b'),"
         " ('us-east-1', 's3://meta/east/c'), ('us-west-2', 's3://meta/west/d');"],
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return postgres_server


def test_array_from_a_postgresql_table_over_regions(user, shards_table):
    rows = [("us-west-2", "s3://meta/west/a"), ("us-east-1", "s3://meta/east/b"),
            ("us-east-1", "s3://meta/east/c"), ("us-west-2", "s3://meta/west/d")]
    events = user.dir / "events"
    query = 'SELECT region AS "REGION", path AS "DATA" FROM shards ORDER BY id'
    spec = user.spec("sql.yaml", "{from_sql: %s, db: %s, target_by: REGION}"
                     % (json.dumps(query), json.dumps(shards_table)),
                     LOCAL_TARGETS, env={"EVENTS": str(events)})
    r = user.cohort("submit", spec, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = user.history()
    assert len(jobs) == 1 and jobs[0]["backend"] == "targets", jobs
    check_finished_array(user, jobs[0]["id"], rows, events)


def test_a_region_without_a_target_is_refused(user):
    rows = MANIFEST[:2] + [("sa-east-1", "s3://shards/sa/part-0")] + MANIFEST[2:]
    user.manifest("regions.csv", rows)
    events = user.dir / "events"
    spec = user.spec("regions.yaml",
                     "{manifest: regions.csv, columns: [REGION, DATA], target_by: REGION}",
                     LOCAL_TARGETS, env={"EVENTS": str(events)})
    for extra in (["--wait"], ["--dry-run"]):
        r = user.cohort("submit", spec, *extra)
        assert r.returncode == 6, r.stdout + r.stderr
        assert "sa-east-1" in r.stderr and "names no target" in r.stderr, r.stderr
        assert "targets: us-east-1, us-west-2" in r.stderr, r.stderr
        assert "nothing was submitted" in r.stderr, r.stderr
        assert r.stdout == "", r.stdout
    assert user.history() == []
    assert not events.exists()
