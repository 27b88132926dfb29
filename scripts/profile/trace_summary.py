#!/usr/bin/env python3
"""Summarise a dense decode timeline written by a HMLA_DENSE_TRACE build (scripts/gpu_profile.sh trace).

Layout (src/sm90/dense_decode/trace.cuh): uint32 clock[2 ctas][3 roles][2048 tiles][8 events], then
uint64 span[2 ctas][4] (clock64 start, globaltimer start, clock64 end, globaltimer end).
Prints, per traced CTA, the median clocks of each step of a tile for the scoring and the other
consumer warpgroup, the tile period and the SM clock rate.
With P published in parts (Config::kPParts), s_softmax runs from S retired to the last
part written: it includes the first parts' barriers and P V issues and the exponentials done beside
them; s_pbar and s_issue are the last part's barrier and P V issue.
Caveat: a clock read right after `bar.sync` (SASS BAR.SYNC.DEFER_BLOCKING) may execute before the
barrier completes, so the other consumer's wait for P shows up in its next step (o_issue), not
in o_pwait."""
import os
import statistics
import sys

from timeline import load_clocks

CTAS, ROLES, TILES, EVENTS = 2, 3, 2048, 8
TOP, DRAINED, READY, SCORED, SOFTMAXED, PUBLISHED, ISSUED = range(7)
P_WAIT, P_ISSUE, P_LANDED = 0, 1, 2


def load(path):
    return load_clocks(path, CTAS, ROLES, TILES, EVENTS)


def d(a, b):  # b - a on a wrapping 32-bit clock
    return (b - a) & 0xFFFFFFFF


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    if not os.path.exists(path):
        print(f"== {label}: no timeline written (needs a HMLA_DENSE_TRACE build, a GPU and HMLA_TRACE_FILE)")
        return
    at, spans = load(path)
    for c in range(CTAS):
        tiles = 0
        while tiles < TILES and (at(c, 0, tiles, ISSUED) or at(c, 1, tiles, ISSUED)):
            tiles += 1
        if tiles < 12:
            continue
        clk0, ns0, clk1, ns1 = spans[4 * c: 4 * c + 4]
        ghz = (clk1 - clk0) / (ns1 - ns0) if ns1 > ns0 else float("nan")
        steady = range(4, tiles - 4)
        rows = {k: [] for k in ("period", "s_drain", "s_kwait", "s_S", "s_softmax", "s_pbar", "s_issue",
                                "o_drain", "o_pwait", "o_issue", "pv_scorer", "load", "slack")}
        for g in steady:
            s, o = g % 2, 1 - g % 2
            rows["period"].append(d(at(c, g % 2, g, SCORED), at(c, (g + 1) % 2, g + 1, SCORED)))
            # The scorer drains its P V and waits for the tile in either order; S starts after both.
            top = at(c, s, g, TOP)
            drained, ready = d(top, at(c, s, g, DRAINED)), d(top, at(c, s, g, READY))
            rows["s_drain"].append(drained)
            rows["s_kwait"].append(max(0, ready - drained))
            s_start = (top + max(drained, ready)) & 0xFFFFFFFF
            rows["s_S"].append(d(s_start, at(c, s, g, SCORED)))
            rows["s_softmax"].append(d(at(c, s, g, SCORED), at(c, s, g, SOFTMAXED)))
            rows["s_pbar"].append(d(at(c, s, g, SOFTMAXED), at(c, s, g, PUBLISHED)))
            rows["s_issue"].append(d(at(c, s, g, PUBLISHED), at(c, s, g, ISSUED)))
            rows["o_drain"].append(d(at(c, o, g, TOP), at(c, o, g, DRAINED)))
            rows["o_pwait"].append(d(at(c, o, g, DRAINED), at(c, o, g, READY)))
            rows["o_issue"].append(d(at(c, o, g, READY), at(c, o, g, ISSUED)))
            # The scorer's drain ends when its P V of tile g - 1 retires: issue of P V(g-1) -> drained.
            rows["pv_scorer"].append(d(at(c, s, g - 1, ISSUED), at(c, s, g, DRAINED)))
            # Producer issue of tile g -> the observer warp sees it landed; landed -> S starts.
            if at(c, 2, g, P_LANDED):
                rows["load"].append(d(at(c, 2, g, P_ISSUE), at(c, 2, g, P_LANDED)))
                rows["slack"].append(d(at(c, 2, g, P_LANDED), s_start))
        total = d(at(c, 0, 4, SCORED), at(c, (tiles - 5) % 2, tiles - 5, SCORED))
        print(f"== {label} cta {c}: {tiles} tiles, SM clock {ghz:.3f} GHz, "
              f"mean period {total / max(1, tiles - 9):.0f} clk")
        print("  " + "  ".join(f"{k} {med(v):.0f}" for k, v in rows.items()))
        # Where the CTA's time goes besides its tiles: kernel entry -> first S retired (Q and the
        # first K tile from HBM, all CTAs at once), the tiles, last P V issued -> CTA end (drain
        # and epilogue). The span's clock64 shares its low 32 bits with the events' %clock.
        periods = [d(at(c, g % 2, g, SCORED), at(c, (g + 1) % 2, g + 1, SCORED)) for g in range(tiles - 1)]
        first = d(clk0 & 0xFFFFFFFF, at(c, 0, 0, SCORED))
        last = d(at(c, (tiles - 1) % 2, tiles - 1, ISSUED), clk1 & 0xFFFFFFFF)
        print(f"  span {clk1 - clk0} clk ({(ns1 - ns0) / 1000:.1f} us): first S retired at {first}, "
              f"tiles {sum(periods)}, last P V issued -> end {last}, longest tile {max(periods)}")


if __name__ == "__main__":
    main()
