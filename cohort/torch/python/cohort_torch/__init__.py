"""libcohort's collectives for torch.distributed.

    import cohort_torch            # registers the backend "cohort"
    torch.distributed.init_process_group("cohort")

Under `cohort run` this package is on the workers' PYTHONPATH; elsewhere (torchrun, a
plain script) add the directory that holds it, e.g.
PYTHONPATH=build/dev/cohort/cli/python. See docs/torch-backend.md; for keeping the workers
through a node loss or join, cohort_torch.live (docs/multinode.md).
"""
import atexit as _atexit

import torch.distributed as _dist

from . import _C

__all__ = ["BACKEND", "report", "topology"]

BACKEND = "cohort"


def report(step=None, loss=None, samples=None, epoch=None, tensorboard_dir=""):
    """Tells cohort how the training loop is doing, for `/job`, `cohort top`,
    `cohort bench scaling` and TensorBoard, as cohort-train does:

        cohort_torch.report(step=step, loss=loss.item(), samples=len(batch))

    `step`: optimizer steps done; `loss`: a float (a tensor is converted); `samples`: samples
    this rank trained since its previous report (samples/s is measured from them); `epoch`:
    epochs done. With `tensorboard_dir` (or COHORT_TENSORBOARD_DIR) rank 0 also writes
    train/loss and train/samples_per_second scalars there. Cheap enough for every step; a
    no-op for the views outside `cohort run`. Works with any backend (gloo, nccl, cohort)."""
    if loss is not None and hasattr(loss, "item"):
        loss = loss.item()
    _C.report(step=None if step is None else int(step),
              loss=None if loss is None else float(loss),
              samples=None if samples is None else float(samples),
              epoch=None if epoch is None else float(epoch),
              tensorboard_dir=str(tensorboard_dir or ""))


def topology(group=None):
    """How the ranks of `group` (default: the world) reach each other: shm, tcp or shm+tcp."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    return _C.topology(pg)


# Before the interpreter finalizes (atexit runs first): from then on the backend's threads
# leave the tensors they still hold to the exiting process rather than free them, which
# would need the GIL and abort the process (cohort/torch/exit_gate.h).
_atexit.register(_C.close_at_exit)

if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _C.create_process_group)
