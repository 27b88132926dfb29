"""Reads Nsight Compute CSV exports for scripts/gpu_profile.sh.

  ncu_csv.py stalls RAW_PAGE.csv      warp-stall breakdown (pc-sampling counters), largest first
  ncu_csv.py hot SOURCE_PAGE.csv      the SASS lines with the most warp-stall samples
  ncu_csv.py lines SOURCE_PAGE.csv [FIRST LAST [MIN]]
                                      every SASS line (index, samples, stall reasons) with at least
                                      MIN samples (default 1) in [FIRST, LAST], then the range's total
                                      by stall reason: the time a stretch of the kernel (a softmax,
                                      a barrier wait) takes, in samples of the warps that run it
SOURCE_PAGE.csv may be gzipped (.gz), as gpu_profile.sh leaves it in $OUT.
"""
import csv
import gzip
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


def source_table(rows):
    """The source page's header, its lines, and the column of all warp-stall samples."""
    hi = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if hi is None:
        print("(no Source column; first rows:)")
        for r in rows[:6]:
            print(r[:12])
        sys.exit(1)
    head = rows[hi]
    samp = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
    if samp is None:
        sys.exit(f"columns: {head}")
    return head, [r for r in rows[hi + 1:] if len(r) == len(head)], samp


def hot(rows):
    head, body, samp = source_table(rows)
    src = head.index("Source")
    total = sum(num(r[samp]) for r in body) or 1.0
    print(f"total samples {total:.0f}")
    for r in sorted(body, key=lambda r: -num(r[samp]))[:45]:
        print(f"{100 * num(r[samp]) / total:5.1f}%  {r[src][:110]}")


def lines(rows, first=0, last=None, min_samples=1):
    head, body, samp = source_table(rows)
    col = {h: i for i, h in enumerate(head)}
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    last = len(body) - 1 if last is None else min(last, len(body) - 1)
    total, by_reason = 0, {}
    for n in range(first, last + 1):
        r = body[n]
        s = int(num(r[samp]))
        total += s
        parts = []
        for h in reasons:
            v = int(num(r[col[h]]))
            if v:
                by_reason[h] = by_reason.get(h, 0) + v
                parts.append(f"{h[6:]}={v}")
        if s >= min_samples:
            print(f"{n:5d} {s:5d}  {r[col['Source']].strip()[:64]:64s} {' '.join(parts)}")
    print(f"lines {first}-{last}: {total} samples")
    for h, v in sorted(by_reason.items(), key=lambda x: -x[1]):
        print(f"  {h[6:]:24s} {v:6d}  {100 * v / max(total, 1):5.1f}%")


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return list(csv.reader(f))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("stalls", "hot", "lines"):
        sys.exit(__doc__)
    rows = read_rows(sys.argv[2])
    if sys.argv[1] == "lines":
        extra = [int(a) for a in sys.argv[3:6]]
        lines(rows, *extra)
    else:
        {"stalls": stalls, "hot": hot}[sys.argv[1]](rows)
