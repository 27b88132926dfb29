#!/usr/bin/env python3
"""Reads the sparse prefill kernel's timeline (src/sm90/sparse_prefill/trace.cuh, written to
$HMLA_TRACE_FILE by a -DHMLA_PREFILL_TRACE build) and prints, per traced CTA, where a pair of K tiles
spends its clocks: every role's events as offsets from consumer A's "S of tile 2j retired" of the same
pair, each half's release -> landed interval, and the waits. Medians (p10 / p90) over the pairs of the
steady state (the CTA's first and last item left out), and the period of a whole item and of the pair
that crosses an item boundary.

  prefill_trace_summary.py trace.bin [--pairs-per-item N] [--json out.json] [--grid-only]
"""
import argparse
import json
import statistics
import struct
import sys

from timeline import load_clocks, signed_delta

CTAS, ROLES, PAIRS, EVENTS = 2, 3, 1024, 10
PAIR_EVENTS = 8  # events of every pair; 8 and 9 only at an item's first / last pair
PRODUCER, A, B = 0, 1, 2
NAMES = {
    PRODUCER: ["top", "free 0L", "free 1R", "free 0R", "free 1L", "issued", "-", "-", "-", "-"],
    A: ["S(2j) retired", "max sent", "own PV done (0L freed)", "B's max in", "P_B in, PV issued",
        "P_B V1 done (1L freed)", "next 0L landed", "next 0R landed", "Q landed", "epilogue done"],
    B: ["top", "1R landed", "1L landed", "S(2j+1) retired", "A's max in", "own PV done (1R freed)",
        "P_A in, PV issued", "P_A V0 done (0R freed)", "Q landed", "epilogue done"],
}


MAX_GRID = 1024


def grid_spans(path):
    """Every CTA's (start ns, end ns, SM), from the buffer's last field (absent in older traces)."""
    raw = open(path, "rb").read()
    at = 4 * CTAS * ROLES * PAIRS * EVENTS + 8 * CTAS * 4
    if len(raw) < at + 8 * MAX_GRID * 3:
        return []
    v = struct.unpack_from(f"<{MAX_GRID * 3}Q", raw, at)
    return [(v[3 * i], v[3 * i + 1], v[3 * i + 2]) for i in range(MAX_GRID) if v[3 * i + 1] > v[3 * i] > 0]


def print_grid_spread(spans):
    """How evenly the persistent grid's CTAs finish: the kernel ends with the last one."""
    if not spans:
        return
    t0 = min(s for s, _, _ in spans)
    ends = sorted((e - t0) / 1e3 for _, e, _ in spans)
    runs = sorted((e - s) / 1e3 for s, e, _ in spans)
    q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]
    print(f"grid: {len(spans)} CTAs; end (us after the first start) min {ends[0]:.1f} p10 {q(ends, 0.1):.1f} "
          f"median {q(ends, 0.5):.1f} p90 {q(ends, 0.9):.1f} max {ends[-1]:.1f}; run time min {runs[0]:.1f} "
          f"median {q(runs, 0.5):.1f} max {runs[-1]:.1f}")
    slowest = sorted(spans, key=lambda x: x[1])[-5:]
    print("  last five to end (SM, run us): " +
          ", ".join(f"SM {sm} {(e - s) / 1e3:.1f}" for s, e, sm in slowest))


def load(path):
    return load_clocks(path, CTAS, ROLES, PAIRS, EVENTS)


def rel(a, b):
    """a - b on the 32-bit SM clock, as a signed difference."""
    return signed_delta(b, a)


def stats(values):
    v = sorted(values)
    if not v:
        return None
    q = lambda f: v[min(len(v) - 1, int(f * len(v)))]
    return {"median": statistics.median(v), "p10": q(0.1), "p90": q(0.9)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--pairs-per-item", type=int, default=16, help="pairs of one item (topk / 128)")
    ap.add_argument("--json")
    ap.add_argument("--grid-only", action="store_true",
                    help="only every CTA's start and end (a -DHMLA_PREFILL_TRACE_GRID build)")
    args = ap.parse_args()
    at, spans = load(args.trace)
    print_grid_spread(grid_spans(args.trace))
    if args.grid_only:
        return
    report = {}
    for c in range(CTAS):
        # Pairs recorded: consumer A's first event is set (the buffer starts at zero).
        count = 0
        while count < PAIRS and at(c, A, count, 0) != 0:
            count += 1
        lo, hi = args.pairs_per_item, count - args.pairs_per_item - 1
        if hi <= lo:
            print(f"CTA {c}: {count} pairs recorded, too few for a steady state")
            continue
        ns = spans[4 * c + 3] - spans[4 * c + 1]
        ghz = (spans[4 * c + 2] - spans[4 * c]) / ns if ns else 0.0
        rows = {}

        def add(name, fn):
            vals = []
            for n in range(lo, hi):
                # Pairs that start an item have no "next" events on A's side of the previous pair.
                if (n + 1) % args.pairs_per_item == 0:
                    continue
                vals.append(fn(n))
            rows[name] = stats(vals)

        add("pair period (A's S retired to the next)", lambda n: rel(at(c, A, n + 1, 0), at(c, A, n, 0)))
        for role, label in ((A, "A"), (B, "B")):
            for e in range(PAIR_EVENTS):
                add(f"{label}: {NAMES[role][e]}", lambda n, role=role, e=e: rel(at(c, role, n, e), at(c, A, n, 0)))
        for e in range(6):
            add(f"producer (next pair's refill): {NAMES[PRODUCER][e]}",
                lambda n, e=e: rel(at(c, PRODUCER, n + 1, e), at(c, A, n, 0)))
        # Each half: released by its last reader -> the producer sees it free -> the reader of the
        # next pair sees it landed.
        add("0L: freed -> landed (A's next S)", lambda n: rel(at(c, A, n, 6), at(c, A, n, 2)))
        add("0R: freed -> landed (A's next S)", lambda n: rel(at(c, A, n, 7), at(c, B, n, 7)))
        add("1R: freed -> landed (B's next S)", lambda n: rel(at(c, B, n + 1, 1), at(c, B, n, 5)))
        add("1L: freed -> landed (B's next S)", lambda n: rel(at(c, B, n + 1, 2), at(c, A, n, 5)))
        add("0R: freed -> producer sees it", lambda n: rel(at(c, PRODUCER, n + 1, 3), at(c, B, n, 7)))
        add("A waits for 0R after 0L", lambda n: rel(at(c, A, n, 7), at(c, A, n, 6)))
        add("B waits for 1R at its top", lambda n: rel(at(c, B, n + 1, 1), at(c, B, n + 1, 0)))
        add("B waits for 1L after 1R", lambda n: rel(at(c, B, n + 1, 2), at(c, B, n + 1, 1)))
        # Whole items of the steady state: what an item costs beyond its pairs (Q's load behind the
        # last pair's S, the epilogue, the first pair's start) is the item period less the pairs'.
        per = args.pairs_per_item
        starts = [k * per for k in range(1, count // per - 1) if (k + 1) * per < count]
        rows["item period (A's first S retired to the next item's)"] = stats(
            [rel(at(c, A, s0 + per, 0), at(c, A, s0, 0)) for s0 in starts])
        rows["item boundary (A's last S retired to the next item's first)"] = stats(
            [rel(at(c, A, s0 + per, 0), at(c, A, s0 + per - 1, 0)) for s0 in starts])
        # The pair that crosses a boundary, from A's last S of the item: each consumer's last product,
        # its epilogue, the next item's Q and S (A's: the "item boundary" row above).
        for name, role, pair_off, e in (("A: last product retired", A, -1, 5), ("B: last product retired", B, -1, 7),
                                        ("A: epilogue done", A, -1, 9), ("B: epilogue done", B, -1, 9),
                                        ("A: next item's Q landed", A, 0, 8), ("B: next item's Q landed", B, 0, 8),
                                        ("producer: next item's first pair issued", PRODUCER, 0, 5),
                                        ("B: next item's S retired", B, 0, 3)):
            rows[f"boundary, {name}"] = stats(
                [rel(at(c, role, s0 + per + pair_off, e), at(c, A, s0 + per - 1, 0)) for s0 in starts])
        report[f"cta{c}"] = {"pairs": count, "sm_ghz": ghz, "rows": rows}
        print(f"CTA {c}: {count} pairs, steady state {lo}..{hi}, SM clock {ghz:.3f} GHz (clk, median [p10, p90])")
        for name, s in rows.items():
            if s:
                print(f"  {name:<52} {s['median']:>8.0f}  [{s['p10']:>6}, {s['p90']:>6}]")
    if args.json:
        json.dump(report, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
