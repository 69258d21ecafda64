#!/usr/bin/env python3
"""Does an open `cohort ui` slow the jobs it shows? (issue 38)

Side by side in one run, on one COHORT_HOME, each configuration --repeat times:

- a training job (`cohort submit`, local backend, cohort-train on synthetic data, 2 ranks,
  metrics exported): its mean samples/s over the job, read from its metrics history;
- an array of --elements short elements (concurrency 2): its makespan, from submit to the
  last element's end; every element start and end is a write to the job history that the
  UI's readers share (SQLite, WAL mode);

with nothing else running ("alone"); with the UI open in --viewers browsers, each loading a
page every second (people watching: "ui open"); and with --clients threads loading pages
back to back ("ui hammered": the jobs list, the job's page, its log, the pipeline list,
compare). Prints a table; the differences include the UI's CPU on this machine, not only
locks: on 2 cores the page loads take CPU from the job.

    python3 bench/ui_load.py [--cohort build/dev/cohort/cli/cohort] [--viewers 5]
        [--clients 20] [--steps 600] [--elements 40] [--repeat 2]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(cohort, env, *args, timeout=600):
    r = subprocess.run([cohort, *map(str, args)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode not in (0, 1):
        sys.exit("cohort %s failed: %s%s" % (" ".join(map(str, args)), r.stdout, r.stderr))
    return r


def submit(cohort, env, spec_path, text):
    spec_path.write_text(text)
    r = run(cohort, env, "submit", spec_path, "--json", "--wait")
    return json.loads(r.stdout.splitlines()[0])


def mean_samples_per_s(log_dir):
    values = []
    for path in Path(log_dir).rglob("rank0.jsonl"):
        for line in path.read_text().splitlines():
            try:
                metrics = json.loads(line)["metrics"]
            except (ValueError, KeyError):
                continue
            for m in metrics:
                if m.get("name") == "cohort_train_samples_per_second" and m.get("value"):
                    values.append(float(m["value"]))
    return statistics.mean(values) if values else float("nan")


def one_round(cohort, env, work, steps, elements, train):
    train_spec = ("name: train-load\nentrypoint: %s\nargs: %s\nnproc_per_node: 2\n"
                  "metrics: {port: 0}\n" % (train, json.dumps(
                      ["--dataset", "synthetic", "--model", "mlp", "--batch-size", "16",
                       "--log-every", "100", "--max-steps", str(steps)])))
    job = submit(cohort, env, work / "train.yaml", train_spec)
    status = json.loads(run(cohort, env, "status", job["id"], "--json").stdout)
    sps = mean_samples_per_s(status["log_dir"])
    array_spec = ("name: array-load\nentrypoint: /bin/sh\nargs: [-c, 'echo $COHORT_ARRAY_INDEX']\n"
                  "array: {range: \"0-%d\", concurrency: 2}\n" % (elements - 1))
    start = time.monotonic()
    submit(cohort, env, work / "array.yaml", array_spec)
    makespan = time.monotonic() - start
    return sps, makespan, job["id"]


def hammer(url, pages, stop, counts, interval):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    i = 0
    while not stop.wait(interval):
        try:
            with opener.open(url + pages[i % len(pages)], timeout=30) as r:
                r.read()
                counts["ok" if r.status == 200 else "bad"] += 1
        except OSError:
            counts["bad"] += 1
        i += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cohort", default=str(REPO / "build/dev/cohort/cli/cohort"))
    ap.add_argument("--viewers", type=int, default=5)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--elements", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    train = str(Path(a.cohort).resolve().parent / "cohort-train")
    work = Path(tempfile.mkdtemp(prefix="ui-load-"))
    env = dict(os.environ, COHORT_HOME=str(work / "home"), COHORT_METRICS_HISTORY_S="1")
    one_round(a.cohort, env, work, 50, 2, train)  # warm: the history exists, caches filled
    ui = subprocess.Popen([a.cohort, "ui", "--home", env["COHORT_HOME"]], env=env,
                          stdout=subprocess.PIPE, text=True, start_new_session=True)
    url = re.search(r"on (http://\S+/)", ui.stdout.readline()).group(1)
    modes = {"alone": (0, 0), "ui open (%d viewers, a page a second each)" % a.viewers:
             (a.viewers, 1.0), "ui hammered (%d threads back to back)" % a.clients: (a.clients, 0)}
    rows = {mode: [] for mode in modes}
    loaded = {mode: {"ok": 0, "bad": 0} for mode in modes}
    pages = ["", "jobs/1", "jobs/1/log?rank=0", "pipelines", "compare?job=1"]
    try:
        for _ in range(a.repeat):
            for mode, (clients, interval) in modes.items():
                stop = threading.Event()
                threads = [threading.Thread(target=hammer,
                                            args=(url, pages, stop, loaded[mode], interval))
                           for _ in range(clients)]
                for t in threads:
                    t.start()
                rows[mode].append(one_round(a.cohort, env, work, a.steps, a.elements, train))
                stop.set()
                for t in threads:
                    t.join()
    finally:
        ui.terminate()
        ui.wait(timeout=20)
    print("cohort ui and the jobs it shows: medians of %d runs" % a.repeat)
    print("| | training samples/s | array of %d: makespan s | pages loaded (errors) |"
          % a.elements)
    print("|---|---:|---:|---:|")
    for mode, results in rows.items():
        print("| %s | %.0f | %.2f | %d (%d) |" % (
            mode, statistics.median(r[0] for r in results),
            statistics.median(r[1] for r in results), loaded[mode]["ok"], loaded[mode]["bad"]))


if __name__ == "__main__":
    main()
