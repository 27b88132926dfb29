"""Reads Nsight Compute CSV exports for scripts/gpu_profile.sh.

  ncu_csv.py stalls RAW_PAGE.csv      warp-stall breakdown (pc-sampling counters), largest first
  ncu_csv.py hot SOURCE_PAGE.csv      the SASS lines with the most warp-stall samples
"""
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def stalls(rows):
    if len(rows) < 3:
        sys.exit("no data rows")
    head, vals = rows[0], rows[2]
    pairs = [(h, v) for h, v in zip(head, vals) if "issue_stalled" in h and "pct" in h]
    if not pairs:
        pairs = [(h, v) for h, v in zip(head, vals) if "issue_stalled" in h]
    for h, v in sorted(pairs, key=lambda p: -num(p[1]))[:18]:
        print(f"{v:>14}  {h}")


def hot(rows):
    hi = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if hi is None:
        print("(no Source column; first rows:)")
        for r in rows[:6]:
            print(r[:12])
        return
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


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("stalls", "hot"):
        sys.exit(__doc__)
    {"stalls": stalls, "hot": hot}[sys.argv[1]](list(csv.reader(open(sys.argv[2]))))
