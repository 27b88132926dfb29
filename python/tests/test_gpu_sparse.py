"""GPU tests of sparse decode (flash_mla_with_kvcache with indices) with PyTorch tensors, against the
float64 reference on the dequantised cache (sparse_ref.py): both FP8 layouts, FlashMLA's page strides,
invalid indices, topk_length, an extra cache with another page size, attention sinks, queries without
a valid key, re-planning, CUDA-graph capture, and errors on CUDA tensors."""

import pytest

import hmla
import sparse_ref
from sparse_ref import assert_close, quantize, reference

pytestmark = pytest.mark.gpu


def make_cache(torch, num_blocks, page, d_qk, gen, packer="flashmla"):
    """(k_cache view, dequantised [num_blocks * page, d_qk] float64)."""
    kv = (torch.randn(num_blocks, page, 1, d_qk, generator=gen, device="cuda") * 0.5).to(torch.bfloat16)
    layout = sparse_ref.layout_of(d_qk)
    if packer == "flashmla":
        return quantize(torch, kv, layout)
    # hmla's own quantiser (the CPU reference's pack_token), moved to the GPU page by page
    pages = hmla.pack_fp8_cache(kv.cpu(), layout=layout, return_pages=True).cuda()
    view = hmla.fp8_cache_view(pages, page, layout)
    deq = hmla.unpack_fp8_cache(pages.cpu(), layout=layout, page_block_size=page)
    return view, deq.reshape(num_blocks * page, d_qk).double().cuda()


def make_indices(torch, b, s_q, topk, n, gen, invalid=True):
    """[b, s_q, topk] int32 into a cache of n tokens; with invalid, -1, other negatives and values
    >= n (both just past the end and far past it) mixed in, and some duplicates."""
    idx = torch.randint(0, n, (b, s_q, topk), generator=gen, device="cuda", dtype=torch.int32)
    if invalid:
        r = torch.rand(b, s_q, topk, generator=gen, device="cuda")
        idx = torch.where(r < 0.10, torch.full_like(idx, -1), idx)
        idx = torch.where((r >= 0.10) & (r < 0.13), torch.full_like(idx, -7), idx)
        idx = torch.where((r >= 0.13) & (r < 0.16), torch.full_like(idx, n), idx)
        idx = torch.where((r >= 0.16) & (r < 0.18), torch.full_like(idx, 2**31 - 1), idx)
        idx[..., -1] = idx[..., 0]  # a duplicate counts twice
    return idx


CASES = {
    # name: (d_qk, b, s_q, h_q, topk, page, num_blocks, packer)
    "v32_h128_s1_topk2048": (576, 3, 1, 128, 2048, 64, 64, "flashmla"),
    "v32_h64_s2_topk100": (576, 2, 2, 64, 100, 64, 8, "flashmla"),
    "v32_h16_s1_topk64_hmla_packer": (576, 4, 1, 16, 64, 32, 16, "hmla"),
    "v32_h100_s2_topk64_page2": (576, 2, 2, 100, 64, 2, 100, "flashmla"),
    "model1_h128_s2_topk100": (512, 2, 2, 128, 100, 64, 8, "flashmla"),
    "model1_h64_s1_topk2048_page576": (512, 2, 1, 64, 2048, 576, 6, "flashmla"),
    "model1_h16_s2_topk64_page69": (512, 3, 2, 16, 64, 69, 10, "hmla"),
    "model1_h100_s1_topk100": (512, 5, 1, 100, 100, 61, 12, "flashmla"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sparse_decode_matches_reference(torch_cuda, name):
    torch = torch_cuda
    d_qk, b, s_q, h_q, topk, page, num_blocks, packer = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(sum(map(ord, name)))
    k_cache, deq = make_cache(torch, num_blocks, page, d_qk, gen, packer)
    q = torch.randn(b, s_q, h_q, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, b, s_q, topk, num_blocks * page, gen)
    meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True,
                                           indices=indices)
    assert meta.have_initialized and meta.config.topk == topk and meta.config.is_fp8_kvcache
    ref_out, ref_lse = reference(torch, q, [(deq, indices, None)], d_qk ** -0.5)
    assert_close(torch, out, lse, ref_out, ref_lse)
    # a second "layer" with new q and indices reuses the plan
    q2 = torch.randn_like(q)
    indices2 = make_indices(torch, b, s_q, topk, num_blocks * page, gen)
    out2, lse2 = hmla.flash_mla_with_kvcache(q2, k_cache, None, None, 512, meta, None, softmax_scale=0.05,
                                             is_fp8_kvcache=True, indices=indices2)
    ref_out, ref_lse = reference(torch, q2, [(deq, indices2, None)], 0.05)
    assert_close(torch, out2, lse2, ref_out, ref_lse)


@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("h_q", [16, 64, 128, 100])
def test_sparse_decode_extra_cache_lengths_and_sinks(torch_cuda, d_qk, h_q):
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(d_qk + h_q)
    b, s_q, topk, extra_topk = 4, 2, 100, 64
    k_cache, deq = make_cache(torch, 12, 64, d_qk, gen)
    extra_k, extra_deq = make_cache(torch, 40, 2, d_qk, gen)  # another page size
    q = torch.randn(b, s_q, h_q, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, b, s_q, topk, 12 * 64, gen)
    extra_indices = make_indices(torch, b, s_q, extra_topk, 80, gen)
    topk_length = torch.tensor([topk, 0, 37, 1], dtype=torch.int32, device="cuda")
    extra_topk_length = torch.tensor([5, 0, extra_topk, 64], dtype=torch.int32, device="cuda")
    # request 1 has no valid key at all (both lengths 0): out 0, lse +inf whatever its sink
    sink = torch.randn(h_q, generator=gen, device="cuda")
    sink[0], sink[1] = float("-inf"), float("inf")
    meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, meta, None, softmax_scale=d_qk ** -0.55, is_fp8_kvcache=True, indices=indices,
        attn_sink=sink, extra_k_cache=extra_k, extra_indices_in_kvcache=extra_indices, topk_length=topk_length,
        extra_topk_length=extra_topk_length)
    ref_out, ref_lse = reference(torch, q, [(deq, indices, topk_length), (extra_deq, extra_indices, extra_topk_length)],
                                 d_qk ** -0.55, sink)
    assert_close(torch, out, lse, ref_out, ref_lse)
    assert torch.all(out[1] == 0) and torch.all(torch.isposinf(lse[1]))
    assert torch.all(out[:, :, 1] == 0)  # sink +inf
    # the sink leaves lse unchanged: the same call without it
    _, lse_no_sink = hmla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, meta, None, softmax_scale=d_qk ** -0.55, is_fp8_kvcache=True, indices=indices,
        extra_k_cache=extra_k, extra_indices_in_kvcache=extra_indices, topk_length=topk_length,
        extra_topk_length=extra_topk_length)
    assert torch.equal(lse, lse_no_sink)


def test_sparse_decode_all_invalid_rows(torch_cuda):
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(5)
    k_cache, deq = make_cache(torch, 4, 64, 576, gen)
    q = torch.randn(3, 2, 64, 576, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, 3, 2, 128, 256, gen)
    indices[0] = -1            # request 0: nothing valid
    indices[2, 1] = 256        # request 2, token 1: only out-of-range values
    meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True,
                                           indices=indices, attn_sink=torch.zeros(64, device="cuda"))
    assert torch.all(out[0] == 0) and torch.all(torch.isposinf(lse[0]))
    assert torch.all(out[2, 1] == 0) and torch.all(torch.isposinf(lse[2, :, 1]))
    ref_out, ref_lse = reference(torch, q, [(deq, indices, None)], 576 ** -0.5, torch.zeros(64, device="cuda"))
    assert_close(torch, out, lse, ref_out, ref_lse)


def test_sparse_decode_topk_length_replan(torch_cuda):
    """The schedule depends on the values in topk_length: FlashMLA's rule is a new metadata object (or
    a re-plan) when they change; replan() writes the new schedule into the same workspace."""
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(9)
    k_cache, deq = make_cache(torch, 40, 64, 512, gen)
    q = torch.randn(8, 1, 64, 512, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, 8, 1, 2048, 40 * 64, gen)
    topk_length = torch.full((8,), 64, dtype=torch.int32, device="cuda")
    meta, _ = hmla.get_mla_metadata()
    hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True, indices=indices,
                                topk_length=topk_length)
    ws = meta.workspace
    topk_length.copy_(torch.tensor([2048, 0, 1, 1000, 2048, 7, 64, 2047], dtype=torch.int32))
    meta.replan()
    assert meta.workspace is ws
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True,
                                           indices=indices, topk_length=topk_length)
    ref_out, ref_lse = reference(torch, q, [(deq, indices, topk_length)], 512 ** -0.5)
    assert_close(torch, out, lse, ref_out, ref_lse)
    # FlashMLA's reset idiom does the same
    topk_length.copy_(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], dtype=torch.int32))
    meta.tile_scheduler_metadata = None
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True,
                                           indices=indices, topk_length=topk_length)
    ref_out, ref_lse = reference(torch, q, [(deq, indices, topk_length)], 512 ** -0.5)
    assert_close(torch, out, lse, ref_out, ref_lse)


def test_sparse_decode_strided_inputs_and_stream(torch_cuda):
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(11)
    k_cache, deq = make_cache(torch, 8, 64, 576, gen)
    q = torch.randn(2, 2, 64, 640, generator=gen, device="cuda").to(torch.bfloat16)[..., :576]  # padded heads
    indices = make_indices(torch, 2, 2, 200, 8 * 64, gen)[..., :128]  # padded index rows
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        meta, _ = hmla.get_mla_metadata()
        out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True,
                                               indices=indices)
    s.synchronize()
    ref_out, ref_lse = reference(torch, q, [(deq, indices, None)], 576 ** -0.5)
    assert_close(torch, out, lse, ref_out, ref_lse)


def test_sparse_decode_graph_capture(torch_cuda):
    """A fresh metadata object whose first (planning) call is captured, as FlashMLA-based engines do;
    replays see new q, indices and topk_length values in the captured buffers."""
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(13)
    b, s_q, h_q, topk = 4, 2, 64, 256
    k_cache, deq = make_cache(torch, 16, 64, 576, gen)
    q = torch.randn(b, s_q, h_q, 576, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, b, s_q, topk, 16 * 64, gen)
    topk_length = torch.tensor([256, 3, 0, 100], dtype=torch.int32, device="cuda")
    warm, _ = hmla.get_mla_metadata()  # first launches outside any capture
    hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, warm, None, is_fp8_kvcache=True, indices=indices,
                                topk_length=topk_length)
    torch.cuda.synchronize()
    meta, _ = hmla.get_mla_metadata()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, is_fp8_kvcache=True,
                                               indices=indices, topk_length=topk_length)
    for lengths in ([256, 3, 0, 100], [1, 256, 255, 0], [256, 256, 256, 256]):
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda").to(torch.bfloat16))
        indices.copy_(make_indices(torch, b, s_q, topk, 16 * 64, gen))
        topk_length.copy_(torch.tensor(lengths, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = reference(torch, q, [(deq, indices, topk_length)], 576 ** -0.5)
        assert_close(torch, out, lse, ref_out, ref_lse)


def test_sparse_decode_errors_on_cuda_tensors(torch_cuda):
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(17)
    k_cache, _ = make_cache(torch, 4, 64, 576, gen)
    q = torch.randn(2, 1, 16, 576, device="cuda").to(torch.bfloat16)
    idx = torch.zeros(2, 1, 64, dtype=torch.int32, device="cuda")
    meta, _ = hmla.get_mla_metadata()

    def call(**kw):
        a = dict(q=q, k_cache=k_cache, indices=idx)
        a.update(kw)
        return hmla.flash_mla_with_kvcache(a.pop("q"), a.pop("k_cache"), None, None, 512, meta, None,
                                           is_fp8_kvcache=True, **a)

    with pytest.raises(ValueError, match="argument 'k_cache': hmla::sparse_decode: argument 'cache.block_stride_bytes'"):
        call(k_cache=torch.zeros(4 * 64 * 656, dtype=torch.uint8, device="cuda")
             .as_strided((4, 64, 1, 656), (64 * 656 - 16, 656, 656, 1)))
    with pytest.raises(ValueError, match="argument 'q': hmla::sparse_decode: argument 'h_q'"):
        call(q=torch.zeros(2, 1, 129, 576, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="argument 'k_cache' has token stride"):
        call(k_cache=torch.zeros(4, 64, 1, 700, dtype=torch.uint8, device="cuda")[..., :656])
    with pytest.raises(TypeError, match="argument 'indices' has dtype int64"):
        call(indices=idx.long())
    with pytest.raises(ValueError, match="argument 'attn_sink' is on the CPU"):
        call(attn_sink=torch.zeros(16))
    assert not meta.have_initialized and meta.workspace is None
    out, lse = call()
    assert out.shape == (2, 1, 16, 512) and lse.shape == (2, 16, 1)
    with pytest.raises(ValueError, match="set up for topk = 64"):
        call(indices=torch.zeros(2, 1, 128, dtype=torch.int32, device="cuda"))
