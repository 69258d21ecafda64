#!/usr/bin/env python3
"""Rank 1 raises inside a @record-decorated main; rank 0 exits 0.

@record writes the exception (PyTorch's JSON error-file format) into the file named by
TORCHELASTIC_ERROR_FILE, so the launcher can report "boom from rank 1" in its summary.
Extra command-line arguments are ignored (tests pass a marker string).
"""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if rank == 1:
        raise RuntimeError("boom from rank %d" % rank)
    print("rank %d ok" % rank, flush=True)


if __name__ == "__main__":
    main()
