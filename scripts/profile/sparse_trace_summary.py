#!/usr/bin/env python3
"""Reads the wide sparse decode kernel's timeline (src/sm90/sparse_decode/trace.cuh, written to
$HMLA_TRACE_FILE by a -DHMLA_SPARSE_TRACE build) and prints, per traced CTA, the period of a tile
inside a request, and the time between two requests: every role's events from the scorer's last S of
a request retired to the next request's first S retired. Medians (p10 / p90) over the CTA's tiles and
request boundaries.

  sparse_trace_summary.py trace.bin [--json out.json]
"""
import argparse
import json
import statistics

from timeline import load_clocks, signed_delta

CTAS, ROLES, TILES, EVENTS = 2, 3, 2048, 8
PRODUCER, SCORER, HELPER = 0, 1, 2
# Event numbers, as in trace.cuh.
P_WAIT, P_FREE, P_FILLED, P_Q, P_CONV = 0, 1, 2, 3, 4
S_Q, S_CONV, S_FULL, S_SCORED, S_PUB, S_RETIRED, S_EPI = 0, 1, 2, 3, 4, 5, 6
H_Q, H_CONV, H_P, H_RETIRED, H_EPI = 0, 1, 2, 3, 4


def load(path):
    at, spans = load_clocks(path, CTAS, ROLES, TILES, EVENTS)
    return at, [spans[4 * c:4 * c + 4] for c in range(CTAS)]


def stats(values):
    """Median, p10, p90 of the intervals that were recorded (None: an event missing)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    v = sorted(values)
    q = lambda f: v[min(len(v) - 1, int(f * len(v)))]
    return {"median": statistics.median(v), "p10": q(0.1), "p90": q(0.9), "count": len(v)}


def delta(a, b):
    """b - a for 32-bit SM clocks (wrapping); None when either was not recorded."""
    return None if a == 0 or b == 0 else signed_delta(a, b)


def summarise(at, span, c):
    tiles = [t for t in range(TILES) if at(c, SCORER, t, S_SCORED) != 0]
    if not tiles:
        return None
    n = tiles[-1] + 1
    # A request's first tile: the scorer records Q converted there whoever converted it (its Q wait
    # is skipped where the producers convert).
    first = [t for t in range(n) if at(c, SCORER, t, S_CONV) != 0]
    last = [t for t in range(n) if at(c, SCORER, t, S_RETIRED) != 0]
    starts = set(first)
    out = {"tiles": n, "requests": len(first)}
    if span[c][1] > span[c][0] and span[c][3] > span[c][2]:
        out["clock_ghz"] = (span[c][2] - span[c][0]) / (span[c][3] - span[c][1])
        out["cta_us"] = (span[c][3] - span[c][1]) / 1e3
    out["tile_period_in_request"] = stats(
        delta(at(c, SCORER, t - 1, S_SCORED), at(c, SCORER, t, S_SCORED)) for t in range(1, n) if t not in starts)
    out["producer_fill_period"] = stats(
        delta(at(c, PRODUCER, t - 1, P_FILLED), at(c, PRODUCER, t, P_FILLED)) for t in range(1, n))
    out["producer_wait_for_free_stage"] = stats(
        delta(at(c, PRODUCER, t, P_WAIT), at(c, PRODUCER, t, P_FREE)) for t in range(n))
    out["scorer_full_to_scored"] = stats(delta(at(c, SCORER, t, S_FULL), at(c, SCORER, t, S_SCORED)) for t in range(n))
    # The boundary between request r (last tile t - 1) and r + 1 (first tile t), from r's last S.
    rows = [
        ("scorer: P published (last tile)", SCORER, -1, S_PUB),
        ("scorer: last P V retired", SCORER, -1, S_RETIRED),
        ("helper: last P V retired", HELPER, -1, H_RETIRED),
        ("scorer: epilogue done", SCORER, -1, S_EPI),
        ("helper: epilogue done", HELPER, -1, H_EPI),
        ("producer: next request's tile 0 filled", PRODUCER, 0, P_FILLED),
        ("producer: its tile 1 filled", PRODUCER, 1, P_FILLED),
        ("producer: tile 2's stage free", PRODUCER, 2, P_FREE),
        ("producer: next Q landed (where it converts Q)", PRODUCER, 0, P_Q),
        ("producer: next Q converted", PRODUCER, 0, P_CONV),
        ("scorer: next Q landed (wait returned)", SCORER, 0, S_Q),
        ("helper: next Q landed", HELPER, 0, H_Q),
        ("scorer: Q converted", SCORER, 0, S_CONV),
        ("scorer: tile 0's stage full (wait returned)", SCORER, 0, S_FULL),
        ("scorer: next request's first S retired", SCORER, 0, S_SCORED),
        ("scorer: its P published", SCORER, 0, S_PUB),
        ("scorer: its second S retired", SCORER, 1, S_SCORED),
    ]
    boundary = {}
    for name, role, off, ev in rows:
        boundary[name] = stats(delta(at(c, SCORER, t - 1, S_SCORED), at(c, role, t + off, ev))
                               for t in first if t > 0 and t - 1 in last and t + off < n)
    out["boundary"] = boundary
    out["request_period"] = stats(
        delta(at(c, SCORER, a, S_SCORED), at(c, SCORER, b, S_SCORED)) for a, b in zip(first, first[1:]))
    return out


def fmt(s):
    return "-" if s is None else f"{s['median']:8.0f}  [{s['p10']:7.0f}, {s['p90']:7.0f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--json")
    a = ap.parse_args()
    at, span = load(a.trace)
    result = {}
    for c in range(CTAS):
        s = summarise(at, span, c)
        if s is None:
            continue
        result[f"cta{c}"] = s
        ghz = s.get("clock_ghz")
        print(f"CTA {c}: {s['tiles']} tiles, {s['requests']} requests"
              + (f", {s['cta_us']:.1f} us at {ghz:.3f} GHz" if ghz else "") + " (clk, median [p10, p90])")
        for key in ("tile_period_in_request", "request_period", "producer_fill_period",
                    "producer_wait_for_free_stage", "scorer_full_to_scored"):
            print(f"  {key.replace('_', ' '):<58} {fmt(s[key])}")
        print("  request boundary, from the last S of a request retired:")
        for name, st in s["boundary"].items():
            print(f"    {name:<56} {fmt(st)}")
    if a.json:
        json.dump(result, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
