"""One view of the whole job, on three network-namespace hosts (root; skipped otherwise):

- every agent runs with --metrics-port 0 --metrics-host 0.0.0.0 and publishes its endpoint in
  the job's store; host 0's /job page, rendered by headless Chromium, lists all three hosts
  and their ranks; `cohort top` in a terminal (tmux) shows the same;
- host 2 is killed (agent and worker, SIGKILL): the page and `cohort top` show it as LOST
  with the cause the survivors recorded, and its last ranks, instead of dropping it; `cohort
  top --once` reading the job's store directly (--rdzv-endpoint), which never saw host 2
  answer, lists it as UNREACHABLE;
- `cohort bench scaling --nodes 1,2` runs the training on 1 and then 2 hosts and reports
  samples/s, speed-up, efficiency and the plot.
Screenshots of the page go to $COHORT_ARTIFACTS (else the test's directory).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns  # noqa: E402
from cluster_fixture import cluster  # noqa: E402,F401 - the fixture
from test_cluster import BIN, TRAIN, node_argv, node_env  # noqa: E402

pytestmark = pytest.mark.skipif(netns.available() is not None,
                                reason=str(netns.available()))

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
URL_RE = re.compile(r"dashboard on (http://[0-9.]+:\d+/)")


def curl_json(c, host, url):
    """GET `url` from inside host `host`'s namespace (the addresses exist only there)."""
    p = subprocess.run(["ip", "netns", "exec", c.hosts[host], "curl", "-sf", "--max-time", "10",
                        url], capture_output=True, text=True, timeout=30)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout else None


def chromium(c, host, url, out_dir, *extra):
    argv = ["ip", "netns", "exec", c.hosts[host], CHROMIUM, "--headless", "--no-sandbox",
            "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000",
            "--window-size=1400,1100", "--user-data-dir=" + str(out_dir / "chromium"), *extra, url]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


class Tmux:
    """A detached tmux session running one command; capture() is its screen as text."""

    def __init__(self, argv, width=200, height=50):
        self.name = "cohort-" + uuid.uuid4().hex[:8]
        cmd = " ".join("'%s'" % a for a in argv)
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width), "-y",
                        str(height), cmd], check=True, timeout=30)

    def capture(self):
        p = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True,
                           text=True, timeout=30)
        return p.stdout

    def close(self):
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True, timeout=30)


def node_rows(screen):
    """{addr: state} of the node lines of a `cohort top` screen (between the NODE and the
    RANK headers)."""
    m = re.search(r"^\s+NODE .*?$(.*?)^\s+RANK ", screen, re.M | re.S)
    return dict(re.findall(r"^\s+\d+\s+\S+ (10\.[0-9.]+)\s+(\S+)", m.group(1), re.M)) if m else {}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_job_page_and_top_show_every_host_and_a_killed_one_as_lost(cluster, tmp_path):
    c = cluster(3)
    ckpt = tmp_path / "ckpt"
    metrics = ("--metrics-port", "0", "--metrics-host", "0.0.0.0")
    nodes = [c.start(i, node_argv(c, i, ckpt, "2:3", 1000000, metrics), node_env(c, i),
                     "node%d" % i) for i in range(3)]
    addrs = [c.addr(i) for i in range(3)]
    url = netns.wait_for(lambda: (URL_RE.search(nodes[0].stderr) or [None, None])[1], 60,
                         "host 0's dashboard URL")
    shots = Path(os.environ.get("COHORT_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)

    def everyone_training():
        job = curl_json(c, 0, url + "api/job")
        if not job or len(job["nodes"]) != 3:
            return None
        ranks = [r for n in job["nodes"] for r in n["ranks"]]
        if sorted(r["rank"] for r in ranks) != [0, 1, 2]:
            return None
        if any(n["state"] != "HEALTHY" for n in job["nodes"]):
            return None
        return job if all((r["step"] or 0) >= 10 for r in ranks) else None
    job = netns.wait_for(everyone_training, 120, "three hosts' ranks training", step=0.5)
    assert sorted(n["addr"] for n in job["nodes"]) == addrs, job["nodes"]
    assert job["summary"]["world_size"] == 3 and job["summary"]["running"] == 3, job["summary"]
    assert all(n["world_size"] == 3 for n in job["nodes"])
    assert job["summary"]["samples_per_s"] > 0

    # The page, as a browser draws it: one row per host and per rank.
    html = chromium(c, 0, url + "job", tmp_path, "--dump-dom")
    for a in addrs:
        assert re.search(r'<tr class="node HEALTHY" data-node="\d" data-addr="%s" '
                         r'data-state="HEALTHY">' % re.escape(a), html), html[:5000]
    assert sorted(re.findall(r'<tr class="rank HEALTHY" data-node="\d" data-rank="(\d)"', html)) \
        == ["0", "1", "2"], html[:5000]
    assert "[%s rank" % addrs[1] in html, "no log lines of host 1"
    chromium(c, 0, url + "job", tmp_path, "--screenshot=" + str(shots / "job-page.png"))

    # `cohort top` in a terminal, from host 1, pointed at host 0's endpoint.
    top = Tmux(["ip", "netns", "exec", c.hosts[1], str(BIN), "top", url, "--interval", "0.5"])
    try:
        screen = netns.wait_for(lambda: (lambda s: s if len(node_rows(s)) == 3 else None)(
            top.capture()), 60, "cohort top listing three nodes", step=0.3)
        assert node_rows(screen) == {a: "HEALTHY" for a in addrs}, screen
        assert "world size 3" in screen, screen

        # Host 2 dies: agent and worker at once.
        nodes[2].kill()

        def lost():
            j = curl_json(c, 0, url + "api/job")
            if not j:
                return None
            gone = [n for n in j["nodes"] if n["addr"] == addrs[2]]
            return j if gone and gone[0]["state"] == "LOST" and j["summary"]["world_size"] == 2 \
                else None
        job = netns.wait_for(lost, 90, "host 2 shown as lost and the job on 2 ranks", step=0.5)
        gone = [n for n in job["nodes"] if n["addr"] == addrs[2]][0]
        print("lost host's cause:", gone["cause"])
        assert "recorded by the survivors" in gone["cause"], gone
        assert gone["ranks"] and all(r["state"] == "LOST" for r in gone["ranks"]), gone
        assert job["summary"]["lost"] == 1 and job["summary"]["running"] == 2, job["summary"]

        html = chromium(c, 0, url + "job", tmp_path, "--dump-dom")
        row = re.search(r'<tr class="node LOST" data-node="\d" data-addr="%s" data-state="LOST">'
                        r'(.*?)</tr>' % re.escape(addrs[2]), html, re.S)
        assert row and "recorded by the survivors" in row.group(1), html[:5000]
        chromium(c, 0, url + "job", tmp_path, "--screenshot=" + str(shots / "job-page-lost.png"))

        screen = netns.wait_for(lambda: (lambda s: s if node_rows(s).get(addrs[2]) == "LOST"
                                         else None)(top.capture()), 30, "cohort top: LOST",
                                step=0.3)
        assert node_rows(screen) == {addrs[0]: "HEALTHY", addrs[1]: "HEALTHY",
                                     addrs[2]: "LOST"}, screen
    finally:
        top.close()

    # The job form: `cohort top` reads the directory from the job's store itself.
    env = node_env(c, 1)
    p = subprocess.run(["ip", "netns", "exec", c.hosts[1], str(BIN), "top", "--once",
                        "--rdzv-endpoint", "%s:29400" % addrs[0], "--rdzv-id", c.tag],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    # A first look never saw host 2 answer: it is listed as UNREACHABLE (not dropped, and
    # not called lost, which only a view that saw it working can tell).
    assert node_rows(p.stdout) == {addrs[0]: "HEALTHY", addrs[1]: "HEALTHY",
                                   addrs[2]: "UNREACHABLE"}, p.stdout


def test_bench_scaling_across_hosts(tmp_path):
    out = tmp_path / "scaling"
    argv = [str(BIN), "bench", "scaling", "--nodes", "1,2", "--out", str(out), "--timeout", "300",
            "--", str(TRAIN), "--model", "mlp", "--dataset", "synthetic", "--epochs", "100",
            "--batch-size", "32", "--max-steps", "300", "--log-every", "50"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        stop_scaling(proc)
    print(stdout)
    assert proc.returncode == 0, stdout + stderr + run_logs(out)
    rows = json.loads((out / "scaling.json").read_text())
    assert [r["nodes"] for r in rows] == [1, 2], rows
    assert all(r["samples_per_s"] and r["samples_per_s"] > 0 for r in rows), rows
    assert rows[0]["speedup"] == 1.0 and rows[1]["efficiency"] > 0, rows
    # The 2-node run was one job of two ranks on two hosts, over TCP between them.
    two = (out / "nodes2/output-node0.log").read_text() + (out / "nodes2/output-node1.log").read_text()
    for r in range(2):
        assert re.search(r"rank %d of 2: transport tcp" % r, two), two[-3000:]
    assert sorted(f.name for f in (out / "nodes2/metrics").glob("rank*.json")) == \
        ["rank0.json", "rank1.json"]
    svg = (out / "scaling.svg").read_text()
    assert "<polyline" in svg and "samples/s against nodes" in svg
    # The plot is a well-formed SVG document whose line has a point per node count.
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
    line = root.find("{http://www.w3.org/2000/svg}polyline")
    assert line is not None and len(line.get("points").split()) == 2, svg
    # No namespace of the command is left behind.
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"^cs%d[a-z]" % proc.pid, left, re.M), left


def test_bench_scaling_interrupted_leaves_nothing_behind(tmp_path):
    """Ctrl-C during a run across hosts: the run's agents and workers stop, the hosts
    (namespaces) are removed, the table so far is written, exit 130."""
    out = tmp_path / "scaling"
    tag = "scalestop" + uuid.uuid4().hex[:6]
    argv = [str(BIN), "bench", "scaling", "--nodes", "2", "--out", str(out), "--",
            str(TRAIN), "--model", "mlp", "--dataset", "synthetic", "--epochs", "1000",
            "--max-steps", "1000000", "--log-every", "10", "--tag", tag]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        # Rank 0 (the one that logs steps) may be on either host: read both logs.
        def training():
            return any("step 20/" in f.read_text(errors="replace")
                       for f in out.glob("nodes2/output-node*.log"))
        try:
            netns.wait_for(training, 120, "the 2-node run training")
        except AssertionError as e:
            raise AssertionError("%s%s" % (e, run_logs(out))) from None
        os.kill(p.pid, 2)  # SIGINT, as Ctrl-C
        stdout, stderr = p.communicate(timeout=60)
    finally:
        stop_scaling(p)
    assert p.returncode == 130, (p.returncode, stderr[-3000:])
    assert "Interrupt" in stderr, stderr[-2000:]
    assert json.loads((out / "scaling.json").read_text())[0]["nodes"] == 2
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    assert left == [], "processes left: %s" % left
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"^cs%d[a-z]" % p.pid, namespaces, re.M), namespaces


def test_bench_scaling_removes_namespaces_a_killed_run_left(tmp_path):
    """A run killed with SIGKILL cannot remove its hosts; the next `cohort bench scaling`
    with that pid removes them instead of failing on `ip netns add` (the shell makes the
    leftovers under its own pid, then execs cohort, which keeps that pid)."""
    out = tmp_path / "scaling"
    script = ('ip netns add cs$$br && ip netns add cs$$h0 && ip netns add cs$$h7 && '
              'exec "$0" "$@"')
    argv = ["bash", "-c", script, str(BIN), "bench", "scaling", "--nodes", "1", "--out",
            str(out), "--", str(TRAIN), "--model", "mlp", "--dataset", "synthetic",
            "--epochs", "1", "--max-steps", "20", "--log-every", "10"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=300)
    finally:
        stop_scaling(p)
    assert p.returncode == 0, stderr[-3000:] + run_logs(out)
    assert json.loads((out / "scaling.json").read_text())[0]["exit_code"] == 0
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"^cs%d[a-z]" % p.pid, namespaces, re.M), namespaces


def stop_scaling(p):
    """A `cohort bench scaling` still running when its test gives up is stopped as a user
    would (SIGTERM: it stops its runs and removes its hosts); SIGKILL only if that fails,
    and then its namespaces are removed here, so that no later test or run meets them."""
    if p.poll() is not None:
        return
    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.communicate(timeout=60)
        return
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in re.findall(r"^(cs%d[a-z]\w*)" % p.pid, listed, re.M):
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def run_logs(out):
    """The tails of a scaling run's node logs, for a failure's message."""
    text = ""
    for f in sorted(Path(out).glob("nodes*/output-node*.log")):
        text += "\n--- %s:\n%s" % (f, f.read_text(errors="replace")[-3000:])
    return text
