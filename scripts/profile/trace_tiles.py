#!/usr/bin/env python3
"""Per-tile timeline of a dense decode trace (HMLA_DENSE_TRACE build, scripts/gpu_profile.sh trace).

Usage: trace_tiles.py TRACE_FILE [CTA 0|1] [FIRST_TILE] [LAST_TILE]
One line per K tile g, every event in SM clocks relative to the loop top of the tile's scorer
(consumer g % 2): its K-ready, drained (own previous P V retired), S retired, softmax done, P
published and P V issued; the other consumer's loop top, drained, P seen and P V issued; the next
scorer's loop top; when the observer warp saw tiles g + 1 and g + 2 land and when the producer
issued tile g + 2. Event meanings: src/sm90/dense_decode/trace.cuh (a clock read right after a
bar.sync may precede the barrier's completion; after a group of wgmma it includes their issue
stalls while the tensor pipe is busy)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_summary import (DRAINED, ISSUED, P_ISSUE, P_LANDED, PUBLISHED, READY, SCORED,  # noqa: E402
                           SOFTMAXED, TOP, load)


def main():
    path = sys.argv[1]
    cta = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    last = int(sys.argv[4]) if len(sys.argv) > 4 else first + 6
    clock, _ = load(path)

    def at(role, tile, ev):
        return clock(cta, role, tile, ev)

    for g in range(first, last):
        x, y = g % 2, 1 - g % 2
        t0 = at(x, g, TOP)

        def rel(role, tile, ev):
            v = (at(role, tile, ev) - t0) & 0xFFFFFFFF
            return f"{v - (1 << 32) if v >= 1 << 31 else v:6d}"

        print(f"g={g} scorer: ready{rel(x, g, READY)} drained{rel(x, g, DRAINED)} S{rel(x, g, SCORED)}"
              f" softmax{rel(x, g, SOFTMAXED)} pub{rel(x, g, PUBLISHED)} pv{rel(x, g, ISSUED)} |"
              f" other: top{rel(y, g, TOP)} drained{rel(y, g, DRAINED)} p{rel(y, g, READY)}"
              f" pv{rel(y, g, ISSUED)} | next top{rel(y, g + 1, TOP)} |"
              f" landed g+1{rel(2, g + 1, P_LANDED)} g+2{rel(2, g + 2, P_LANDED)}"
              f" issued g+2{rel(2, g + 2, P_ISSUE)}")


if __name__ == "__main__":
    main()
