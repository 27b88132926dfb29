"""Micro-benchmark: cost of the Python call of hmla.flash_mla_with_kvcache over the bare kernels.

On a tiny shape (batch 1, s_q 1, h_q 16, 64 cached tokens: the GPU work is a few microseconds) it
measures, per call:

  graph_gpu_us     the kernels alone: N calls captured in one CUDA graph, replayed (CUDA events)
  eager_wall_us    N eager calls of hmla.flash_mla_with_kvcache, wall clock including the final sync
  python_host_us   host time of one eager hmla.flash_mla_with_kvcache call (N calls, no sync in the loop)
  compiled_wall_us the same call inside a torch.compile(fullgraph=True) function (torch.ops.hmla ops,
                   guards, Inductor's wrapper), wall clock including the final sync
  compiled_host_us host time of one call of that compiled function (no sync in the loop)
  cxx_host_us      host time of the bare C++ entry point hmla._C.dense_decode_run with pre-made
                   DLPack capsules and preallocated outputs (checks + launches, no Python layer)
  *_dlpack         eager_wall_us, python_host_us and overhead_over_kernel_us with hmla._torch_fast
                   turned off (the DLPack path), when it is built ("torch_fast": whether it is)
  *_direct_launches eager_wall_us, python_host_us, cxx_host_us and overhead_over_kernel_us with the
                   runs' graph replay turned off (hmla.set_launch_replay(False)): each run's two
                   kernels launched one by one, as before the replay

and reports python_layer_us = python_host_us - cxx_host_us (what the Python layer adds to the C++
call), overhead_over_kernel_us = eager_wall_us - graph_gpu_us (the time an eager call costs beyond
the kernels; the issue's target is < 10 us) and compiled_overhead_over_kernel_us = compiled_wall_us -
graph_gpu_us. When FlashMLA is importable, its graph_gpu_us, eager_wall_us, python_host_us and
overhead_over_kernel_us on the same call are measured beside ("flashmla"). "pieces" times, on the
same host, each PyTorch and Python operation an eager call is made of (output allocation, DLPack
export, the stream query, attribute reads, a bare Python call), to say where the Python layer's
time goes. Results go to stdout and, when $OUT is set, to $OUT/python_overhead.json.
Usage: python python/tests/bench_overhead.py [--calls N] [--pieces-only]   (--pieces-only: the pieces
alone, without hmla installed)
"""

import argparse
import json
import os
import statistics
import time

import torch
from torch.utils.dlpack import to_dlpack


HOST_CHUNK = 50  # calls per host-time chunk: fewer launches than the queue holds


def graph_timer(call, n):
    """n calls of `call` captured in one CUDA graph; returns a function timing one replay, in
    microseconds per call on the GPU (CUDA events): the kernels alone, with no host cost."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            call()
    g.replay()
    torch.cuda.synchronize()

    def graph_gpu():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e3 / n

    return graph_gpu


def flashmla_beside(q, k, bt, sl, timed, repeats):
    """FlashMLA's figures on the same call when it is importable (PYTHONPATH of
    ../shared/anchors/compare/build_flashmla.sh), else None: its eager wall clock and host time, its
    kernels in a graph, and its overhead over them, measured as hmla's are."""
    try:
        import flash_mla
    except ImportError:
        return None
    meta = flash_mla.get_mla_metadata()[0]
    call = lambda: flash_mla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, None, causal=False)  # noqa: E731
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    graph_gpu = graph_timer(call, 1000)
    res = {name: statistics.median(f() for _ in range(repeats))
           for name, f in (("graph_gpu_us", graph_gpu), ("eager_wall_us", timed(call, True)),
                           ("python_host_us", timed(call, False)))}
    res["overhead_over_kernel_us"] = res["eager_wall_us"] - res["graph_gpu_us"]
    return res


def host_pieces(q, k, repeats, n=2000):
    """Host microseconds of each operation an eager call is made of, on this host (median of repeats of
    n calls each): where python_layer_us goes."""
    dev = q.get_device()
    raw_stream = torch._C._cuda_getCurrentRawStream
    f32 = torch.float32
    cap = to_dlpack(q)
    del cap

    def noop(a, b, c, d, e, f, g):
        return a

    pieces = {
        "python_call_7_args": lambda: noop(q, k, q, k, q, k, q),
        "new_empty_out": lambda: q.new_empty((1, 1, 16, 512)),
        "new_empty_lse_f32": lambda: q.new_empty((1, 16, 1), dtype=f32),
        "torch_empty_f32": lambda: torch.empty((1, 16, 1), dtype=f32, device=q.device),
        "to_dlpack": lambda: to_dlpack(q),
        "dunder_dlpack": lambda: q.__dlpack__(),
        "raw_stream": lambda: raw_stream(dev),
        "get_device": lambda: q.get_device(),
        "shape_unpack": lambda: tuple(q.shape),
        "data_ptr": lambda: q.data_ptr(),
        "stride": lambda: q.stride(),
        "dtype_is": lambda: q.dtype is torch.bfloat16,
        "current_stream_object": lambda: torch.cuda.current_stream(dev).cuda_stream,
    }
    try:
        from hmla import _interface

        pieces["hmla_is_compiling"] = _interface._torch_compile.is_compiling
    except ImportError:  # --pieces-only without hmla
        pass
    res = {}
    for name, f in pieces.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times.append((time.perf_counter() - t0) / n * 1e6)
        res[name] = statistics.median(times)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--pieces-only", action="store_true")
    args = ap.parse_args()
    if args.pieces_only:
        q = torch.randn(1, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
        for key, value in host_pieces(q, q, args.repeats).items():
            print(f"piece {key:28s} {value:8.3f}")
        return
    import hmla
    from hmla import _C

    n = args.calls
    torch.manual_seed(0)
    dev = "cuda"
    b, s_q, h_q, h_kv, page = 1, 1, 16, 1, 64
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device=dev)
    k = torch.randn(4, page, h_kv, 576, dtype=torch.bfloat16, device=dev)
    bt = torch.arange(4, dtype=torch.int32, device=dev).view(1, 4)
    sl = torch.tensor([64], dtype=torch.int32, device=dev)
    meta, _ = hmla.get_mla_metadata()
    call = lambda: hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=False)  # noqa: E731
    for _ in range(50):
        call()
    torch.cuda.synchronize()

    def timed(f, wall):
        """Microseconds per call of f over n calls: to the final sync (wall) or host time only."""

        def measure():
            torch.cuda.synchronize()
            if wall:
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                torch.cuda.synchronize()
                return (time.perf_counter() - t0) / n * 1e6
            # Host time in chunks that the launch queue holds, synchronised between: a host loop
            # faster than the GPU would otherwise fill the queue and time the GPU.
            total = 0.0
            for _ in range(n // HOST_CHUNK):
                t0 = time.perf_counter()
                for _ in range(HOST_CHUNK):
                    f()
                total += time.perf_counter() - t0
                torch.cuda.synchronize()
            return total / (n // HOST_CHUNK * HOST_CHUNK) * 1e6

        return measure

    out = torch.empty(b, s_q, h_q, 512, dtype=q.dtype, device=dev)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=dev)
    sched = meta.schedule
    stream = torch.cuda.current_stream().cuda_stream
    scale = 576 ** -0.5

    def cxx_host():
        chunks = n // HOST_CHUNK
        total = 0.0
        for _ in range(chunks):
            caps = [(to_dlpack(q), to_dlpack(k), to_dlpack(bt), to_dlpack(sl), to_dlpack(out), to_dlpack(lse))
                    for _ in range(HOST_CHUNK)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for c in caps:
                _C.dense_decode_run(c[0], c[1], c[2], c[3], c[4], c[5], sched, scale, False, stream)
            total += time.perf_counter() - t0
        torch.cuda.synchronize()
        return total / (chunks * HOST_CHUNK) * 1e6

    # The kernels alone: n calls in one graph (metadata planned before the capture: run only).
    graph_gpu = graph_timer(call, n)

    # The same call in a compiled function. The metadata object is the eager calls' (planned): the
    # first compiled call plans once more into its workspace, the recompiled graph of later calls
    # only runs, like the eager calls.
    def layer(q, k, bt, sl, meta):
        return hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=False)

    compiled_layer = torch.compile(layer, fullgraph=True)
    compiled_call = lambda: compiled_layer(q, k, bt, sl, meta)  # noqa: E731
    for _ in range(50):
        compiled_call()
    torch.cuda.synchronize()
    assert all(torch.equal(c, e) for c, e in zip(compiled_call(), call())), "compiled call differs from eager"

    from hmla._frameworks import _singleton

    adapter = _singleton("torch")
    fast = adapter.fast

    def dlpack_path(measure):
        def run():
            adapter.fast = None
            try:
                return measure()
            finally:
                adapter.fast = fast

        return run

    res = {"torch_fast": fast is not None}
    if fast is not None:
        # The C++ call an eager call makes once its Python layer has found the metadata planned.
        direct = lambda: fast.dense_decode_planned(q, k, bt, sl, sched, meta._key, None, False, 512)  # noqa: E731
        res["torch_fast_direct_host_us"] = statistics.median(timed(direct, False)() for _ in range(args.repeats))
        res["torch_fast_pieces"] = fast._host_timings(q, 2000)

        class NoLaunch:
            """The fast path's planned call replaced by a stub: what remains is the Python layer."""

            @staticmethod
            def dense_decode_planned(*args):
                return q, sl

        adapter.fast = NoLaunch()
        try:
            res["python_layer_only_host_us"] = statistics.median(timed(call, False)() for _ in range(args.repeats))
        finally:
            adapter.fast = fast
        for name, f in (("eager_wall_us_dlpack", dlpack_path(timed(call, True))),
                        ("python_host_us_dlpack", dlpack_path(timed(call, False)))):
            res[name] = statistics.median(f() for _ in range(args.repeats))
    def direct_launches(measure):
        def run():
            previous = hmla.set_launch_replay(False)
            try:
                return measure()
            finally:
                hmla.set_launch_replay(previous)

        return run

    for name, f in (("eager_wall_us_direct_launches", direct_launches(timed(call, True))),
                    ("python_host_us_direct_launches", direct_launches(timed(call, False))),
                    ("cxx_host_us_direct_launches", direct_launches(cxx_host))):
        res[name] = statistics.median(f() for _ in range(args.repeats))
    for name, f in (("graph_gpu_us", graph_gpu), ("eager_wall_us", timed(call, True)),
                    ("python_host_us", timed(call, False)), ("compiled_wall_us", timed(compiled_call, True)),
                    ("compiled_host_us", timed(compiled_call, False)), ("cxx_host_us", cxx_host)):
        res[name] = statistics.median(f() for _ in range(args.repeats))
    res["python_layer_us"] = res["python_host_us"] - res["cxx_host_us"]
    res["overhead_over_kernel_us"] = res["eager_wall_us"] - res["graph_gpu_us"]
    res["compiled_overhead_over_kernel_us"] = res["compiled_wall_us"] - res["graph_gpu_us"]
    res["overhead_over_kernel_us_direct_launches"] = res["eager_wall_us_direct_launches"] - res["graph_gpu_us"]
    if fast is not None:
        res["overhead_over_kernel_us_dlpack"] = res["eager_wall_us_dlpack"] - res["graph_gpu_us"]
    res["flashmla"] = flashmla_beside(q, k, bt, sl, timed, args.repeats)
    res["pieces"] = host_pieces(q, k, args.repeats)
    res["target_us"] = 10.0
    res["meets_target"] = res["overhead_over_kernel_us"] < 10.0
    res["shape"] = dict(batch=b, s_q=s_q, h_q=h_q, h_kv=h_kv, seqlen=64, page=page, dtype="bf16", calls=n)
    res["versions"] = dict(torch=torch.__version__, hmla=hmla.__version__, gpu=torch.cuda.get_device_name())
    for key in ("graph_gpu_us", "eager_wall_us", "python_host_us", "compiled_wall_us", "compiled_host_us",
                "cxx_host_us", "python_layer_us", "overhead_over_kernel_us", "compiled_overhead_over_kernel_us",
                "eager_wall_us_dlpack", "python_host_us_dlpack", "overhead_over_kernel_us_dlpack",
                "torch_fast_direct_host_us", "python_layer_only_host_us", "eager_wall_us_direct_launches",
                "python_host_us_direct_launches", "cxx_host_us_direct_launches",
                "overhead_over_kernel_us_direct_launches"):
        if key in res:
            print(f"{key:34s} {res[key]:8.2f}")
    print(f"torch_fast (hmla._torch_fast loaded): {res['torch_fast']}")
    for key, value in (res["flashmla"] or {}).items():
        print(f"flashmla {key:25s} {value:8.2f}")
    for key, value in (res.get("torch_fast_pieces") or {}).items():
        print(f"torch_fast piece {key:20s} {value:8.3f}")
    for key, value in res["pieces"].items():
        print(f"piece {key:28s} {value:8.3f}")
    print(f"meets target (< 10 us over the kernels): {res['meets_target']}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "python_overhead.json"), "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
