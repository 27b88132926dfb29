"""Summarises scripts/gpu_ab.sh's output: one line per row, each variant's best time over the rounds
(the card's clock drifts; the best is the least disturbed) and its ratio to the first variant
(above 1: faster than it).

  python3 scripts/profile/ab_summary.py AB_OUTPUT
AB_OUTPUT: the lines gpu_ab.sh prints, `VARIANT <hmla-bench row>` (a row's time in us is the first
number after its first '|').
"""
import sys


def main(path):
    order, rows = [], {}
    for line in open(path):
        name, _, rest = line.rstrip("\n").partition(" ")
        parts = rest.split("|")
        if len(parts) < 2:
            continue
        try:
            t = float(parts[1].split()[0])
        except (IndexError, ValueError):
            continue
        shape = " ".join(parts[0].split())
        if name not in order:
            order.append(name)
        rows.setdefault(shape, {}).setdefault(name, []).append(t)
    for shape, by in rows.items():
        best = {v: min(ts) for v, ts in by.items()}
        base = best.get(order[0])
        cells = [f"{v} {best[v]:9.2f}" + (f" ({base / best[v]:.3f})" if base and v != order[0] else "")
                 for v in order if v in best]
        print(f"{shape[:64]:64s} | " + "  ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
