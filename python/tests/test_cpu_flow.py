"""CPU tests of the Python call flow of flash_mla_with_kvcache: planning, metadata reuse, config checks.

A test framework adapter hands out arrays that claim to live on a CUDA device (hand-made DLPack
capsules, dlpack_util), so the real C++ argument checks run; the three entry points of each decode
family that would touch a GPU (workspace size, plan, run) are replaced by recorders.
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
        return types.SimpleNamespace(batch=rec.batch, s_q=s_q, h_q=h_q, h_kv=h_kv, device=0, sparse=False)

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


# ------------------------------------------------------------------------------------ sparse decode
H_S, TOPK, PAGE = 64, 128, 64


@pytest.fixture
def sparse_gpu_free(monkeypatch):
    """Records the sparse plan/run calls instead of launching; returns the record."""
    rec = types.SimpleNamespace(plans=[], runs=[], ws_sizes=[])
    monkeypatch.setitem(_frameworks._BY_TYPE, dl.FakeArray, FakeDeviceAdapter())

    def ws_bytes(batch, s_q, h_q, device, fn):
        rec.ws_sizes.append((batch, s_q, h_q))
        return 100 * batch * s_q + h_q

    def plan(batch, s_q, h_q, topk, topk_length, extra, extra_topk, extra_topk_length, ws, stream, fn):
        rec.plans.append(dict(batch=batch, s_q=s_q, h_q=h_q, topk=topk, topk_length=topk_length is not None,
                              extra=extra, extra_topk=extra_topk, extra_topk_length=extra_topk_length is not None,
                              stream=stream, fn=fn))
        return types.SimpleNamespace(batch=batch, s_q=s_q, h_q=h_q, h_kv=1, device=0, sparse=True)

    def run(q, k, indices, topk_length, attn_sink, extra_k, extra_indices, extra_topk_length, out, lse, sched, scale,
            stream):
        rec.runs.append(dict(sched=sched, scale=scale, stream=stream, attn_sink=attn_sink is not None,
                             extra=extra_k is not None))

    monkeypatch.setattr(_C, "sparse_decode_workspace_bytes", ws_bytes)
    monkeypatch.setattr(_C, "sparse_decode_plan", plan)
    monkeypatch.setattr(_C, "sparse_decode_run", run)
    return rec


def sparse_tensors(b=B, s_q=S_Q, h_q=H_S, d_qk=576, topk=TOPK, page=PAGE, extra_topk=None, extra_page=2):
    """q, k_cache (FlashMLA's quantiser's page strides), indices, and an extra cache with its indices."""
    c = dict(device_type=dl.CUDA)
    bpt = 656 if d_qk == 576 else 584
    stride = (page + 1) * 656 if d_qk == 576 else hmla._C.sparse_page_bytes(1, page)
    t = dict(q=dl.bf16((b, s_q, h_q, d_qk), **c), k_cache=dl.u8((10, page, 1, bpt), strides=(stride, bpt, bpt, 1), **c),
             indices=dl.i32((b, s_q, topk), **c))
    if extra_topk is not None:
        t["extra_k_cache"] = dl.u8((6, extra_page, 1, bpt), strides=(hmla._C.sparse_page_bytes(d_qk == 512, extra_page),
                                                                      bpt, bpt, 1), **c)
        t["extra_indices_in_kvcache"] = dl.i32((b, s_q, extra_topk), **c)
    return t


def sparse(meta, t, **kw):
    t = dict(t)
    return hmla.flash_mla_with_kvcache(t.pop("q"), t.pop("k_cache"), None, None, 512, meta, None,
                                       is_fp8_kvcache=True, indices=t.pop("indices"), **t, **kw)


def test_sparse_plans_on_first_call_then_runs_only(sparse_gpu_free):
    rec = sparse_gpu_free
    t = sparse_tensors()
    meta, _ = hmla.get_mla_metadata()
    out, lse = sparse(meta, t)
    assert out.shape == (B, S_Q, H_S, 512) and (out.code, out.bits) == (dl.BFLOAT, 16)
    assert lse.shape == (B, H_S, S_Q) and (lse.code, lse.bits) == (dl.FLOAT, 32)
    assert rec.plans == [dict(batch=B, s_q=S_Q, h_q=H_S, topk=TOPK, topk_length=False, extra=False, extra_topk=0,
                              extra_topk_length=False, stream=STREAM, fn="flash_mla_with_kvcache")]
    assert meta.config == hmla.FlashMLASchedMeta.Config(B, S_Q, H_S, PAGE, 1, False, True, TOPK, None, None)
    assert meta.workspace_bytes == 100 * B * S_Q + H_S and rec.ws_sizes == [(B, S_Q, H_S)]
    t2 = sparse_tensors()  # other layers, other index lists of the same shape: run only
    for _ in range(3):
        sparse(meta, t2)
    assert len(rec.plans) == 1 and len(rec.runs) == 4
    assert rec.runs[0]["scale"] == pytest.approx(576 ** -0.5) and rec.runs[0]["stream"] == STREAM
    assert rec.runs[0]["sched"] is meta.schedule
    sparse(meta, t2, softmax_scale=0.25)
    assert rec.runs[-1]["scale"] == 0.25 and len(rec.plans) == 1
    m1 = hmla.get_mla_metadata()[0]
    sparse(m1, sparse_tensors(d_qk=512))
    assert rec.runs[-1]["scale"] == pytest.approx(512 ** -0.5)


def test_sparse_extra_cache_lengths_and_sink_reach_the_plan_and_run(sparse_gpu_free):
    rec = sparse_gpu_free
    c = dict(device_type=dl.CUDA)
    t = sparse_tensors(d_qk=512, extra_topk=64)
    meta, _ = hmla.get_mla_metadata(is_fp8_kvcache=True, topk=TOPK)
    assert meta.schedule is None and meta.workspace is None  # sparse: nothing prepared
    lengths = dl.i32((B,), **c)
    sparse(meta, t, topk_length=lengths, extra_topk_length=dl.i32((B,), **c), attn_sink=dl.f32((H_S,), **c))
    assert rec.plans[-1] | dict(stream=0, fn="") == dict(batch=B, s_q=S_Q, h_q=H_S, topk=TOPK, topk_length=True,
                                                         extra=True, extra_topk=64, extra_topk_length=True,
                                                         stream=0, fn="")
    assert rec.runs[-1]["attn_sink"] and rec.runs[-1]["extra"]
    assert meta.config.extra_page_block_size == 2 and meta.config.extra_topk == 64
    # replan(): same configuration, the lengths the last plan read unless new ones are given
    meta.replan()
    meta.replan(topk_length=dl.i32((B,), **c))
    assert len(rec.plans) == 3 and rec.plans[-1]["fn"] == "FlashMLASchedMeta.replan" and rec.plans[-1]["topk_length"]
    assert meta._lengths[0] is not lengths


def test_sparse_consistency_checks_and_replanning(sparse_gpu_free):
    rec = sparse_gpu_free
    c = dict(device_type=dl.CUDA)
    t = sparse_tensors()
    meta, _ = hmla.get_mla_metadata()
    sparse(meta, t)
    with pytest.raises(ValueError, match="set up for topk = 128, but this call has topk = 64"):
        sparse(meta, sparse_tensors(topk=64))
    with pytest.raises(ValueError, match="set up for h_q = 64"):
        sparse(meta, sparse_tensors(h_q=16))
    with pytest.raises(ValueError, match="set up for extra_page_block_size = None"):
        sparse(meta, sparse_tensors(extra_topk=64))
    with pytest.raises(ValueError, match="'causal' must be False"):
        sparse(meta, t, causal=True)
    with pytest.raises(ValueError, match="set up for is_fp8_kvcache = True"):  # a dense call on a sparse meta
        hmla.flash_mla_with_kvcache(dl.bf16((B, S_Q, H_S, 576), **c), dl.bf16((20, 64, 1, 576), **c),
                                    dl.i32((B, 8), **c), dl.i32((B,), **c), 512, meta)
    with pytest.raises(ValueError, match="argument 'cache_seqlens' is given, but this metadata object was planned "
                                         "for sparse decode"):
        meta.replan(dl.i32((B,), **c))
    with pytest.raises(ValueError, match="argument 'topk_length' is given, but the plan was made without it"):
        meta.replan(topk_length=dl.i32((B,), **c))
    assert len(rec.plans) == 1
    # topk_length appearing is a new plan input: planned again (FlashMLA's config does not record it)
    sparse(meta, t, topk_length=dl.i32((B,), **c))
    assert len(rec.plans) == 2 and rec.plans[-1]["topk_length"]
    sparse(meta, t, topk_length=dl.i32((B,), **c))
    assert len(rec.plans) == 2
    # FlashMLA's reset idiom: the next call plans again into the same workspace
    ws = meta.workspace
    meta.tile_scheduler_metadata = None
    sparse(meta, t, topk_length=dl.i32((B,), **c))
    assert len(rec.plans) == 3 and meta.workspace is ws
    # have_initialized = False: a new config is recorded and planned; a larger shape gets a larger workspace
    meta.have_initialized = False
    sparse(meta, sparse_tensors(b=2 * B, topk=2048, extra_topk=512))
    assert meta.config.b == 2 * B and rec.plans[-1]["extra_topk"] == 512 and meta.workspace is not ws
    assert meta.workspace_bytes == 100 * 2 * B * S_Q + H_S


def test_sparse_failed_first_call_records_nothing(sparse_gpu_free):
    meta, _ = hmla.get_mla_metadata()
    with pytest.raises(ValueError, match="argument 'k_cache': hmla::sparse_decode: argument 'cache.block_stride_bytes'"):
        sparse(meta, dict(sparse_tensors(), k_cache=dl.u8((10, PAGE, 1, 656), strides=(PAGE * 656 - 16, 656, 656, 1),
                                                          device_type=dl.CUDA)))
    assert not meta.have_initialized and meta.workspace is None and not sparse_gpu_free.plans
