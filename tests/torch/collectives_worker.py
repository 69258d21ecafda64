#!/usr/bin/env python3
"""Checks every collective of the "cohort" torch.distributed backend on this rank.

Started by a launcher (cohort run, torchrun) with the env:// variables. Each check computes
the expected result by hand from inputs that depend only on (rank, case), and, where torch
1.13's gloo backend supports the operation, also runs it through gloo and compares. Prints
`rank R checks N failures F` at the end, `FAIL ...` per failure, and exits 1 on any failure.
"""
import datetime
import hashlib
import os
import sys

import torch
import torch.distributed as dist

import cohort_torch

FAILURES = []
CHECKS = [0]


def say(line):
    """Prints one line in one write(2): the ranks under torchrun share one pipe, and a
    print's text and newline could be written apart ("...over shmrank 1 of 2: ..." once)."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
GLOO_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8,
               torch.int32, torch.int64}


def check(name, got, want, tol=0.0):
    CHECKS[0] += 1
    got = got.to(torch.float64)
    want = want.to(torch.float64)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        FAILURES.append(name + " (got)")
        say(f"FAIL {name}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}")


def tolerance(dtype):
    return {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}.get(dtype, 1e-9)


def value(rank, n, dtype, salt=0):
    """Inputs small enough that products and sums stay exact in every dtype."""
    base = torch.arange(n, dtype=torch.int64) + salt
    vals = (base * 7 + rank * 3) % 5 + 1  # 1..5
    if dtype == torch.uint8 or dtype == torch.int8:
        vals = (base + rank) % 2 + 1  # 1..2: a product over 4 ranks stays below 127
    return vals.to(dtype)


def reduce_by_hand(tensors, op):
    acc = torch.stack([t.to(torch.float64) for t in tensors])
    if op == "sum":
        return acc.sum(0)
    if op == "product":
        return acc.prod(0)
    if op == "min":
        return acc.min(0).values
    if op == "max":
        return acc.max(0).values
    return acc.mean(0)


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("cohort", timeout=datetime.timedelta(seconds=120))
    assert dist.get_backend() == "cohort", dist.get_backend()
    assert dist.get_world_size() == world and dist.get_rank() == rank
    gloo = dist.new_group(backend="gloo")
    say(f"rank {rank} of {world}: backend cohort over {cohort_torch.topology()}")
    n = 37  # odd: blocks do not align with anything

    # all_reduce: every dtype x op, against the hand result and gloo.
    for dtype in DTYPES:
        for op_name, op in OPS.items():
            if op_name == "avg" and not dtype.is_floating_point:
                continue
            t = value(rank, n, dtype)
            want = reduce_by_hand([value(r, n, dtype) for r in range(world)], op_name)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {dtype} {op_name}", t, want.to(dtype), tolerance(dtype))
            if dtype in GLOO_DTYPES and op_name != "avg":
                g = value(rank, n, dtype)
                dist.all_reduce(g, op=op, group=gloo)
                check(f"all_reduce {dtype} {op_name} vs gloo", t, g, tolerance(dtype))

    # Integer avg is refused with a clear error.
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG)
        FAILURES.append("int avg accepted")
    except RuntimeError as e:
        CHECKS[0] += 1
        if "avg" not in str(e):
            FAILURES.append(f"int avg message: {e}")

    # Non-contiguous input (a transposed view), reduced in place.
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
    view = base.t()
    dist.all_reduce(view)
    want = sum(torch.arange(12, dtype=torch.float32).reshape(3, 4) + r for r in range(world)).t()
    check("all_reduce non-contiguous", view, want)

    # Coalesced.
    ts = [value(rank, 5, torch.float32, 1), value(rank, 9, torch.float32, 2)]
    dist.all_reduce_coalesced(ts)
    check("all_reduce_coalesced[0]", ts[0], reduce_by_hand(
        [value(r, 5, torch.float32, 1) for r in range(world)], "sum"))
    check("all_reduce_coalesced[1]", ts[1], reduce_by_hand(
        [value(r, 9, torch.float32, 2) for r in range(world)], "sum"))

    for dtype in DTYPES:
        # broadcast from every root
        for root in range(world):
            t = value(rank, n, dtype, root)
            dist.broadcast(t, src=root)
            check(f"broadcast {dtype} root {root}", t, value(root, n, dtype, root))
        # all_gather (list) and _all_gather_base
        outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, value(rank, n, dtype))
        for r in range(world):
            check(f"all_gather {dtype} [{r}]", outs[r], value(r, n, dtype))
        flat = torch.zeros(world * n, dtype=dtype)
        dist._all_gather_base(flat, value(rank, n, dtype))
        check(f"_all_gather_base {dtype}", flat, torch.cat([value(r, n, dtype) for r in range(world)]))
        # reduce_scatter (list) and _reduce_scatter_base, sum and max
        for op_name in ("sum", "max"):
            ins = [value(rank, n, dtype, 10 * j) for j in range(world)]
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter(out, ins, op=OPS[op_name])
            want = reduce_by_hand([value(r, n, dtype, 10 * rank) for r in range(world)], op_name)
            check(f"reduce_scatter {dtype} {op_name}", out, want.to(dtype), tolerance(dtype))
            out2 = torch.zeros(n, dtype=dtype)
            dist._reduce_scatter_base(out2, torch.cat(ins), op=OPS[op_name])
            check(f"_reduce_scatter_base {dtype} {op_name}", out2, want.to(dtype),
                  tolerance(dtype))
        # reduce to every root
        for root in range(world):
            t = value(rank, n, dtype)
            dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
            if rank == root:
                want = reduce_by_hand([value(r, n, dtype) for r in range(world)], "sum")
                check(f"reduce {dtype} root {root}", t, want.to(dtype), tolerance(dtype))
        # gather / scatter
        root = world - 1
        gathered = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
        dist.gather(value(rank, n, dtype), gather_list=gathered, dst=root)
        if rank == root:
            for r in range(world):
                check(f"gather {dtype} [{r}]", gathered[r], value(r, n, dtype))
        out = torch.zeros(n, dtype=dtype)
        pieces = [value(j, n, dtype, 3) for j in range(world)] if rank == root else None
        dist.scatter(out, scatter_list=pieces, src=root)
        check(f"scatter {dtype}", out, value(rank, n, dtype, 3))
        # all_to_all_single, equal blocks
        inp = torch.cat([value(rank, n, dtype, j) for j in range(world)])
        out = torch.zeros(world * n, dtype=dtype)
        dist.all_to_all_single(out, inp)
        check(f"all_to_all_single {dtype}", out,
              torch.cat([value(j, n, dtype, rank) for j in range(world)]))

    # all_to_all_single with split sizes: rank r sends (j + r + 1) rows of 3 to rank j.
    rows_to = [j + rank + 1 for j in range(world)]
    rows_from = [rank + j + 1 for j in range(world)]
    inp = torch.cat([torch.full((rows_to[j], 3), float(100 * rank + j)) for j in range(world)])
    out = torch.zeros(sum(rows_from), 3)
    dist.all_to_all_single(out, inp, output_split_sizes=rows_from, input_split_sizes=rows_to)
    want = torch.cat([torch.full((rows_from[j], 3), float(100 * j + rank)) for j in range(world)])
    check("all_to_all_single uneven", out, want)
    # all_to_all (lists of different sizes)
    ins = [torch.full((j + 1,), float(10 * rank + j)) for j in range(world)]
    outs = [torch.zeros(rank + 1) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for j in range(world):
        check(f"all_to_all [{j}]", outs[j], torch.full((rank + 1,), float(10 * j + rank)))

    # send/recv with tags around the ring: tag 7 carries the data, tag 9 a second message.
    right, left = (rank + 1) % world, (rank - 1) % world
    for size in (5, 300000):  # the second exceeds one shared-memory slot
        if rank % 2 == 0:
            dist.send(torch.full((size,), float(rank)), dst=right, tag=7)
            got = torch.zeros(size)
            dist.recv(got, src=left, tag=7)
        else:
            got = torch.zeros(size)
            dist.recv(got, src=left, tag=7)
            dist.send(torch.full((size,), float(rank)), dst=right, tag=7)
        check(f"send/recv {size}", got, torch.full((size,), float(left)))

    # Asynchronous work and futures, issued back to back, completed in order.
    works, tensors = [], []
    for i in range(8):
        t = torch.full((1000,), float(rank + i))
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    futs = [w.get_future() for w in works]
    for i, f in enumerate(futs):
        res = f.wait()
        check(f"future {i}", res[0], torch.full((1000,), float(sum(range(world)) + world * i)))
    for w in works:
        if not w.is_completed():
            FAILURES.append("work not completed after its future")

    # new_group: the even ranks, their own communicator.
    evens = list(range(0, world, 2))
    sub = dist.new_group(ranks=evens, backend="cohort")
    if rank in evens:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=sub)
        check("new_group evens", t, torch.tensor([float(sum(evens))]))

    # Tensors libcohort cannot take are refused at once, in the caller, with a clear error:
    # sparse ones and unsupported types. (A CUDA tensor takes the same path, "runs on CPU
    # tensors"; Debian's torch has no CUDA to show it.)
    for bad, words in ((torch.ones(4).to_sparse(), "dense"),
                       (torch.ones(4, dtype=torch.bool), "not supported")):
        try:
            dist.all_reduce(bad)
            FAILURES.append(f"{words}: accepted")
        except RuntimeError as e:
            CHECKS[0] += 1
            if "cohort backend" not in str(e) or words not in str(e):
                FAILURES.append(f"refusal message: {e}")

    for f in FAILURES:
        if "got" not in f:  # value mismatches were printed by check()
            say(f"FAIL {f}")
    dist.barrier()
    digest = hashlib.sha256(str(CHECKS[0]).encode() + str(len(FAILURES)).encode()).hexdigest()[:12]
    say(f"rank {rank} checks {CHECKS[0]} failures {len(FAILURES)} digest {digest}")
    dist.destroy_process_group()
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
