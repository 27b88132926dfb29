"""hmla's attention as PyTorch custom ops (``torch.ops.hmla.*``), so that torch.compile traces through it.

Imported by ``hmla/__init__.py`` only when PyTorch is importable; CuPy and JAX users never load it.
Eager calls are unchanged: they go to the C++ extension over DLPack. Dynamo cannot trace into that
extension, so while torch.compile traces ``flash_mla_with_kvcache`` the call takes ``dense_decode`` /
``sparse_decode`` below instead, which emit two kinds of graph node:

``hmla::dense_decode_plan`` / ``hmla::sparse_decode_plan``
    hmla's plan: writes the split of the batch over the SMs into the workspace (mutated).
``hmla::dense_decode_run`` / ``hmla::sparse_decode_run``
    the attention: reads the plan from the workspace, writes partial results there (mutated),
    returns ``(out, lse)`` shaped and typed as the eager call's.

In the graph the metadata object is its workspace, a uint8 tensor: the plan's device part lives there,
and a run node rebuilds the host part (a few ints and pointers into the workspace, a function of the
shape and the workspace's address) from it without planning again (``_C.dense_decode_schedule``,
hmla::dense_decode_schedule in C++). A run op therefore reads the plan its workspace holds, as the C++
run does: the graph's plan node writes it, or an eager plan into the same metadata object did. (A
cache of host schedules by workspace address would be wrong for a new workspace allocated where a
planned one was freed.)

A compiled function plans once per metadata object, at its first call in the trace (later calls, other
layers, only run), exactly when an eager call would: a fresh metadata object (``get_mla_metadata()``
inside the compiled function, or a new one passed in each step) plans on every call of the compiled
function and on every replay of a CUDA graph captured from it. docs/PYTHON.md "torch.compile".
"""

import sys
from typing import Any, Optional, Tuple

import torch

from . import _C, _interface
from ._frameworks import _singleton, export

_FN = "flash_mla_with_kvcache"
_TORCH = _singleton("torch")
_Q_LAYOUT = "[batch, s_q, h_q, head_dim]"

is_compiling = torch.compiler.is_compiling


def _shape(x: torch.Tensor, ndim: int, arg: str, layout: str) -> list:
    """x's shape as ints (in a trace: specialised, the plan depends on them); ValueError naming the
    argument when x does not have ndim dimensions."""
    if x.dim() != ndim:
        raise ValueError(f"hmla.{_FN}: argument '{arg}' has {x.dim()} dimensions, expected {ndim} {layout}")
    return [int(n) for n in x.shape]


def _dense_key(batch: int, s_q: int, h_q: int, h_kv: int) -> tuple:
    return ("dense", batch, s_q, h_q, h_kv)


def _sparse_key(q, indices, topk_length, extra_k_cache, extra_indices_in_kvcache, extra_topk_length) -> tuple:
    """What a sparse plan depends on besides the length values (the C++ plan key's fields)."""
    b, s_q, h_q, _ = _shape(q, 4, "q", _Q_LAYOUT)
    topk = _shape(indices, 3, "indices", "[batch, s_q, topk]")[2]
    extra = extra_k_cache is not None
    extra_topk = 0
    if extra and extra_indices_in_kvcache is not None:
        extra_topk = _shape(extra_indices_in_kvcache, 3, "extra_indices_in_kvcache", "[batch, s_q, extra_topk]")[2]
    return ("sparse", b, s_q, h_q, topk, extra, extra_topk, topk_length is not None, extra_topk_length is not None)


def _outputs(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as the eager call allocates them: the fake implementations return these too."""
    if q.dim() != 4:
        raise ValueError(f"hmla.{_FN}: argument 'q' has {q.dim()} dimensions, expected 4 {_Q_LAYOUT}")
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    return _TORCH.alloc_outputs(q, (b, s_q, h_q, _interface._D_V), (b, h_q, s_q))


# ---------------------------------------------------------------------------------------------
# The ops. Their bodies call the extension through the same helpers as the eager path.

@torch.library.custom_op("hmla::dense_decode_plan", mutates_args=("workspace",))
def dense_decode_plan(cache_seqlens: torch.Tensor, workspace: torch.Tensor, s_q: int, h_q: int, h_kv: int) -> None:
    _interface._dense_plan_into(workspace, _TORCH, cache_seqlens, _TORCH, s_q, h_q, h_kv, _FN)


@dense_decode_plan.register_fake
def _dense_decode_plan_fake(cache_seqlens, workspace, s_q, h_q, h_kv):
    return None


@torch.library.custom_op("hmla::dense_decode_run", mutates_args=("workspace",))
def dense_decode_run(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
                     workspace: torch.Tensor, softmax_scale: float, causal: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q, _ = _shape(q, 4, "q", _Q_LAYOUT)
    h_kv = _shape(k_cache, 4, "k_cache", "[num_blocks, page_block_size, h_kv, head_dim]")[2]
    schedule = _C.dense_decode_schedule(export(workspace, _TORCH, _FN, "workspace"), b, s_q, h_q, h_kv, _FN)
    return _interface._run_dense(_TORCH, q, k_cache, block_table, cache_seqlens, schedule, softmax_scale, causal, _FN)


@dense_decode_run.register_fake
def _dense_decode_run_fake(q, k_cache, block_table, cache_seqlens, workspace, softmax_scale, causal):
    return _outputs(q)


@torch.library.custom_op("hmla::sparse_decode_plan", mutates_args=("workspace",))
def sparse_decode_plan(workspace: torch.Tensor, topk_length: Optional[torch.Tensor],
                       extra_topk_length: Optional[torch.Tensor], batch: int, s_q: int, h_q: int, topk: int,
                       extra: bool, extra_topk: int) -> None:
    _interface._sparse_plan_into(workspace, _TORCH, batch, s_q, h_q, topk, extra, extra_topk, topk_length,
                                 extra_topk_length, _FN)


@sparse_decode_plan.register_fake
def _sparse_decode_plan_fake(workspace, topk_length, extra_topk_length, batch, s_q, h_q, topk, extra, extra_topk):
    return None


@torch.library.custom_op("hmla::sparse_decode_run", mutates_args=("workspace",))
def sparse_decode_run(q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor,
                      topk_length: Optional[torch.Tensor], attn_sink: Optional[torch.Tensor],
                      extra_k_cache: Optional[torch.Tensor], extra_indices_in_kvcache: Optional[torch.Tensor],
                      extra_topk_length: Optional[torch.Tensor], workspace: torch.Tensor,
                      softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    _, batch, s_q, h_q, topk, extra, extra_topk, with_length, with_extra_length = _sparse_key(
        q, indices, topk_length, extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    schedule = _C.sparse_decode_schedule(export(workspace, _TORCH, _FN, "workspace"), batch, s_q, h_q, topk,
                                         with_length, extra, extra_topk, with_extra_length, _FN)
    arrays = (q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    return _interface._run_sparse(_TORCH, arrays, schedule, softmax_scale, _FN)


@sparse_decode_run.register_fake
def _sparse_decode_run_fake(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                            extra_topk_length, workspace, softmax_scale):
    return _outputs(q)


# ---------------------------------------------------------------------------------------------
# What flash_mla_with_kvcache runs while Dynamo traces it. Everything here is traced Python: no call
# into the extension except through the ops above and the two size queries, which Dynamo evaluates
# once at trace time (their arguments are the specialised shape and the device).

@torch.compiler.assume_constant_result
def _dense_workspace_bytes(batch: int, s_q: int, h_q: int, h_kv: int, device: int) -> int:
    return _C.dense_decode_workspace_bytes(batch, s_q, h_q, h_kv, device, _FN)


@torch.compiler.assume_constant_result
def _sparse_workspace_bytes(batch: int, s_q: int, h_q: int, device: int) -> int:
    return _C.sparse_decode_workspace_bytes(batch, s_q, h_q, device, _FN)


def _check_head_dim_v(head_dim_v: int) -> None:
    # The eager path leaves this to the extension's checks, which the graph runs only at run time.
    if head_dim_v != _interface._D_V:
        raise ValueError(f"hmla.{_FN}: argument 'head_dim_v' is {head_dim_v}, expected {_interface._D_V}")


def _graph_workspace(meta: Any, like: torch.Tensor, need: int, device: int) -> torch.Tensor:
    """meta's workspace, a tensor of at least `need` bytes on like's device: the one it holds, or a new
    one allocated in the graph and kept by meta (as the eager path keeps the one it allocates)."""
    held = meta.workspace
    if held is not None and not isinstance(held, torch.Tensor):
        meta.workspace = None  # a CuPy or JAX workspace cannot enter a PyTorch graph
    _interface._ensure_workspace(meta, _TORCH, like, need, device)
    if meta.workspace is not held:
        meta._graph_plan = None  # a new workspace holds no plan
    return meta.workspace


def dense_decode(meta, q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal):
    _interface._check_dense_scalars(block_table, cache_seqlens, head_dim_v, _FN)
    _check_head_dim_v(head_dim_v)
    b, s_q, h_q, d_qk = _shape(q, 4, "q", _Q_LAYOUT)
    h_kv = _shape(k_cache, 4, "k_cache", "[num_blocks, page_block_size, h_kv, head_dim]")[2]
    device = q.get_device()
    workspace = _graph_workspace(meta, q, _dense_workspace_bytes(b, s_q, h_q, h_kv, device), device)
    key = _dense_key(b, s_q, h_q, h_kv)
    if meta._graph_plan != key:
        torch.ops.hmla.dense_decode_plan(cache_seqlens, workspace, s_q, h_q, h_kv)
        meta._graph_plan = key
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)
    return torch.ops.hmla.dense_decode_run(q, k_cache, block_table, cache_seqlens, workspace, scale, bool(causal))


def sparse_decode(meta, q, k_cache, head_dim_v, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                  extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length):
    _interface._check_sparse_scalars(indices, head_dim_v, softmax_scale, causal, is_fp8_kvcache, _FN)
    _check_head_dim_v(head_dim_v)
    key = _sparse_key(q, indices, topk_length, extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    _, b, s_q, h_q, topk, extra, extra_topk, _, _ = key
    d_qk = _shape(q, 4, "q", _Q_LAYOUT)[3]
    device = q.get_device()
    workspace = _graph_workspace(meta, q, _sparse_workspace_bytes(b, s_q, h_q, device), device)
    if meta._graph_plan != key:
        torch.ops.hmla.sparse_decode_plan(workspace, topk_length, extra_topk_length, b, s_q, h_q, topk, extra,
                                          extra_topk)
        meta._graph_plan = key
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)
    return torch.ops.hmla.sparse_decode_run(q, k_cache, indices, topk_length, attn_sink, extra_k_cache,
                                            extra_indices_in_kvcache, extra_topk_length, workspace, scale)


_interface._torch_compile = sys.modules[__name__]
