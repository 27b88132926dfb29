"""Host helpers over hmla's CPU reference: FP8 KV-cache pack/unpack and the FP8 cache view.

The two FP8 layouts (docs/API.md, "FP8 layout kV32" and "FP8 layout kModel1"):

* ``"v32"``    DeepSeek-V3.2, head_dim 576: 656 bytes per token (512 e4m3 NoPE, 4 float32 scales,
  64 bf16 RoPE), tokens back to back; page bytes = page_size * 656.
* ``"model1"`` DeepSeek-V4, head_dim 512: per page every token's 576 data bytes (448 e4m3 NoPE +
  64 bf16 RoPE) then every token's 8 scale bytes (7 UE8M0); page bytes = page_size * 584 rounded
  up to a multiple of 576.

FlashMLA's kernels see such a cache as ``[num_blocks, page_block_size, 1, bytes_per_token]`` bytes
(656 or 584) whose block stride is the page size in bytes; ``pack_fp8_cache`` returns exactly that
view, ``fp8_cache_view`` makes it from a page buffer on any framework.

Quantisation and dequantisation are hmla::reference::pack_token / unpack_token (the same code the
C++ tests use), run over host arrays (NumPy arrays or PyTorch CPU tensors).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import _C

_LAYOUTS = {"v32": 0, "model1": 1}
_LAYOUT_BY_DQK = {576: "v32", 512: "model1"}
_LAYOUT_BY_BPT = {656: "v32", 584: "model1"}


def _layout_id(layout: Optional[str], fn: str, *, d_qk: Optional[int] = None, bpt: Optional[int] = None) -> int:
    if layout is None:
        guess = _LAYOUT_BY_DQK.get(d_qk) if d_qk is not None else _LAYOUT_BY_BPT.get(bpt)
        if guess is None:
            what = f"head_dim {d_qk}" if d_qk is not None else f"{bpt} bytes per token"
            raise ValueError(
                f"hmla.{fn}: cannot infer the FP8 layout from {what}; expected head_dim 576 ('v32') or 512 ('model1') "
                "(656 or 584 bytes per token), or pass layout="
            )
        layout = guess
    if not isinstance(layout, str) or layout.lower() not in _LAYOUTS:
        raise ValueError(f"hmla.{fn}: argument 'layout' is {layout!r}, expected 'v32' or 'model1'")
    return _LAYOUTS[layout.lower()]


def _host(x: Any, fn: str, arg: str) -> Tuple[Any, str]:
    """(array, kind) for a host array: kind 'torch' for a PyTorch CPU tensor, else 'numpy'."""
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise ValueError(
                f"hmla.{fn}: argument '{arg}' is on {x.device}; this helper runs on the host: pass a CPU tensor"
            )
        return x, "torch"
    if isinstance(x, np.ndarray):
        return x, "numpy"
    if mod.startswith(("cupy", "jax", "jaxlib")):
        raise ValueError(
            f"hmla.{fn}: argument '{arg}' is a device array ({mod.split('.')[0]}); this helper runs on the host: "
            "pass a NumPy array or a PyTorch CPU tensor"
        )
    try:
        return np.asarray(x), "numpy"
    except Exception:
        raise TypeError(f"hmla.{fn}: argument '{arg}' has type {type(x).__qualname__}, expected a NumPy array "
                        "or a PyTorch CPU tensor") from None


def _bf16_bits(x: Any, kind: str, fn: str, arg: str) -> np.ndarray:
    """C-contiguous uint16 array of bf16 bit patterns."""
    if kind == "torch":
        import torch

        if x.dtype == torch.bfloat16:
            return np.ascontiguousarray(x.contiguous().view(torch.int16).numpy().view(np.uint16))
        if x.dtype in (torch.float32, torch.float16, torch.float64):
            x = x.to(torch.float32).numpy()
        else:
            raise TypeError(f"hmla.{fn}: argument '{arg}' has dtype {x.dtype}, expected bfloat16 (or float32/float16)")
    dt = x.dtype
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes.bfloat16 (JAX's numpy dtype)
        return np.ascontiguousarray(x).view(np.uint16)
    if dt == np.uint16:
        return np.ascontiguousarray(x)  # raw bf16 bits
    if dt in (np.float32, np.float16, np.float64):
        src = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(src.shape, dtype=np.uint16)
        _C.float32_to_bf16(src.reshape(-1), out.reshape(-1))  # round to nearest even, as hmla's reference
        return out
    raise TypeError(
        f"hmla.{fn}: argument '{arg}' has dtype {dt}, expected bfloat16 (torch.bfloat16, ml_dtypes.bfloat16, "
        "uint16 bit patterns) or float32/float16 (rounded to bf16 first)"
    )


def _as_strided_numpy(pages: np.ndarray, shape, strides_elems) -> np.ndarray:
    item = pages.dtype.itemsize
    return np.lib.stride_tricks.as_strided(pages, shape=shape, strides=tuple(s * item for s in strides_elems))


def pack_fp8_cache(k_cache: Any, layout: Optional[str] = None, return_pages: bool = False) -> Any:
    """Quantises a bf16 KV cache into an FP8 layout (hmla::reference::pack_token for every token).

    k_cache: ``[num_blocks, page_block_size, 1, head_dim]`` or ``[num_blocks, page_block_size, head_dim]``
    bf16 (torch.bfloat16 CPU tensor, ml_dtypes.bfloat16 or uint16 bit patterns in NumPy; float32/float16
    are rounded to bf16 first). layout: ``"v32"`` (head_dim 576) or ``"model1"`` (head_dim 512);
    default from head_dim.

    Returns uint8 ``[num_blocks, page_block_size, 1, bytes_per_token]`` (same rank as the input), a
    strided view whose block stride is the page size in bytes, i.e. FlashMLA's FP8 ``k_cache``; with
    ``return_pages=True`` the underlying ``[num_blocks, page_bytes]`` buffer instead (copy that to the
    GPU and view it with ``fp8_cache_view``: a plain ``.cuda()`` of the model1 view would drop the
    padding between pages). NumPy in, NumPy out; PyTorch CPU in, PyTorch CPU out.
    """
    fn = "pack_fp8_cache"
    x, kind = _host(k_cache, fn, "k_cache")
    shape = tuple(x.shape)
    if len(shape) == 4:
        if shape[2] != 1:
            raise ValueError(f"hmla.{fn}: argument 'k_cache' has shape {shape}, expected h_kv = 1 "
                             "([num_blocks, page_block_size, 1, head_dim])")
    elif len(shape) != 3:
        raise ValueError(f"hmla.{fn}: argument 'k_cache' has shape {shape}, expected "
                         "[num_blocks, page_block_size, 1, head_dim] or [num_blocks, page_block_size, head_dim]")
    num_blocks, page_size, d_qk = shape[0], shape[1], shape[-1]
    if num_blocks < 1 or page_size < 1:
        raise ValueError(f"hmla.{fn}: argument 'k_cache' has shape {shape}, expected num_blocks >= 1 and page_block_size >= 1")
    lid = _layout_id(layout, fn, d_qk=d_qk)
    if d_qk != _C.sparse_cache_d_qk(lid):
        raise ValueError(f"hmla.{fn}: argument 'k_cache' has head_dim {d_qk}, layout {layout!r} needs {_C.sparse_cache_d_qk(lid)}")
    tokens = _bf16_bits(x, kind, fn, "k_cache").reshape(num_blocks, page_size, d_qk)
    page_bytes = int(_C.sparse_page_bytes(lid, page_size))
    pages = np.empty((num_blocks, page_bytes), dtype=np.uint8)
    _C.pack_pages(tokens, pages, lid)
    result = pages if return_pages else _cache_view_numpy(pages, page_size, lid, rank=len(shape))
    if kind == "torch":
        import torch

        return torch.from_numpy(result)
    return result


def _cache_view_numpy(pages: np.ndarray, page_size: int, lid: int, rank: int = 4) -> np.ndarray:
    bpt = int(_C.sparse_token_bytes(lid))
    page_bytes = pages.shape[1]
    if rank == 4:
        return _as_strided_numpy(pages, (pages.shape[0], page_size, 1, bpt), (page_bytes, bpt, bpt, 1))
    return _as_strided_numpy(pages, (pages.shape[0], page_size, bpt), (page_bytes, bpt, 1))


def fp8_cache_view(pages: Any, page_block_size: int, layout: str = "v32") -> Any:
    """Views a page buffer ``[num_blocks, page_bytes]`` (uint8, any framework with strided views:
    PyTorch, CuPy, NumPy) as FlashMLA's FP8 ``k_cache`` ``[num_blocks, page_block_size, 1, bytes_per_token]``.
    """
    fn = "fp8_cache_view"
    lid = _layout_id(layout, fn)
    if isinstance(page_block_size, bool) or not isinstance(page_block_size, int) or page_block_size < 1:
        raise ValueError(f"hmla.{fn}: argument 'page_block_size' is {page_block_size!r}, expected an int >= 1")
    shape = tuple(pages.shape)
    need = int(_C.sparse_page_bytes(lid, page_block_size))
    if len(shape) != 2 or shape[1] < need:
        raise ValueError(f"hmla.{fn}: argument 'pages' has shape {shape}, expected [num_blocks, >= {need}] bytes")
    bpt = int(_C.sparse_token_bytes(lid))
    mod = type(pages).__module__ or ""
    view_shape = (shape[0], page_block_size, 1, bpt)
    if mod.startswith("torch"):
        import torch

        if pages.dtype != torch.uint8 or pages.stride(1) != 1:
            raise ValueError(f"hmla.{fn}: argument 'pages' must be a uint8 tensor with contiguous rows")
        return torch.as_strided(pages, view_shape, (pages.stride(0), bpt, bpt, 1), pages.storage_offset())
    if mod.startswith("cupy"):
        import cupy

        if pages.dtype != cupy.uint8 or pages.strides[1] != 1:
            raise ValueError(f"hmla.{fn}: argument 'pages' must be a uint8 array with contiguous rows")
        return cupy.lib.stride_tricks.as_strided(pages, view_shape, (pages.strides[0], bpt, bpt, 1))
    if isinstance(pages, np.ndarray):
        if pages.dtype != np.uint8 or pages.strides[1] != 1:
            raise ValueError(f"hmla.{fn}: argument 'pages' must be a uint8 array with contiguous rows")
        return np.lib.stride_tricks.as_strided(pages, view_shape, (pages.strides[0], bpt, bpt, 1))
    raise TypeError(f"hmla.{fn}: argument 'pages' has type {type(pages).__qualname__}; strided views need "
                    "PyTorch, CuPy or NumPy (JAX arrays have no strides)")


def unpack_fp8_cache(k_cache: Any, layout: Optional[str] = None, page_block_size: Optional[int] = None) -> Any:
    """Dequantises an FP8 cache back to float32 (hmla::reference::unpack_token for every token).

    k_cache: FlashMLA's view ``[num_blocks, page_block_size, 1, bytes_per_token]`` or
    ``[num_blocks, page_block_size, bytes_per_token]`` (uint8/int8/float8 bytes, any block stride,
    tokens contiguous), or a page buffer ``[num_blocks, page_bytes]`` together with
    ``page_block_size`` and ``layout``. Returns float32 ``[num_blocks, page_block_size, (1,) head_dim]``
    (the dequantised NoPE values, then the RoPE values). NumPy in, NumPy out; PyTorch CPU in, PyTorch
    CPU out.
    """
    fn = "unpack_fp8_cache"
    x, kind = _host(k_cache, fn, "k_cache")
    if kind == "torch":
        import torch

        if x.element_size() != 1:
            raise TypeError(f"hmla.{fn}: argument 'k_cache' has dtype {x.dtype}, expected 1-byte elements (uint8, int8, float8)")
        arr = x.view(torch.uint8).numpy()
    else:
        if x.dtype.itemsize != 1:
            raise TypeError(f"hmla.{fn}: argument 'k_cache' has dtype {x.dtype}, expected 1-byte elements (uint8, int8, float8)")
        arr = x.view(np.uint8)
    shape = tuple(arr.shape)
    if len(shape) == 2:
        if page_block_size is None:
            raise ValueError(f"hmla.{fn}: argument 'page_block_size' is required for a [num_blocks, page_bytes] buffer")
        if layout is None:
            raise ValueError(f"hmla.{fn}: argument 'layout' is required for a [num_blocks, page_bytes] buffer")
        lid = _layout_id(layout, fn)
        need = int(_C.sparse_page_bytes(lid, page_block_size))
        if shape[1] < need or arr.strides[1] != 1:
            raise ValueError(f"hmla.{fn}: argument 'k_cache' has shape {shape}, expected [num_blocks, >= {need}] contiguous bytes")
        view3 = _cache_view_numpy(arr, page_block_size, lid, rank=3)
        out_rank = 4
    elif len(shape) in (3, 4):
        if len(shape) == 4 and shape[2] != 1:
            raise ValueError(f"hmla.{fn}: argument 'k_cache' has shape {shape}, expected h_kv = 1")
        lid = _layout_id(layout, fn, bpt=shape[-1])
        if shape[-1] != int(_C.sparse_token_bytes(lid)):
            raise ValueError(f"hmla.{fn}: argument 'k_cache' has {shape[-1]} bytes per token, layout {layout!r} "
                             f"has {int(_C.sparse_token_bytes(lid))}")
        if len(shape) == 4:
            view3 = np.lib.stride_tricks.as_strided(arr, (shape[0], shape[1], shape[3]),
                                                    (arr.strides[0], arr.strides[1], arr.strides[3]))
        else:
            view3 = arr
        if (view3.shape[1] > 1 and view3.strides[1] != view3.shape[2]) or view3.strides[2] != 1:
            raise ValueError(f"hmla.{fn}: argument 'k_cache' must hold whole pages: token stride == bytes per token, "
                             "byte stride 1")
        out_rank = len(shape)
    else:
        raise ValueError(f"hmla.{fn}: argument 'k_cache' has shape {shape}, expected "
                         "[num_blocks, page_block_size, 1, bytes_per_token] or [num_blocks, page_bytes]")
    num_blocks, page_size = view3.shape[0], view3.shape[1]
    d_qk = int(_C.sparse_cache_d_qk(lid))
    tokens = np.empty((num_blocks, page_size, d_qk), dtype=np.float32)
    _C.unpack_pages(view3, tokens, lid)
    if out_rank == 4:
        tokens = tokens.reshape(num_blocks, page_size, 1, d_qk)
    if kind == "torch":
        import torch

        return torch.from_numpy(tokens)
    return tokens
