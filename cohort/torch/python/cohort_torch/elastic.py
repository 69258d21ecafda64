"""An elastic training loop for PyTorch scripts in a few changed lines (docs/torch-backend.md,
section 6): the workers keep their processes through a node loss or join under
`cohort run`, with any backend (gloo, nccl, cohort), and the same script restarts from its
checkpoint under torchrun or with COHORT_LIVE_RECONFIG=0.

    import cohort_torch.elastic as elastic
    dist.init_process_group("gloo")
    model = elastic.DistributedDataParallel(net)               # instead of DDP(net)
    sampler = elastic.ElasticSampler(dataset, batch_size)      # instead of DistributedSampler
    loader = DataLoader(dataset, batch_size, sampler=sampler)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          checkpoint="ckpt")                   # instead of loading it

    @elastic.run                                               # the function that trains
    def train_epoch(loader, model, opt):
        for x, y in loader:
            ...forward, backward, opt.step()...
            elastic.commit(loss)                               # the step boundary

    for epoch in range(state.epoch, epochs):
        sampler.set_epoch(epoch)
        train_epoch(loader, model, opt)
        state.save()                                           # a snapshot: one copy

State() forms the job: the ranks agree on the newest state (a newcomer receives it from the
others, by broadcast; a job that starts or restarts resumes from the job's newest snapshot
or checkpoint, cohort_torch.checkpoint's: the nodes' memory under `cohort run`, then the
`checkpoint` directory). When,
inside a function decorated with run(), a collective fails because a peer went away, or
commit() learns that the agent announced a new membership (a node joined or was lost),
run() re-forms the default process group at the new rank and world size with the script's
own backend (cohort_torch.live), shares the newest state with newcomers and with ranks that
missed the last step, re-wraps DDP and calls the function again with the same arguments:
the sampler continues the epoch from the global sample position on the new world size, so
no sample of the epoch is trained twice or skipped across the change.

commit() is cheap: a step counter, the sampler's position, cohort_torch.report() (step,
loss, samples for /job, cohort top and TensorBoard) and one 8-byte all-reduce by which the
ranks agree to re-form at the same step boundary (a notice handled between steps needs no
interruption of a collective, so it works with nccl as with gloo).

Thread-safety: for the training thread only (cohort_torch.live's watcher thread is the only
other thread, and it touches none of these objects).
"""
import functools
import gc
import math
import os
import re
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from . import checkpoint as _checkpoint
from . import live as _live
from . import report as _report

__all__ = ["DistributedDataParallel", "ElasticSampler", "MembershipChanged", "State", "commit",
           "run"]

_current = None  # the State that run() and commit() act on: the newest one made

# Errors of a collective whose peer went away, by backend: gloo's TCP pairs, NCCL's
# communicator, cohort's transports, a store that closed. Anything else is the script's own
# error and is raised as it is (the agent restarts the workers from the checkpoint).
_PEER_ERROR = re.compile(
    r"connection|closed|reset by peer|broken pipe|timed? ?out|gloo|nccl|cohort|interrupted|"
    r"peer|socket|store", re.IGNORECASE)


class MembershipChanged(RuntimeError):
    """Raised by State.commit() when the ranks agreed that a new membership was announced;
    run() catches it and re-forms."""


class ElasticSampler(torch.utils.data.Sampler):
    """DistributedSampler's job on a world size that may change mid-epoch.

    Each epoch is one order of the data set (shuffled with `seed + epoch`, or in order).
    `position` counts the samples of the epoch the whole group has trained (advanced by
    State.commit(): `batch_size` per rank per step); an iterator deals out what is left,
    rank r taking every world-th sample from r, with the rank and world size of the group
    at the time it is made. So after a re-form the new group continues with exactly the
    samples not yet trained. Like DistributedSampler, the tail of an epoch is padded from
    the epoch's start to a multiple of the world size (every rank needs as many batches)."""

    def __init__(self, dataset, batch_size, shuffle=True, seed=0):
        if int(batch_size) < 1:
            raise ValueError("ElasticSampler: batch_size must be at least 1, not %r" % batch_size)
        self.size = len(dataset)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0

    @staticmethod
    def _group():
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def set_epoch(self, epoch):
        """Starts `epoch` from its first sample, unless it is the epoch under way (a call
        after a re-form continues it)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.position = 0

    def _order(self):
        if not self.shuffle:
            return torch.arange(self.size)
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=g)

    def __iter__(self):
        rank, world = self._group()
        order = self._order()
        rest = order[self.position:]
        if len(rest) % world:
            pad = world - len(rest) % world
            rest = torch.cat([rest, order[:pad].repeat(math.ceil(pad / max(1, len(order))))[:pad]])
        return iter(rest[rank::world].tolist())

    def __len__(self):
        _, world = self._group()
        return math.ceil(max(0, self.size - self.position) / world)

    def advance(self, samples_per_rank=None):
        """One step of the group done: `samples_per_rank` (default batch_size) on each rank."""
        n = self.batch_size if samples_per_rank is None else int(samples_per_rank)
        self.position = min(self.size, self.position + n * self._group()[1])

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, saved):
        self.epoch, self.position = int(saved["epoch"]), int(saved["position"])
        self.seed = int(saved.get("seed", self.seed))


class DistributedDataParallel(nn.Module):
    """torch's DistributedDataParallel for a group that may be re-formed: a module that holds
    `module` (so its state_dict has DDP's `module.` keys) and a DDP wrapper of it that run()
    drops before the old group is destroyed and rebuilds on the new one. Takes DDP's
    keyword arguments."""

    def __init__(self, module, **ddp_kwargs):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_kwargs", dict(ddp_kwargs))
        object.__setattr__(self, "_ddp", None)

    def rewrap(self):
        """Wraps `module` for the current default group (DDP broadcasts rank 0's
        parameters and buffers)."""
        self.drop()
        object.__setattr__(self, "_ddp", _TorchDDP(self.module, **self._kwargs))

    def drop(self):
        """Forgets the DDP wrapper, so that nothing keeps the old group's connections open."""
        object.__setattr__(self, "_ddp", None)

    def forward(self, *args, **kwargs):
        if self._ddp is None:
            self.rewrap()
        return self._ddp(*args, **kwargs)

    def no_sync(self):
        if self._ddp is None:
            self.rewrap()
        return self._ddp.no_sync()


class State:
    """What a re-form carries over: the model, the optimizer, the sampler's place, the step
    count (`step`, commits done) and the script's own values, given as keywords and read and
    set as attributes; `state.epoch` is the sampler's first epoch not finished unless the
    script gives its own.
    `checkpoint`: the directory of the job's checkpoints (cohort_torch.checkpoint: save()
    takes a snapshot, which rank 0 writes there in the background; None: snapshots in the
    nodes' memory only, under `cohort run`); a job that starts, or restarts, resumes from
    the newest; `checkpoint_every`: save() every N commits as well.
    Making it forms the job (a collective on every rank: make it at the same point on all,
    after init_process_group, which it calls with gloo, or nccl with CUDA, if the script
    did not)."""

    _OWN = ("model", "optimizer", "sampler", "checkpoint", "checkpoint_every", "step")

    def __init__(self, model=None, optimizer=None, sampler=None, checkpoint=None,
                 checkpoint_every=0, **values):
        for name in values:
            if name in self._OWN or name.startswith("_"):
                raise ValueError("cohort_torch.elastic.State: %r is a name State uses itself; "
                                 "call the value something else" % name)
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.checkpoint = os.fspath(checkpoint) if checkpoint else None
        if self.checkpoint and os.path.isfile(self.checkpoint):
            raise ValueError(
                "cohort_torch.elastic.State: checkpoint=%r is a file, but it names a directory "
                "(cohort_torch.checkpoint's snapshots are written there); pass a directory "
                "path. The file is left as it is (torch.load it yourself to start from it)."
                % self.checkpoint)
        self._checkpointer = _checkpoint.Checkpointer(self.checkpoint)
        self.checkpoint_every = int(checkpoint_every or 0)
        self.step = 0
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._live = None
        global _current
        _current = self
        self._start()

    def __getattr__(self, name):  # only for names not set on the object
        sampler = self.__dict__.get("sampler")
        if name == "epoch" and sampler is not None:  # the first epoch not finished
            return sampler.epoch + (1 if sampler.position >= sampler.size else 0)
        raise AttributeError("cohort_torch.elastic.State has no value %r (give it as a "
                             "keyword: State(..., %s=...))" % (name, name))

    # -- what travels -------------------------------------------------------------------
    def _module(self):
        return self.model.module if isinstance(self.model, (DistributedDataParallel,
                                                            _TorchDDP)) else self.model

    def state_dict(self):
        out = {"step": self.step, "values": {n: getattr(self, n) for n in self._names}}
        if self.model is not None:
            out["model"] = self._module().state_dict()
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer.state_dict()
        if self.sampler is not None:
            out["sampler"] = self.sampler.state_dict()
        return out

    def load_state_dict(self, saved):
        self.step = int(saved["step"])
        for name, value in saved.get("values", {}).items():
            if name in self._names:
                setattr(self, name, value)
        if self.model is not None and "model" in saved:
            self._module().load_state_dict(saved["model"])
        if self.optimizer is not None and "optimizer" in saved:
            self.optimizer.load_state_dict(saved["optimizer"])
        if self.sampler is not None and "sampler" in saved:
            self.sampler.load_state_dict(saved["sampler"])

    def save(self):
        """Takes a snapshot of the state at `step` (cohort_torch.checkpoint: returns after
        one copy; under `cohort run` it is kept in the node's memory, and rank 0 writes it
        to `checkpoint` in the background, atomically). Every rank calls it."""
        self._checkpointer.save(self.state_dict(), self.step)

    def flush(self, timeout_s=600.0):
        """Waits until the newest snapshot is written to `checkpoint` (RuntimeError with
        the write's error when it cannot be)."""
        self._checkpointer.flush(timeout_s)

    # -- the step boundary --------------------------------------------------------------
    def commit(self, loss=None, samples=None):
        """Ends a step: counts it, advances the sampler by `samples` per rank (default its
        batch_size), reports progress, saves every `checkpoint_every` commits, and raises
        MembershipChanged on every rank at once when a new membership was announced."""
        self.step += 1
        if self.sampler is not None:
            self.sampler.advance(samples)
        per_rank = samples if samples is not None else getattr(self.sampler, "batch_size", None)
        epoch = getattr(self, "epoch", None)
        _report(step=self.step, loss=loss, samples=per_rank,
                epoch=epoch if isinstance(epoch, (int, float)) else None)
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.save()
        if self._live is not None:
            self._agree()

    def _agree(self):
        """One all-reduce of the newest announced round: every rank learns of a notice at
        the same step, whichever saw it first."""
        notice = self._live.pending()
        newest = torch.tensor([notice["round"] if notice else 0], dtype=torch.int64,
                              device=_live.collective_device())
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        if int(newest.item()) > self._live.round:
            raise MembershipChanged("round %d was announced" % int(newest.item()))

    # -- forming and re-forming ----------------------------------------------------------
    def _start(self):
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self._live = _live.start()  # None under torchrun or with COHORT_LIVE_RECONFIG=0
        self._formed(had_state=False)

    def _formed(self, had_state):
        """After the group formed: the newest state everywhere, DDP on the new group."""
        restored = None
        if self._live is not None:
            snapshot, step = self._live.share(self.state_dict() if had_state else None,
                                              self.step if had_state else -1)
            if snapshot is not None and (not had_state or step != self.step):
                self.load_state_dict(snapshot)
                restored = "from rank state, step %d" % self.step
        if not had_state and restored is None:  # every rank, or none: load() is collective
            found = self._checkpointer.load()
            if found is not None:
                self.load_state_dict(found[0])
                restored = "from %s, step %d" % (self._checkpointer.loaded_from, self.step)
        if isinstance(self.model, DistributedDataParallel):
            self.model.rewrap()
        rank, world = dist.get_rank(), dist.get_world_size()
        print("cohort_torch.elastic: rank %d of %d round %s pid %d step %d%s" % (
            rank, world, self._live.round if self._live else "-", os.getpid(), self.step,
            " (resumed %s)" % restored if restored else ""), flush=True)

    def _reform(self, why):
        if isinstance(self.model, DistributedDataParallel):
            self.model.drop()  # DDP holds the old group: its connections must close now
        gc.collect()
        notice = self._live.reform(why)
        self._formed(had_state=True)
        return notice


def _is_membership_error(state, error):
    if isinstance(error, MembershipChanged):
        return True
    if state._live is None or not isinstance(error, RuntimeError):
        return False
    return state._live.pending() is not None or bool(_PEER_ERROR.search(str(error)))


def _state_for(args):
    if args and isinstance(args[0], State):
        return args[0]
    if _current is None:
        raise RuntimeError("cohort_torch.elastic: make a State before calling a function "
                           "decorated with run() or commit()")
    return _current


def commit(loss=None, samples=None):
    """State.commit() of the current State (the newest one made)."""
    _state_for(()).commit(loss=loss, samples=samples)


def run(func):
    """Decorates the function that trains (an epoch, or the whole loop): calls it and, after
    a membership change inside it, re-forms and calls it again with the same arguments.
    Acts on the State given as its first argument, else the current one. Returns what
    `func` returns. Errors that are not a peer's loss are raised unchanged."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        state = _state_for(args)
        while True:
            why = None
            try:
                return func(*args, **kwargs)
            except RuntimeError as error:
                if not _is_membership_error(state, error):
                    raise
                # Only the text leaves this block: the traceback's frames hold tensors of
                # the failed step, and through them the old group.
                why = None if isinstance(error, MembershipChanged) else \
                    (str(error).strip() or type(error).__name__)
            began = time.monotonic()
            if why is not None:
                state._live.report_lost(why)  # the agents form the next round meanwhile
            notice = state._reform(why)
            print("cohort_torch.elastic: rank %d re-formed live in %.0f ms at step %d "
                  "(round %d)" % (dist.get_rank(), 1000 * (time.monotonic() - began),
                                  state.step, notice["round"]), file=sys.stderr, flush=True)
    return wrapper
