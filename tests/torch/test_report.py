"""A PyTorch script's progress in cohort's views: a gloo DDP loop that calls
cohort_torch.report(step=, loss=, samples=) each step shows its step, loss and samples/s per
rank in the agent's /api/job and in `cohort top` (before: "-" for every PyTorch job), and
rank 0 writes the TensorBoard scalars; submitted as a job, its loss curve is in `cohort ui`.
"""
import json
import re
import subprocess
import urllib.request
from pathlib import Path

import e2e_util as U

PROBE = Path(__file__).resolve().parent / "report_probe.py"


def test_a_pytorch_loop_reports_its_progress(cohort, need_torch, launcher, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    tb = tmp_path / "tb"
    env = U.clean_env(COHORT_TENSORBOARD_DIR=tb, COHORT_METRICS_HISTORY_S="0.2")
    p = launcher.start([cohort, "run", "--nproc-per-node", 2, "--metrics-port", 0,
                        "--log-dir", tmp_path / "logs", PROBE, out, launcher.marker], env=env)
    m = U.wait_for(lambda: re.search(r"metrics on (http://[\d.]+:\d+/)metrics", p.stderr + p.stdout),
                   120, what="the metrics URL")
    url = m.group(1)

    def ranks_reporting():
        try:
            with urllib.request.urlopen(url + "api/job", timeout=5) as r:
                job = json.loads(r.read())
        except OSError:
            return None
        rows = [r for n in job.get("nodes", []) for r in n.get("ranks", [])]
        ok = len(rows) == 2 and all(isinstance(r.get("step"), (int, float)) and r["step"] >= 5
                                    and isinstance(r.get("loss"), (int, float))
                                    and (r.get("samples_per_s") or 0) > 0 for r in rows)
        return rows if ok else None
    rows = U.wait_for(ranks_reporting, 120, interval=0.3, what="both ranks' step, loss, samples/s")
    assert sorted(r["rank"] for r in rows) == [0, 1], rows
    top = subprocess.run([cohort, "top", url, "--once"], capture_output=True, text=True,
                         timeout=60, env=U.clean_env())
    assert top.returncode == 0, top.stderr
    # RANK NODE STATE STEP LOSS SAMPLES/S ...: numbers, not "-", for both ranks.
    ranks_table = re.split(r"^\s*RANK\s+NODE", top.stdout, flags=re.M)[1]
    rows = re.findall(r"^\s+([01])\s+.*?HEALTHY\s+(\d+)\s+([0-9.e+-]+)\s+(\d+)\s", ranks_table,
                      re.M)
    assert sorted(r[0] for r in rows) == ["0", "1"], top.stdout
    assert all(int(step) >= 5 and int(sps) > 0 for _, step, _, sps in rows), top.stdout
    (out / "stop").write_text("1")
    assert p.wait(120) == 0, p.describe()
    events = list(tb.glob("events.out.tfevents.*"))
    assert len(events) == 1, events  # rank 0 only
    data = events[0].read_bytes()
    assert b"train/loss" in data and b"train/samples_per_second" in data


def test_a_pytorch_jobs_curves_in_cohort_ui(cohort, need_torch, marker, tmp_path):
    """The same PyTorch loop submitted as a job (`cohort submit`): `cohort ui` draws its loss
    and samples/s from what cohort_torch.report exported, as for cohort-train."""
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    env = U.clean_env(COHORT_HOME=home, COHORT_METRICS_HISTORY_S="0.2")
    spec = tmp_path / "probe.yaml"
    spec.write_text("name: torch-probe\nentrypoint: %s\nargs: [%s, %s]\nnproc_per_node: 2\n"
                    "metrics: {port: 0}\n" % (PROBE, out, marker))
    submit = subprocess.run([cohort, "submit", spec, "--json"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    job = json.loads(submit.stdout.splitlines()[0])["id"]
    ui = subprocess.Popen([cohort, "ui"], env=env, stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
    try:
        url = re.search(r"on (http://\S+/)", ui.stdout.readline()).group(1)

        def series():
            with urllib.request.urlopen(url + "compare?job=%d" % job, timeout=30) as r:
                page = r.read().decode()
            loss = re.search(r'id="loss">(.*?)</div>', page, re.S)
            paths = re.findall(r'<path class="series" data-series="([^"]+)" d="([^"]+)"',
                               loss.group(1) if loss else "")
            return paths if paths and paths[0][1].count("L") >= 2 else None
        paths = U.wait_for(series, 120, interval=0.5, what="the job's loss curve in cohort ui")
        assert [name for name, _ in paths] == ["job %d torch-probe" % job], paths
    finally:
        (out / "stop").write_text("1")
        ui.terminate()
        assert ui.wait(timeout=20) == 0
    waited = subprocess.run([cohort, "status", str(job), "--wait"], env=env,
                            capture_output=True, text=True, timeout=180)
    assert waited.returncode == 0, waited.stdout + waited.stderr  # 0: it succeeded
