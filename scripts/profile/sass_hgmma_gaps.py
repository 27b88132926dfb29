#!/usr/bin/env python3
"""The instructions between a kernel's wgmma batches, from a SASS listing (cuobjdump -sass).

Each line is one HGMMA run (consecutive HGMMA with only WARPGROUP/NOP/uniform bookkeeping between
them is one run) with the number of instructions in the listing since the previous run and the most
frequent opcodes among them: the softmax, conversion and store code a consumer runs between its
S and its P V, for comparing two kernels' instruction streams (e.g. hmla's and FlashMLA's prefill).
Counts are of the listing, not of what executes: branches skipped at run time are included.

  python3 scripts/profile/sass_hgmma_gaps.py FILE.sass [--min-gap N]

cuobjdump and nvdisasm for the workstation come from PyPI (`pip download --no-deps
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, unzip, nvidia/cu13/bin on PATH).
"""
import argparse
import collections
import re

from sass_load_moves import instructions  # the listing's (address, instruction) pairs

BOOKKEEPING = ("WARPGROUP", "NOP", "UIADD3", "UMOV", "ULOP3", "USHF")


def opcode(text):
    words = text.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("--min-gap", type=int, default=0, help="print only runs after at least this many instructions")
    args = ap.parse_args()
    with open(args.sass) as f:
        ins = [(int(address, 16), text) for address, text in instructions(f.read())]
    previous_end = 0
    i = 0
    while i < len(ins):
        if "HGMMA" not in ins[i][1]:
            i += 1
            continue
        j = i
        while j < len(ins) and ("HGMMA" in ins[j][1] or opcode(ins[j][1]) in BOOKKEEPING):
            j += 1
        count = sum("HGMMA" in text for _, text in ins[i:j])
        shape = re.search(r"HGMMA\.(\S+)", ins[i][1]).group(1)
        gap = ins[previous_end:i]
        if len(gap) >= args.min_gap:
            top = ", ".join(f"{k} {v}" for k, v in collections.Counter(opcode(t) for _, t in gap).most_common(10))
            print(f"{ins[i][0]:#7x}  {len(gap):5d} instructions, then {count:2d} x HGMMA.{shape}  | {top}")
        previous_end = j
        i = j


if __name__ == "__main__":
    main()
