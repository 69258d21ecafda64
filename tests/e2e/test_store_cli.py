"""`cohort store`: a standalone embedded store that agents on several nodes join
(`--rdzv-conf is_host=false`), with the job token; a wrong token is refused."""
import re
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_util as U  # noqa: E402


def test_standalone_store_serves_two_agents(cohort, launcher, marker):
    env = U.clean_env(COHORT_TOKEN="store-cli-" + marker)
    store = launcher.start([cohort, "store", "--host", "127.0.0.1", "--port", "0"], env=env,
                           name="store")
    m = U.wait_for(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", store.stdout), 30,
                   what="cohort store to listen")
    port = m.group(1)
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "127.0.0.1:" + port,
              "--rdzv-id", marker, "--rdzv-conf", "is_host=false,join_timeout=30",
              "--no-python", "--"]
    a = launcher.start([cohort, "run", *common, "/bin/sh", "-c",
                        "echo rank=$RANK world=$WORLD_SIZE", marker], env=env, name="a")
    b = launcher.start([cohort, "run", *common, "/bin/sh", "-c",
                        "echo rank=$RANK world=$WORLD_SIZE", marker], env=env, name="b")
    assert a.wait(60) == 0, a.describe()
    assert b.wait(60) == 0, b.describe()
    out = a.stdout + b.stdout
    assert "rank=0 world=2" in out and "rank=1 world=2" in out, out
    # A node with another token is refused with a clear message.
    bad = launcher.start([cohort, "run", *common, "/bin/true"],
                         env=U.clean_env(COHORT_TOKEN="not-the-token"), name="bad")
    assert bad.wait(60) == 4, bad.describe()
    assert "token" in bad.stderr, bad.describe()
    store.p.send_signal(signal.SIGTERM)
    assert store.wait(30) == 0, store.describe()
