#!/usr/bin/env python3
"""Prints one line to stdout and one to stderr naming its rank, then its arguments as
JSON (`argv from rank R: [...]`), and exits 0.

Usage: echo_ranks.py [args...]. Needs no torch.
"""
import json
import os
import sys

rank = os.environ.get("RANK", "unknown")
print("hello-stdout from rank %s" % rank, flush=True)
print("hello-stderr from rank %s" % rank, file=sys.stderr, flush=True)
print("argv from rank %s: %s" % (rank, json.dumps(sys.argv[1:])), flush=True)
