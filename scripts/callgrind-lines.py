#!/usr/bin/env python3
"""One function's instructions by the line of its own source, inlined code included.

    valgrind --tool=callgrind --dump-instr=yes --dump-line=no --callgrind-out-file=OUT BINARY ...
    callgrind-lines.py OUT FUNCTION BINARY SOURCE [--inner]

callgrind_annotate charges the code inlined into a function (a Vec's push, an iterator, another
module's helper) to the line of the inlined source, in the standard library or elsewhere, so a
release build's hot function shows a few lines of its own and most of its cost spread over
`vec/mod.rs`, `iter/macros.rs`, ... with no way to tell which of its lines they came from. This
reads the instruction-level counts of every function whose name contains FUNCTION, asks
`addr2line -i` for each instruction's inline chain, and charges the instruction to the outermost
frame (`--inner`: the innermost) whose file name contains SOURCE: a line of that file. Calls out
are charged, with their inclusive cost, to the line that makes them (`LINE -> callee`).
Issue 35 (docs/program-speed.md, "The core's work per launch of 8 clients") found its cuts so.
"""
import collections
import re
import subprocess
import sys


def parse(path, function):
    """Self cost by address and inclusive call cost by (address, callee) of the matching functions."""
    names = {}

    def name(spec):
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")

    own, calls = collections.Counter(), collections.Counter()
    fn, callee, in_call, last = None, None, False, 0
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        if line.startswith("fn="):
            fn = name(line[3:])
        elif line.startswith("cfn="):
            callee = name(line[4:])
        elif line.startswith("calls="):
            in_call = True
        elif line[0] in "+-*0":
            tok, *cost = line.split()
            if tok == "*":
                pass
            elif tok[0] in "+-":
                last += int(tok, 0) if tok[1:].startswith("0x") else int(tok)
            else:
                last = int(tok, 16)
            c = int(cost[0]) if cost else 0
            if fn and function in fn:
                if in_call:
                    calls[(last, callee)] += c
                else:
                    own[last] += c
            in_call = False
    return own, calls


def chains(binary, addrs):
    """Each address's inline chain, innermost frame first."""
    out = subprocess.run(
        ["addr2line", "-a", "-i", "-e", binary] + [hex(a) for a in addrs], capture_output=True, text=True, check=True
    ).stdout
    result, cur = {}, None
    for line in out.splitlines():
        if line.startswith("0x"):
            cur = int(line, 16)
            result[cur] = []
        else:
            result[cur].append(line.split("/")[-1])
    return result


def main():
    args = [a for a in sys.argv[1:] if a != "--inner"]
    if len(args) != 4:
        sys.exit(__doc__)
    path, function, binary, source = args
    inner = "--inner" in sys.argv
    own, calls = parse(path, function)
    addrs = sorted(set(own) | {a for a, _ in calls})
    frames = chains(binary, addrs)

    def line_of(addr):
        hits = [f for f in frames.get(addr, []) if source in f]
        return (hits[0] if inner else hits[-1]) if hits else "?"

    by_line = collections.Counter()
    for a, c in own.items():
        by_line[line_of(a)] += c
    for (a, callee), c in calls.items():
        by_line[f"{line_of(a)} -> {callee.split('::')[-1][:50]}"] += c
    total = sum(by_line.values())
    print(f"{total:>12,} in all")

    def number(key):
        m = re.search(r":(\d+)", key)
        return int(m.group(1)) if m else 0

    for key, c in sorted(by_line.items(), key=lambda kv: (number(kv[0]), kv[0])):
        if c * 500 >= total:
            print(f"{c:>12,} {key}")


if __name__ == "__main__":
    main()
