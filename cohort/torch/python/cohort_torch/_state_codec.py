"""Training state as bytes that carry data, never code: what live.share() sends between ranks.

A state is tensors, numbers, strings, booleans, None, and lists, tuples and dicts of them
(a model's and an optimizer's state_dict, an epoch counter). encode() writes a typed JSON
header describing the structure, then the tensors' raw bytes; decode() rebuilds it and
checks every field first (types from a fixed set, shapes, sizes inside the payload, a depth
limit). Nothing is unpickled: a hostile sender can make decode() raise ValueError, not run
code. torch 1.13's torch.load(weights_only=True) refuses floats (pickle's BINFLOAT), so an
optimizer's learning rate could not travel through it.

    bytes = encode(state)                 # tensors are copied to the CPU
    state = decode(bytes)                 # ValueError on anything malformed

flatten() and unflatten() are the same without the framing, for a caller that places the
tensors' bytes itself (cohort_torch.checkpoint: a snapshot's payload).

Layout: b"COHORTS1", the header's length (8 bytes, little-endian), the header (UTF-8 JSON),
then each tensor's bytes in header order. Thread-safety: pure functions.
"""
import collections
import json
import struct

import torch

__all__ = ["encode", "decode", "flatten", "unflatten"]

_MAGIC = b"COHORTS1"
_MAX_DEPTH = 64
_DTYPES = {str(dt).replace("torch.", ""): dt for dt in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.bool)}


def encode(state):
    """The bytes of `state`; TypeError for a value of another type (say which, and where)."""
    header, tensors = flatten(state)
    parts = [_MAGIC, struct.pack("<Q", len(header)), header]
    parts.extend(t.numpy().tobytes() for t in tensors)
    return b"".join(parts)


def flatten(state):
    """(header, tensors): the structure as JSON bytes, and each tensor's bytes as a flat
    contiguous uint8 CPU tensor, in header order (a CPU tensor's are its own memory, not a
    copy). TypeError for a value of another type."""
    tensors = []

    def node(value, where, depth):
        if depth > _MAX_DEPTH:
            raise TypeError("cohort state: nested deeper than %d at %s" % (_MAX_DEPTH, where))
        if value is None:
            return {"t": "none"}
        if isinstance(value, bool):
            return {"t": "bool", "v": value}
        if isinstance(value, int):
            return {"t": "int", "v": str(value)}  # any size, exactly
        if isinstance(value, float):
            return {"t": "float", "v": value.hex()}  # exactly, NaN and infinities included
        if isinstance(value, str):
            return {"t": "str", "v": value}
        if isinstance(value, torch.Tensor):
            name = str(value.dtype).replace("torch.", "")
            if name not in _DTYPES:
                raise TypeError("cohort state: tensor of dtype %s at %s is not supported" %
                                (value.dtype, where))
            flat = value.detach().to("cpu").contiguous().reshape(-1)
            tensors.append(flat.view(torch.uint8) if flat.numel() else
                           torch.empty(0, dtype=torch.uint8))
            return {"t": "tensor", "dtype": name, "shape": list(value.shape),
                    "bytes": tensors[-1].numel()}
        if isinstance(value, (list, tuple)):
            return {"t": "list" if isinstance(value, list) else "tuple",
                    "items": [node(v, "%s[%d]" % (where, i), depth + 1)
                              for i, v in enumerate(value)]}
        if isinstance(value, dict):
            return {"t": "odict" if isinstance(value, collections.OrderedDict) else "dict",
                    "items": [[node(k, "%s key" % where, depth + 1),
                               node(v, "%s[%r]" % (where, k), depth + 1)]
                              for k, v in value.items()]}
        raise TypeError("cohort state: %s at %s is not a tensor, number, string, or list, "
                        "tuple or dict of them" % (type(value).__name__, where))

    header = json.dumps(node(state, "state", 0), separators=(",", ":")).encode()
    return header, tensors


def decode(data):
    """The state encode() wrote; ValueError saying what is wrong for anything else."""
    data = memoryview(data)
    if len(data) < 16 or bytes(data[:8]) != _MAGIC:
        raise ValueError("cohort state: not a cohort state (no COHORTS1 header)")
    (size,) = struct.unpack("<Q", data[8:16])
    if size > len(data) - 16:
        raise ValueError("cohort state: header of %d bytes in %d" % (size, len(data)))
    offset = [16 + size]

    def next_bytes(nbytes):
        if nbytes > len(data) - offset[0]:
            return None
        offset[0] += nbytes
        return data[offset[0] - nbytes:offset[0]]

    state = unflatten(bytes(data[16:16 + size]), next_bytes)
    if offset[0] != len(data):
        raise ValueError("cohort state: %d bytes after the last tensor" %
                         (len(data) - offset[0]))
    return state


def unflatten(header, next_bytes):
    """The state of `header` (flatten's), each tensor's bytes taken, in order, from
    `next_bytes(n)`: a buffer of n bytes (copied), or a uint8 tensor of n bytes that the
    caller gives away (the tensor is a view of it: no copy), or None when there are not
    that many. ValueError saying what is wrong for anything malformed."""
    try:
        tree = json.loads(bytes(header).decode())
    except (ValueError, RecursionError) as error:
        raise ValueError("cohort state: malformed header: %s" % str(error)[:200]) from None

    def fail(what, where):
        raise ValueError("cohort state: %s at %s" % (what, where))

    def value(n, where, depth):
        if depth > _MAX_DEPTH:
            fail("nested deeper than %d" % _MAX_DEPTH, where)
        if not isinstance(n, dict) or not isinstance(n.get("t"), str):
            fail("a node without a type", where)
        kind = n["t"]
        if kind == "none":
            return None
        if kind in ("bool", "int", "float", "str"):
            v = n.get("v")
            want = {"bool": bool, "int": str, "float": str, "str": str}[kind]
            if not isinstance(v, want):
                fail("a %s without its value" % kind, where)
            try:
                return int(v) if kind == "int" else float.fromhex(v) if kind == "float" else v
            except ValueError:
                fail("a malformed %s" % kind, where)
        if kind == "tensor":
            return tensor(n, where)
        items = n.get("items")
        if not isinstance(items, list):
            fail("a %s without items" % kind, where)
        if kind in ("list", "tuple"):
            out = [value(v, "%s[%d]" % (where, i), depth + 1) for i, v in enumerate(items)]
            return out if kind == "list" else tuple(out)
        if kind in ("dict", "odict"):
            out = collections.OrderedDict() if kind == "odict" else {}
            for pair in items:
                if not isinstance(pair, list) or len(pair) != 2:
                    fail("a dict entry that is not a pair", where)
                key = value(pair[0], "%s key" % where, depth + 1)
                try:
                    out[key] = value(pair[1], "%s[%r]" % (where, key), depth + 1)
                except TypeError:
                    fail("an unhashable key", where)
            return out
        fail("an unknown type %r" % kind[:40], where)

    def tensor(n, where):
        dtype = _DTYPES.get(n.get("dtype")) if isinstance(n.get("dtype"), str) else None
        shape, nbytes = n.get("shape"), n.get("bytes")
        if dtype is None:
            fail("a tensor of an unsupported dtype", where)
        if (not isinstance(shape, list) or len(shape) > 64 or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                        for d in shape)):
            fail("a tensor with a malformed shape", where)
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            fail("a tensor with a malformed size", where)
        numel = 1
        for d in shape:
            numel *= d
        element = torch.empty(0, dtype=dtype).element_size()
        source = next_bytes(nbytes) if numel * element == nbytes else None
        if source is None:
            fail("a tensor whose %d bytes do not match its shape or the payload" % nbytes,
                 where)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if isinstance(source, torch.Tensor):
            if source.storage_offset() % element:
                fail("a tensor not aligned to its element size in the payload", where)
            return source.view(dtype).reshape(shape)
        raw = bytearray(source)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)

    return value(tree, "state", 0)
