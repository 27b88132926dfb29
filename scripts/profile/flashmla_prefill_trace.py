#!/usr/bin/env python3
"""FlashMLA's sparse prefill kernel timed pair by pair, for comparison with hmla's prefill trace.

FlashMLA needs 4.5-9 % fewer cycles than hmla on every compare.py prefill row at the same SM clock
(docs/PERF.md, "Cycles, not clocks"); this says where. It runs a FlashMLA built from the kit with
scripts/profile/flashmla_prefill_trace.patch (scripts/profile/flashmla_prefill_trace.sh builds it):
with the environment variable FM_TRACE_PTR set to a device buffer, the CTA FM_TRACE_BLOCK records
clock64 at fixed points of every pair of 64-token blocks in each of its three warpgroups, and every
CTA its SM, its start and the issue of its LSE stores on the global timer (into a buffer of the
kernel's own, copied to FM_TRACE_PTR after the call: a pointer loaded at every point cost the kernel
~16 % on the h 64 row, a CTA test made once at its start costs a branch). Prints, for one
compare.py prefill row (same inputs): the call's time with the trace off and on (the instrumentation's
cost), the traced CTA's pair period and each event's median offset from the pair's S_0 retiring,
and over all CTAs their median duration and the median gap on an SM from one CTA's LSE stores to
the next CTA's start (FlashMLA's item boundary, its grid not being persistent).

  PYTHONPATH=<traced FlashMLA> python3 scripts/profile/flashmla_prefill_trace.py \\
      --compare .deps/compare/compare.py --h-q 64 --d-qk 576 --s-kv 8192 [--block 2048] [--json F]
"""
import argparse
import importlib.util
import json
import os
import statistics

import torch

EVENTS, PAIRS = 8, 64
CTA_BASE = 8 + 3 * PAIRS * EVENTS
MAX_CTAS = 16384  # the patch's FM_TRACE_MAX_CTAS: its buffer, copied whole to FM_TRACE_PTR after each call
NAMES = {
    0: ["S_0 retired", "own P V issued", "V0L freed", "WG1's max in", "P_0 stored", "P_1 in", "P_1 V_1L issued",
        "V1L freed"],
    1: ["S_1 retired", "WG0's max in", "own P V issued", "P_0 V_0R issued", "P_1 stored", "V1R freed", "V0R freed", "-"],
    2: ["V0L free", "V0L issued", "V1R free", "V1R issued", "V0R free", "V0R issued", "V1L free", "V1L issued"],
}
ROLES = {0: "WG0", 1: "WG1", 2: "producer"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", required=True, help="compare.py (its input generators are used)")
    ap.add_argument("--h-q", type=int, default=64)
    ap.add_argument("--d-qk", type=int, default=576)
    ap.add_argument("--s-kv", type=int, default=8192)
    ap.add_argument("--s-q", type=int, default=4096)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--block", type=int, default=-1, help="the traced CTA (default: the middle of the grid)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="write the raw records and the summary here")
    args = ap.parse_args()

    spec = importlib.util.spec_from_file_location("compare", args.compare)
    cmp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cmp)
    import flash_mla

    s_q, h_q, d_qk, s_kv, topk = args.s_q, args.h_q, args.d_qk, args.s_kv, args.topk
    q = cmp.rand_bf16(s_q, h_q, d_qk, clamp=10.0)
    kv = cmp.rand_bf16(s_kv, 1, d_qk, clamp=10.0)
    idx = cmp.randperm_rows(s_q, s_kv, topk).view(s_q, 1, topk)
    sink = torch.randn(h_q, dtype=torch.float32, device="cuda")
    sm = d_qk ** -0.5
    grid = s_q * h_q // 64
    block = args.block if args.block >= 0 else grid // 2
    assert grid <= MAX_CTAS, f"grid {grid} above the traced build's {MAX_CTAS} CTAs"
    buf = torch.zeros(CTA_BASE + 4 * MAX_CTAS, dtype=torch.int64, device="cuda")

    def call(_):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, sm, 512, sink, None)

    # compare.py's timing (its sleep kernel before each call, the median of events around it)
    os.environ.pop("FM_TRACE_PTR", None)
    us_off = cmp.time_calls(call, 1, args.iters)
    os.environ["FM_TRACE_PTR"] = str(buf.data_ptr())
    os.environ["FM_TRACE_BLOCK"] = str(block)
    us_on = cmp.time_calls(call, 1, args.iters)
    torch.cuda.synchronize()
    os.environ.pop("FM_TRACE_PTR", None)
    raw = buf.cpu().tolist()

    row = f"s_q {s_q} h_q {h_q} d_qk {d_qk} s_kv {s_kv} topk {topk}"
    print(f"{row}: {us_off:.1f} us with the trace off, {us_on:.1f} us on; traced CTA {block} of {grid}")
    pairs = topk // 128
    ev = lambda role, p, e: raw[8 + (role * PAIRS + p) * EVENTS + e]
    s0 = [ev(0, p, 0) for p in range(pairs)]
    periods = [b - a for a, b in zip(s0, s0[1:]) if a and b]
    summary = {"row": row, "us_off": us_off, "us_on": us_on, "block": block,
               "pair_period_clk": statistics.median(periods) if periods else None, "events": {}}
    print(f"pair period (S_0 to S_0): median {summary['pair_period_clk']} clk over {len(periods)} pairs")
    inner = range(1, pairs - 1)  # the item's first and last pair are its boundary's
    for role in (0, 1, 2):
        for e in range(EVENTS):
            name = NAMES[role][e]
            offsets = [ev(role, p, e) - s0[p] for p in inner if ev(role, p, e) and s0[p]]
            if name == "-" or not offsets:
                continue
            med = statistics.median(offsets)
            summary["events"][f"{ROLES[role]}: {name}"] = med
            print(f"  {ROLES[role]:8s} {name:18s} {med:8.0f} clk")

    ctas = [raw[CTA_BASE + 4 * b: CTA_BASE + 4 * b + 4] for b in range(grid)]
    done = [c for c in ctas if c[1] and c[2]]
    if done:
        dur = statistics.median((c[2] - c[1]) / 1e3 for c in done)
        by_sm = {}
        for c in done:
            by_sm.setdefault(c[0], []).append((c[1], c[2]))
        gaps = []
        for items in by_sm.values():
            items.sort()
            gaps += [(b[0] - a[1]) / 1e3 for a, b in zip(items, items[1:])]
        summary.update(cta_us=dur, gap_us=statistics.median(gaps) if gaps else None, ctas=len(done),
                       sms=len(by_sm))
        print(f"CTAs: {len(done)} on {len(by_sm)} SMs; start to LSE stores issued: median {dur:.2f} us; "
              f"an SM's LSE stores to its next CTA's start: median {summary['gap_us']:.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "raw_pairs": raw[:CTA_BASE]}, f, indent=1)


if __name__ == "__main__":
    main()
