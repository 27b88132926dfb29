#!/usr/bin/env python3
"""Counts the register copies of just-loaded values in a SASS listing (cuobjdump -sass).

A copy `MOV Rd, Rs` / `IMAD.MOV.U32 Rd, RZ, RZ, Rs` whose source was written by a global load
(LDG) and not overwritten since must wait for that load: loads the code means to keep in flight
(the sparse decode producers' refills) then complete where the copy is. Prints every such copy
with the load it waits for, then the count.

  python3 scripts/profile/sass_load_moves.py FILE.sass [--quiet]

cuobjdump runs on the workstation too: the `nvidia-cuda-cuobjdump` wheel from PyPI holds it
(`pip download --no-deps nvidia-cuda-cuobjdump`, unzip, nvidia/cu13/bin/cuobjdump), and it reads
the objects nvcc 13.0 writes (`nvcc -c ... -o k.o; cuobjdump -sass k.o > k.sass`).
"""
import re
import sys

NO_DEST = ("ST", "BRA", "BAR", "SYNCS", "RET", "EXIT", "WARPGROUP", "HGMMA", "CCTL", "UTMA", "UBLKPF",
           "ISETP", "FSETP", "PLOP3")


def instructions(text):
    for line in text.split("\n"):
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            yield m.group(1), m.group(2)


def written(tokens):
    op = tokens[0]
    if op.startswith(NO_DEST) or len(tokens) < 2:
        return []
    m = re.match(r"R(\d+)", tokens[1].rstrip(","))
    if not m:
        return []
    base = int(m.group(1))
    width = 4 if ".128" in op else (2 if ".64" in op else 1)
    return [base + k for k in range(width)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    quiet = "--quiet" in sys.argv
    loaded = {}  # register -> (address, load instruction) while it still holds the loaded value
    copies = loads = 0
    for addr, ins in instructions(open(sys.argv[1]).read()):
        tokens = ins.split()
        if tokens and tokens[0].startswith("@"):
            tokens = tokens[1:]
        if not tokens:
            continue
        if tokens[0].startswith("LDG"):
            loads += 1
            for r in written(tokens):
                loaded[r] = (addr, ins)
            continue
        if tokens[0].startswith(("IMAD.MOV", "MOV")):
            for s in (int(x) for x in re.findall(r"\bR(\d+)\b", " ".join(tokens[2:]))):
                if s in loaded:
                    copies += 1
                    if not quiet:
                        print(f"{addr}  {ins}    <- {loaded[s][0]}  {loaded[s][1]}")
        for r in written(tokens):
            loaded.pop(r, None)
    print(f"{sys.argv[1]}: {loads} global loads, {copies} copies of just-loaded registers")


if __name__ == "__main__":
    main()
