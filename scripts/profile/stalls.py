"""Prints the warp-stall breakdown of an Nsight Compute raw-page CSV (scripts/gpu_profile.sh)."""
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3:
    sys.exit("no data rows")
head, vals = rows[0], rows[2]
pairs = [(h, v) for h, v in zip(head, vals) if "issue_stalled" in h and "pct" in h]
if not pairs:
    pairs = [(h, v) for h, v in zip(head, vals) if "issue_stalled" in h]
for h, v in sorted(pairs, key=lambda p: -num(p[1]))[:18]:
    print(f"{v:>14}  {h}")
