#!/usr/bin/env python3
"""compare.py with the SM clock of every timed call: are two libraries' times apart by cycles or by clock?

On power-capped rows (sparse prefill, the wide sparse decode rows) the SM clock moves with what a
kernel does, so a time ratio mixes the cycles a kernel needs with the clock it leaves the card at.
This runs ../shared/anchors/compare/compare.py unchanged (same rows, inputs, interleaving and
timing) with its timing function wrapped: around every call a one-thread-per-SM kernel records
(%smid, clock64, %globaltimer) before and after, and the call's mean SM clock is the median over
SMs of d(clock64) / d(globaltimer) (the same SM's counters; the stamps run outside
the events). Per row it prints both libraries' time, clock, and cycles (time x clock). The cross-check:
compare.py's own nvidia-smi reading after each row (`clocks` in its JSON); a counter that stopped
while its SM idled would read low.

  PYTHONPATH=<FlashMLA>:<hmla> python3 scripts/profile/compare_clocks.py --compare .deps/compare/compare.py \
      --out DIR [compare.py's arguments: --only ..., --iters ...]
Writes DIR/compare.json (compare.py's rows plus `<lib>_mhz`: the median clock of each timing round)
and DIR/clocks.json.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import warnings

import torch

STAMP_SRC = r"""
extern "C" __global__ void stamp(unsigned long long* out) {
  if (threadIdx.x != 0) return;
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  unsigned long long clk, ns;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(clk));
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  out[3 * blockIdx.x] = smid;
  out[3 * blockIdx.x + 1] = clk;
  out[3 * blockIdx.x + 2] = ns;
}
"""


def make_stamper():
    """A launcher of the stamp kernel on torch's current stream: CuPy's NVRTC if present."""
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        import cupy
        import numpy
        kern = cupy.RawKernel(STAMP_SRC, "stamp")

        def launch(buf):
            with warnings.catch_warnings():  # CuPy 13 deprecates ExternalStream; it still does what is needed
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
            with stream:
                kern((n_sm,), (32,), (numpy.uint64(buf.data_ptr()),))
        return n_sm, launch
    except ImportError:
        from torch.utils.cpp_extension import load_inline
        mod = load_inline("hmla_stamp", cpp_sources="void launch(torch::Tensor buf);",
                          cuda_sources="#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n"
                          + STAMP_SRC + "void launch(torch::Tensor buf) { stamp<<<%d, 32, 0, "
                          "at::cuda::getCurrentCUDAStream()>>>((unsigned long long*)buf.data_ptr()); }" % n_sm,
                          functions=["launch"])
        return n_sm, mod.launch


def mean_mhz(before, after):
    """Median over the SMs seen in both stamps of the clock between them, in MHz."""
    b = {int(r[0]): (int(r[1]), int(r[2])) for r in before.tolist()}
    rates = []
    for r in after.tolist():
        sm = int(r[0])
        if sm in b and int(r[2]) > b[sm][1]:
            rates.append((int(r[1]) - b[sm][0]) / (int(r[2]) - b[sm][1]) * 1e3)
    return statistics.median(rates) if rates else float("nan")


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--compare", required=True, help="path of compare.py")
    args, rest = ap.parse_known_args()
    spec = importlib.util.spec_from_file_location("compare", args.compare)
    cmp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cmp)

    n_sm, stamp = make_stamper()
    rounds = []  # (median us, median MHz) of each time_calls, in call order

    def time_calls(fn, n_sets, iters):
        for i in range(3):
            fn(i % n_sets)
        torch.cuda.synchronize()
        bufs = torch.zeros(iters, 2, n_sm, 3, dtype=torch.int64, device="cuda")
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            if cmp._sleep is not None:
                cmp._sleep(cmp.SLEEP_CYCLES)
            stamp(bufs[i, 0])
            starts[i].record()
            fn(i % n_sets)
            ends[i].record()
            stamp(bufs[i, 1])
        torch.cuda.synchronize()
        host = bufs.cpu()
        us = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
        mhz = statistics.median(mean_mhz(host[i, 0], host[i, 1]) for i in range(iters))
        rounds.append((us, mhz))
        return us

    cmp.time_calls = time_calls
    original_case = cmp.Runner.case
    table = []

    def case(self, kind, desc, call, n_sets, flop, nbytes, check):
        rounds.clear()
        original_case(self, kind, desc, call, n_sets, flop, nbytes, check)
        row = self.rows[-1]
        names = list(self.libs)
        if len(rounds) == 2 * len(names):
            line = dict(kind=kind, **desc)
            for j, name in enumerate(names):
                mine = [rounds[k] for k in range(j, len(rounds), len(names))]
                row[f"{name}_mhz"] = [m for _, m in mine]
                us = statistics.mean(u for u, _ in mine)
                mhz = statistics.mean(m for _, m in mine)
                line[name] = dict(us=us, mhz=mhz, kclk=us * mhz / 1e3)
            if "flashmla" in line and "hmla" in line:
                f, h = line["flashmla"], line["hmla"]
                line["time_ratio"] = f["us"] / h["us"]
                line["cycle_ratio"] = f["kclk"] / h["kclk"]
                cmp.log(f"  clocks: F {f['us']:8.1f} us at {f['mhz']:6.0f} MHz = {f['kclk']:8.1f} kclk | "
                        f"H {h['us']:8.1f} us at {h['mhz']:6.0f} MHz = {h['kclk']:8.1f} kclk | "
                        f"time ratio {line['time_ratio']:.3f}, cycle ratio {line['cycle_ratio']:.3f}")
            table.append(line)
            with open(os.path.join(out_dir, "clocks.json"), "w") as fh:
                json.dump(dict(rows=table), fh, indent=1)
        with open(os.path.join(self.out_dir, "compare.json"), "w") as fh:
            json.dump(dict(rows=self.rows), fh, indent=1)

    cmp.Runner.case = case
    out_dir = rest[rest.index("--out") + 1]
    os.makedirs(out_dir, exist_ok=True)
    sys.argv = [args.compare] + rest
    cmp.main()


if __name__ == "__main__":
    main()
