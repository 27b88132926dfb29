"""CPU tests of the Python call flow of flash_mla_with_kvcache: planning, metadata reuse, config checks.

A test framework adapter hands out arrays that claim to live on a CUDA device (hand-made DLPack
capsules, dlpack_util), so the real C++ argument checks run; the three entry points that would touch a
GPU (workspace size, plan, run) are replaced by recorders.
"""

import types

import pytest

import hmla
import dlpack_util as dl
from hmla import _C, _frameworks

B, S_Q, H_Q, H_KV, D = 3, 2, 32, 2, 576
STREAM = 1234


class FakeDeviceAdapter(_frameworks.Adapter):
    name = "fake-cuda"

    def dl(self, x):
        return x.__dlpack__()

    def stream(self, x):
        return STREAM

    def device_index(self, x):
        return x.device_id

    def empty(self, shape, like):
        return dl.FakeArray(shape, like.code, like.bits, device_type=dl.CUDA)

    def empty_f32(self, shape, like):
        return dl.f32(shape, device_type=dl.CUDA)

    def empty_bytes(self, nbytes, like):
        return dl.u8((nbytes,), device_type=dl.CUDA)

    def dtype_name(self, x):
        return {(dl.INT, 32): "int32"}.get((x.code, x.bits), "other")


@pytest.fixture
def gpu_free(monkeypatch):
    """Records plan/run calls instead of launching; returns the record."""
    rec = types.SimpleNamespace(plans=[], runs=[], ws_sizes=[])
    monkeypatch.setitem(_frameworks._BY_TYPE, dl.FakeArray, FakeDeviceAdapter())

    def ws_bytes(batch, s_q, h_q, h_kv, device, fn):
        rec.ws_sizes.append((batch, s_q, h_q, h_kv))
        return 1000 * batch + 10 * s_q * h_q + h_kv

    def plan(seqlens_cap, s_q, h_q, h_kv, ws_cap, stream, fn):
        rec.plans.append(dict(s_q=s_q, h_q=h_q, h_kv=h_kv, stream=stream, fn=fn))
        return types.SimpleNamespace(batch=rec.batch, s_q=s_q, h_q=h_q, h_kv=h_kv, device=0)

    def run(q, k, bt, sl, out, lse, sched, scale, causal, stream):
        rec.runs.append(dict(sched=sched, scale=scale, causal=causal, stream=stream))

    monkeypatch.setattr(_C, "dense_decode_workspace_bytes", ws_bytes)
    monkeypatch.setattr(_C, "dense_decode_plan", plan)
    monkeypatch.setattr(_C, "dense_decode_run", run)
    rec.batch = B
    return rec


def tensors(b=B, s_q=S_Q, h_q=H_Q, h_kv=H_KV):
    c = dict(device_type=dl.CUDA)
    return (dl.bf16((b, s_q, h_q, D), **c), dl.bf16((20, 64, h_kv, D), **c), dl.i32((b, 8), **c), dl.i32((b,), **c))


def test_plan_on_first_call_then_run_only(gpu_free):
    q, k, bt, sl = tensors()
    meta, none = hmla.get_mla_metadata()
    assert none is None
    out, lse = hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    assert out.shape == (B, S_Q, H_Q, 512) and (out.code, out.bits) == (dl.BFLOAT, 16)
    assert lse.shape == (B, H_Q, S_Q) and (lse.code, lse.bits) == (dl.FLOAT, 32)
    assert len(gpu_free.plans) == 1 and gpu_free.plans[0] == dict(s_q=S_Q, h_q=H_Q, h_kv=H_KV, stream=STREAM,
                                                                 fn="flash_mla_with_kvcache")
    assert meta.have_initialized
    assert meta.config == hmla.FlashMLASchedMeta.Config(B, S_Q, H_Q, 64, H_KV, True, False, None, None, None)
    assert meta.workspace_bytes == 1000 * B + 10 * S_Q * H_Q + H_KV
    for _ in range(3):  # other layers: run only
        hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    assert len(gpu_free.plans) == 1 and len(gpu_free.runs) == 4
    r = gpu_free.runs[0]
    assert r["scale"] == pytest.approx(576 ** -0.5) and r["causal"] is True and r["stream"] == STREAM
    assert r["sched"] is meta.schedule is meta.tile_scheduler_metadata
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, softmax_scale=0.25, causal=1)
    assert gpu_free.runs[-1]["scale"] == 0.25 and len(gpu_free.plans) == 1


def test_old_style_allocates_then_plans_on_first_call(gpu_free):
    q, k, bt, sl = tensors()
    meta, num_splits = hmla.get_mla_metadata(sl, S_Q * H_Q // H_KV, H_KV)
    assert num_splits is None and meta.schedule is None and not gpu_free.plans
    # sized for every (s_q, h_q) with s_q * h_q / h_kv = 32 and h_q <= 128
    assert sorted(gpu_free.ws_sizes) == sorted((B, s, 32 // s * H_KV, H_KV) for s in (1, 2, 4, 8, 16))
    ws = meta.workspace
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, num_splits, causal=True)
    assert len(gpu_free.plans) == 1 and meta.workspace is ws  # planned into the preallocated workspace


def test_full_shape_plans_inside_get_mla_metadata(gpu_free):
    q, k, bt, sl = tensors()
    meta, _ = hmla.get_mla_metadata(sl, S_Q * H_Q // H_KV, H_KV, num_heads_q=H_Q)
    assert len(gpu_free.plans) == 1 and gpu_free.plans[0]["fn"] == "get_mla_metadata"
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    assert len(gpu_free.plans) == 1 and len(gpu_free.runs) == 2
    # a hint that does not match the call: planned again for the real shape (FlashMLA ignores hints)
    meta2, _ = hmla.get_mla_metadata(sl, S_Q * H_Q // H_KV, H_KV, num_heads_q=H_Q // 2)
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta2, causal=True)
    assert gpu_free.plans[-1]["h_q"] == H_Q and len(gpu_free.plans) == 3


def test_consistency_checks_and_replanning(gpu_free):
    q, k, bt, sl = tensors()
    meta, _ = hmla.get_mla_metadata()
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    with pytest.raises(ValueError, match="set up for causal = True, but this call has causal = False"):
        hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=False)
    q2, k2, bt2, sl2 = tensors(s_q=1)
    with pytest.raises(ValueError, match="set up for s_q = 2"):
        hmla.flash_mla_with_kvcache(q2, k2, bt2, sl2, 512, meta, causal=True)
    with pytest.raises(ValueError, match="head_dim_v"):
        hmla.flash_mla_with_kvcache(q, k, bt, sl, 256, meta, causal=True)
    # FlashMLA's reset idiom: the next call plans again into the same workspace
    ws = meta.workspace
    meta.tile_scheduler_metadata = None
    hmla.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    assert len(gpu_free.plans) == 2 and meta.workspace is ws
    meta.replan()
    assert len(gpu_free.plans) == 3 and gpu_free.plans[-1]["fn"] == "FlashMLASchedMeta.replan"
    # have_initialized = False: the next call records a new config (and plans for the new shape)
    meta.have_initialized = False
    hmla.flash_mla_with_kvcache(q2, k2, bt2, sl2, 512, meta, causal=False)
    assert meta.config.s_q == 1 and gpu_free.plans[-1]["s_q"] == 1


def test_bad_hints(gpu_free):
    _, _, _, sl = tensors()
    with pytest.raises(ValueError, match="'num_heads_k' is 3, which does not divide num_heads_q = 32"):
        hmla.get_mla_metadata(sl, 64, 3, num_heads_q=32)
    with pytest.raises(ValueError, match="'num_q_tokens_per_head_k' is 1000"):
        hmla.get_mla_metadata(sl, 1000, 1, num_heads_q=32)
    with pytest.raises(ValueError, match="'num_q_tokens_per_head_k' is 4096"):
        hmla.get_mla_metadata(sl, 4096, 1)
    with pytest.raises(TypeError, match="'num_heads_k' is 1.5"):
        hmla.get_mla_metadata(sl, 64, 1.5)
    with pytest.raises(TypeError, match="'cache_seqlens' has dtype other"):
        hmla.get_mla_metadata(dl.f32((B,), device_type=dl.CUDA), 64, 1)
    with pytest.raises(ValueError, match="'cache_seqlens' has shape"):
        hmla.get_mla_metadata(dl.i32((B, 1), device_type=dl.CUDA), 64, 1)
