"""hmla: Multi-head Latent Attention kernels for NVIDIA Hopper, with FlashMLA's Python interface.

``import hmla as flash_mla`` is a drop-in change for code written for FlashMLA's dense decode and its
token-sparse decode over FP8 caches:

    sched_meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, sched_meta, causal=True)
    out, lse = hmla.flash_mla_with_kvcache(q, fp8_cache, None, None, 512, sparse_meta, is_fp8_kvcache=True,
                                           indices=indices)

Arrays may be PyTorch tensors, CuPy arrays or JAX arrays (through DLPack); outputs come back in the
caller's framework. Full reference: docs/PYTHON.md.
"""

from . import _C
from ._host import fp8_cache_view, pack_fp8_cache, unpack_fp8_cache
from ._indices import positions_to_indices
from ._interface import FlashMLASchedMeta, flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata

__version__ = "0.1.0"

__all__ = [
    "FlashMLASchedMeta",
    "get_mla_metadata",
    "flash_mla_with_kvcache",
    "flash_mla_sparse_fwd",
    "pack_fp8_cache",
    "unpack_fp8_cache",
    "fp8_cache_view",
    "positions_to_indices",
    "check_dense_decode_args",
    "check_sparse_decode_args",
    "cuda_device_count",
]


def check_dense_decode_args(q, k_cache, block_table, cache_seqlens, head_dim_v=512, require_cuda=True):
    """Runs every argument check of the dense ``flash_mla_with_kvcache`` without launching anything.

    Returns a dict (batch, s_q, h_q, h_kv, head_dim, page_block_size, num_blocks, dtype, device) or
    raises TypeError/ValueError naming the argument. ``require_cuda=False`` also accepts host arrays
    (NumPy, PyTorch CPU), which lets the checks run on a machine without a GPU.
    """
    from ._frameworks import adapter_for, export

    fn = "flash_mla_with_kvcache"
    fw = adapter_for(q, fn, "q")
    return _C.check_dense_decode_args(
        export(q, fw, fn, "q"), export(k_cache, fw, fn, "k_cache"), export(block_table, fw, fn, "block_table"),
        export(cache_seqlens, fw, fn, "cache_seqlens"), head_dim_v, require_cuda)


def check_sparse_decode_args(q, k_cache, indices, topk_length=None, attn_sink=None, extra_k_cache=None,
                             extra_indices_in_kvcache=None, extra_topk_length=None, head_dim_v=512,
                             softmax_scale=None, require_cuda=True):
    """Runs every argument check of the sparse ``flash_mla_with_kvcache`` (FlashMLA's and hmla's
    ``hmla::validate``) without launching anything.

    Returns a dict (batch, s_q, h_q, head_dim, layout, topk, page_block_size, num_blocks,
    block_stride_bytes, extra_topk, extra_page_block_size, device) or raises TypeError/ValueError
    naming the argument. ``require_cuda=False`` also accepts host arrays.
    """
    from ._interface import _sparse_exports

    arrays = (q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    return _C.check_sparse_decode_args(*_sparse_exports(arrays, "flash_mla_with_kvcache"), head_dim_v,
                                       0.0 if softmax_scale is None else float(softmax_scale), require_cuda)


def cuda_device_count() -> int:
    """Number of CUDA devices the hmla extension sees (0 without a GPU or driver)."""
    return int(_C.cuda_device_count())
