#!/usr/bin/env python3
"""PNG plots of hmla's result JSON files (matplotlib).

  python3 tools/plot_results.py FILE.json [FILE.json ...] [--out DIR] [--ceilings FILE.json]

Each file is recognised by its shape:
* an hmla-bench result (`meta.ceilings`, `rows` of one or more kernel families): one roofline per
  family, `<file stem>_<family>_roofline.png`: every row at (FLOP per byte moved, TFLOPS) under the
  ceilings measured in the same run (bf16 matmul rate, read-stream bandwidth). A file benchmarked
  with --no-ceilings has none: --ceilings names another hmla-bench file to take them from, and the
  title says so.
* a compare.py result (`rows` with `flashmla` and `hmla` entries): one chart per kind,
  `<file stem>_<kind>_ratio.png`: FlashMLA time / hmla time per row (above 1: hmla is faster),
  with the geometric mean.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABEL_KEYS = ("layout", "b", "s_q", "h_q", "d_qk", "s_k", "s_kv", "topk", "extra_topk", "causal")


def row_label(row):
    parts = []
    for k in LABEL_KEYS:
        v = row.get(k)
        # Keys a kind does not have (prefill rows have no batch) are left out; zeros only where
        # they mean "none" (no extra list, not causal).
        if v is None or (v in (0, False, "bf16") and k not in ("b", "s_q", "h_q")):
            continue
        if k == "layout":
            parts.append(str(v).replace("fp8_", ""))
        elif k == "causal":
            parts.append("causal")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def plot_ratios(doc, stem, out_dir):
    written = []
    kinds = sorted({r["kind"] for r in doc["rows"] if "ratio" in r})
    for kind in kinds:
        rows = [r for r in doc["rows"] if r["kind"] == kind and "ratio" in r]
        ratios = [r["ratio"] for r in rows]
        fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.4))
        colors = ["tab:green" if x >= 1.0 else "tab:red" for x in ratios]
        ax.barh(range(len(rows)), ratios, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([row_label(r) for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("FlashMLA time / hmla time (same run; > 1: hmla faster)")
        ax.set_title(f"{kind}: {len(rows)} rows, geometric mean {geomean(ratios):.3f}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}_{kind}_ratio.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")  # long row labels stay whole
        plt.close(fig)
        written.append(path)
    return written


def plot_rooflines(doc, stem, out_dir, ceilings, ceilings_source):
    written = []
    peak = ceilings.get("bf16_matmul_tflops_8192")
    bandwidth = ceilings.get("read_stream_gbps")
    kinds = sorted({r.get("kind", "dense_decode") for r in doc["rows"]})
    for kind in kinds:
        rows = [r for r in doc["rows"] if r.get("kind", "dense_decode") == kind and r.get("bytes")]
        if not rows:
            continue
        intensity = [r["flop"] / r["bytes"] for r in rows]
        tflops = [r["tflops"] for r in rows]
        fig, ax = plt.subplots(figsize=(7, 5))
        lo, hi = min(intensity) / 2, max(intensity) * 2
        if peak and bandwidth:
            xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            ax.plot(xs, [min(peak, bandwidth * x / 1e3) for x in xs], color="black", linewidth=1,
                    label=f"ceilings: {peak:.0f} TFLOPS, {bandwidth / 1e3:.2f} TB/s")
        heads = sorted({r.get("h_q") for r in rows})
        for h in heads:
            sel = [i for i, r in enumerate(rows) if r.get("h_q") == h]
            ax.scatter([intensity[i] for i in sel], [tflops[i] for i in sel], s=18, label=f"h_q {h}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("FLOP per byte moved (FlashMLA's byte formula)")
        ax.set_ylabel("TFLOPS")
        title = f"{kind}: {len(rows)} rows"
        if ceilings_source:
            title += f"\n(ceilings from {ceilings_source})"
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}_{kind}_roofline.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default=".")
    ap.add_argument("--ceilings", help="an hmla-bench JSON whose ceilings to use for files without them")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fallback = None
    if args.ceilings:
        with open(args.ceilings) as f:
            fallback = json.load(f).get("meta", {}).get("ceilings")
    for name in args.files:
        with open(name) as f:
            doc = json.load(f)
        stem = os.path.splitext(os.path.basename(name))[0]
        rows = doc.get("rows", [])
        if rows and "flashmla" in rows[0] or any("hmla" in r and "flashmla" in r for r in rows):
            written = plot_ratios(doc, stem, args.out)
        elif "meta" in doc:
            ceilings = doc["meta"].get("ceilings")
            source = None
            if not ceilings:
                if not fallback:
                    sys.exit(f"{name}: no ceilings in the file (benchmarked with --no-ceilings): pass --ceilings")
                ceilings, source = fallback, os.path.basename(args.ceilings)
            written = plot_rooflines(doc, stem, args.out, ceilings, source)
        else:
            sys.exit(f"{name}: neither an hmla-bench nor a compare.py result")
        for path in written:
            print(path)


if __name__ == "__main__":
    main()
