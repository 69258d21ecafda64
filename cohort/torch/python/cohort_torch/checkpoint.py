"""Checkpoints that do not stop training, for PyTorch scripts (docs/checkpoints.md).

    import cohort_torch.checkpoint as ckpt

    restored = ckpt.load("ckpt")                # None, or (state, step): the job's newest
    if restored:
        state, step = restored
        model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])
    for step in range(step, steps):
        ...
        ckpt.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step,
                  "ckpt")                       # returns after one copy of the state
    ckpt.flush()                                # the newest is on disk (also at exit)

save() copies the state (tensors, numbers, strings, and lists, tuples and dicts of them:
what state_dict() returns) into a snapshot: the only time training waits. Under
`cohort run` local rank 0 of every node publishes it in the node's snapshot directory
(COHORT_SNAPSHOT_DIR, shared memory the agent owns), so it outlives a crashed worker; rank 0
also writes it to the directory in the background (atomic, checksummed, the newest `keep`
kept; a failed write is retried while training goes on). The state is taken to be the same
on every rank (data parallel), as torch's DDP keeps it.

load() finds, on every rank, the newest valid snapshot or checkpoint on its node (the
snapshot directory, then the checkpoint directory); with torch.distributed initialized the
ranks agree on the newest of all and the rank that holds it sends it to the others, so a
replacement node with nothing on it, or a job with no shared file system, resumes at the
job's newest step. Every rank calls load() and save() (they are collective only in load,
and only when torch.distributed is initialized). Without `cohort run` (torchrun, a plain
script) only the checkpoint directory is used. The rank whose copy is used prints
"cohort_torch: resumed from <where> at step <step>".

When the process exits, every Checkpointer's newest snapshot is written first (exit
status 12, with the error on stderr, when it cannot be).

Nothing is unpickled: the state is a typed JSON header and the tensors' raw bytes
(_state_codec), so a hostile file can make load() raise ValueError, never run code.
Thread-safety: one Checkpointer per process, used from one thread.
"""
import atexit
import json
import os
import sys
import weakref

import numpy
import torch
import torch.distributed as dist

from . import _C
from ._state_codec import flatten, unflatten

__all__ = ["Checkpointer", "save", "load", "flush"]

_FORMAT = "cohort_torch1"


def _env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Checkpointer:
    """Snapshots of one job's state in `directory` (None: the node's memory only, under
    `cohort run`) and the node's snapshot directory; `keep` checkpoint files kept."""

    def __init__(self, directory=None, keep=3):
        self.directory = os.fspath(directory) if directory else ""
        self.keep = int(keep)
        self.memory_dir = os.environ.get(_C.WORKER_ENV["snapshot_dir"], "")
        self._store = None
        self._rank = None
        self.loaded_from = None  # where load()'s state came from
        _open.add(self)

    def _roles(self):
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else \
            _env_int(_C.WORKER_ENV["rank"], 0)
        local_rank = _env_int(_C.WORKER_ENV["local_rank"], 0)
        memory = self.memory_dir if local_rank == 0 else ""
        disk = self.directory if rank == 0 else ""
        return rank, local_rank, memory, disk

    def _snapshots(self):
        rank, local_rank, memory, disk = self._roles()
        if self._store is not None and self._rank == rank:
            return self._store
        self.flush()
        self._store, self._rank = None, rank
        if memory or disk:
            self._store = _C.Snapshots(memory, disk, self.keep, local_rank)
        return self._store

    def save(self, state, step):
        """Takes the snapshot of `state` at `step` (an int: the newest step is what load()
        returns); returns once the state is copied."""
        store = self._snapshots()
        if store is None:
            return
        header, tensors = flatten(state)
        meta = json.dumps({"format": _FORMAT, "step": int(step), "header": header.decode()},
                          separators=(",", ":"))
        store.take(int(step), meta, tensors)

    def flush(self, timeout_s=600.0):
        """Waits until the newest snapshot is written to the directory (RuntimeError with
        the last write's error when it is not within `timeout_s`)."""
        if self._store is not None:
            self._store.flush(float(timeout_s))

    def stats(self):
        """Counters of this process's snapshots (taken, persisted, dropped, write_failures,
        blocking_seconds, ...), or {} when it keeps none."""
        return self._store.stats() if self._store is not None else {}

    def load(self):
        """(state, step) of the job's newest snapshot or checkpoint, or None."""
        found = _C.newest_snapshot(self.memory_dir, self.directory)
        mine = -1 if found is None else found.step
        distributed = dist.is_available() and dist.is_initialized() and \
            dist.get_world_size() > 1
        if not distributed:
            return None if found is None else self._restore_found(found)
        device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend() == "nccl" else torch.device("cpu")
        newest = torch.tensor([mine], dtype=torch.int64, device=device)
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        newest = int(newest.item())
        if newest < 0:
            return None
        world = dist.get_world_size()
        source = torch.tensor([dist.get_rank() if mine == newest else world],
                              dtype=torch.int64, device=device)
        dist.all_reduce(source, op=dist.ReduceOp.MIN)
        source = int(source.item())
        # Every rank that holds the newest restores its own copy (no transfer); the others
        # receive the source's: its metadata, then its payload, by broadcast.
        holders = torch.tensor([1 if mine == newest else 0], dtype=torch.int64, device=device)
        dist.all_reduce(holders)
        if int(holders.item()) == world:
            return self._restore_found(found)
        self.loaded_from = found.where if dist.get_rank() == source else \
            "rank %d's copy (sent by broadcast)" % source
        if dist.get_rank() == source:
            meta = found.meta
            sizes = torch.tensor([len(meta), len(memoryview(found.payload))], dtype=torch.int64,
                                 device=device)
        else:
            sizes = torch.zeros(2, dtype=torch.int64, device=device)
        dist.broadcast(sizes, src=source)
        n_meta, n_payload = (int(x) for x in sizes.tolist())
        # One copy of the payload per rank, which the restored tensors then view: the
        # source copies it out of the mapped file (never broadcast from a read-only
        # mapping), the others receive into theirs.
        header = torch.empty(n_meta, dtype=torch.uint8)
        payload = torch.empty(n_payload, dtype=torch.uint8)
        if dist.get_rank() == source:
            header.numpy()[:] = numpy.frombuffer(meta, dtype=numpy.uint8)
            payload.numpy()[:] = numpy.frombuffer(memoryview(found.payload), dtype=numpy.uint8)
            found.recheck()  # the bytes copied were the ones verified
        header_dev, payload_dev = header.to(device), payload.to(device)
        dist.broadcast(header_dev, src=source)
        dist.broadcast(payload_dev, src=source)
        if dist.get_rank() == source:
            print("cohort_torch: resumed from %s at step %d (and sent it to the ranks without "
                  "it)" % (found.where, found.step), flush=True)
        else:
            header, payload = header_dev.cpu(), payload_dev.cpu()
        return self._restore(header.numpy().tobytes(), payload, None, newest)

    def _restore_found(self, found):
        self.loaded_from = found.where
        result = self._restore(found.meta, memoryview(found.payload), found.where, found.step)
        found.recheck()  # the bytes copied were the ones verified
        return result

    @staticmethod
    def _restore(meta, payload, where, step):
        try:
            info = json.loads(meta.decode())
        except ValueError as error:
            raise ValueError("cohort_torch.checkpoint: malformed metadata: %s" % error) from None
        if not isinstance(info, dict) or info.get("format") != _FORMAT:
            raise ValueError("cohort_torch.checkpoint: not a cohort_torch checkpoint (format "
                             "%r); was it written by cohort-train?" %
                             (info.get("format") if isinstance(info, dict) else None))
        if not isinstance(payload, torch.Tensor):
            payload = memoryview(payload)
        offset = [0]

        def next_bytes(nbytes):
            start = (offset[0] + 63) // 64 * 64
            if start + nbytes > len(payload):
                return None
            offset[0] = start + nbytes
            return payload[start:start + nbytes]

        state = unflatten(info["header"].encode(), next_bytes)
        if where is not None:
            print("cohort_torch: resumed from %s at step %d" % (where, step), flush=True)
        return state, int(info.get("step", step))


_default = {}
_open = weakref.WeakSet()  # every Checkpointer: flushed when the process exits


@atexit.register
def _flush_at_exit():
    """The newest snapshot of every Checkpointer is written before the process ends; when
    that fails the process exits 12 (as cohort-train does), the error on stderr."""
    for c in list(_open):
        try:
            c.flush()
        except RuntimeError as error:
            print("cohort_torch.checkpoint: the last checkpoint could not be written to %s: %s"
                  % (c.directory, error), file=sys.stderr, flush=True)
            os._exit(12)


def _checkpointer(directory, keep):
    key = (os.fspath(directory) if directory else "", int(keep))
    if key not in _default:
        _default[key] = Checkpointer(directory, keep)
    return _default[key]


def save(state, step, directory=None, keep=3):
    """Checkpointer(directory, keep).save(state, step), with one Checkpointer per
    directory for the process."""
    _checkpointer(directory, keep).save(state, step)


def load(directory=None, keep=3):
    """Checkpointer(directory, keep).load(): (state, step) or None."""
    return _checkpointer(directory, keep).load()


def flush(timeout_s=600.0):
    """Waits until every directory's newest snapshot is written."""
    for c in _default.values():
        c.flush(timeout_s)
