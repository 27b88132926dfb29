"""positions_to_indices: logical token positions + block table -> the sparse kernels' indices.

Pure array code in the caller's framework (PyTorch, CuPy, JAX or NumPy; host or device), no kernel.
"""

from __future__ import annotations

import numbers
from typing import Any


def _namespace(x: Any, fn: str, arg: str):
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        import torch

        return "torch", torch
    if mod.startswith("cupy"):
        import cupy

        return "cupy", cupy
    if mod.startswith(("jax", "jaxlib")):
        import jax.numpy as jnp

        return "jax", jnp
    import numpy as np

    if isinstance(x, np.ndarray):
        return "numpy", np
    raise TypeError(f"hmla.{fn}: argument '{arg}' has type {type(x).__qualname__}, expected a PyTorch, CuPy, "
                    "JAX or NumPy array")


def _is_integer_dtype(kind: str, xp, x) -> bool:
    if kind == "torch":
        return not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != xp.bool
    return xp.issubdtype(x.dtype, xp.integer)


def positions_to_indices(positions: Any, block_table: Any, page_block_size: int) -> Any:
    """Converts logical token positions into FlashMLA's sparse indices.

    positions: ``[batch, ...]`` integers (for sparse decode ``[batch, s_q, topk]``), position ``p`` of
    request ``b`` is its ``p``-th cached token; negative values mark padding.
    block_table: ``[batch, max_num_blocks_per_seq]`` integers, the page ids of each request in order.
    page_block_size: tokens per page of the cache.

    Returns int32 indices of positions' shape: ``block_table[b, p // page_block_size] * page_block_size
    + p % page_block_size``, and -1 (invalid, skipped by the kernels) where ``p < 0``, where
    ``p // page_block_size >= max_num_blocks_per_seq``, or where the block-table entry is negative.
    Same framework and device as ``positions``.
    """
    fn = "positions_to_indices"
    if isinstance(page_block_size, bool) or not isinstance(page_block_size, numbers.Integral) or page_block_size < 1:
        raise ValueError(f"hmla.{fn}: argument 'page_block_size' is {page_block_size!r}, expected an int >= 1")
    page = int(page_block_size)
    kind, xp = _namespace(positions, fn, "positions")
    bkind, _ = _namespace(block_table, fn, "block_table")
    if bkind != kind:
        raise TypeError(f"hmla.{fn}: argument 'block_table' is a {bkind} array but positions is a {kind} array")
    pshape, bshape = tuple(positions.shape), tuple(block_table.shape)
    if len(pshape) < 1:
        raise ValueError(f"hmla.{fn}: argument 'positions' has shape {pshape}, expected [batch, ...]")
    if len(bshape) != 2:
        raise ValueError(f"hmla.{fn}: argument 'block_table' has shape {bshape}, expected [batch, max_num_blocks_per_seq]")
    if bshape[0] != pshape[0]:
        raise ValueError(f"hmla.{fn}: argument 'block_table' has batch {bshape[0]}, but positions has batch {pshape[0]}")
    if bshape[1] < 1:
        raise ValueError(f"hmla.{fn}: argument 'block_table' has no columns")
    if not _is_integer_dtype(kind, xp, positions):
        raise TypeError(f"hmla.{fn}: argument 'positions' has dtype {positions.dtype}, expected an integer dtype")
    if not _is_integer_dtype(kind, xp, block_table):
        raise TypeError(f"hmla.{fn}: argument 'block_table' has dtype {block_table.dtype}, expected an integer dtype")

    batch, max_blocks = bshape
    if kind == "torch":
        wide = xp.int64
        pos = positions.to(wide)
        table = block_table.to(wide)
        bidx = xp.arange(batch, device=positions.device, dtype=wide)
    else:
        # JAX keeps 32-bit integers unless x64 is enabled; the products fit for any real cache.
        wide = xp.int32 if kind == "jax" else xp.int64
        pos = positions.astype(wide)
        table = block_table.astype(wide)
        bidx = xp.arange(batch, dtype=wide)
    bidx = bidx.reshape((batch,) + (1,) * (len(pshape) - 1))

    valid = pos >= 0
    pos = xp.where(valid, pos, 0)
    blk = pos // page
    valid = valid & (blk < max_blocks)
    blk = xp.where(blk < max_blocks, blk, 0)
    page_id = table[bidx, blk]
    valid = valid & (page_id >= 0)
    idx = page_id * page + pos % page
    minus_one = xp.full_like(idx, -1)
    out = xp.where(valid, idx, minus_one)
    return out.to(xp.int32) if kind == "torch" else out.astype(xp.int32)
