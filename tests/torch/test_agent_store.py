"""torch's env:// rendezvous under `cohort run` reaches a TCPStore the agent serves
(TORCHELASTIC_USE_AGENT_STORE=True), speaking torch 1.13's wire protocol, fresh each round.
"""
import re
from pathlib import Path

import e2e_util as U

PROBE = Path(__file__).resolve().parent / "agent_store_probe.py"


def test_torch_clients_use_the_agents_store(cohort, need_torch, launcher, tmp_path):
    p = launcher.run([cohort, "run", "--nproc-per-node", 3, "--log-dir", tmp_path / "logs",
                      PROBE, launcher.marker], timeout=300)
    assert p.p.returncode == 0, p.describe()
    logs = [f.read_text() for f in sorted((tmp_path / "logs").rglob("stdout.log"))]
    assert len(logs) == 3 and all("agent_store True" in log for log in logs), logs
    ok = re.findall(r"rank (\d) store ok world (\d) restart 0", p.stdout)
    assert sorted(ok) == [("0", "3"), ("1", "3"), ("2", "3")], p.stdout
    # Every rank is a client of a server that already listens: none waits a second to
    # retry a refused connection, as torch's clients do when rank 0 races to start it.
    for t in re.findall(r"init_s ([0-9.]+)", p.stdout):
        assert float(t) < 0.9, p.stdout


def test_each_round_gets_a_fresh_store(cohort, need_torch, launcher, tmp_path):
    p = launcher.run([cohort, "run", "--nproc-per-node", 2, "--max-restarts", 1,
                      "--log-dir", tmp_path / "logs", PROBE, "--fail-first-attempt",
                      launcher.marker], timeout=300)
    assert p.p.returncode == 0, p.describe()
    for restart in ("0", "1"):
        ok = re.findall(r"rank (\d) store ok world 2 restart %s" % restart, p.stdout)
        assert sorted(ok) == ["0", "1"], p.stdout


def test_a_fixed_master_port_is_served_too(cohort, need_torch, launcher, tmp_path):
    port = U.free_port()
    p = launcher.run([cohort, "run", "--nproc-per-node", 2, "--master-port", port,
                      "--log-dir", tmp_path / "logs", PROBE, launcher.marker], timeout=300)
    assert p.p.returncode == 0, p.describe()
    assert len(re.findall(r"store ok world 2", p.stdout)) == 2, p.stdout
