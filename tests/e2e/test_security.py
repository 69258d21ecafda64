"""What another node or another user can put in front of cohort's views and files, checked
as a user would see it (reproductions of the hardening review):

- the job page (/job) drawn by headless Chromium from a hostile /api/job answer (markup in
  an event's round, a rank, a node index; a javascript: URL): the DOM shows it as text,
  the page's title is unchanged, and the link goes nowhere;
- `cohort top` prints a hostile agent's log lines without terminal control sequences
  (window title, OSC 52 clipboard, CSI);
- the default log directory is this user's own ($TMPDIR/cohort-logs-<uid>, 0700): another
  user's directory of that name is refused with a clear error, and nothing is written there.
"""
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import e2e_util as U

NOBODY = 65534
HOSTILE_TITLE = "<img src=x onerror=\"document.title='pwned'\">"


def hostile_job():
    return {
        "run_id": "<script>document.title='pwned'</script>",
        "summary": {"nodes": "<b>1</b>", "running": 1, "world_size": 2},
        "nodes": [{
            "index": "<img src=x onerror=\"document.title='pwned'\">",
            "host": "h", "addr": "10.0.0.1", "url": "javascript:document.title='pwned'",
            "state": "HEALTHY", "round": 1, "restarts": 0, "cause": "<u>why</u>",
            "gpus": "none",
            "ranks": [{"rank": "<i onmouseover=x>0</i>", "state": "HEALTHY", "step": 5}],
            "events": [{"type": "restart", "round": HOSTILE_TITLE, "cause": "c", "time": 1}],
        }],
        "logs": [{"time": 1, "node": 1, "host": "h", "addr": "10.0.0.1", "rank": 0,
                  "line": "plain \x1b]0;pwned-title\x07 \x1b]52;c;cGF3bmVk\x07 \x1b[2J"
                          "\u009b31m red end"}],
    }


class HostileAgent:
    """Serves `page` at / and /job, and a hostile /api/job (and /api/state)."""

    def __init__(self, page=""):
        body = json.dumps(hostile_job()).encode()
        page_bytes = page.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                data, kind = (body, "application/json") if self.path.startswith("/api/") \
                    else (page_bytes, "text/html; charset=utf-8")
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def job_page(cohort, tmp_path, marker):
    """The /job page exactly as a real agent serves it."""
    log = tmp_path / "run.log"
    proc = subprocess.Popen([cohort, "run", "--nproc-per-node", "1", "--metrics-port", "0",
                             "--log-dir", str(tmp_path / "logs"), "--no-python", "--",
                             "/bin/sh", "-c", "sleep 120", marker],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env=U.clean_env(), start_new_session=True)
    try:
        m = U.wait_for(lambda: re.search(r"metrics on (http://[\d.]+:\d+/)metrics",
                                         log.read_text()), 60, what="the metrics URL")
        with urllib.request.urlopen(m.group(1) + "job", timeout=10) as r:
            return r.read().decode()
    finally:
        os.killpg(proc.pid, 2)
        proc.wait(timeout=60)
        assert U.kill_marker_procs(marker) == []


def test_the_job_page_shows_hostile_answers_as_text(cohort, tmp_path, marker):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    agent = HostileAgent(job_page(cohort, tmp_path, marker))
    try:
        dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                              "--virtual-time-budget=4000",
                              "--user-data-dir=" + str(tmp_path / "chromium"),
                              "--dump-dom", agent.url + "job"],
                             capture_output=True, text=True, timeout=120)
    finally:
        agent.close()
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "data-state=\"HEALTHY\"" in html, html[:3000]  # the page did draw the answer
    assert "<title>cohort job</title>" in html and "pwned" not in re.search(
        r"<title>.*?</title>", html).group(0), html[:500]
    # Markup from the answer is text, never elements.
    assert "<img" not in html and "<script>document" not in html and "<i onmouseover" not in html
    assert "&lt;img src=x" in html and "(round &lt;img" in html, html
    assert "<u>why</u>" not in html and "&lt;u&gt;why" in html
    # A link only to http(s).
    assert "javascript:" not in html.split("<script>")[0].split("</h1>", 1)[1], html
    assert 'href="#"' in html


def test_top_prints_no_terminal_control_sequences(cohort):
    agent = HostileAgent()
    try:
        p = subprocess.run([cohort, "top", agent.url, "--once"], capture_output=True,
                           timeout=60, env=U.clean_env())
    finally:
        agent.close()
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, p.stderr
    assert "plain" in out and "red end" in out, out
    assert "\x1b" not in out and "\x07" not in out and "\u009b" not in out, repr(out)


def test_another_users_log_directory_is_refused(cohort, tmp_path, marker):
    if os.geteuid() != 0:
        pytest.skip("needs root, to make the directory as another user (nobody)")
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    # The attack on the shared directory used before (every user's logs in one place, the
    # first user's directory): nobody prepares it, and this user's name too.
    old_shared = shared / "cohort-logs"
    theirs = shared / ("cohort-logs-%d" % os.geteuid())
    for d in (old_shared, theirs):
        os.mkdir(d)
        os.chown(d, NOBODY, NOBODY)
        os.chmod(d, 0o777)
    env = U.clean_env(TMPDIR=shared)
    p = subprocess.run([cohort, "run", "--nproc-per-node", "1", "--no-python", "--",
                        "/bin/echo", marker], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "belongs to uid 65534" in p.stderr and "--log-dir" in p.stderr, p.stderr
    assert os.listdir(theirs) == [] and os.listdir(old_shared) == [], \
        "cohort wrote into another user's directory"
    # Without it, the default directory is made private, and the job logs there.
    os.rmdir(theirs)
    p = subprocess.run([cohort, "run", "--nproc-per-node", "1", "--no-python", "--",
                        "/bin/echo", marker], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr
    st = os.lstat(theirs)
    assert st.st_uid == os.geteuid() and (st.st_mode & 0o777) == 0o700, oct(st.st_mode)
    logs = list(theirs.rglob("stdout.log"))
    assert logs and marker in logs[0].read_text(), logs
    assert os.listdir(old_shared) == [], "cohort wrote into another user's directory"


def test_an_agent_killed_leaves_no_channel_directory(cohort, launcher, marker):
    port = U.free_port()
    env = U.clean_env(COHORT_TOKEN=os.urandom(16).hex())
    p = launcher.start([cohort, "run", "--nnodes", "1:2", "--nproc-per-node", "1",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:%d" % port,
                        "--rdzv-id", marker, "--rdzv-conf", "last_call_timeout=0.2",
                        "--no-python", "--", "/bin/sh", "-c",
                        'echo "channel=$COHORT_MEMBERSHIP_DIR"; exec sleep 120', marker],
                       env=env)
    m = U.wait_for(lambda: re.search(r"channel=(/\S+)", p.stdout), 60, what="the channel")
    channel = m.group(1)
    runtime = os.path.dirname(channel)
    assert os.path.isdir(channel) and os.path.basename(runtime).startswith("cohort-agent-")
    assert (os.lstat(runtime).st_mode & 0o777) == 0o700
    os.kill(p.pid, 9)
    U.wait_for(lambda: not os.path.exists(runtime), 30,
               what="the killed agent's runtime directory to be removed")
    U.wait_for(lambda: not U.marker_pids(marker), 30, what="the workers to be swept")
