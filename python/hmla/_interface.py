"""FlashMLA's Python interface over hmla: get_mla_metadata, flash_mla_with_kvcache, flash_mla_sparse_fwd.

Signatures, shapes, dtypes and defaults follow FlashMLA's current ``flash_mla_interface.py``, so
``import hmla as flash_mla`` works for code written for FlashMLA: dense decode, token-sparse decode
over FP8 caches and token-sparse prefill (``flash_mla_sparse_fwd``).

Scheduling (the one place where hmla has to choose, see docs/PYTHON.md "Metadata and planning"):
hmla's plan needs (batch, s_q, h_q, h_kv) and the device-side sequence lengths. The plan runs

* inside ``get_mla_metadata`` when it is given the old interface's arguments and the full shape:
  ``cache_seqlens``, ``num_q_tokens_per_head_k``, ``num_heads_k`` and ``num_heads_q``;
* otherwise on the first ``flash_mla_with_kvcache`` call with that metadata object (this is what
  FlashMLA's current interface does); when that first call is captured in a CUDA graph, the plan is
  part of the graph and every replay re-plans from the lengths then in ``cache_seqlens``.

Later calls only run the attention. The metadata object owns hmla's workspace (allocated once, with
the caller's framework, by ``get_mla_metadata`` when it is given ``cache_seqlens``, else by the first
call) and keeps the schedule. Reuse a metadata object only while the shapes and the values of
``cache_seqlens`` stay the same (FlashMLA's rule), or re-plan with ``meta.replan(cache_seqlens)`` or
by setting ``meta.tile_scheduler_metadata = None``.

Sparse decode (``indices`` given) plans on the first call, from the shape, ``topk``, the extra
cache's presence and ``extra_topk``, and the values in ``topk_length`` / ``extra_topk_length`` (when
given). The same rule holds: reuse the metadata object while those stay the same, or re-plan with
``meta.replan(topk_length=..., extra_topk_length=...)`` or ``meta.tile_scheduler_metadata = None``.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Optional, Tuple

from . import _C
from ._frameworks import _BY_TYPE, Adapter, adapter_for, export


_MAX_S_Q = 16
_MAX_H_Q = 128
_D_V = 512  # head_dim_v: the only value hmla's kernels (and FlashMLA's) support


class _NoTorchCompile:
    """What the attention functions see of torch.compile where PyTorch is absent: never tracing."""

    @staticmethod
    def is_compiling() -> bool:
        return False


# While torch.compile traces a call, the call takes hmla._torch_library's path (PyTorch custom ops)
# instead of the extension's, which Dynamo cannot trace. That module puts itself here on import.
_torch_compile: Any = _NoTorchCompile


@dataclasses.dataclass(frozen=True)
class _SparsePlan:
    """What a sparse decode plan depends on, besides the values in the length arrays."""

    batch: int
    s_q: int
    h_q: int
    topk: int
    extra: bool
    extra_topk: int
    topk_length: bool
    extra_topk_length: bool
    device: int


class FlashMLASchedMeta:
    """Tile-scheduler metadata of one (shape, sequence lengths) combination; owns hmla's workspace.

    Attributes (FlashMLA-compatible): ``have_initialized``, ``config`` (a ``Config``, recorded by the
    first ``flash_mla_with_kvcache`` call), ``tile_scheduler_metadata`` and ``num_splits`` (the hmla
    schedule, ``None`` until planned; assigning ``None`` to either makes the next call re-plan).
    hmla additions: ``workspace`` (the device buffer, an array of the caller's framework),
    ``workspace_bytes``, ``schedule`` and ``replan()``.
    """

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    def __init__(self) -> None:
        self.have_initialized: bool = False
        self.config: Optional[FlashMLASchedMeta.Config] = None
        self.workspace: Any = None
        self.workspace_bytes: int = 0
        self._schedule: Any = None
        self._key: Any = None  # fast-path key of the recorded config
        self._seqlens: Any = None  # the cache_seqlens the last plan read (for replan())
        self._plan_shape: Any = None  # dense: (s_q, h_q, h_kv) of the last plan; sparse: a _SparsePlan
        self._lengths: Any = None  # sparse: (topk_length, extra_topk_length) the last plan read
        self._workspace_fw: Any = None  # the adapter that allocated the workspace
        self._workspace_device: Optional[int] = None
        self._graph_plan: Any = None  # what a torch.compile graph planned into the workspace (a key tuple)

    # ---- FlashMLA's fields
    @property
    def tile_scheduler_metadata(self) -> Any:
        return self._schedule

    @tile_scheduler_metadata.setter
    def tile_scheduler_metadata(self, value: Any) -> None:
        if value is not None and value is not self._schedule:
            raise ValueError(
                "hmla.FlashMLASchedMeta: tile_scheduler_metadata can only be set to None (re-plan on the "
                "next call); hmla keeps its schedule in the metadata object's workspace"
            )
        self._schedule = value
        if value is None:
            self._graph_plan = None  # compiled calls re-plan too

    @property
    def num_splits(self) -> Any:
        return self._schedule

    @num_splits.setter
    def num_splits(self, value: Any) -> None:
        self.tile_scheduler_metadata = value

    # ---- hmla's additions
    @property
    def schedule(self) -> Any:
        """The hmla plan (``hmla._C.Schedule``) or None."""
        return self._schedule

    def replan(self, cache_seqlens: Any = None, *, topk_length: Any = None, extra_topk_length: Any = None) -> None:
        """Re-runs hmla's plan into this object's workspace on the current stream (same shape).

        For engines that reuse one metadata object (and a CUDA graph that captured only the attention
        calls) while the sequence lengths change: call it before the calls (or before the replay)
        that should see the new lengths. Dense decode: ``cache_seqlens`` defaults to the array the
        last plan read. Sparse decode: ``topk_length`` / ``extra_topk_length`` default to the arrays
        the last plan read (whether each is given at all cannot change: that is a new configuration).
        """
        fn = "FlashMLASchedMeta.replan"
        if self._plan_shape is None:
            raise ValueError(f"hmla.{fn}: nothing was planned yet (call flash_mla_with_kvcache first)")
        if isinstance(self._plan_shape, _SparsePlan):
            if cache_seqlens is not None:
                raise ValueError(f"hmla.{fn}: argument 'cache_seqlens' is given, but this metadata object was "
                                 "planned for sparse decode (pass topk_length / extra_topk_length)")
            plan = self._plan_shape
            for name, given, planned in (("topk_length", topk_length, plan.topk_length),
                                         ("extra_topk_length", extra_topk_length, plan.extra_topk_length)):
                if given is not None and not planned:
                    raise ValueError(f"hmla.{fn}: argument '{name}' is given, but the plan was made without it "
                                     "(a new configuration: let the next flash_mla_with_kvcache call plan)")
            lengths = (self._lengths[0] if topk_length is None else topk_length,
                       self._lengths[1] if extra_topk_length is None else extra_topk_length)
            _plan_sparse(self, self._workspace_fw, self.workspace, plan, lengths[0], lengths[1], fn)
            return
        if topk_length is not None or extra_topk_length is not None:
            name = "topk_length" if topk_length is not None else "extra_topk_length"
            raise ValueError(f"hmla.{fn}: argument '{name}' is given, but this metadata object was planned for "
                             "dense decode (pass cache_seqlens)")
        seqlens = self._seqlens if cache_seqlens is None else cache_seqlens
        s_q, h_q, h_kv = self._plan_shape
        fw = adapter_for(seqlens, fn, "cache_seqlens")
        _plan(self, fw, seqlens, s_q, h_q, h_kv, fn)

    def __repr__(self) -> str:
        return (
            f"hmla.FlashMLASchedMeta(have_initialized={self.have_initialized}, config={self.config}, "
            f"schedule={self._schedule}, workspace_bytes={self.workspace_bytes})"
        )


def _positive_int(value: Any, fn: str, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"hmla.{fn}: argument '{arg}' is {value!r}, expected a positive int")
    if int(value) < 1:
        raise ValueError(f"hmla.{fn}: argument '{arg}' is {value}, expected >= 1")
    return int(value)


def _device_of(fw: Adapter, x: Any, fn: str, arg: str) -> int:
    dev = None if fw.host else fw.device_index(x)
    if dev is None:
        raise ValueError(f"hmla.{fn}: argument '{arg}' is in host memory, expected a CUDA device array")
    return dev


def _ensure_workspace(meta: FlashMLASchedMeta, fw: Adapter, like: Any, need: int, device: int) -> None:
    """Keeps the workspace when it is large enough and on the device, else allocates one with fw."""
    if meta.workspace is None or meta.workspace_bytes < need or meta._workspace_device != device:
        meta.workspace = fw.empty_bytes(need, like)
        meta.workspace_bytes = need
        meta._workspace_fw = fw
        meta._workspace_device = device


def _dense_plan_into(workspace: Any, wfw: Adapter, cache_seqlens: Any, fw: Adapter, s_q: int, h_q: int, h_kv: int,
                     fn: str) -> Any:
    """hmla's dense plan for the lengths in cache_seqlens, written into workspace (of wfw's framework) on
    the current stream of cache_seqlens' framework fw; returns the schedule."""
    return _C.dense_decode_plan(export(cache_seqlens, fw, fn, "cache_seqlens"), s_q, h_q, h_kv,
                                export(workspace, wfw, fn, "workspace"), fw.stream(cache_seqlens), fn)


def _plan(meta: FlashMLASchedMeta, fw: Adapter, cache_seqlens: Any, s_q: int, h_q: int, h_kv: int, fn: str) -> Any:
    """Makes sure the workspace is large enough (allocating it with fw), then plans into it."""
    device = _device_of(fw, cache_seqlens, fn, "cache_seqlens")
    batch = _batch_of(cache_seqlens, fn)
    need = _C.dense_decode_workspace_bytes(batch, s_q, h_q, h_kv, device, fn)
    _ensure_workspace(meta, fw, cache_seqlens, need, device)
    meta._schedule = _dense_plan_into(meta.workspace, meta._workspace_fw, cache_seqlens, fw, s_q, h_q, h_kv, fn)
    meta._seqlens = cache_seqlens
    meta._plan_shape = (s_q, h_q, h_kv)
    return meta._schedule


def _batch_of(cache_seqlens: Any, fn: str) -> int:
    shape = tuple(cache_seqlens.shape)
    if len(shape) != 1:
        raise ValueError(f"hmla.{fn}: argument 'cache_seqlens' has shape {shape}, expected 1 dimension [batch]")
    if shape[0] < 1:
        raise ValueError(f"hmla.{fn}: argument 'cache_seqlens' is empty (batch = 0), expected batch >= 1")
    return int(shape[0])


def get_mla_metadata(
    cache_seqlens: Any = None,
    num_q_tokens_per_head_k: Optional[int] = None,
    num_heads_k: Optional[int] = None,
    num_heads_q: Optional[int] = None,
    is_fp8_kvcache: bool = False,
    topk: Optional[int] = None,
    **kwargs: Any,
) -> Tuple[FlashMLASchedMeta, None]:
    """Returns ``(FlashMLASchedMeta, None)``, as FlashMLA's current interface does.

    Both FlashMLA call styles work: ``sched_meta, _ = get_mla_metadata()`` (plan on the first
    ``flash_mla_with_kvcache`` call) and the older
    ``tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)``
    (``num_splits`` is None and is passed back unchanged). For dense decode with ``cache_seqlens``
    given, the workspace is allocated here with ``cache_seqlens``' framework; if ``num_heads_q`` is also
    given the shape is known and the plan runs here too, on the current stream. Other keyword
    arguments are accepted and ignored, as FlashMLA does.
    """
    fn = "get_mla_metadata"
    meta = FlashMLASchedMeta()
    if _torch_compile.is_compiling():
        return meta, None  # the compiled flash_mla_with_kvcache call allocates and plans in the graph
    if cache_seqlens is None or is_fp8_kvcache or topk is not None:
        return meta, None  # nothing to prepare: plan on the first call (sparse: it knows topk and the lengths)

    fw = adapter_for(cache_seqlens, fn, "cache_seqlens")
    device = _device_of(fw, cache_seqlens, fn, "cache_seqlens")
    batch = _batch_of(cache_seqlens, fn)
    if fw.dtype_name(cache_seqlens) != "int32":
        raise TypeError(f"hmla.{fn}: argument 'cache_seqlens' has dtype {fw.dtype_name(cache_seqlens)}, expected int32")
    if num_q_tokens_per_head_k is None or num_heads_k is None:
        return meta, None
    rows = _positive_int(num_q_tokens_per_head_k, fn, "num_q_tokens_per_head_k")
    h_kv = _positive_int(num_heads_k, fn, "num_heads_k")

    if num_heads_q is not None:
        h_q = _positive_int(num_heads_q, fn, "num_heads_q")
        if h_q % h_kv != 0:
            raise ValueError(f"hmla.{fn}: argument 'num_heads_k' is {h_kv}, which does not divide num_heads_q = {h_q}")
        if h_q > _MAX_H_Q:
            raise ValueError(f"hmla.{fn}: argument 'num_heads_q' is {h_q}, expected 1..{_MAX_H_Q}")
        if (rows * h_kv) % h_q != 0 or not 1 <= (rows * h_kv) // h_q <= _MAX_S_Q:
            raise ValueError(
                f"hmla.{fn}: argument 'num_q_tokens_per_head_k' is {rows}, expected s_q * num_heads_q // num_heads_k "
                f"with s_q in 1..{_MAX_S_Q} (num_heads_q = {h_q}, num_heads_k = {h_kv})"
            )
        s_q = (rows * h_kv) // h_q
        _plan(meta, fw, cache_seqlens, s_q, h_q, h_kv, fn)
        return meta, None

    # s_q and h_q are not known separately: size the workspace for the largest compatible shape and
    # plan on the first call, which knows them.
    need = 0
    for s_q in range(1, _MAX_S_Q + 1):
        if rows % s_q == 0 and (rows // s_q) * h_kv <= _MAX_H_Q:
            need = max(need, _C.dense_decode_workspace_bytes(batch, s_q, (rows // s_q) * h_kv, h_kv, device, fn))
    if need == 0:
        raise ValueError(
            f"hmla.{fn}: argument 'num_q_tokens_per_head_k' is {rows}, which is not s_q * h_q / h_kv for any "
            f"s_q in 1..{_MAX_S_Q} and h_q <= {_MAX_H_Q} (num_heads_k = {h_kv})"
        )
    _ensure_workspace(meta, fw, cache_seqlens, need, device)
    return meta, None


def _shape4(x: Any, fn: str, arg: str, layout: str) -> Tuple[int, int, int, int]:
    try:
        shape = tuple(x.shape)
    except AttributeError:
        raise TypeError(f"hmla.{fn}: argument '{arg}' has type {type(x).__qualname__}, expected an array") from None
    if len(shape) != 4:
        raise ValueError(f"hmla.{fn}: argument '{arg}' has shape {shape}, expected 4 dimensions {layout}")
    return shape  # type: ignore[return-value]


def _check_config(meta: FlashMLASchedMeta, config: "FlashMLASchedMeta.Config", fn: str) -> None:
    """FlashMLA's rule: calls that share an initialised metadata object have its recorded config."""
    if meta.have_initialized and meta.config is not None and meta.config != config:
        for field in dataclasses.fields(config):
            have, got = getattr(meta.config, field.name), getattr(config, field.name)
            if have != got:
                raise ValueError(
                    f"hmla.{fn}: tile_scheduler_metadata was set up for {field.name} = {have}, but this call has "
                    f"{field.name} = {got}. Use one metadata object per shape (get_mla_metadata() again), as "
                    "with FlashMLA: the arguments must stay consistent across calls that share sched_meta."
                )


def _check_dense_scalars(block_table, cache_seqlens, head_dim_v, fn):
    """The dense call's checks that need no array memory (shared with the torch.compile path)."""
    if block_table is None or cache_seqlens is None:
        missing = "block_table" if block_table is None else "cache_seqlens"
        raise ValueError(f"hmla.{fn}: argument '{missing}' is None; block_table and cache_seqlens are required for dense attention")
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, numbers.Integral):
        raise TypeError(f"hmla.{fn}: argument 'head_dim_v' is {head_dim_v!r}, expected the int 512")


def _first_dense_call(meta, fw, q, k_cache, block_table, cache_seqlens, head_dim_v, causal, key, fn):
    """Slow path of flash_mla_with_kvcache: checks, config bookkeeping, and the plan when needed."""
    _check_dense_scalars(block_table, cache_seqlens, head_dim_v, fn)
    # Full argument check (FlashMLA's checks plus hmla's stride/alignment checks) before anything runs.
    shape = _C.check_dense_decode_args(
        export(q, fw, fn, "q"), export(k_cache, fw, fn, "k_cache"), export(block_table, fw, fn, "block_table"),
        export(cache_seqlens, fw, fn, "cache_seqlens"), int(head_dim_v), True)
    b, s_q, h_q, page, h_kv = key[0], key[1], key[2], key[3], key[4]
    config = FlashMLASchedMeta.Config(b, s_q, h_q, page, h_kv, causal, False, None, None, None)
    _check_config(meta, config, fn)
    sched = meta._schedule
    if sched is None or sched.sparse or (sched.batch, sched.s_q, sched.h_q, sched.h_kv) != (b, s_q, h_q, h_kv) \
            or sched.device != shape["device"]:
        sched = _plan(meta, adapter_for(cache_seqlens, fn, "cache_seqlens"), cache_seqlens, s_q, h_q, h_kv, fn)
    meta.config = config
    meta.have_initialized = True
    meta._key = key
    return sched


def flash_mla_with_kvcache(
    q: Any,
    k_cache: Any,
    block_table: Any,
    cache_seqlens: Any,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Any = None,
    attn_sink: Any = None,
    extra_k_cache: Any = None,
    extra_indices_in_kvcache: Any = None,
    topk_length: Any = None,
    extra_topk_length: Any = None,
) -> Tuple[Any, Any]:
    """MLA decode attention over a paged KV cache (FlashMLA's ``flash_mla_with_kvcache``).

    Dense (``indices`` None): q ``[batch, s_q, h_q, 576]`` bf16/fp16, k_cache
    ``[num_blocks, page_block_size, h_kv, 576]`` (same dtype; V is its first 512 columns),
    block_table ``[batch, max_num_blocks_per_seq]`` int32, cache_seqlens ``[batch]`` int32,
    head_dim_v 512. Returns ``out [batch, s_q, h_q, 512]`` (q's dtype) and
    ``lse [batch, h_q, s_q]`` float32, allocated with q's framework, computed on its current stream.
    ``causal``: query token i of a request sees its first ``s_k - s_q + i + 1`` keys.
    Sparse (``indices`` given, ``is_fp8_kvcache=True``, ``causal=False``): q ``[batch, s_q, h_q, 576 | 512]``
    bf16, k_cache FlashMLA's FP8 view ``[num_blocks, page_block_size, 1, 656 | 584]`` (1-byte dtype, any
    page stride), indices ``[batch, s_q, topk]`` int32 (``page * page_block_size + offset``; -1 and
    out-of-range values are skipped); optional ``topk_length [batch]`` int32, ``attn_sink [h_q]``
    float32, ``extra_k_cache`` (same layout, own page size) with ``extra_indices_in_kvcache
    [batch, s_q, extra_topk]`` and ``extra_topk_length [batch]``. Returns ``out [batch, s_q, h_q, 512]``
    bf16 and ``lse [batch, h_q, s_q]`` float32.
    """
    fn = "flash_mla_with_kvcache"
    meta = tile_scheduler_metadata
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError(
            f"hmla.{fn}: argument 'tile_scheduler_metadata' has type {type(meta).__qualname__}, expected the "
            "hmla.FlashMLASchedMeta returned by hmla.get_mla_metadata()"
        )
    if num_splits is not None:
        raise ValueError(f"hmla.{fn}: argument 'num_splits' must be None (the second value get_mla_metadata returns)")
    if indices is not None or is_fp8_kvcache:
        return _sparse_decode(meta, q, k_cache, head_dim_v, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                              extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    if attn_sink is not None or extra_k_cache is not None or extra_indices_in_kvcache is not None \
            or topk_length is not None or extra_topk_length is not None:
        name = next(n for n, v in (("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                                   ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                                   ("topk_length", topk_length), ("extra_topk_length", extra_topk_length)) if v is not None)
        raise ValueError(f"hmla.{fn}: argument '{name}' must be None for dense attention (it needs indices)")
    if _torch_compile.is_compiling():
        return _torch_compile.dense_decode(meta, q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale,
                                           causal)

    fw = _BY_TYPE.get(type(q)) or adapter_for(q, fn, "q")
    fast = fw.fast
    if fast is not None and meta.have_initialized and meta._schedule is not None:
        # A planned call in C++ (hmla._torch_fast): the same key comparison as below, then the run;
        # None when the call needs this function's own path.
        result = fast.dense_decode_planned(q, k_cache, block_table, cache_seqlens, meta._schedule, meta._key,
                                           softmax_scale, causal, head_dim_v)
        if result is not None:
            return result
    if fw.host:
        raise ValueError(f"hmla.{fn}: argument 'q' is a host ({fw.name}) array, expected a CUDA device array")
    try:
        b, s_q, h_q, d_qk = q.shape
        _, page, h_kv, _ = k_cache.shape
    except Exception:  # wrong rank or not an array: the named error
        b, s_q, h_q, d_qk = _shape4(q, fn, "q", "[batch, s_q, h_q, head_dim]")
        _, page, h_kv, _ = _shape4(k_cache, fn, "k_cache", "[num_blocks, page_block_size, h_kv, head_dim]")
    causal = bool(causal)
    key = (b, s_q, h_q, page, h_kv, causal, head_dim_v)  # hmla._torch_fast.dense_decode_planned reads this layout
    sched = meta._schedule
    if sched is None or key != meta._key or not meta.have_initialized:
        sched = _first_dense_call(meta, fw, q, k_cache, block_table, cache_seqlens, head_dim_v, causal, key, fn)
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    return _run_dense(fw, q, k_cache, block_table, cache_seqlens, sched, softmax_scale, causal, fn)


def _run_dense(fw, q, k_cache, block_table, cache_seqlens, sched, softmax_scale, causal, fn):
    """Allocates (out, lse) with q's framework fw and runs the dense attention with sched on q's stream
    (the eager call's and the PyTorch custom op's launch)."""
    qt = type(q)
    fast = fw.fast
    if fast is not None and qt is fw.tensor_type and type(k_cache) is qt and type(block_table) is qt \
            and type(cache_seqlens) is qt:
        return fast.dense_decode(q, k_cache, block_table, cache_seqlens, sched, softmax_scale, causal, fw.stream(q))
    b, s_q, h_q, _ = q.shape
    out, lse = fw.alloc_outputs(q, (b, s_q, h_q, _D_V), (b, h_q, s_q))
    stream = fw.stream(q)
    dl = fw.dl
    caps = None
    if type(k_cache) is qt and type(block_table) is qt and type(cache_seqlens) is qt:
        try:
            caps = (dl(q), dl(k_cache), dl(block_table), dl(cache_seqlens))
        except Exception:
            caps = None
    if caps is None:  # mixed frameworks, or an export failed: per-argument, with named errors
        caps = (export(q, fw, fn, "q"), export(k_cache, fw, fn, "k_cache"),
                export(block_table, fw, fn, "block_table"), export(cache_seqlens, fw, fn, "cache_seqlens"))
    _C.dense_decode_run(caps[0], caps[1], caps[2], caps[3], dl(out), dl(lse), sched, softmax_scale, causal, stream)
    if fw.synchronous:
        fw.finish(stream, q)
    return out, lse


_SPARSE_ARGS = ("q", "k_cache", "indices", "topk_length", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache",
                "extra_topk_length")
_FP8_CACHES = ("k_cache", "extra_k_cache")


def _sparse_exports(arrays, fn):
    """DLPack capsules of the sparse inputs (None stays None), each through its own framework; the FP8
    caches viewed as bytes first (not every framework exports float8 over DLPack)."""
    caps = []
    for x, arg in zip(arrays, _SPARSE_ARGS):
        if x is None:
            caps.append(None)
            continue
        a = adapter_for(x, fn, arg)
        caps.append(export(a.as_bytes(x) if arg in _FP8_CACHES else x, a, fn, arg))
    return caps


def _sparse_plan_into(workspace: Any, wfw: Adapter, batch: int, s_q: int, h_q: int, topk: int, extra: bool,
                      extra_topk: int, topk_length: Any, extra_topk_length: Any, fn: str) -> Any:
    """hmla's sparse plan (for the values in the optional length arrays), written into workspace (of wfw's
    framework) on that framework's current stream; returns the schedule."""
    lengths = _sparse_exports((None, None, None, topk_length, None, None, None, extra_topk_length), fn)
    return _C.sparse_decode_plan(batch, s_q, h_q, topk, lengths[3], extra, extra_topk, lengths[7],
                                 export(workspace, wfw, fn, "workspace"), wfw.stream(workspace), fn)


def _plan_sparse(meta: FlashMLASchedMeta, fw: Adapter, like: Any, plan: _SparsePlan, topk_length: Any,
                 extra_topk_length: Any, fn: str) -> Any:
    """Makes sure the workspace is large enough (allocating it with fw, like `like`), then plans into it
    on the workspace's current stream."""
    need = _C.sparse_decode_workspace_bytes(plan.batch, plan.s_q, plan.h_q, plan.device, fn)
    _ensure_workspace(meta, fw, like, need, plan.device)
    meta._schedule = _sparse_plan_into(meta.workspace, meta._workspace_fw, plan.batch, plan.s_q, plan.h_q, plan.topk,
                                       plan.extra, plan.extra_topk, topk_length, extra_topk_length, fn)
    meta._plan_shape = plan
    meta._lengths = (topk_length, extra_topk_length)
    return meta._schedule


def _check_sparse_scalars(indices, head_dim_v, softmax_scale, causal, is_fp8_kvcache, fn):
    """The sparse call's checks that need no array memory (shared with the torch.compile path)."""
    if indices is None:
        raise ValueError(
            f"hmla.{fn}: argument 'is_fp8_kvcache' is True but 'indices' is None: FP8 KV caches are used by "
            "sparse attention only (pass indices), as in FlashMLA's current interface"
        )
    if causal:
        raise ValueError(f"hmla.{fn}: argument 'causal' must be False when sparse attention is enabled (indices given)")
    if not is_fp8_kvcache:
        raise ValueError(f"hmla.{fn}: argument 'is_fp8_kvcache' must be True when sparse attention is enabled (indices given)")
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real)):
        raise TypeError(f"hmla.{fn}: argument 'softmax_scale' is {softmax_scale!r}, expected a float or None")
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, numbers.Integral):
        raise TypeError(f"hmla.{fn}: argument 'head_dim_v' is {head_dim_v!r}, expected the int 512")


def _first_sparse_call(meta, fw, arrays, head_dim_v, softmax_scale, causal, is_fp8_kvcache, key, fn):
    """Slow path of sparse flash_mla_with_kvcache: every check, config bookkeeping, the plan when needed."""
    q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices, extra_topk_length = arrays
    _check_sparse_scalars(indices, head_dim_v, softmax_scale, causal, is_fp8_kvcache, fn)
    # Every check (the metadata here, the rest in hmla::validate) before anything is allocated or
    # launched; 0 stands for the default scale.
    shape = _C.check_sparse_decode_args(*_sparse_exports(arrays, fn), int(head_dim_v),
                                        0.0 if softmax_scale is None else float(softmax_scale), True)
    extra = shape["extra_topk"] is not None
    config = FlashMLASchedMeta.Config(shape["batch"], shape["s_q"], shape["h_q"], shape["page_block_size"], 1, False,
                                      True, shape["topk"], shape["extra_page_block_size"], shape["extra_topk"])
    _check_config(meta, config, fn)
    plan = _SparsePlan(shape["batch"], shape["s_q"], shape["h_q"], shape["topk"], extra,
                       shape["extra_topk"] if extra else 0, topk_length is not None, extra_topk_length is not None,
                       shape["device"])
    if meta._schedule is None or meta._plan_shape != plan:
        _plan_sparse(meta, fw, q, plan, topk_length, extra_topk_length, fn)
    meta.config = config
    meta.have_initialized = True
    meta._key = key
    return meta._schedule


def _sparse_decode(meta, q, k_cache, head_dim_v, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                   extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length):
    fn = "flash_mla_with_kvcache"
    if _torch_compile.is_compiling():
        return _torch_compile.sparse_decode(meta, q, k_cache, head_dim_v, softmax_scale, causal, is_fp8_kvcache,
                                            indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
                                            extra_topk_length)
    fw = _BY_TYPE.get(type(q)) or adapter_for(q, fn, "q")
    if fw.host:
        raise ValueError(f"hmla.{fn}: argument 'q' is a host ({fw.name}) array, expected a CUDA device array")
    arrays = (q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    try:
        b, s_q, h_q, d_qk = q.shape
        key = (b, s_q, h_q, d_qk, k_cache.shape[1], indices.shape[-1],
               None if extra_k_cache is None else extra_k_cache.shape[1],
               None if extra_indices_in_kvcache is None else extra_indices_in_kvcache.shape[-1],
               topk_length is None, extra_topk_length is None, causal, is_fp8_kvcache, head_dim_v)
    except Exception:  # not arrays, or the wrong rank: the slow path names the argument
        key = None
    sched = meta._schedule
    if key is None or sched is None or key != meta._key or not meta.have_initialized:
        sched = _first_sparse_call(meta, fw, arrays, head_dim_v, softmax_scale, causal, is_fp8_kvcache, key, fn)
        b, s_q, h_q, d_qk = q.shape
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    return _run_sparse(fw, arrays, sched, softmax_scale, fn)


def _run_sparse(fw, arrays, sched, softmax_scale, fn):
    """Allocates (out, lse) with q's framework fw and runs the sparse attention with sched on q's stream
    (the eager call's and the PyTorch custom op's launch). arrays: the inputs in _SPARSE_ARGS order."""
    q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache, extra_topk_length = arrays
    qt = type(q)
    fast = fw.fast
    if fast is not None and qt is fw.tensor_type and all(x is None or type(x) is qt for x in arrays):
        return fast.sparse_decode(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                                  extra_topk_length, sched, softmax_scale, fw.stream(q))
    b, s_q, h_q, _ = q.shape
    out, lse = fw.alloc_outputs(q, (b, s_q, h_q, _D_V), (b, h_q, s_q))
    stream = fw.stream(q)
    dl = fw.dl
    caps = None
    # The byte views of the caches stay referenced until the call returns (after a synchronous
    # framework's wait): the kernels read them.
    k_bytes = fw.as_bytes(k_cache) if type(k_cache) is qt else None
    extra_bytes = fw.as_bytes(extra_k_cache) if type(extra_k_cache) is qt else None
    if k_bytes is not None and (extra_k_cache is None or extra_bytes is not None) and all(
            x is None or type(x) is qt for x in arrays):
        try:
            caps = (dl(q), dl(k_bytes), dl(indices), None if topk_length is None else dl(topk_length),
                    None if attn_sink is None else dl(attn_sink), None if extra_bytes is None else dl(extra_bytes),
                    None if extra_indices_in_kvcache is None else dl(extra_indices_in_kvcache),
                    None if extra_topk_length is None else dl(extra_topk_length))
        except Exception:
            caps = None
    if caps is None:  # mixed frameworks, or an export failed: per-argument, with named errors
        caps = _sparse_exports(arrays, fn)
    _C.sparse_decode_run(*caps, dl(out), dl(lse), sched, softmax_scale, stream)
    if fw.synchronous:
        fw.finish(stream, q)
    return out, lse


def _check_sparse_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, indexer_topk, fn,
                          cu_seqlens_q=None, seq_kv_offset=None, seq_kv_len=None):
    """flash_mla_sparse_fwd's checks (ValueError/TypeError naming the argument); returns q's framework
    adapter and the DLPack export of an optional argument. The batched form's arrays are checked for
    their metadata only (dtype, rank, device, lengths): their values are device data."""
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"hmla.{fn}: argument 'sm_scale' is {sm_scale!r}, expected a float")
    for name, v in (("d_v", d_v), ("indexer_topk", indexer_topk)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"hmla.{fn}: argument '{name}' is {v!r}, expected an int")
    fw = adapter_for(q, fn, "q")
    if fw.host:
        raise ValueError(f"hmla.{fn}: argument 'q' is a host ({fw.name}) array, expected a CUDA device array")

    def ex(x, arg):
        if x is None:
            return None
        return export(x, adapter_for(x, fn, arg), fn, arg)

    _C.check_sparse_prefill_args(ex(q, "q"), ex(kv, "kv"), ex(indices, "indices"), int(d_v), ex(attn_sink, "attn_sink"),
                                 ex(topk_length, "topk_length"), int(indexer_topk), ex(cu_seqlens_q, "cu_seqlens_q"),
                                 ex(seq_kv_offset, "seq_kv_offset"), ex(seq_kv_len, "seq_kv_len"), True)
    if indexer_topk > 0 and tuple(q.shape)[1] == 128:
        raise ValueError(f"hmla.{fn}: argument 'indexer_topk' > 0 is not supported for h_q == 128 (as in FlashMLA)")
    return fw, ex


def flash_mla_sparse_fwd(
    q: Any,
    kv: Any,
    indices: Any,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Any = None,
    topk_length: Any = None,
    indexer_topk: int = 0,
    *,
    cu_seqlens_q: Any = None,
    seq_kv_offset: Any = None,
    seq_kv_len: Any = None,
) -> Tuple[Any, Any, Any]:
    """Token-sparse prefill (FlashMLA's ``flash_mla_sparse_fwd``): q ``[s_q, h_q, d_qk]`` bf16,
    kv ``[s_kv, 1, d_qk]`` bf16, indices ``[s_q, 1, topk]`` int32 -> (out, max_logits, lse).

    Indices < 0 or >= s_kv are skipped; ``topk_length[s]`` limits token s to its first entries;
    ``attn_sink [h_q]`` as in decode. Returns ``out [s_q, h_q, 512]`` bf16, ``max_logits`` and ``lse``
    ``[s_q, h_q]`` float32 (natural log of the scaled scores; a token with no valid key: out 0, lse
    +inf, max_logits -inf), in q's framework, on q's current stream.

    hmla's batched form (keyword only, all three or none, int32 device arrays): the tokens are
    ``num_seqs`` sequences, sequence i being tokens ``[cu_seqlens_q[i], cu_seqlens_q[i + 1])``
    (``cu_seqlens_q [num_seqs + 1]``, from 0 to s_q); its indices address only its own kv rows, index
    j being valid when ``0 <= j < seq_kv_len[i]`` and naming row ``seq_kv_offset[i] + j``
    (``seq_kv_offset``, ``seq_kv_len [num_seqs]``). One call then serves several requests.
    """
    fn = "flash_mla_sparse_fwd"
    fw, ex = _check_sparse_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, indexer_topk, fn,
                                   cu_seqlens_q, seq_kv_offset, seq_kv_len)
    s_q, h_q = int(q.shape[0]), int(q.shape[1])
    out, lse = fw.alloc_outputs(q, (s_q, h_q, _D_V), (s_q, h_q))
    max_logits = fw.empty_f32((s_q, h_q), q)
    # The workspace that cuts the last round of items over the SMs it would leave idle (a few MB at
    # most, from the framework's allocator; none when the items fill whole rounds).
    ws_bytes = _C.sparse_prefill_workspace_bytes(s_q, h_q, int(indices.shape[-1]), fw.device_index(q))
    workspace = fw.empty_bytes(ws_bytes, q) if ws_bytes > 0 else None
    _C.sparse_prefill_run(ex(q, "q"), ex(kv, "kv"), ex(indices, "indices"), float(sm_scale), int(d_v),
                          ex(attn_sink, "attn_sink"), ex(topk_length, "topk_length"), int(indexer_topk),
                          ex(cu_seqlens_q, "cu_seqlens_q"), ex(seq_kv_offset, "seq_kv_offset"),
                          ex(seq_kv_len, "seq_kv_len"), export(out, fw, fn, "out"),
                          export(max_logits, fw, fn, "max_logits"), export(lse, fw, fn, "lse"),
                          export(workspace, fw, fn, "workspace") if workspace is not None else None, fw.stream(q))
    return out, max_logits, lse
