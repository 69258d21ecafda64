"""A small data-parallel job that checkpoints with cohort_torch.checkpoint every step: an
MLP with SGD momentum on a fixed synthetic data set, deterministic for a world size. Every
rank prints `rank R param_digest D` at the end (CRC-32 of all parameters' bytes).

    checkpoint_train.py MARKER CKPT_DIR STEPS [KILL_STEP [API]]

KILL_STEP: in the first attempt (TORCHELASTIC_RESTART_COUNT=0), rank 1 SIGKILLs itself
right after the snapshot of that step (the write to disk may not have happened). CKPT_DIR
"-": no checkpoint directory (the node's memory only). API: "checkpoint" (default:
cohort_torch.checkpoint.save/load) or "elastic" (cohort_torch.elastic.State with a save at
every commit, its `step` the commits done, so the snapshot after step s is labelled s + 1)."""
import os
import signal
import sys
import zlib

import torch
import torch.distributed as dist

import cohort_torch  # noqa: F401 - the "cohort" backend
import cohort_torch.checkpoint as ckpt

marker, directory, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
kill_step = int(sys.argv[4]) if len(sys.argv) > 4 else -1
api = sys.argv[5] if len(sys.argv) > 5 else "checkpoint"
directory = None if directory == "-" else directory
dist.init_process_group("cohort")
rank, world = dist.get_rank(), dist.get_world_size()
first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = torch.randn(512, 32, generator=torch.Generator().manual_seed(1))
labels = torch.randint(0, 4, (512,), generator=torch.Generator().manual_seed(2))

start = 0
if api == "elastic":
    import cohort_torch.elastic as elastic
    state = elastic.State(model=model, optimizer=opt, checkpoint=directory, checkpoint_every=1)
    start = state.step
    if start:
        os.write(1, ("rank %d restored step %d\n" % (rank, start - 1)).encode())
else:
    restored = ckpt.load(directory)
    if restored is not None:
        state, start = restored
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start += 1
        os.write(1, ("rank %d restored step %d\n" % (rank, start - 1)).encode())

for step in range(start, steps):
    i = (step * world + rank) % 16
    x, y = data[i * 32:(i + 1) * 32], labels[i * 32:(i + 1) * 32]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    if api == "elastic":
        state.commit()  # saves: a snapshot labelled step + 1
    else:
        ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step, directory)
    if step == kill_step and first_attempt:
        dist.barrier()  # rank 0 (local rank 0: the node's copy) has taken this snapshot
    if step == kill_step and rank == 1 and first_attempt:
        os.write(1, b"rank 1: SIGKILL after the snapshot of step %d\n" % step)
        os.kill(os.getpid(), signal.SIGKILL)
if api != "elastic":
    ckpt.flush()  # (elastic: flushed when the process exits)
crc = 0
for p in model.parameters():
    crc = zlib.crc32(p.detach().numpy().tobytes(), crc)
os.write(1, ("rank %d param_digest %08x %s\n" % (rank, crc, marker)).encode())
dist.destroy_process_group()
