#!/usr/bin/env python3
"""Dumps the launcher-provided environment of this worker as JSON.

Usage: env_dump.py OUT_DIR [marker...]  -> writes OUT_DIR/env_<RANK>.json (atomically).
Needs no torch.
"""
import json
import os
import sys

KEYS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS", "COHORT_TOKEN", "COHORT_STORE_ADDR", "COHORT_STORE_PORT",
    "COHORT_FLIGHT_RECORDER_DIR", "COHORT_ROUND", "COHORT_JOB_COOKIE",
]


def main():
    out_dir = sys.argv[1]
    env = {k: os.environ[k] for k in KEYS if k in os.environ}
    env["_all_keys"] = sorted(os.environ)
    env["_pid"] = os.getpid()
    rank = os.environ.get("RANK", "unknown")
    final = os.path.join(out_dir, "env_%s.json" % rank)
    tmp = final + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(env, f, indent=1, sort_keys=True)
    os.replace(tmp, final)


if __name__ == "__main__":
    main()
