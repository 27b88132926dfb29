"""Merging partial attention results: ``merge_attention_states`` and its n-way form.

The same query rows attended over disjoint sets of keys (context parallelism, cascade / shared-prefix
attention, chunked prefill) give one ``(out, lse)`` per set; merged, they are the attention over the
union. ``out [batch, s_q, h, d_v]`` is bf16 or fp16 with a contiguous last dimension, ``lse
[batch, h, s_q]`` float32 natural-log (the layouts ``flash_mla_with_kvcache`` returns; other strides
work too). A state with ``lse = +inf`` (hmla's "no key") or ``-inf`` contributes nothing; a row with no
key in any state gets out 0 and lse +inf; a NaN propagates. The C++ op is ``hmla::merge_attention_states``
(include/hmla/merge.h); docs/API.md has the full contract.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from . import _C
from ._frameworks import adapter_for, export

_FN = "merge_attention_states"


def _split_states(x: Any, arg: str, rank: int) -> Sequence[Any]:
    """A sequence of arrays as given, or the states of one stacked array [n, ...]."""
    if isinstance(x, (list, tuple)):
        return x
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != rank + 1:
        raise TypeError(f"hmla.{_FN}: argument '{arg}' must be a list of arrays or one array stacked on a "
                        f"leading state dimension ({rank + 1} dimensions)")
    return [x[i] for i in range(shape[0])]


def merge_attention_states(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, *, out: Any = None,
                           lse: Any = None) -> Tuple[Any, Any]:
    """Merges two partial results: returns ``(out, lse)`` of the attention over both key sets.

    ``out`` / ``lse`` (optional) receive the result; passing ``out=out_a, lse=lse_a`` merges in place.
    Otherwise they are allocated with ``out_a``'s framework. Runs on ``out_a``'s current stream.
    """
    return merge_attention_states_n((out_a, out_b), (lse_a, lse_b), out=out, lse=lse)


def merge_attention_states_n(outs: Any, lses: Any, *, out: Any = None, lse: Any = None) -> Tuple[Any, Any]:
    """Merges n partial results (1 <= n <= 32) in one launch: ``outs`` and ``lses`` are lists of arrays
    or arrays stacked on a leading state dimension (``[n, batch, s_q, h, d_v]`` and ``[n, batch, h, s_q]``).

    ``out`` / ``lse`` as for ``merge_attention_states`` (``out=outs[0], lse=lses[0]`` merges in place).
    """
    out_list = _split_states(outs, "outs", 4)
    lse_list = _split_states(lses, "lses", 3)
    if len(out_list) == 0:
        raise ValueError(f"hmla.{_FN}: argument 'outs' is empty, expected 1..{_C.MAX_MERGE_STATES} arrays")
    first = out_list[0]
    fw = adapter_for(first, _FN, "outs[0]")
    if fw.host:
        raise ValueError(f"hmla.{_FN}: argument 'outs[0]' is a host ({fw.name}) array, expected a CUDA device array")
    shape = tuple(first.shape)
    if len(shape) != 4:
        raise ValueError(f"hmla.{_FN}: argument 'outs[0]' has shape {shape}, expected 4 dimensions [batch, s_q, h, d_v]")
    b, s_q, h, _ = shape
    if out is None:
        out = fw.empty(shape, first)
    if lse is None:
        lse = fw.empty_f32((b, h, s_q), first)
    out_caps = [export(x, adapter_for(x, _FN, f"outs[{i}]"), _FN, f"outs[{i}]") for i, x in enumerate(out_list)]
    lse_caps = [export(x, adapter_for(x, _FN, f"lses[{i}]"), _FN, f"lses[{i}]") for i, x in enumerate(lse_list)]
    stream = fw.stream(first)
    _C.merge_attention_states(out_caps, lse_caps, export(out, adapter_for(out, _FN, "out"), _FN, "out"),
                              export(lse, adapter_for(lse, _FN, "lse"), _FN, "lse"), stream)
    if fw.synchronous:
        fw.finish(stream, first)
    return out, lse
