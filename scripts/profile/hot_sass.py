"""Prints the SASS lines with the most warp-stall samples from an Nsight Compute source-page CSV."""
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


rows = list(csv.reader(open(sys.argv[1])))
hi = next((i for i, r in enumerate(rows) if "Source" in r), None)
if hi is None:
    print("(no Source column; first rows:)")
    for r in rows[:6]:
        print(r[:12])
    sys.exit()
head = rows[hi]
src = head.index("Source")
samp = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
if samp is None:
    sys.exit(f"columns: {head}")
body = [r for r in rows[hi + 1:] if len(r) > max(src, samp)]
total = sum(num(r[samp]) for r in body) or 1.0
print(f"total samples {total:.0f}")
for r in sorted(body, key=lambda r: -num(r[samp]))[:45]:
    print(f"{100 * num(r[samp]) / total:5.1f}%  {r[src][:110]}")
