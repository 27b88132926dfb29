"""GPU tests with PyTorch tensors: dense decode against the PyTorch float32 reference (gpu_ref.py),
metadata reuse and planning modes, streams, strides and argument errors on real CUDA tensors."""

import pytest

import hmla
from gpu_ref import assert_close, make_case, reference

pytestmark = pytest.mark.gpu

CASES = {
    # name: (batch, s_q, h_q, h_kv, seqlens, page, dtype, causal, softmax_scale)
    "decode_h128_varlen": (4, 1, 128, 1, [1, 100, 1000, 4097], 64, "bf16", False, None),
    "mtp2_causal_lonely": (3, 2, 128, 1, [0, 1, 777], 64, "bf16", True, None),
    "mtp4_causal_hkv2_fp16_page32": (2, 4, 16, 2, [3, 513], 32, "fp16", True, None),
    "varlen_batch33": (33, 1, 16, 1, None, 64, "bf16", False, None),
    "hkv4_page256_causal": (3, 3, 64, 4, [300, 2, 1200], 256, "bf16", True, None),
    "page16_scale": (2, 1, 32, 1, [50, 1000], 16, "bf16", False, 0.1),
    "h_q_1": (2, 1, 1, 1, [64, 65], 64, "bf16", False, None),
    "s_q16_h8_causal": (2, 16, 8, 1, [16, 3000], 128, "bf16", True, None),
}


def _dtype(torch, name):
    return torch.bfloat16 if name == "bf16" else torch.float16


@pytest.mark.parametrize("name", list(CASES))
def test_dense_decode_matches_reference(torch_cuda, name):
    torch = torch_cuda
    b, s_q, h_q, h_kv, seqlens, page, dt, causal, scale = CASES[name]
    if seqlens is None:
        seqlens = torch.randint(0, 3000, (b,), generator=torch.Generator().manual_seed(1)).tolist()
    dtype = _dtype(torch, dt)
    q, k, bt, sl = make_case(torch, b, s_q, h_q, h_kv, seqlens, page=page, dtype=dtype)
    meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, softmax_scale=scale, causal=causal)
    assert isinstance(out, torch.Tensor) and out.device == q.device
    assert meta.have_initialized and meta.config.b == b and meta.config.h_k == h_kv
    ref_out, ref_lse = reference(torch, q, k, bt, sl, causal, scale)
    assert_close(torch, out, lse, ref_out, ref_lse, dtype)
    # reuse of the metadata (run only): same result bit for bit
    out2, lse2 = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, softmax_scale=scale, causal=causal)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_planning_modes_agree(torch_cuda):
    torch = torch_cuda
    b, s_q, h_q, h_kv = 8, 2, 64, 1
    q, k, bt, sl = make_case(torch, b, s_q, h_q, h_kv, [5, 50, 500, 5000, 64, 1, 0, 129])
    results = []
    # FlashMLA's current style: plan on the first call
    m1, _ = hmla.get_mla_metadata()
    results.append(hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, m1, causal=True))
    # the older style: workspace allocated here, plan on the first call (s_q and h_q not known apart)
    m2, ns = hmla.get_mla_metadata(sl, s_q * h_q // h_kv, h_kv)
    assert ns is None and m2.workspace is not None and m2.schedule is None
    results.append(hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, m2, ns, causal=True))
    # the full shape given: the plan runs inside get_mla_metadata
    m3, _ = hmla.get_mla_metadata(sl, s_q * h_q // h_kv, h_kv, num_heads_q=h_q)
    assert m3.schedule is not None and m3.schedule.s_q == s_q and m3.schedule.h_q == h_q
    ws = m3.workspace
    results.append(hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, m3, causal=True))
    assert m3.workspace is ws  # not reallocated
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    ref_out, ref_lse = reference(torch, q, k, bt, sl, True)
    assert_close(torch, results[0][0], results[0][1], ref_out, ref_lse, torch.bfloat16)


def test_replan_with_new_lengths(torch_cuda):
    torch = torch_cuda
    q, k, bt, sl = make_case(torch, 4, 1, 128, 1, [10, 20, 30, 40], capacity=4096, poison=False)
    meta, _ = hmla.get_mla_metadata()
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    sl.copy_(torch.tensor([4000, 1, 0, 2048], dtype=torch.int32))
    meta.replan()  # same workspace, new lengths
    out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    ref_out, ref_lse = reference(torch, q, k, bt, sl, False)
    assert_close(torch, out, lse, ref_out, ref_lse, torch.bfloat16)
    # FlashMLA's idiom: drop the schedule, the next call plans again
    sl.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    meta.tile_scheduler_metadata = None
    out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    ref_out, ref_lse = reference(torch, q, k, bt, sl, False)
    assert_close(torch, out, lse, ref_out, ref_lse, torch.bfloat16)


def test_non_default_stream_and_strided_inputs(torch_cuda):
    torch = torch_cuda
    b, s_q, h_q = 3, 2, 32
    q0, k0, bt, sl = make_case(torch, b, s_q, h_q, 1, [100, 2000, 7], poison=False)
    # q as a view with padding between heads, k_cache as a view with padding between pages
    q = torch.zeros(b, s_q, h_q, 640, dtype=q0.dtype, device="cuda")[..., :576]
    q.copy_(q0)
    kbig = torch.zeros(k0.shape[0], k0.shape[1] + 1, 1, 576, dtype=k0.dtype, device="cuda")
    k = kbig[:, : k0.shape[1]]
    k.copy_(k0)
    assert not q.is_contiguous() and not k.is_contiguous()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        meta, _ = hmla.get_mla_metadata()
        out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    ref_out, ref_lse = reference(torch, q0, k0, bt, sl, True)
    assert_close(torch, out, lse, ref_out, ref_lse, q.dtype)


def test_errors_on_cuda_tensors(torch_cuda):
    torch = torch_cuda
    q, k, bt, sl = make_case(torch, 2, 1, 16, 1, [10, 20], poison=False)
    meta, _ = hmla.get_mla_metadata()
    with pytest.raises(ValueError, match="argument 'cache_seqlens' is on the CPU"):
        hmla.flash_mla_with_kvcache(q, k, bt, sl.cpu(), 512, meta)
    with pytest.raises(TypeError, match="argument 'q' has dtype float32"):
        hmla.flash_mla_with_kvcache(q.float(), k, bt, sl, 512, meta)
    with pytest.raises(TypeError, match="argument 'k_cache' has dtype float16"):
        hmla.flash_mla_with_kvcache(q, k.half(), bt, sl, 512, meta)
    with pytest.raises(ValueError, match="argument 'k_cache' has h_kv = 3"):
        hmla.flash_mla_with_kvcache(q, k.expand(-1, -1, 3, -1), bt, sl, 512, meta)
    with pytest.raises(ValueError, match="argument 'q' must have a contiguous last dimension"):
        hmla.flash_mla_with_kvcache(torch.cat([q, q], -1)[..., ::2], k, bt, sl, 512, meta)
    with pytest.raises(ValueError, match="argument 'head_dim_v'"):
        hmla.flash_mla_with_kvcache(q, k, bt, sl, 576, meta)
    assert not meta.have_initialized
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)
    with pytest.raises(ValueError, match="set up for causal = False"):
        hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    q2, k2, bt2, sl2 = make_case(torch, 3, 1, 16, 1, [10, 20, 30], poison=False)
    with pytest.raises(ValueError, match="set up for b = 2"):
        hmla.flash_mla_with_kvcache(q2, k2, bt2, sl2, 512, meta)


def test_fp8_cache_view_on_gpu(torch_cuda):
    torch = torch_cuda
    x = torch.randn(4, 64, 1, 512).to(torch.bfloat16)
    pages = hmla.pack_fp8_cache(x, return_pages=True).cuda()
    view = hmla.fp8_cache_view(pages, 64, "model1")
    assert view.is_cuda and view.shape == (4, 64, 1, 584) and view.stride() == (37440, 584, 584, 1)
    back = hmla.unpack_fp8_cache(hmla.fp8_cache_view(pages.cpu(), 64, "model1"))
    assert torch.equal(back, hmla.unpack_fp8_cache(hmla.pack_fp8_cache(x)))


def test_positions_to_indices_on_gpu(torch_cuda):
    torch = torch_cuda
    bt = torch.tensor([[4, 2, -1], [0, 1, 3]], dtype=torch.int32, device="cuda")
    pos = torch.tensor([[[0, 70, 130, -1]], [[5, 64, 191, 192]]], device="cuda")
    got = hmla.positions_to_indices(pos, bt, 64)
    assert got.is_cuda and got.dtype == torch.int32
    assert got.tolist() == [[[256, 134, -1, -1]], [[5, 64, 255, -1]]]


@pytest.mark.parametrize("d_qk", [576, 512])
def test_sparse_prefill_matches_a_float64_reference(torch_cuda, d_qk):
    """flash_mla_sparse_fwd against a float64 computation in PyTorch: invalid indices (< 0, >= s_kv)
    skipped, out / max_logits / lse of FlashMLA's shapes and dtypes."""
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(d_qk)
    s_q, h_q, s_kv, topk, scale = 8, 64, 32, 64, 0.04
    q = torch.randn(s_q, h_q, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    idx = torch.randint(-2, s_kv + 2, (s_q, 1, topk), generator=gen, device="cuda", dtype=torch.int32)
    out, max_logits, lse = hmla.flash_mla_sparse_fwd(q, kv, idx, scale)
    assert out.shape == (s_q, h_q, 512) and out.dtype == torch.bfloat16
    assert max_logits.shape == (s_q, h_q) and lse.shape == (s_q, h_q) and lse.dtype == torch.float32
    valid = (idx[:, 0] >= 0) & (idx[:, 0] < s_kv)
    k = kv[:, 0].double()[idx[:, 0].clamp(0, s_kv - 1).long()]  # [s_q, topk, d_qk]
    scores = torch.einsum("thd,tkd->thk", q.double(), k) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    ref_out = torch.einsum("thk,tkd->thd", torch.softmax(scores, -1), k[..., :512])
    rel = ((out.double() - ref_out).norm() / ref_out.norm()).item()
    assert rel < 4e-3, rel
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(max_logits.double(), scores.max(-1).values, rtol=2e-4, atol=2e-4)


def test_sparse_prefill_batched_form_matches_per_sequence_calls(torch_cuda):
    """flash_mla_sparse_fwd's batched form (hmla only): four sequences, one of a single token and one of
    none, overlapping kv ranges, indices past each sequence's kv length (inside kv and past it). Bit for
    bit the flat call on each sequence's rows and kv range; one sequence over all of kv is the flat form."""
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(26)
    d_qk, h_q, s_kv, topk, scale = 576, 64, 400, 96, 0.04
    n_q, kv_offset, kv_len = [5, 1, 0, 12], [0, 100, 150, 300], [200, 250, 10, 100]
    cu = [0]
    for n in n_q:
        cu.append(cu[-1] + n)
    s_q = cu[-1]
    q = torch.randn(s_q, h_q, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    idx = torch.randint(-2, 260, (s_q, 1, topk), generator=gen, device="cuda", dtype=torch.int32)
    topk_length = torch.randint(0, topk + 1, (s_q,), generator=gen, device="cuda", dtype=torch.int32)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    out, max_logits, lse = hmla.flash_mla_sparse_fwd(q, kv, idx, scale, topk_length=topk_length,
                                                     cu_seqlens_q=i32(cu), seq_kv_offset=i32(kv_offset),
                                                     seq_kv_len=i32(kv_len))
    assert out.shape == (s_q, h_q, 512) and lse.shape == (s_q, h_q) and max_logits.shape == (s_q, h_q)
    for i, n in enumerate(n_q):
        if n == 0:
            continue
        rows = slice(cu[i], cu[i + 1])
        o, m, l = hmla.flash_mla_sparse_fwd(q[rows], kv[kv_offset[i]:kv_offset[i] + kv_len[i]], idx[rows], scale,
                                            topk_length=topk_length[rows])
        assert torch.equal(out[rows], o) and torch.equal(max_logits[rows], m) and torch.equal(lse[rows], l), i

    flat = hmla.flash_mla_sparse_fwd(q, kv, idx, scale)
    one = hmla.flash_mla_sparse_fwd(q, kv, idx, scale, cu_seqlens_q=i32([0, s_q]), seq_kv_offset=i32([0]),
                                    seq_kv_len=i32([s_kv]))
    assert all(torch.equal(a, b) for a, b in zip(flat, one))
    with pytest.raises(ValueError, match="argument 'seq_kv_len'"):
        hmla.flash_mla_sparse_fwd(q, kv, idx, scale, cu_seqlens_q=i32(cu), seq_kv_offset=i32(kv_offset))
