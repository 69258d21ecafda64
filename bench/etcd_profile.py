#!/usr/bin/env python3
"""Summarises Go CPU profiles of etcd members (what `etcd --enable-pprof` serves at
/debug/pprof/profile; bench/rdzv_scale.py --etcd-profile DIR saves one per member during a
round): the CPU seconds in all, the functions where the CPU was spent (flat) and the calls
that spent it (cumulative), summed over the files given.

    python3 bench/etcd_profile.py DIR/*.pb.gz [--top 40]

A profile is a gzipped protobuf message (github.com/google/pprof, proto/profile.proto);
only the fields read here are decoded: samples (location ids, values), locations (function
ids), functions (name), and the string table. Go symbolises its own profiles, so a
stripped etcd binary still names its functions."""
import argparse
import collections
import gzip


def _varint(buf, i):
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _fields(buf):
    """(field number, wire type, value) of each field of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("unsupported protobuf wire type %d" % wire)
        yield number, wire, value


def _ints(wire, value):
    """A repeated integer field's values (packed or not)."""
    if wire == 0:
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


def read_profile(path):
    """[(stack of function names, leaf first; CPU nanoseconds)] of one profile."""
    strings, samples, locations, functions = [], [], {}, {}
    for number, wire, value in _fields(gzip.decompress(open(path, "rb").read())):
        if number == 2:  # Sample: location_id = 1, value = 2
            ids, values = [], []
            for n, w, v in _fields(value):
                if n == 1:
                    ids += _ints(w, v)
                elif n == 2:
                    values += _ints(w, v)
            samples.append((ids, values[-1] if values else 0))
        elif number == 4:  # Location: id = 1, line = 4 (Line: function_id = 1)
            loc_id, funcs = 0, []
            for n, w, v in _fields(value):
                if n == 1:
                    loc_id = v
                elif n == 4:
                    funcs += [fv for fn, _, fv in _fields(v) if fn == 1]
            locations[loc_id] = funcs
        elif number == 5:  # Function: id = 1, name = 2 (string table index)
            fields = {n: v for n, _, v in _fields(value)}
            functions[fields.get(1, 0)] = fields.get(2, 0)
        elif number == 6:
            strings.append(value.decode(errors="replace"))
    out = []
    for ids, nanos in samples:
        stack = [strings[functions[f]] for loc in ids for f in locations.get(loc, [])]
        out.append((stack, nanos))
    return out


def summarise(paths, top=40):
    """{"cpu_s", "flat": [(function, %)], "cumulative": [(function, %)]} over the files."""
    flat, cumulative, total = collections.Counter(), collections.Counter(), 0
    for path in paths:
        for stack, nanos in read_profile(path):
            total += nanos
            if stack:
                flat[stack[0]] += nanos
            for name in set(stack):
                cumulative[name] += nanos

    def shares(counter, n):
        return [(name, 100.0 * nanos / total) for name, nanos in counter.most_common(n)]
    return {"cpu_s": total / 1e9,
            "flat": shares(flat, top // 2) if total else [],
            "cumulative": shares(cumulative, top) if total else []}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    s = summarise(args.profiles, args.top)
    print("%.2f CPU s in %d profile(s)" % (s["cpu_s"], len(args.profiles)))
    print("\nflat (where the CPU was spent):")
    for name, pct in s["flat"]:
        print("  %5.1f%%  %s" % (pct, name))
    print("\ncumulative (calls that spent it):")
    for name, pct in s["cumulative"]:
        print("  %5.1f%%  %s" % (pct, name))


if __name__ == "__main__":
    main()
