"""The warm interpreter: workers forked from a process that already imported torch must not
be able to tell, and a restart must not pay for the interpreter start again.

Each test runs the same probe with the warm start (default) and with --no-preload (a
fresh interpreter per worker) and compares what the workers saw.
"""
import json
import re
from pathlib import Path

import pytest

import e2e_util as U

HERE = Path(__file__).resolve().parent
PROBE = HERE / "warm_probe.py"
RECORD_FAIL = U.E2E_DIR / "record_fail.py"

SAME = ["argv", "orig_argv", "name", "file", "main_file", "path0", "cwd", "env", "c_env",
        "signals", "blocked", "pgid_is_pid"]


def probes(text):
    out = {}
    for line in text.splitlines():
        m = re.search(r"probe (\{.*\})$", line)
        if m:
            facts = json.loads(m.group(1))
            out[int(facts["env"]["RANK"])] = facts
    return out


def run_probe(cohort, launcher, tmp_path, name, extra, args=(), nproc=2, timeout=300):
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    argv = [cohort, "run", "--nproc-per-node", nproc, "--log-dir", tmp_path / name, *extra,
            PROBE, *args, launcher.marker]
    return launcher.run(argv, timeout=timeout, name=name, cwd=workdir,
                        env=U.clean_env(PROBE_VAR="probe value"))


def test_forked_worker_sees_what_a_fresh_one_sees(cohort, need_torch, launcher, tmp_path):
    warm = run_probe(cohort, launcher, tmp_path, "warm", ["--preload", "torch"])
    fresh = run_probe(cohort, launcher, tmp_path, "fresh", ["--no-preload"])
    assert warm.p.returncode == 0, warm.describe()
    assert fresh.p.returncode == 0, fresh.describe()
    w, f = probes(warm.stdout), probes(fresh.stdout)
    assert sorted(w) == sorted(f) == [0, 1], (warm.stdout, fresh.stdout)
    for rank in (0, 1):
        assert w[rank]["forked"] and w[rank]["torch_preloaded"], w[rank]
        assert not f[rank]["forked"] and not f[rank]["torch_preloaded"], f[rank]
        # The C library sees the environment os.environ has (putenv, not only a dict).
        assert w[rank]["env"] == w[rank]["c_env"], w[rank]
        assert w[rank]["env"]["TORCHELASTIC_ERROR_FILE"].endswith("attempt_0/%d/error.json" % rank)
        for facts in (w[rank], f[rank]):  # values of the run, not of how it started
            for view in ("env", "c_env"):
                for per_run in ("MASTER_PORT", "TORCHELASTIC_ERROR_FILE"):
                    facts[view].pop(per_run)
        for key in SAME:
            assert w[rank][key] == f[rank][key], (rank, key, w[rank][key], f[rank][key])
        # The agent (cohort run itself) is the parent either way.
        assert w[rank]["ppid"] == warm.pid and f[rank]["ppid"] == fresh.pid
    assert w[0]["env"]["PROBE_VAR"] == "probe value"
    assert w[0]["random"] != w[1]["random"], "forked workers share a random seed"


@pytest.mark.parametrize("args,expect", [
    (["--exit", "7"], r"exit(ed with)? code 7"),
    (["--raise"], r"exit(ed with)? code 1"),
    (["--interrupt"], r"SIGINT"),
])
def test_exit_status_and_traceback_as_fresh(cohort, need_torch, launcher, tmp_path, args,
                                            expect):
    runs = {}
    for name, extra in (("warm", ["--preload", "torch"]), ("fresh", ["--no-preload"])):
        p = run_probe(cohort, launcher, tmp_path, name, extra, args=args, nproc=1)
        assert p.p.returncode != 0, p.describe()
        assert re.search(expect, p.stderr), p.describe()
        if "--raise" in args:  # the fast exit after a failure (warm) keeps these too
            unclosed = tmp_path / "work" / "unclosed.txt"
            assert unclosed.read_text() == "written before the failure\n", name
            unclosed.unlink()
            assert "probe atexit ran" in p.stdout, p.describe()
        runs[name] = p
    assert runs["warm"].p.returncode == runs["fresh"].p.returncode
    if "--raise" in args:
        for name, p in runs.items():
            log = next((tmp_path / name).rglob("stderr.log")).read_text()
            assert "ValueError: probe raised on purpose" in log, log
            assert 'File "%s"' % PROBE in log, log
            assert "cohort_zygote" not in log, log  # the traceback starts at the script


def test_record_error_file_and_output_capture(cohort, need_torch, launcher, tmp_path):
    p = launcher.run([cohort, "run", "--nproc-per-node", 2, "--log-dir", tmp_path / "logs",
                      RECORD_FAIL, launcher.marker], timeout=300)
    assert p.p.returncode != 0, p.describe()
    assert "boom from rank 1" in p.stderr, p.describe()  # from @record's error file
    lines = run_probe(cohort, launcher, tmp_path, "lines", [], args=["--print-lines", "2000"])
    assert lines.p.returncode == 0, lines.describe()
    assert probes(lines.stdout)[0]["forked"]
    for rank in (0, 1):
        log = next((tmp_path / "lines").rglob("%d/stdout.log" % rank)).read_text()
        assert log.count("\nline ") == 2000 and log.endswith("line 1999\n"), log[-300:]


def test_restart_forks_from_the_warm_interpreter(cohort, need_torch, launcher, tmp_path):
    p = run_probe(cohort, launcher, tmp_path, "restart", ["--max-restarts", "1"],
                  args=["--kill-first-attempt"])
    assert p.p.returncode == 0, p.describe()
    attempts = sorted((tmp_path / "restart").rglob("attempt_*"))
    assert len(attempts) == 2, attempts
    second = [json.loads(re.search(r"probe (\{.*\})", (d / "stdout.log").read_text()).group(1))
              for d in sorted(attempts[1].iterdir()) if (d / "stdout.log").exists()]
    assert len(second) == 2 and all(s["forked"] and s["torch_preloaded"] for s in second)


def test_failed_preload_falls_back_to_fresh_workers(cohort, need_torch, launcher, tmp_path):
    p = run_probe(cohort, launcher, tmp_path, "nomod", ["--preload", "no_such_module_for_cohort"])
    assert p.p.returncode == 0, p.describe()
    assert "no_such_module_for_cohort" in p.stderr and "fresh" in p.stderr, p.describe()
    assert not any(f["forked"] for f in probes(p.stdout).values()), p.stdout
