#!/usr/bin/env python3
"""Prints one line to stdout and one to stderr naming its rank, then exits 0.

Usage: echo_ranks.py [marker...]. Needs no torch.
"""
import os
import sys

rank = os.environ.get("RANK", "unknown")
print("hello-stdout from rank %s" % rank, flush=True)
print("hello-stderr from rank %s" % rank, file=sys.stderr, flush=True)
