"""Hang detection: a rank that never enters a collective makes the others time out; the
agent then collects every rank's flight recorder and names the rank that did not enter
which collective."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_util as U  # noqa: E402


def test_agent_names_the_rank_that_did_not_enter_the_collective(cohort, launcher, marker):
    loop = Path(cohort).parent / "allreduce_loop"
    env = U.clean_env(COHORT_COMM_TIMEOUT="2", HANG_RANK="1", HANG_AT="4")
    p = launcher.start([cohort, "run", "--nproc-per-node", "3", "--max-restarts", "0",
                        str(loop), "10", marker], env=env, name="hang")
    rc = p.wait(60)
    assert rc == 1, p.describe()
    err = p.stderr
    assert "timed out waiting for rank 1" in err, p.describe()
    assert "rank 1: last operation allreduce #3" in err, p.describe()
    assert "rank 1 has not entered allreduce #4" in err, p.describe()
    assert not U.marker_pids(marker), "leftover processes: %r" % U.marker_pids(marker)
