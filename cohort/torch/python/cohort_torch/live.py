"""Live reconfiguration for PyTorch training loops (docs/multinode.md, "Live
reconfiguration"): under `cohort run` across nodes, a worker that uses this module keeps its
process, model and optimizer through a node loss or join; it re-forms the "cohort" process
group at the new rank and world size between steps, and a newcomer receives the state from
the others instead of reading a checkpoint. Any backend: the group is re-formed with the
one the script chose (gloo, nccl, cohort). cohort_torch.elastic builds a training loop on
this in a few lines; this module is its lower layer.

    import cohort_torch.live
    dist.init_process_group("cohort")
    live = cohort_torch.live.start()          # None when the agent offers nothing
    state, step = live.share(None, -1) if live else (None, -1)   # a newcomer gets the state
    ...
    while step < steps:
        if live and live.pending():           # a node joined or was lost
            live.reform()
            state, step = live.share(my_state, step)   # then rebuild DDP, re-shard the data
        try:
            one_step()
        except RuntimeError as error:         # a peer went away, or a notice interrupted it
            if live is None:
                raise
            live.reform(error)
            ...

examples/torch_live_reconfig.py is a complete loop. Under torchrun, or with
COHORT_LIVE_RECONFIG=0, start() returns None and the script restarts from its checkpoint as
any elastic script does.

The channel is a private directory of the agent's user, and the agent's notices carry a
secret that only its workers inherit (COHORT_MEMBERSHIP_SECRET): anything else is refused.
share() sends the state as data, never as a pickle: tensors, numbers, strings and lists,
tuples and dicts of them (model and optimizer state_dicts), in cohort's typed format
(_state_codec.py) with a SHA-256 digest; anything malformed is refused, nothing is run.

Thread-safety: the methods are for the training thread; a watcher thread of the object's
own interrupts the current group when a newer membership is announced (under a lock that
reform() holds while it replaces the group).
"""
import datetime
import hashlib
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from . import _C
from . import _state_codec

__all__ = ["Live", "start"]


# The largest training state share() moves (a guard against a corrupt or hostile header).
_MAX_STATE_BYTES = 1 << 40
# The key of every round's torch store that holds the round's number (cohort/agent/agent.cc).
_ROUND_KEY = "cohort/round"


def collective_device():
    """Where the tensors of this module's own collectives live: the current CUDA device
    for an nccl group (NCCL takes no CPU tensors), else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _seconds(name, default):
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class Live:
    """This worker's side of the membership channel (cohort/base/membership_channel.h)."""

    def __init__(self, directory, local_rank, round_, secret):
        self.directory = directory
        self.local_rank = local_rank
        self._secret = secret
        self.round = round_  # the round the current group was formed in
        self.timeout = _seconds(_C.WORKER_ENV["reconfig_timeout"], 60.0)
        # Re-formed groups use the script's own backend (gloo, nccl or cohort).
        self.backend = dist.get_backend() if dist.is_initialized() else "cohort"
        self._reported = None  # the round whose loss of a peer was reported to the agent
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # The watcher keeps it current. Raises when the channel is not the agent's own.
        self._newest = _C.read_notice(directory, local_rank, secret)
        _C.mark_ready(directory, local_rank)
        self._watcher = threading.Thread(target=self._watch, name="cohort-live-watch",
                                         daemon=True)
        self._watcher.start()

    def pending(self):
        """The agent's membership notice (a dict) when it is newer than the current group.
        Cheap enough for every step: the watcher thread reads the file, this does not."""
        notice = self._newest
        return notice if notice is not None and notice["round"] > self.round else None

    def _watch(self):
        interrupted = self.round
        refused = None
        while not self._stop.wait(0.02):
            try:
                notice = _C.read_notice(self.directory, self.local_rank, self._secret)
            except RuntimeError as error:  # not from the agent: never acted on
                if str(error) != refused:
                    refused = str(error)
                    print("cohort_torch.live: ignoring the membership notice: %s" % refused[:300],
                          file=sys.stderr, flush=True)
                continue
            if notice is None or notice["round"] <= interrupted:
                continue
            self._newest = notice
            with self._lock:  # never the group reform() forms for this notice
                if notice["round"] > self.round and dist.is_initialized():
                    try:
                        _C.interrupt(dist.distributed_c10d._get_default_group(),
                                     "round %d has %d rank(s)" % (notice["round"],
                                                                  notice["world_size"]))
                    except (RuntimeError, ValueError):
                        pass  # not a cohort group: its peers' closing connections tell it
            interrupted = notice["round"]

    def reform(self, error=None):
        """Waits for the new membership (after `error`, a failed collective or its text,
        telling the agent that a peer went away unless a notice explains it), then replaces
        the default process group with one of the same backend at the new rank and world
        size. A group that does not form (its round
        ended meanwhile) is reported like a failed collective and the next one is formed.
        Returns the notice of the round formed."""
        deadline = time.monotonic() + 2 * self.timeout  # the agent decides; this bounds it
        while True:
            notice = self._await(error, deadline)
            with self._lock:
                self._drop_group("re-forming in round %d" % notice["round"])
                # Newcomers of this round start with exactly these variables (env://): the
                # agent's notice lists them (the worker contract, base/worker_env.h).
                os.environ.update(notice["environment"])
                # torch 1.13 counts groups even when creating one failed, and the default
                # group's store barrier is keyed by that count: keep it a newcomer's.
                dist.distributed_c10d._group_count = 0
                try:
                    store = self._round_store(notice, deadline)
                    if store is not None:
                        dist.init_process_group(
                            self.backend, store=store, rank=notice["rank"],
                            world_size=notice["world_size"],
                            timeout=datetime.timedelta(seconds=2 * self.timeout))
                except (RuntimeError, OSError) as failed:
                    self.round = notice["round"]  # the round that did not form
                    error = failed
                    continue
                if store is None:  # a newer round was announced: form that one
                    error = None
                    continue
                self.round = notice["round"]
            _C.write_formed(self.directory, self.local_rank, self.round)
            return notice

    def _round_store(self, notice, deadline):
        """The torch store of the notice's round (node 0's agent serves a new one every
        round), as env:// makes it; None when a newer round was announced meanwhile. A
        round that ended has no store any more, and torch's client retries a refused
        connection for its whole timeout without letting other threads run: so the
        connection is tried a second at a time, reading the agent's newest notice between
        tries. The next round's store may listen on the same port already: the store's
        round key (the agent sets it) must be this round's, else the next notice is awaited."""
        while True:
            newest = self._refresh()
            if newest is not None and newest["round"] > notice["round"]:
                return None
            try:
                store = dist.TCPStore(notice["master_addr"], notice["master_port"],
                                      notice["world_size"], False,
                                      datetime.timedelta(seconds=1))
                if store.get(_ROUND_KEY).decode(errors="replace") == str(notice["round"]):
                    break
            except (RuntimeError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("cohort: the torch store of round %d at %s:%d did not "
                                   "answer" % (notice["round"], notice["master_addr"],
                                               notice["master_port"]))
            time.sleep(0.05)
        store.set_timeout(datetime.timedelta(seconds=2 * self.timeout))
        # The keys env:// and init_process_group use (under an agent that serves the store,
        # TORCHELASTIC_USE_AGENT_STORE), so that newcomers, which form with env://, meet
        # this rank.
        attempt = dist.PrefixStore("/worker/attempt_%d" % notice["restart_count"], store)
        return dist.PrefixStore("default_pg", attempt)

    def _refresh(self):
        """Reads the agent's newest notice now (the watcher's copy may lag while this thread
        holds the interpreter) and keeps it when it is newer; returns the newest known, None
        when there is none (a notice that is not the agent's is never taken)."""
        try:
            read = _C.read_notice(self.directory, self.local_rank, self._secret)
        except RuntimeError:
            read = None
        if read is not None and (self._newest is None or read["round"] > self._newest["round"]):
            self._newest = read
        return self._newest

    def report_lost(self, error):
        """Tells the agent at once that a peer of the current group went away (`error`: the
        failed collective or its text), unless a newer membership was announced already
        (it explains the error) or this round was reported. reform(error) does it too; a
        caller with cleaning up to do first (dropping DDP, collecting garbage) calls this
        before, so that the agents form the next round meanwhile."""
        self._refresh()
        if self.pending() is not None or error is None or self._reported == self.round:
            return
        rank = dist.get_rank() if dist.is_initialized() else -1
        text = str(error).strip().splitlines()[0][:1000] if str(error).strip() else "error"
        _C.write_lost(self.directory, self.local_rank, self.round, rank, text, self._secret)
        self._reported = self.round

    def _await(self, error, deadline):
        self.report_lost(error)
        notice = self.pending()
        while notice is None:
            if time.monotonic() > deadline:
                raise RuntimeError("cohort: no new membership announced after: %s" % error)
            time.sleep(0.01)
            notice = self.pending()
        return notice

    def _drop_group(self, why):
        """Closes the current group's connections at once (peers blocked on it see an error)
        and forgets it; its torch objects (a DDP wrapper) may outlive it."""
        if not dist.is_initialized():
            return
        try:
            _C.interrupt(dist.distributed_c10d._get_default_group(), why)
        except (RuntimeError, ValueError):
            pass  # not a cohort group
        dist.destroy_process_group()

    def share(self, state, step):
        """After forming a group: the newest training state any rank holds. Ranks that hold
        none (newcomers: state None, step -1) or an older step receive the state of the
        lowest rank with the newest step, by broadcast. Returns (state, step); (None, -1)
        on every rank when no rank held any (a job that starts: read the checkpoint)."""
        device = collective_device()
        mine = step if state is not None else -1
        span = torch.tensor([mine, -mine], dtype=torch.int64, device=device)
        dist.all_reduce(span, op=dist.ReduceOp.MAX)
        newest, oldest = int(span[0]), -int(span[1])
        if newest < 0 or oldest == newest:
            return state, step
        source = torch.tensor([dist.get_rank() if mine == newest else dist.get_world_size()],
                              dtype=torch.int64, device=device)
        dist.all_reduce(source, op=dist.ReduceOp.MIN)
        source = int(source[0])
        # Header: the payload's size, then its SHA-256 digest as 32 bytes.
        header = torch.zeros(5, dtype=torch.int64)
        payload = torch.empty(0, dtype=torch.uint8)
        if dist.get_rank() == source:
            data = _state_codec.encode(state)
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            header[0] = len(data)
            header[1:] = torch.frombuffer(bytearray(hashlib.sha256(data).digest()),
                                          dtype=torch.int64)
        header = header.to(device)
        dist.broadcast(header, src=source)
        header = header.cpu()
        size = int(header[0])
        if size < 0 or size > _MAX_STATE_BYTES:
            raise RuntimeError("cohort_torch.live: rank %d announced a state of %d bytes "
                               "(at most %d): refused" % (source, size, _MAX_STATE_BYTES))
        if dist.get_rank() != source:
            payload = torch.empty(size, dtype=torch.uint8)
        payload = payload.to(device)
        dist.broadcast(payload, src=source)
        if dist.get_rank() != source:
            data = payload.cpu().numpy().tobytes()
            if hashlib.sha256(data).digest() != header[1:].numpy().tobytes():
                raise RuntimeError("cohort_torch.live: the state from rank %d does not match "
                                   "its SHA-256 digest: refused" % source)
            try:
                state = _state_codec.decode(data)
            except ValueError as error:
                raise RuntimeError("cohort_torch.live: the state from rank %d is malformed: "
                                   "refused (%s)" % (source, str(error)[:300])) from None
        return state, newest

    def close(self):
        self._stop.set()
        self._watcher.join()


def start():
    """The membership channel `cohort run` offers this worker (COHORT_MEMBERSHIP_DIR), as a
    Live object that has declared support; None when there is none."""
    env = _C.WORKER_ENV
    directory = os.environ.get(env["membership_dir"])
    if not directory:
        return None
    return Live(directory, int(os.environ.get(env["local_rank"], "0")),
                int(os.environ.get(env["round"], "0") or 0),
                os.environ.get(env["membership_secret"], ""))
