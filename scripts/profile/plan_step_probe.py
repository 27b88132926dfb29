#!/usr/bin/env python3
"""Reads the ring of a -DHMLA_STEP_PROBE build (bench/variants/plan_step_probe.patch): lines
"kind cta start end" on the global timer (ns); kind 1 the plan, 2 an attention warpgroup (its CTA's
start, its own end), 3 a combine CTA, 4 an attention CTA past griddepcontrol.wait (end = that time),
16 + 8 tile + event the scorer's first tiles (trace.cuh events, start = end); cta = linear block index | SM << 20.

Prints, over the last `--window-ms` of the file (hmla-bench's step loop comes last), for the
attention launches that follow a plan and for the others, the medians of: the gap from the end of
the previous attention launch to the plan's start, the plan kernel, the gap from the plan's end to
the attention's first CTA, the working CTAs' time in griddepcontrol.wait and after it, their whole
duration, the launch's span (first start to last end), and how many CTAs ran on the SM their block
index had in the launch before (us); and, where the build recorded the scorer's first tiles, the
working CTAs' time from their wait's end to each of those tiles' S retiring and from the fourth to
their end (a slow start against a slow steady state), and the first tile's path (its Q landed and
converted, its stage full, its S retired) with the producers' side of it (the part's metadata read,
the first index loaded, the first row's bytes in registers, the stage filled). Then, over the whole file, how many consecutive attention
launches overlapped and how many of the later one's CTAs passed their wait before the earlier one
ended (the early completion of the combine's grid, docs/PERF.md)."""
import argparse
import statistics

PLAN, ATTENTION, COMBINE, WAITED = 1, 2, 3, 4
TILE_EVENTS = 16          # kind 16 + 8 tile + event: the scorer's tile `tile` reached trace.cuh's `event`
SCORER_SCORED = 3         # trace.cuh ScorerEvent kScorerScored
# The first tile's path, trace.cuh ScorerEvent: Q landed, Q converted, the stage full, S retired.
FIRST_TILE_EVENTS = ((0, "Q landed"), (1, "Q converted"), (2, "stage full"), (3, "S retired"))
PRODUCER_EVENTS = 64      # kind 64 + event: the producers' first tile (trace.cuh ProducerEvent)
# Its path: the part's metadata read, the first index loaded, the stage free, the first row's bytes
# in registers, the stage announced full.
PRODUCER_FIRST_TILE = ((5, "metadata"), (6, "index"), (1, "stage free"), (7, "row landed"), (2, "stage filled"))
PROBED_TILES = 4
NEW_LAUNCH_NS = 3000  # CTAs of one launch start within ~0.2 us of each other; launches >= 15 us apart


def read(path):
    with open(path) as f:
        return sorted((tuple(int(x) for x in line.split()) for line in f if line.strip()), key=lambda r: r[2])


def attention_launches(records):
    """Groups the attention records (and the waits, by CTA) into launches in time order."""
    launches, plan_pending = [], None
    for kind, cta, start, end in records:
        if kind == PLAN:
            plan_pending = (start, end)
        elif kind == ATTENTION:
            if not launches or start - launches[-1]["first"] >= NEW_LAUNCH_NS:
                launches.append({"first": start, "ctas": {}, "waited": {}, "tiles": {}, "plan": plan_pending})
                plan_pending = None
            block, sm = cta & 0xFFFFF, cta >> 20
            c = launches[-1]["ctas"].setdefault(block, [start, end, sm])
            c[1] = max(c[1], end)
        elif kind == WAITED:
            # The latest launch whose CTA of this block started before it and has not waited yet
            # (launches overlap: a later launch may already have begun).
            block = cta & 0xFFFFF
            for launch in reversed(launches):
                c = launch["ctas"].get(block)
                if c is not None and c[0] <= end and block not in launch["waited"]:
                    launch["waited"][block] = end
                    break
        elif kind >= TILE_EVENTS:
            # Producer events are kept as tile -1.
            tile, event = (-1, kind - PRODUCER_EVENTS) if kind >= PRODUCER_EVENTS else divmod(kind - TILE_EVENTS, 8)
            block = cta & 0xFFFFF
            for launch in reversed(launches):
                c = launch["ctas"].get(block)
                if c is not None and c[0] <= end:
                    launch["tiles"].setdefault(block, {}).setdefault((tile, event), end)
                    break
    return launches


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) / 1e3 if values else float("nan")


def from_wait(cur, working, key):
    """The working CTAs' median time from their wait's end to the recorded event `key` (tile, event)."""
    times = [cur["tiles"][b][key] - cur["waited"][b] for b in working
             if b in cur["waited"] and key in cur["tiles"].get(b, {})]
    return statistics.median(times) if times else None


def print_medians(title, rows):
    """One line per class: the medians over its launches of each column (us)."""
    if not any(x[0] is not None for items in rows.values() for x in items):
        return
    print(title)
    for name, items in rows.items():
        if items:
            print(f"{name:10s} {'':22s}" + " ".join(f"{med([x[j] for x in items]):6.2f}" for j in range(len(items[0]))))


def summarise(launches, window_ns):
    last = max(max(c[1] for c in l["ctas"].values()) for l in launches)
    rows = {"after plan": [], "alone": []}
    tile_rows = {"after plan": [], "alone": []}
    first_rows = {"after plan": [], "alone": []}
    producer_rows = {"after plan": [], "alone": []}
    for prev, cur in zip(launches, launches[1:]):
        if cur["first"] < last - window_ns:
            continue
        prev_end = max(c[1] for c in prev["ctas"].values())
        working = {b: c for b, c in cur["ctas"].items() if c[1] - c[0] > 5000}
        waits = [cur["waited"][b] - c[0] for b, c in working.items() if b in cur["waited"]]
        after = [c[1] - cur["waited"][b] for b, c in working.items() if b in cur["waited"]]
        same_sm = sum(1 for b, c in cur["ctas"].items() if b in prev["ctas"] and prev["ctas"][b][2] == c[2])
        plan = cur["plan"]
        cls = "after plan" if plan else "alone"
        first_rows[cls].append([from_wait(cur, working, (0, ev)) for ev, _ in FIRST_TILE_EVENTS])
        producer_rows[cls].append([from_wait(cur, working, (-1, ev)) for ev, _ in PRODUCER_FIRST_TILE])
        # per probed tile, then the rest: the working CTAs' medians
        scored = [from_wait(cur, working, (t, SCORER_SCORED)) for t in range(PROBED_TILES)]
        rest = [c[1] - cur["tiles"][b][(PROBED_TILES - 1, SCORER_SCORED)] for b, c in working.items()
                if (PROBED_TILES - 1, SCORER_SCORED) in cur["tiles"].get(b, {})]
        scored.append(statistics.median(rest) if rest else None)
        tile_rows[cls].append(scored)
        rows[cls].append((
            plan[0] - prev_end if plan else None, plan[1] - plan[0] if plan else None,
            cur["first"] - plan[1] if plan else cur["first"] - prev_end,
            statistics.median(waits) if waits else None, statistics.median(after) if after else None,
            statistics.median(c[1] - c[0] for c in working.values()) if working else None,
            max(c[1] for c in cur["ctas"].values()) - cur["first"], same_sm * 1e3, len(cur["ctas"]) * 1e3))
    print("class       n  prev->plan  plan  ->attention  wait  after_wait  cta  span  same_SM/ctas")
    for name, items in rows.items():
        if items:
            m = [med([x[j] for x in items]) for j in range(9)]
            print(f"{name:10s} {len(items):4d}  {m[0]:9.2f} {m[1]:5.2f} {m[2]:11.2f} {m[3]:5.2f} {m[4]:10.2f} "
                  f"{m[5]:6.2f} {m[6]:6.2f}  {m[7]:.0f}/{m[8]:.0f}")
    if any(x[0] is not None for items in tile_rows.values() for x in items):
        print("class       wait end -> S of tile " + " ".join(f"{t:6d}" for t in range(PROBED_TILES)) + "   tile 3 -> CTA end")
        for name, items in tile_rows.items():
            if items:
                m = [med([x[j] for x in items]) for j in range(PROBED_TILES + 1)]
                print(f"{name:10s} {'':22s}" + " ".join(f"{v:6.2f}" for v in m[:PROBED_TILES]) + f"   {m[-1]:9.2f}")
    print_medians("class       wait end -> tile 0: " + ", ".join(label for _, label in FIRST_TILE_EVENTS), first_rows)
    print_medians("class       wait end -> producers' tile 0: " + ", ".join(label for _, label in PRODUCER_FIRST_TILE),
                  producer_rows)


def overlaps(launches):
    overlapping = early = 0
    for prev, cur in zip(launches, launches[1:]):
        prev_end = max(c[1] for c in prev["ctas"].values())
        if cur["first"] < prev_end:
            overlapping += 1
            if cur["waited"] and min(cur["waited"].values()) < prev_end - 2000:
                early += 1
    print(f"{len(launches)} attention launches; {overlapping} began before the one before ended, "
          f"{early} of them with CTAs past their wait > 2 us before it ended")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ring", help="the file HMLA_STEP_PROBE_FILE named")
    parser.add_argument("--window-ms", type=float, default=6.0, help="the step loop: the file's last N ms")
    args = parser.parse_args()
    launches = attention_launches(read(args.ring))
    if len(launches) < 2:
        print("fewer than two attention launches recorded")
        return
    summarise(launches, args.window_ms * 1e6)
    overlaps(launches)


if __name__ == "__main__":
    main()
