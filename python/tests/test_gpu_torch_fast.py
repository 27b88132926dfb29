"""GPU tests of hmla._torch_fast, the eager PyTorch path in C++ (python/src/torch_fast_path.cpp): it
is built where PyTorch is installed at build time, it gives the DLPack path's results bit for bit
(dense and sparse decode, strided inputs, a side stream), and bad arguments reaching it after the
first call get the DLPack path's errors."""

import pytest

import hmla
from gpu_ref import make_case
from test_gpu_sparse import make_cache, make_indices

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch_adapter(torch_cuda):
    from hmla._frameworks import _singleton

    adapter = _singleton("torch")
    if adapter.fast is None:
        pytest.fail("hmla._torch_fast did not load: the package was built without PyTorch importable "
                    "(pip install --no-build-isolation ./python) or against another PyTorch")
    return adapter


def both_paths(adapter, call):
    """call() through hmla._torch_fast, then through the DLPack path (fresh metadata each time)."""
    fast = adapter.fast
    first = call()
    adapter.fast = None
    try:
        second = call()
    finally:
        adapter.fast = fast
    return first, second


def test_dense_decode_fast_path_equals_dlpack_path(torch_cuda, torch_adapter):
    torch = torch_cuda
    q0, k0, bt, sl = make_case(torch, 3, 2, 32, 1, [100, 2000, 7])
    q = torch.zeros(3, 2, 32, 640, dtype=q0.dtype, device="cuda")[..., :576]
    q.copy_(q0)  # heads padded: strides the fast path must pass on
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())

    def call():
        with torch.cuda.stream(s):
            meta, _ = hmla.get_mla_metadata()
            hmla.flash_mla_with_kvcache(q, k0, bt, sl, 512, meta, causal=True)  # plans (slow path)
            return hmla.flash_mla_with_kvcache(q, k0, bt, sl, 512, meta, causal=True)  # run only

    (out_f, lse_f), (out_d, lse_d) = both_paths(torch_adapter, call)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert out_f.shape == out_d.shape and out_f.stride() == out_d.stride() and out_f.dtype == out_d.dtype
    assert lse_f.shape == lse_d.shape and lse_f.stride() == lse_d.stride() and lse_f.dtype == torch.float32
    assert torch.equal(out_f, out_d) and torch.equal(lse_f, lse_d)
    assert torch.isfinite(out_f).all()


@pytest.mark.parametrize("d_qk", [576, 512])
def test_sparse_decode_fast_path_equals_dlpack_path(torch_cuda, torch_adapter, d_qk):
    torch = torch_cuda
    gen = torch.Generator(device="cuda").manual_seed(d_qk)
    b, s_q, h_q, topk, page = 2, 2, 16, 100, 64
    k_cache, _ = make_cache(torch, 8, page, d_qk, gen)
    extra_cache, _ = make_cache(torch, 20, 2, d_qk, gen)
    q = torch.randn(b, s_q, h_q, d_qk, generator=gen, device="cuda").to(torch.bfloat16)
    indices = make_indices(torch, b, s_q, topk, 8 * page, gen)
    extra_indices = make_indices(torch, b, s_q, 33, 40, gen)
    topk_length = torch.tensor([77, 0], dtype=torch.int32, device="cuda")
    extra_length = torch.tensor([5, 33], dtype=torch.int32, device="cuda")
    sink = torch.randn(h_q, generator=gen, device="cuda")

    def call():
        meta, _ = hmla.get_mla_metadata()
        args = dict(is_fp8_kvcache=True, indices=indices, attn_sink=sink, extra_k_cache=extra_cache,
                    extra_indices_in_kvcache=extra_indices, topk_length=topk_length, extra_topk_length=extra_length)
        hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, **args)
        return hmla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, None, softmax_scale=0.07, **args)

    (out_f, lse_f), (out_d, lse_d) = both_paths(torch_adapter, call)
    torch.cuda.synchronize()
    assert out_f.dtype == torch.bfloat16 and out_f.shape == (b, s_q, h_q, 512) and lse_f.shape == (b, h_q, s_q)
    assert torch.equal(out_f, out_d) and torch.equal(lse_f, lse_d)


def test_fast_path_errors_match_the_dlpack_path(torch_cuda, torch_adapter):
    torch = torch_cuda
    q, k, bt, sl = make_case(torch, 2, 1, 16, 1, [10, 20], poison=False)
    for fast in (torch_adapter.fast, None):
        saved = torch_adapter.fast
        torch_adapter.fast = fast
        try:
            meta, _ = hmla.get_mla_metadata()
            hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)  # planned: later calls take the run path
            # Same shapes (the metadata's key), so these reach the run path, whose checks must name them.
            with pytest.raises(TypeError, match="argument 'q' has dtype float32"):
                hmla.flash_mla_with_kvcache(q.float(), k, bt, sl, 512, meta)
            with pytest.raises(ValueError, match="argument 'cache_seqlens' is on the CPU"):
                hmla.flash_mla_with_kvcache(q, k, bt, sl.cpu(), 512, meta)
            with pytest.raises(TypeError, match="argument 'block_table' has dtype int64"):
                hmla.flash_mla_with_kvcache(q, k, bt.long(), sl, 512, meta)
            with pytest.raises(ValueError, match="argument 'q' must have a contiguous last dimension"):
                hmla.flash_mla_with_kvcache(torch.cat([q, q], -1)[..., ::2], k, bt, sl, 512, meta)
            out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)  # still works
            assert torch.isfinite(out).all()
        finally:
            torch_adapter.fast = saved
