"""`cohort ui` end to end: a real `cohort ui` over real histories made here by `cohort submit`
and `cohort pipeline run` (two training jobs with metrics, an array with a failed element, a
pipeline with a skipped branch and, run twice, a cached step), driven by headless Chromium
(Selenium + chromedriver): each element's state in the grid, the skipped step's condition and
the cached mark in the DAG, both runs' curves on the compare chart, cancel from the page
(checked with `cohort status`), the token beyond loopback, and 100 concurrent page loads while
a job writes its history. Each page's screenshot is written to $COHORT_UI_SCREENSHOTS (the
docs' images: COHORT_UI_SCREENSHOTS=docs/img) or the test's directory.
"""
import concurrent.futures
import html
import json
import os
import re
import shutil
import subprocess
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import e2e_util as U

TRAIN = U.REPO / "build/dev/cohort/cli/cohort-train"
TRAIN_NAME = {"0.05": "mlp-lr-05", "0.01": "mlp-lr-01"}
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


class Home:
    """A COHORT_HOME filled by the CLI, and the `cohort ui` serving it."""

    def __init__(self, cohort, path):
        self.cohort = cohort
        self.dir = path
        self.home = path / "home"
        self.env = U.clean_env(COHORT_HOME=self.home, COHORT_METRICS_HISTORY_S="0.2")
        self.ui = None
        self.url = None

    def run(self, *args, timeout=180, cwd=None):
        return subprocess.run([self.cohort, *map(str, args)], env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=cwd or self.dir)

    def spec(self, name, text):
        p = self.dir / name
        p.write_text(textwrap.dedent(text))
        return p

    def submit(self, name, text, wait=True):
        r = self.run("submit", self.spec(name, text), "--json", *(["--wait"] if wait else []))
        assert r.returncode in (0, 1), r.stdout + r.stderr
        return json.loads(r.stdout.splitlines()[0])["id"]

    def status(self, job):
        r = self.run("status", job, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def start_ui(self, *extra, env=None):
        proc = subprocess.Popen([self.cohort, "ui", "--home", str(self.home), *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env or self.env, start_new_session=True)
        line = proc.stdout.readline()
        m = re.search(r"on (http://\S+/)", line)
        if not m:
            proc.kill()
            raise AssertionError("cohort ui did not start: %r %s" % (line, proc.stderr.read()))
        return proc, m.group(1)

    def stop_ui(self, proc):
        proc.terminate()
        assert proc.wait(timeout=20) == 0


def get(url, headers=None, data=None):
    req = urllib.request.Request(url, headers=headers or {}, data=data)
    opener = urllib.request.build_opener(NoRedirect())
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fill(h):
    """The histories the pages show, made as a user makes them."""
    train = [str(TRAIN), "--dataset", "synthetic", "--model", "mlp", "--batch-size", "16",
             "--log-every", "50", "--max-steps", "1500"]
    ids = {}
    for lr in ("0.05", "0.01"):
        ids["train" + lr] = h.submit("train%s.yaml" % lr, """\
            name: %s
            entrypoint: %s
            args: %s
            nproc_per_node: 2
            metrics: {port: 0}
            """ % (TRAIN_NAME[lr], train[0], json.dumps(train[1:] + ["--lr", lr])))
    ids["array"] = h.submit("sweep.yaml", """\
        name: sweep
        entrypoint: /bin/sh
        args: [-c, 'echo "element $COHORT_ARRAY_INDEX says hello"; test "$COHORT_ARRAY_INDEX" != 2']
        array: {range: "0-3", concurrency: 2}
        """)
    spec = h.spec("pipe.yaml", """\
        name: branches
        parameters:
          runtime: {type: string, default: local}
        steps:
          - name: prepare
            command: "echo 40 > $COHORT_OUTPUTS/samples; echo prepared"
            outputs: [samples]
            cache: true
          - name: on-slurm
            depends: [prepare]
            when: "{{params.runtime}} == 'slurm'"
            command: "echo never"
          - name: train
            depends: [prepare]
            command: "echo training on {{steps.prepare.outputs.samples}} samples"
          - name: report
            depends: [train, on-slurm]
            command: "echo done"
        """)
    for _ in range(2):  # the second run takes `prepare` from the first one's cache
        r = h.run("pipeline", "run", spec)
        assert r.returncode == 0, r.stdout + r.stderr
    listed = json.loads(h.run("pipeline", "list", "--json").stdout)
    ids["run"] = max(run["id"] for run in listed)
    return ids


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    b = U.cohort_bin()
    if not b.exists():
        pytest.skip("cohort binary not built: %s" % b)
    if not TRAIN.exists():
        pytest.skip("cohort-train not built")
    h = Home(str(b.resolve()), tmp_path_factory.mktemp("ui"))
    h.ids = fill(h)
    h.ui, h.url = h.start_ui()
    try:
        yield h
    finally:
        h.stop_ui(h.ui)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("python3-selenium not installed")
    chromium = shutil.which("chromium")
    if chromium is None or not os.path.exists(CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver not installed")
    opts = Options()
    opts.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--window-size=1280,1000",
                "--user-data-dir=" + str(tmp_path_factory.mktemp("chromium"))):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver, name, tmp_path, width=1280):
    """The page's screenshot (PNG, checked) where the docs keep them or in the test's dir."""
    out = Path(os.environ.get("COHORT_UI_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(int(height) + 40, 600), 2400))
    png = out / ("ui-%s.png" % name)
    driver.save_screenshot(str(png))
    driver.set_window_size(1280, 1000)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000, (png, len(data))


def wait_for_element(driver, element_id, timeout=60):
    """The element, once the page navigated to (after a click) shows it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout).until(
        EC.presence_of_element_located((By.ID, element_id)))


def wait_for_text(driver, element_id, text, timeout=60):
    """The element `element_id` once it holds `text` (a page reached by a click)."""
    from selenium.webdriver.support.ui import WebDriverWait

    def holds(d):
        found = d.find_elements("id", element_id)
        return found[0] if found and text in found[0].text else False
    return WebDriverWait(driver, timeout).until(holds)


def css(driver, selector):
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, selector)


def test_jobs_list_and_the_array_grid(ui, browser, tmp_path):
    browser.get(ui.url)
    rows = {r.get_attribute("data-job"): r for r in css(browser, "#jobs tr[data-job]")}
    assert {str(i) for i in ui.ids.values() if i != ui.ids["run"]} <= set(rows), rows.keys()
    states = {css(r, "td")[4].text for r in rows.values()}
    assert {"succeeded", "failed"} <= states, states
    shot(browser, "jobs", tmp_path)
    # Filtered: failed jobs only.
    browser.get(ui.url + "?state=failed")
    shown = [r.get_attribute("data-job") for r in css(browser, "#jobs tr[data-job]")]
    assert shown == [str(ui.ids["array"])], shown
    # The array's grid: every element's state, the failed one in the middle.
    browser.get(ui.url + "jobs/%d" % ui.ids["array"])
    cells = {c.get_attribute("data-element"): c.get_attribute("data-state")
             for c in css(browser, "#elements .element")}
    assert cells == {"0": "succeeded", "1": "succeeded", "2": "failed", "3": "succeeded"}, cells
    assert "1 failed" in browser.find_element("css selector", "#elements").find_element(
        "xpath", "preceding-sibling::h2[1]").text
    shot(browser, "array", tmp_path)
    # Click on the failed element: its log.
    css(browser, '#elements .element[data-element="2"]')[0].click()
    assert "element 2 says hello" in wait_for_element(browser, "log").text


def test_a_job_page_shows_spec_history_logs_and_its_loss(ui, browser, tmp_path):
    job = ui.ids["train0.05"]
    browser.get(ui.url + "jobs/%d" % job)
    assert css(browser, "#summary .badge")[0].get_attribute("data-state") == "succeeded"
    assert "mlp-lr-05" in browser.find_element("id", "spec").text
    history = browser.find_element("id", "history").text
    assert "submitted" in history and "running" in history and "succeeded" in history, history
    ranks = [a.text for a in css(browser, "a.rank-log")]
    assert ranks == ["rank 0", "rank 1"], ranks
    assert len(css(browser, "svg.chart path.series")) == 1
    shot(browser, "job", tmp_path)
    # A phone: the page fits its width.
    browser.set_window_size(390, 844)
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - window.innerWidth")
    browser.set_window_size(1280, 1000)
    assert overflow <= 1, overflow
    css(browser, "a.rank-log")[1].click()
    assert "rank 1 of 2" in wait_for_element(browser, "log").text


def test_the_pipeline_dag_marks_the_skipped_branch_and_the_cached_step(ui, browser, tmp_path):
    browser.get(ui.url + "pipelines")
    assert css(browser, '#runs tr[data-run="%d"]' % ui.ids["run"])
    browser.get(ui.url + "pipelines/%d" % ui.ids["run"])
    steps = {g.get_attribute("data-step"): g for g in css(browser, "svg.dag g.step")}
    assert set(steps) == {"prepare", "on-slurm", "train", "report"}, steps.keys()
    state = {k: g.get_attribute("data-state") for k, g in steps.items()}
    assert state == {"prepare": "cached", "on-slurm": "skipped", "train": "succeeded",
                     "report": "succeeded"}, state
    assert steps["prepare"].get_attribute("data-cached") == "true"
    skipped = steps["on-slurm"].get_attribute("textContent")
    assert "skipped" in skipped and "params.runtime" in skipped, skipped
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to"))
             for e in css(browser, "svg.dag path.edge")}
    assert edges == {("prepare", "on-slurm"), ("prepare", "train"), ("train", "report"),
                     ("on-slurm", "report")}, edges
    shot(browser, "pipeline", tmp_path)
    # A step: its outputs and its log.
    browser.get(ui.url + "pipelines/%d/steps/train" % ui.ids["run"])
    assert "training on 40 samples" in browser.find_element("id", "log").text
    browser.get(ui.url + "pipelines/%d/steps/prepare" % ui.ids["run"])
    assert "samples=40" in browser.find_element("id", "step").text


def test_compare_draws_both_runs(ui, browser, tmp_path):
    a, b = ui.ids["train0.05"], ui.ids["train0.01"]
    browser.get(ui.url + "compare?job=%d&job=%d" % (a, b))
    loss = [p.get_attribute("data-series") for p in css(browser, "#loss path.series")]
    speed = [p.get_attribute("data-series") for p in css(browser, "#speed path.series")]
    assert sorted(loss) == sorted(["job %d mlp-lr-05" % a, "job %d mlp-lr-01" % b]), loss
    assert len(speed) == 2, speed
    for p in css(browser, "#loss path.series"):
        assert p.get_attribute("d").count("L") >= 1, "a curve: two points at least"
    shot(browser, "compare", tmp_path)


def test_cancel_from_the_page_ends_the_running_job(ui, browser, marker):
    job = ui.submit("long.yaml", """\
        name: long
        entrypoint: /bin/sh
        args: [-c, 'echo started; sleep 600; true', %s]
        nproc_per_node: 2
        """ % marker, wait=False)
    U.wait_for(lambda: len(U.marker_pids(marker)) >= 2, 60, what="the job's workers")
    browser.get(ui.url + "jobs/%d" % job)
    browser.find_element("id", "cancel").click()
    wait_for_element(browser, "confirm").click()  # the confirmation page's POST
    assert "cancelled" in wait_for_text(browser, "note", "cohort cancel %d" % job).text
    assert ui.status(job)["state"] == "cancelled"
    U.wait_for(lambda: U.marker_pids(marker) == [], 30, what="the workers to be gone")
    # Resubmit from the page: a new job with the same spec.
    browser.find_element("id", "resubmit").click()
    wait_for_element(browser, "confirm").click()
    wait_for_text(browser, "note", "resubmitted from job %d" % job)
    new = int(re.search(r"/jobs/(\d+)", browser.current_url).group(1))
    assert new != job and ui.status(new)["name"] == "long"
    assert ui.run("cancel", new).returncode == 0
    U.wait_for(lambda: U.marker_pids(marker) == [], 30, what="the resubmitted job's workers")


def test_actions_need_the_pages_form_and_a_token_beyond_loopback(ui):
    # A POST that did not come from the page's form (no anti-forgery value) changes nothing.
    status, body, _ = get(ui.url + "jobs/%d/cancel" % ui.ids["array"], data=b"x=1")
    assert status == 403 and "did not come from this cohort ui" in body
    # Beyond loopback without a token: refused at start, clearly, with its exit code.
    r = ui.run("ui", "--home", ui.home, "--host", "0.0.0.0", timeout=30)
    assert r.returncode == 3 and "without a token" in r.stderr, (r.returncode, r.stderr)
    env = dict(ui.env, COHORT_UI_TOKEN="s3cret-token")
    proc, url = ui.start_ui("--host", "0.0.0.0", env=env)
    try:
        port = re.search(r":(\d+)/", url).group(1)
        base = "http://127.0.0.1:%s/" % port
        status, body, _ = get(base)
        assert status == 401 and "Token required" in body
        status, _, headers = get(base + "?token=wrong")
        assert status == 401
        status, _, headers = get(base + "?token=s3cret-token")
        assert status == 303 and "cohort_ui_token=s3cret-token" in headers.get("Set-Cookie", "")
        status, body, _ = get(base, headers={"Cookie": "cohort_ui_token=s3cret-token"})
        assert status == 200 and "sweep" in body
        status, body, _ = get(base, headers={"Authorization": "Bearer s3cret-token"})
        assert status == 200
    finally:
        ui.stop_ui(proc)


def test_a_hundred_concurrent_page_loads_while_a_job_writes(ui, marker):
    job = ui.submit("writer.yaml", """\
        name: writer
        entrypoint: /bin/sh
        args: [-c, 'i=0; while [ $i -lt 100000 ]; do echo "line $i"; i=$((i+1)); done; sleep 600', %s]
        array: {range: "0-3"}
        """ % marker, wait=False)
    pages = ["", "jobs/%d" % job, "jobs/%d/log?element=0" % job, "pipelines",
             "pipelines/%d" % ui.ids["run"], "compare?job=%d" % ui.ids["train0.05"],
             "jobs/%d/log.txt?element=1&offset=0" % job]
    try:
        with concurrent.futures.ThreadPoolExecutor(100) as pool:
            results = list(pool.map(lambda i: get(ui.url + pages[i % len(pages)])[0], range(100)))
        assert results == [200] * 100, results
        # The job went on meanwhile: its elements ran and wrote their logs.
        st = ui.status(job)
        assert st["state"] == "running", st
    finally:
        assert ui.run("cancel", job).returncode == 0
        U.wait_for(lambda: U.marker_pids(marker) == [], 30, what="the writer's workers")


def test_unknown_pages_and_bad_values_say_what_is_missing(ui):
    status, body, _ = get(ui.url + "jobs/99999")
    assert status == 404 and "job 99999" in body
    status, body, _ = get(ui.url + "pipelines/%d/steps/nope" % ui.ids["run"])
    assert status == 404 and "step 'nope'" in html.unescape(body)
    status, body, _ = get(ui.url + "jobs/%d/log?element=9" % ui.ids["array"])
    assert status == 404 and "elements 0..3" in body
    status, body, _ = get(ui.url + "compare?job=abc&job=99999")
    assert status == 200 and "No such job: 99999" in body


def test_resume_from_the_page_runs_the_failed_steps_again(ui, browser):
    flag = ui.dir / "fixed"
    spec = ui.spec("flaky.yaml", """\
        name: flaky
        steps:
          - name: first
            command: "echo first"
          - name: needs-fix
            depends: [first]
            command: "test -e %s && echo fixed"
        """ % flag)
    r = ui.run("pipeline", "run", spec)
    assert r.returncode != 0, r.stdout + r.stderr
    run = max(x["id"] for x in json.loads(ui.run("pipeline", "list", "--json").stdout))
    browser.get(ui.url + "pipelines/%d" % run)
    steps = {g.get_attribute("data-step"): g.get_attribute("data-state")
             for g in css(browser, "svg.dag g.step")}
    assert steps == {"first": "succeeded", "needs-fix": "failed"}, steps
    flag.write_text("")
    browser.find_element("id", "resume").click()
    wait_for_element(browser, "confirm").click()
    wait_for_text(browser, "note", "cohort pipeline resume %d started" % run)

    def state():
        s = json.loads(ui.run("pipeline", "status", run, "--json").stdout)
        return s["state"] == "succeeded" and s
    st = U.wait_for(state, 60, interval=0.2, what="the resumed run to succeed")
    browser.get(ui.url + "pipelines/%d" % run)
    steps = {g.get_attribute("data-step"): g.get_attribute("data-state")
             for g in css(browser, "svg.dag g.step")}
    assert steps["needs-fix"] == "succeeded", steps


def test_a_running_job_links_to_its_live_page(ui, browser, marker):
    release = ui.dir / "release-live"
    job = ui.submit("live.yaml", """\
        name: live
        entrypoint: /bin/sh
        args: [-c, 'while [ ! -e "%s" ]; do sleep 0.05; done', %s]
        nproc_per_node: 2
        metrics: {port: 0}
        """ % (release, marker), wait=False)
    try:
        def linked():
            browser.get(ui.url + "jobs/%d" % job)
            return css(browser, "#live")
        U.wait_for(linked, 60, interval=0.5, what="the job page to link its live page")
        href = css(browser, "#live")[0].get_attribute("href")
        assert re.match(r"http://127\.0\.0\.1:\d+/job$", href), href
        status, body, _ = get(href)
        assert status == 200 and "<html" in body.lower()
        # The compare page links it too.
        browser.get(ui.url + "compare?job=%d" % job)
        assert [a.get_attribute("href") for a in css(browser, "#compared a.live")] == [href]
    finally:
        release.write_text("")
    r = ui.run("status", job, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
