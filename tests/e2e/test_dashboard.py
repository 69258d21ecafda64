"""Observability end to end: a real training job under `cohort run --metrics-port 0`, its
Prometheus /metrics (agent, every rank, /proc), the dashboard rendered by headless Chromium
with the job's live data (DOM checked, screenshot kept), a metrics port in use that does not
stop the job, and identical console lines of several ranks merged into one.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

import e2e_util as U

TRAIN = U.REPO / "build/dev/cohort/cli/cohort-train"


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def start_training(cohort, tmp_path, marker, extra=()):
    log = open(tmp_path / "run.log", "wb")
    argv = [cohort, "run", "--nproc-per-node", "2", "--metrics-port", "0", "--metrics-host",
            "127.0.0.1", "--log-dir", str(tmp_path / "logs"), *extra, str(TRAIN),
            "--dataset", "synthetic", "--model", "mlp", "--epochs", "1000", "--batch-size", "16",
            "--max-steps", "100000", "--log-every", "5", "--tag", marker]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env=U.clean_env(COHORT_METRICS_HISTORY_S="0.2"),
                            start_new_session=True)
    return proc, tmp_path / "run.log"


def interrupt(proc):
    """Ctrl-C to a launcher's group, SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def stop(proc, marker):
    interrupt(proc)
    assert U.kill_marker_procs(marker) == []


@pytest.fixture
def need_train():
    if not TRAIN.exists():
        pytest.skip("cohort-train not built")


def test_metrics_and_dashboard_show_the_running_job(cohort, need_train, tmp_path):
    marker = U.new_marker()
    proc, log = start_training(cohort, tmp_path, marker)
    try:
        url = U.wait_for(lambda: (re.search(r"dashboard on (http://\S+/)", log.read_text())
                                  or [None, None])[1], 60, what="the dashboard URL")

        def trained():
            state = json.loads(get(url + "api/state"))
            steps = [r["metrics"].get("cohort_train_step", 0) for r in state["ranks"]]
            return state if len(steps) == 2 and min(steps) >= 10 else None
        state = U.wait_for(trained, 120, interval=0.2, what="both ranks reporting steps")
        assert state["agent"]["state"] == "HEALTHY", state["agent"]
        assert [r["state"] for r in state["agent"]["ranks"]] == ["HEALTHY", "HEALTHY"]
        assert state["system"]["gpus"]["available"] is False  # no NVIDIA driver here
        assert "NVML" in state["system"]["gpus"]["reason"]

        text = get(url + "metrics")
        for needle in ['cohort_train_loss{rank="0"}', 'cohort_train_loss{rank="1"}',
                       'cohort_train_samples_per_second{rank="1"}',
                       'cohort_comm_bytes_total{op="allreduce",rank="0"}',
                       'cohort_train_step_seconds_bucket{rank="0",le="+Inf"}',
                       "cohort_agent_rendezvous_rounds_total 1", "cohort_agent_workers_running 2",
                       'cohort_agent_worker_up{rank="1"} 1',
                       'cohort_worker_cpu_percent{rank="1"}', "cohort_gpu_monitoring_available 0"]:
            assert needle in text, (needle, text[:3000])
        assert text.count("# TYPE cohort_train_loss gauge") == 1

        # The job-wide view of a one-node job: this agent, both ranks, from the store's
        # directory; `cohort top --once` prints the same.
        job = json.loads(get(url + "api/job"))
        assert [n["state"] for n in job["nodes"]] == ["HEALTHY"], job["nodes"]
        assert [r["rank"] for r in job["nodes"][0]["ranks"]] == [0, 1], job["nodes"]
        assert job["summary"]["ranks"] == 2 and job["summary"]["samples_per_s"] > 0
        top = subprocess.run([cohort, "top", url, "--once"], capture_output=True, text=True,
                             timeout=60, env=U.clean_env())
        assert top.returncode == 0, top.stderr
        assert "nodes 1 (running 1" in top.stdout and "world size 2" in top.stdout, top.stdout

        browser = chromium()
        if browser is None:
            pytest.skip("chromium not installed (apt-get install chromium)")
        common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                  "--virtual-time-budget=6000", "--window-size=1280,1200",
                  "--user-data-dir=" + str(tmp_path / "chromium")]
        dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True,
                             timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        rows = re.findall(r"<tr><td>(\d+)</td><td class=\"l HEALTHY\">HEALTHY</td><td>(\d+)</td>"
                          r"<td>([0-9.e+-]+)</td><td>([0-9.]+)</td>", html)
        assert [r[0] for r in rows] == ["0", "1"], html[:4000]
        assert all(int(step) >= 10 and float(loss) >= 0 and float(sps) > 0
                   for _, step, loss, sps in rows), rows
        chart = re.search(r'<svg id="chart".*?</svg>', html, re.S)
        assert chart and chart.group(0).count("<polyline") == 2, "no throughput line per rank"
        assert "[rank0]" in html, "no log lines shown"
        shots = Path(os.environ.get("COHORT_ARTIFACTS", tmp_path))
        shots.mkdir(parents=True, exist_ok=True)
        png = shots / "dashboard.png"
        shot = subprocess.run(common + ["--screenshot=" + str(png), url], capture_output=True,
                              text=True, timeout=120)
        assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000, len(data)
    finally:
        stop(proc, marker)


def test_metrics_port_in_use_does_not_stop_the_job(cohort, tmp_path):
    marker = U.new_marker()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([cohort, "run", "--nproc-per-node", "2", "--metrics-port", str(port),
                            "--metrics-host", "127.0.0.1", "--log-dir", str(tmp_path),
                            "/bin/sh", "-c", "echo worked", marker],
                           capture_output=True, text=True, timeout=120, env=U.clean_env())
    assert p.returncode == 0, p.stderr
    assert "warning" in p.stderr and "in use" in p.stderr and str(port) in p.stderr, p.stderr
    assert len(U.rank_lines(p.stdout)) == 2


def test_identical_lines_of_several_ranks_print_once(cohort, tmp_path):
    marker = U.new_marker()
    script = 'echo "same on every rank"; echo "rank $RANK only"'
    p = subprocess.run([cohort, "run", "--nproc-per-node", "3", "--log-merge-ms", "20000",
                        "--log-dir", str(tmp_path), "/bin/sh", "-c", script, marker],
                       capture_output=True, text=True, timeout=120, env=U.clean_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("same on every rank") == 1, p.stdout
    assert "[ranks 0-2]: same on every rank" in p.stdout, p.stdout
    for r in range(3):
        assert "[rank%d]: rank %d only" % (r, r) in p.stdout, p.stdout
    # The per-rank files keep every line.
    for r in range(3):
        files = list(tmp_path.glob("*/attempt_0/%d/stdout.log" % r))
        assert files and "same on every rank" in files[0].read_text()
    off = subprocess.run([cohort, "run", "--nproc-per-node", "3", "--log-merge-ms", "0",
                          "--log-dir", str(tmp_path), "/bin/sh", "-c", script, marker],
                         capture_output=True, text=True, timeout=120, env=U.clean_env())
    assert off.stdout.count("same on every rank") == 3, off.stdout


def test_bench_scaling_prints_the_table_and_writes_the_plot(cohort, need_train, tmp_path):
    out = tmp_path / "scaling"
    p = subprocess.run([cohort, "bench", "scaling", "--workers", "1,2", "--out", str(out), "--",
                        str(TRAIN), "--dataset", "synthetic", "--model", "mlp", "--batch-size",
                        "16", "--max-steps", "300", "--log-every", "5"],
                       capture_output=True, text=True, timeout=600, env=U.clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^\s+workers\s+samples/s\s+epoch s\s+speed-up\s+efficiency", p.stdout, re.M)
    rows = json.loads((out / "scaling.json").read_text())
    assert [r["workers"] for r in rows] == [1, 2], rows
    for r in rows:
        assert r["exit_code"] == 0 and r["samples_per_s"] > 0 and r["epoch_s"] > 0, rows
    assert rows[0]["efficiency"] == 1.0 and rows[1]["efficiency"] > 0, rows
    svg = (out / "scaling.svg").read_text()
    assert svg.startswith("<svg") and "<polyline" in svg and "stroke-dasharray" in svg
    bad = subprocess.run([cohort, "bench", "scaling", "--workers", "0,x"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "no training command" in bad.stderr
    bad = subprocess.run([cohort, "bench", "scaling", "--workers", "0,x", "--", "/bin/true"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 3 and "--workers" in bad.stderr


def test_slow_clients_do_not_lock_out_the_dashboard(cohort, tmp_path):
    """100 clients that send a request line and stop: /metrics still answers, every time
    (before: 1-2 of 4 scrapes within 5 s with ~100 held connections), and the endpoint
    listens on loopback by default (it shows logs and PIDs without auth)."""
    marker = U.new_marker()
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen([cohort, "run", "--nproc-per-node", "1", "--metrics-port", "0",
                             "--log-dir", str(tmp_path / "logs"), "/bin/sh", "-c",
                             "echo up; sleep 120", marker],
                            stdout=log, stderr=subprocess.STDOUT, env=U.clean_env(),
                            start_new_session=True)
    slow = []
    try:
        m = U.wait_for(lambda: re.search(r"metrics on http://([\d.]+):(\d+)/metrics",
                                         (tmp_path / "run.log").read_text()), 60,
                       what="the metrics URL")
        host, port = m.group(1), int(m.group(2))
        assert host == "127.0.0.1", "the metrics endpoint must default to loopback"
        for _ in range(100):
            c = socket.create_connection((host, port), timeout=5)
            c.sendall(b"GET /metrics HTTP/1.1\r\n")
            slow.append(c)
        for _ in range(4):
            text = get("http://%s:%d/metrics" % (host, port), timeout=5)
            assert "cohort_agent" in text or "# TYPE" in text, text[:500]
    finally:
        for c in slow:
            c.close()
        stop(proc, marker)


def test_top_refuses_bad_input_clearly(cohort, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: nothing listens there
    p = subprocess.run([cohort, "top", "http://127.0.0.1:%d/" % dead, "--once"],
                       capture_output=True, text=True, timeout=60, env=U.clean_env())
    assert p.returncode == 4, (p.returncode, p.stderr)
    assert "no answer" in p.stderr and "--metrics-port" in p.stderr, p.stderr
    p = subprocess.run([cohort, "top"], capture_output=True, text=True, timeout=60,
                       env=U.clean_env())
    assert p.returncode == 2 and "--rdzv-endpoint" in p.stderr, p.stderr
    p = subprocess.run([cohort, "top", "--rdzv-endpoint", "127.0.0.1:%d" % dead, "--once"],
                       capture_output=True, text=True, timeout=60, env=U.clean_env())
    assert p.returncode == 3 and "COHORT_TOKEN" in p.stderr, p.stderr
    p = subprocess.run([cohort, "top", "x:1", "--interval", "0"], capture_output=True,
                       text=True, timeout=60, env=U.clean_env())
    assert p.returncode == 3, p.stderr


def test_a_live_reform_is_counted_as_a_reform_not_a_restart(cohort, need_train, tmp_path):
    """A node joins a running cohort-train job (two agents on this machine): node 0's
    workers re-form in place, so its /api/state says reforms 1, restarts 0 (before: a live
    re-form after a loss showed RESTARTS 1 though no process restarted), and `cohort top`
    has a REFORMS column."""
    marker = U.new_marker()
    port = U.free_port()
    env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex(), COHORT_METRICS_HISTORY_S="0.2")
    common = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", marker,
              "--rdzv-conf", "last_call_timeout=0.2", "--log-dir", str(tmp_path / "logs"),
              str(TRAIN), "--dataset", "synthetic", "--model", "mlp", "--epochs", "1000",
              "--batch-size", "16", "--max-steps", "100000", "--log-every", "5",
              "--tag", marker]
    procs = []
    try:
        log0 = tmp_path / "node0.log"
        procs.append(subprocess.Popen([cohort, "run", "--metrics-port", "0", *common],
                                      stdout=open(log0, "wb"), stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True))
        m = U.wait_for(lambda: re.search(r"metrics on (http://[\d.]+:\d+/)metrics",
                                         log0.read_text()), 60, what="the metrics URL")
        url = m.group(1)

        def agent():
            try:
                return json.loads(get(url + "api/state"))["agent"]
            except (OSError, ValueError, KeyError):
                return {}
        U.wait_for(lambda: agent().get("world_size") == 1 and "step" in log0.read_text(),
                   120, what="node 0 training alone")
        procs.append(subprocess.Popen([cohort, "run", *common],
                                      stdout=open(tmp_path / "node1.log", "wb"),
                                      stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
        a = U.wait_for(lambda: agent() if agent().get("world_size") == 2 else None, 120,
                       what="node 0 in a round of world size 2")
        assert a["reforms"] == 1 and a["restarts"] == 0, a
        top = subprocess.run([cohort, "top", url, "--once"], capture_output=True, text=True,
                             timeout=60, env=U.clean_env())
        assert top.returncode == 0, top.stderr
        assert "REFORMS" in top.stdout, top.stdout
    finally:
        for p in reversed(procs):  # the joining node first, the store's host last
            interrupt(p)
        assert U.kill_marker_procs(marker) == []
