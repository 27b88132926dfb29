"""CUDA-graph tests (torch.cuda.graph): the metadata object is reused across replays."""

import pytest

import hmla
from gpu_ref import assert_close, make_case, reference

pytestmark = pytest.mark.gpu

B, S_Q, H_Q = 4, 2, 64
CAPACITY = 4096


def _warm_up(torch, q, k, bt, sl):
    # First launch of each kernel outside any capture (a different metadata object).
    meta, _ = hmla.get_mla_metadata()
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    torch.cuda.synchronize()


def test_graph_plans_inside_capture(torch_cuda):
    """FlashMLA's current pattern: a fresh metadata object whose first call is captured. The plan is
    part of the graph, so every replay re-plans from the lengths then in cache_seqlens."""
    torch = torch_cuda
    q, k, bt, sl = make_case(torch, B, S_Q, H_Q, 1, [10, 200, 3000, 64], capacity=CAPACITY, poison=False)
    q2 = torch.randn_like(q)
    _warm_up(torch, q, k, bt, sl)
    meta, _ = hmla.get_mla_metadata()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out1, lse1 = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)   # plan + run
        out2, lse2 = hmla.flash_mla_with_kvcache(q2, k, bt, sl, 512, meta, causal=True)  # run only
    for lengths in ([10, 200, 3000, 64], [4000, 1, 0, 999], [64, 64, 64, 64], [4096, 4095, 1, 2]):
        sl.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        q2.copy_(torch.randn_like(q2))
        g.replay()
        torch.cuda.synchronize()
        for qq, out, lse in ((q, out1, lse1), (q2, out2, lse2)):
            ref_out, ref_lse = reference(torch, qq, k, bt, sl, True)
            assert_close(torch, out, lse, ref_out, ref_lse, q.dtype)


def test_graph_reuses_planned_metadata(torch_cuda):
    """The plan runs before the capture (inside get_mla_metadata); the graph holds only the attention.
    Replays see new q values; new lengths need meta.replan() before the replay."""
    torch = torch_cuda
    q, k, bt, sl = make_case(torch, B, S_Q, H_Q, 1, [100, 1500, 7, 4000], capacity=CAPACITY, poison=False)
    _warm_up(torch, q, k, bt, sl)
    meta, _ = hmla.get_mla_metadata(sl, S_Q * H_Q, 1, num_heads_q=H_Q)
    assert meta.schedule is not None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        g.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = reference(torch, q, k, bt, sl, True)
        assert_close(torch, out, lse, ref_out, ref_lse, q.dtype)
    sl.copy_(torch.tensor([4096, 0, 1000, 33], dtype=torch.int32))
    meta.replan()  # same workspace: the captured kernels read the new schedule
    g.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(torch, q, k, bt, sl, True)
    assert_close(torch, out, lse, ref_out, ref_lse, q.dtype)


def test_eager_launch_replay_matches_direct_launches(torch_cuda):
    """Eager runs replay their two kernels as the stream's graph (hmla/launch_replay.h, one replay per
    thread); switched off, they launch one by one. Same bits either way, on the current stream and on
    a side stream, and again after a capture on that stream (which takes the kernels directly)."""
    torch = torch_cuda

    q, k, bt, sl = make_case(torch, B, S_Q, H_Q, 1, [100, 1500, 7, 4000], capacity=CAPACITY, poison=False)
    _warm_up(torch, q, k, bt, sl)
    meta, _ = hmla.get_mla_metadata(sl, S_Q * H_Q, 1, num_heads_q=H_Q)
    previous = hmla.set_launch_replay(False)
    try:
        direct = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
        torch.cuda.synchronize()
        hmla.set_launch_replay(True)
        side = torch.cuda.Stream()
        for stream in (torch.cuda.current_stream(), side, side):
            with torch.cuda.stream(stream):
                for _ in range(3):
                    out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
            torch.cuda.synchronize()
            assert torch.equal(out, direct[0]) and torch.equal(lse, direct[1])
            if stream is side:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=side):
                    captured = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
                g.replay()
                torch.cuda.synchronize()
                assert torch.equal(captured[0], direct[0]) and torch.equal(captured[1], direct[1])
    finally:
        hmla.set_launch_replay(previous)
