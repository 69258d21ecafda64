"""libcohort's collectives for torch.distributed.

    import cohort_torch            # registers the backend "cohort"
    torch.distributed.init_process_group("cohort")

Under `cohort run` this package is on the workers' PYTHONPATH; elsewhere (torchrun, a
plain script) add the directory that holds it, e.g.
PYTHONPATH=build/dev/cohort/cli/python. See docs/torch-backend.md; for keeping the workers
through a node loss or join, cohort_torch.live (docs/multinode.md).
"""
import torch.distributed as _dist

from . import _C

__all__ = ["BACKEND", "topology"]

BACKEND = "cohort"


def topology(group=None):
    """How the ranks of `group` (default: the world) reach each other: shm, tcp or shm+tcp."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    return _C.topology(pg)


if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _C.create_process_group)
