"""CPU tests: import, FlashMLA-compatible signatures and metadata object, argument checking.

Runs without a GPU: host arrays and hand-made DLPack capsules (dlpack_util) exercise every check.
"""

import inspect

import numpy as np
import pytest

import hmla
import dlpack_util as dl


# ------------------------------------------------------------------------------------ import
def test_import_and_extension():
    assert hmla._C is not None
    assert hmla.__version__
    for name in hmla.__all__:
        assert hasattr(hmla, name), name
    assert hmla.cuda_device_count() >= 0


def test_set_launch_replay_switches_and_returns_the_previous_setting():
    # On by default unless HMLA_LAUNCH_REPLAY=0; whatever it was is restored.
    import os

    first = hmla.set_launch_replay(False)
    try:
        assert first == (os.environ.get("HMLA_LAUNCH_REPLAY") != "0")
        assert hmla.set_launch_replay(True) is False
        assert hmla.set_launch_replay(True) is True
    finally:
        hmla.set_launch_replay(first)


def test_signatures_match_flashmla():
    sig = inspect.signature(hmla.flash_mla_with_kvcache)
    assert list(sig.parameters) == [
        "q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata", "num_splits",
        "softmax_scale", "causal", "is_fp8_kvcache", "indices", "attn_sink", "extra_k_cache",
        "extra_indices_in_kvcache", "topk_length", "extra_topk_length",
    ]
    defaults = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    assert defaults == {
        "num_splits": None, "softmax_scale": None, "causal": False, "is_fp8_kvcache": False, "indices": None,
        "attn_sink": None, "extra_k_cache": None, "extra_indices_in_kvcache": None, "topk_length": None,
        "extra_topk_length": None,
    }
    sig = inspect.signature(hmla.flash_mla_sparse_fwd)
    assert list(sig.parameters)[:7] == ["q", "kv", "indices", "sm_scale", "d_v", "attn_sink", "topk_length"]
    assert sig.parameters["d_v"].default == 512
    sig = inspect.signature(hmla.get_mla_metadata)
    assert list(sig.parameters)[:6] == [
        "cache_seqlens", "num_q_tokens_per_head_k", "num_heads_k", "num_heads_q", "is_fp8_kvcache", "topk"]


def test_flash_mla_interface_alias():
    from hmla import flash_mla_interface as fmi

    assert fmi.flash_mla_with_kvcache is hmla.flash_mla_with_kvcache
    assert fmi.get_mla_metadata is hmla.get_mla_metadata


# ------------------------------------------------------------------------------------ metadata
def test_get_mla_metadata_new_style():
    meta, second = hmla.get_mla_metadata()
    assert second is None
    assert isinstance(meta, hmla.FlashMLASchedMeta)
    assert meta.have_initialized is False and meta.config is None
    assert meta.tile_scheduler_metadata is None and meta.num_splits is None
    assert meta.workspace is None
    # FlashMLA's current interface ignores its arguments; so does hmla when nothing is planned.
    meta2, _ = hmla.get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=4096, topk=2048,
                                     num_heads_q=64, num_heads_k=1, is_fp8_kvcache=True)
    assert isinstance(meta2, hmla.FlashMLASchedMeta)
    meta3, _ = hmla.get_mla_metadata(some_future_keyword=1)
    assert isinstance(meta3, hmla.FlashMLASchedMeta)


def test_metadata_reset_like_flashmla():
    meta, _ = hmla.get_mla_metadata()
    meta.tile_scheduler_metadata = None  # engines do this to force a new plan
    meta.num_splits = None
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        meta.tile_scheduler_metadata = object()
    with pytest.raises(ValueError, match="nothing was planned"):
        meta.replan()


def test_get_mla_metadata_rejects_host_seqlens():
    with pytest.raises(ValueError, match="'cache_seqlens' is in host memory"):
        hmla.get_mla_metadata(np.zeros(4, np.int32), 128, 1)


# ------------------------------------------------------------------------------------ dense checks
B, S_Q, H_Q, D = 2, 2, 16, 576


def dense_args(**over):
    a = dict(
        q=np.zeros((B, S_Q, H_Q, D), np.float16),
        k_cache=np.zeros((10, 64, 1, D), np.float16),
        block_table=np.zeros((B, 5), np.int32),
        cache_seqlens=np.zeros(B, np.int32),
    )
    a.update(over)
    return a


def check(**over):
    head_dim_v = over.pop("head_dim_v", 512)
    a = dense_args(**over)
    return hmla.check_dense_decode_args(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"], head_dim_v,
                                        require_cuda=False)


def test_dense_valid_shapes():
    s = check()
    assert s == {"batch": 2, "s_q": 2, "h_q": 16, "h_kv": 1, "head_dim": 576, "page_block_size": 64,
                 "num_blocks": 10, "dtype": "float16", "device": 0}
    s = check(k_cache=np.zeros((3, 16, 4, D), np.float16))
    assert s["h_kv"] == 4 and s["page_block_size"] == 16
    # bf16 through DLPack
    s = hmla.check_dense_decode_args(dl.bf16((B, S_Q, H_Q, D)), dl.bf16((10, 64, 1, D)), dl.i32((B, 5)),
                                     dl.i32((B,)), 512, require_cuda=False)
    assert s["dtype"] == "bfloat16"
    # a view with padding between heads (stride > 576) is fine
    big = np.zeros((B, S_Q, H_Q, D + 64), np.float16)
    assert check(q=big[..., :D])["h_q"] == H_Q


@pytest.mark.parametrize(
    "over, exc, arg, text",
    [
        (dict(q=np.zeros((B, S_Q, H_Q, D), np.float32)), TypeError, "q", "dtype float32"),
        (dict(k_cache=np.zeros((10, 64, 1, D), np.float32)), TypeError, "k_cache", "same dtype"),
        (dict(block_table=np.zeros((B, 5), np.int64)), TypeError, "block_table", "int32"),
        (dict(cache_seqlens=np.zeros(B, np.int64)), TypeError, "cache_seqlens", "int32"),
        (dict(q=np.zeros((B, H_Q, D), np.float16)), ValueError, "q", "4 dimensions"),
        (dict(k_cache=np.zeros((10, 64, D), np.float16)), ValueError, "k_cache", "4 dimensions"),
        (dict(block_table=np.zeros(B, np.int32)), ValueError, "block_table", "2 dimensions"),
        (dict(cache_seqlens=np.zeros((B, 1), np.int32)), ValueError, "cache_seqlens", "1 dimensions"),
        (dict(q=np.zeros((B, S_Q, H_Q, 2 * D), np.float16)[..., ::2]), ValueError, "q", "contiguous last dimension"),
        (dict(k_cache=np.zeros((10, 64, 1, 2 * D), np.float16)[..., ::2]), ValueError, "k_cache", "contiguous last"),
        (dict(block_table=np.zeros((B, 10), np.int32)[:, ::2]), ValueError, "block_table", "contiguous last"),
        (dict(cache_seqlens=np.zeros(2 * B, np.int32)[::2]), ValueError, "cache_seqlens", "contiguous"),
        (dict(q=np.zeros((B, S_Q, H_Q, 512), np.float16), k_cache=np.zeros((10, 64, 1, 512), np.float16)),
         ValueError, "q", "head_dim 512"),
        (dict(head_dim_v=576), ValueError, "head_dim_v", "expected 512"),
        (dict(k_cache=np.zeros((10, 64, 3, D), np.float16)), ValueError, "k_cache", "h_q % h_kv"),
        (dict(k_cache=np.zeros((10, 48, 1, D), np.float16)), ValueError, "k_cache", "page_block_size 48"),
        (dict(k_cache=np.zeros((0, 64, 1, D), np.float16)), ValueError, "k_cache", "no blocks"),
        (dict(q=np.zeros((B, 17, H_Q, D), np.float16)), ValueError, "q", "s_q"),
        (dict(q=np.zeros((B, 1, 256, D), np.float16)), ValueError, "q", "h_q 256"),
        (dict(q=np.zeros((0, S_Q, H_Q, D), np.float16)), ValueError, "q", "batch 0"),
        (dict(block_table=np.zeros((B + 1, 5), np.int32)), ValueError, "block_table", "shape"),
        (dict(block_table=np.zeros((B, 0), np.int32)), ValueError, "block_table", "no columns"),
        (dict(cache_seqlens=np.zeros(B + 1, np.int32)), ValueError, "cache_seqlens", "shape"),
        (dict(k_cache=np.zeros((10, 64, 1, D + 1), np.float16)), ValueError, "k_cache", "shape"),
    ],
)
def test_dense_bad_arguments(over, exc, arg, text):
    with pytest.raises(exc) as e:
        check(**over)
    msg = str(e.value)
    assert msg.startswith("hmla.flash_mla_with_kvcache: argument '" + arg + "'"), msg
    assert text in msg, msg


def test_dense_hmla_stride_check_is_reported():
    # Overlapping heads (stride 0 on an extent > 1) pass FlashMLA's checks but not hmla's.
    q = np.lib.stride_tricks.as_strided(np.zeros((B, S_Q, 1, D), np.float16), (B, S_Q, H_Q, D),
                                        (S_Q * D * 2, D * 2, 0, 2))
    with pytest.raises(ValueError, match="q_head_stride"):
        check(q=q)


def test_dense_device_checks():
    a = dense_args()
    with pytest.raises(ValueError, match="argument 'q' is on the CPU"):
        hmla.check_dense_decode_args(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"], 512)
    # arrays on two different devices
    with pytest.raises(ValueError, match="argument 'k_cache' is on cuda:1"):
        hmla.check_dense_decode_args(dl.bf16((B, S_Q, H_Q, D), device_type=dl.CUDA),
                                     dl.bf16((10, 64, 1, D), device_type=dl.CUDA, device_id=1),
                                     dl.i32((B, 5), device_type=dl.CUDA), dl.i32((B,), device_type=dl.CUDA), 512)


def test_flash_mla_with_kvcache_rejects_host_arrays_and_bad_objects():
    a = dense_args()
    meta, _ = hmla.get_mla_metadata()
    with pytest.raises(ValueError, match="argument 'q' is a host"):
        hmla.flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"], 512, meta)
    with pytest.raises(TypeError, match="argument 'tile_scheduler_metadata'"):
        hmla.flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"], 512, None)
    with pytest.raises(ValueError, match="argument 'num_splits' must be None"):
        hmla.flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"], 512, meta, 3)
    with pytest.raises(TypeError, match="argument 'q' has type"):
        hmla.flash_mla_with_kvcache([1, 2], a["k_cache"], a["block_table"], a["cache_seqlens"], 512, meta)
    with pytest.raises(ValueError, match="argument 'attn_sink' must be None for dense"):
        hmla.flash_mla_with_kvcache(a["q"], a["k_cache"], a["block_table"], a["cache_seqlens"], 512, meta,
                                    attn_sink=np.zeros(H_Q, np.float32))
    assert meta.have_initialized is False  # nothing was recorded by failed calls


def test_flash_mla_with_kvcache_missing_block_table():
    meta, _ = hmla.get_mla_metadata()
    q = dl.bf16((B, S_Q, H_Q, D), device_type=dl.CUDA)
    k = dl.bf16((10, 64, 1, D), device_type=dl.CUDA)
    with pytest.raises(ValueError, match="argument 'block_table' is None"):
        hmla.flash_mla_with_kvcache(q, k, None, dl.i32((B,), device_type=dl.CUDA), 512, meta)


# ------------------------------------------------------------------------------------ sparse decode
H_S = 64


def sparse_args(d_qk=576, **over):
    dev = dict(device_type=dl.CUDA)
    bpt = 656 if d_qk == 576 else 584
    a = dict(
        q=dl.bf16((B, S_Q, H_S, d_qk), **dev),
        k_cache=dl.u8((8, 64, 1, bpt), strides=(64 * 656 if d_qk == 576 else 37440, bpt, bpt, 1), **dev),
        indices=dl.i32((B, S_Q, 128), **dev),
    )
    a.update(over)
    return a


def sparse_call(meta=None, head_dim_v=512, **kw):
    meta = meta or hmla.get_mla_metadata()[0]
    a = sparse_args(kw.pop("d_qk", 576), **{k: v for k, v in kw.items() if k in ("q", "k_cache", "indices")})
    rest = {k: v for k, v in kw.items() if k not in ("q", "k_cache", "indices")}
    rest.setdefault("is_fp8_kvcache", True)
    return hmla.flash_mla_with_kvcache(a["q"], a["k_cache"], None, None, head_dim_v, meta, indices=a["indices"], **rest)


def sparse_check(d_qk=576, **kw):
    a = sparse_args(d_qk, **{k: v for k, v in kw.items() if k in ("q", "k_cache", "indices")})
    rest = {k: v for k, v in kw.items() if k not in ("q", "k_cache", "indices")}
    return hmla.check_sparse_decode_args(a["q"], a["k_cache"], a["indices"], **rest)


def test_sparse_decode_valid_arguments_pass_every_check():
    dev = dict(device_type=dl.CUDA)
    s = sparse_check()
    assert s == {"batch": B, "s_q": S_Q, "h_q": H_S, "head_dim": 576, "layout": "v32", "topk": 128,
                 "page_block_size": 64, "num_blocks": 8, "block_stride_bytes": 64 * 656, "extra_topk": None,
                 "extra_page_block_size": None, "device": 0}
    # FlashMLA's quantiser: V3.2 pages padded by one token, MODEL1 pages padded to a multiple of 576 bytes;
    # an extra cache with its own page size; every optional input; float8_e4m3fn bytes.
    s = sparse_check(k_cache=dl.FakeArray((8, 64, 1, 656), dl.FLOAT8_E4M3FN, 8, strides=(65 * 656, 656, 656, 1), **dev))
    assert s["block_stride_bytes"] == 65 * 656
    s = sparse_check(d_qk=512, topk_length=dl.i32((B,), **dev), attn_sink=dl.f32((H_S,), **dev),
                     extra_k_cache=dl.u8((4, 2, 1, 584), strides=(1728, 584, 584, 1), **dev),
                     extra_indices_in_kvcache=dl.i32((B, S_Q, 64), **dev), extra_topk_length=dl.i32((B,), **dev),
                     softmax_scale=0.05)
    assert (s["layout"], s["extra_topk"], s["extra_page_block_size"], s["block_stride_bytes"]) == ("model1", 64, 2, 37440)
    # host arrays pass with require_cuda=False
    s = sparse_check(q=dl.bf16((B, S_Q, H_S, 576)), k_cache=dl.u8((8, 64, 1, 656)), indices=dl.i32((B, S_Q, 128)),
                     require_cuda=False)
    assert s["device"] == 0


@pytest.mark.parametrize(
    "kw, exc, arg",
    [
        (dict(causal=True), ValueError, "causal"),
        (dict(is_fp8_kvcache=False), ValueError, "is_fp8_kvcache"),
        (dict(q=dl.f16((B, S_Q, H_S, 576), device_type=dl.CUDA)), TypeError, "q"),
        (dict(q=dl.bf16((B, S_Q, H_S, 576))), ValueError, "q"),  # host
        (dict(q=dl.bf16((B, S_Q, H_S, 640), device_type=dl.CUDA)), ValueError, "q"),
        (dict(head_dim_v=576), ValueError, "head_dim_v"),
        (dict(k_cache=dl.bf16((8, 64, 1, 576), device_type=dl.CUDA)), TypeError, "k_cache"),
        (dict(k_cache=dl.u8((8, 64, 1, 584), device_type=dl.CUDA)), ValueError, "k_cache"),
        (dict(k_cache=dl.u8((8, 64, 2, 656), device_type=dl.CUDA)), ValueError, "k_cache"),
        # model1 pages are padded to a multiple of 576 bytes: a dense [nb, 64, 1, 584] view is too tight
        (dict(d_qk=512, k_cache=dl.u8((8, 64, 1, 584), device_type=dl.CUDA)), ValueError, "k_cache"),
        (dict(k_cache=dl.u8((8, 64, 1, 656), device_type=dl.CUDA, strides=(64 * 700, 700, 656, 1))), ValueError,
         "k_cache"),
        (dict(indices=dl.FakeArray((B, S_Q, 128), dl.INT, 64, device_type=dl.CUDA)), TypeError, "indices"),
        (dict(indices=dl.i32((B, S_Q + 1, 128), device_type=dl.CUDA)), ValueError, "indices"),
        (dict(indices=dl.i32((B, S_Q, 0), device_type=dl.CUDA)), ValueError, "indices"),
        (dict(topk_length=dl.i32((B + 1,), device_type=dl.CUDA)), ValueError, "topk_length"),
        (dict(attn_sink=dl.bf16((H_S,), device_type=dl.CUDA)), TypeError, "attn_sink"),
        (dict(attn_sink=dl.f32((H_S + 1,), device_type=dl.CUDA)), ValueError, "attn_sink"),
        (dict(extra_k_cache=dl.u8((4, 32, 1, 656), device_type=dl.CUDA)), ValueError, "extra_indices_in_kvcache"),
        (dict(extra_indices_in_kvcache=dl.i32((B, S_Q, 8), device_type=dl.CUDA)), ValueError,
         "extra_indices_in_kvcache"),
        (dict(extra_topk_length=dl.i32((B,), device_type=dl.CUDA)), ValueError, "extra_topk_length"),
        (dict(topk_length=dl.i32((B,), device_type=dl.CUDA, device_id=3)), ValueError, "topk_length"),
        (dict(softmax_scale="0.1"), TypeError, "softmax_scale"),
    ],
)
def test_sparse_decode_bad_arguments(kw, exc, arg):
    with pytest.raises(exc) as e:
        sparse_call(**kw)
    assert str(e.value).startswith(f"hmla.flash_mla_with_kvcache: argument '{arg}'"), str(e.value)


# Checks that live in hmla::validate (C++): the message names the Python argument, then hmla's own
# message with the field of SparseDecodeParams.
@pytest.mark.parametrize(
    "kw, arg, field",
    [
        (dict(q=dl.bf16((16385, 2, 1, 576), strides=(0, 0, 0, 1), device_type=dl.CUDA),
              indices=dl.i32((16385, 2, 16), strides=(0, 0, 1), device_type=dl.CUDA)), "q", "batch"),
        (dict(q=dl.bf16((B, S_Q, 129, 576), device_type=dl.CUDA)), "q", "h_q"),
        (dict(q=dl.bf16((B, S_Q, H_S, 576), strides=(S_Q * H_S * 584, H_S * 584, 580, 1), device_type=dl.CUDA)),
         "q", "q_head_stride"),
        (dict(q=dl.bf16((B, S_Q, H_S, 576), strides=(S_Q * H_S * 576, H_S * 576, 0, 1), device_type=dl.CUDA)),
         "q", "q_head_stride"),
        (dict(head_dim_v=576), "head_dim_v", "d_v"),
        (dict(k_cache=dl.u8((0, 64, 1, 656), device_type=dl.CUDA)), "k_cache", "cache.num_blocks"),
        (dict(k_cache=dl.u8((8, 64, 1, 656), strides=(64 * 656 + 8, 656, 656, 1), device_type=dl.CUDA)),
         "k_cache", "cache.block_stride_bytes"),
        (dict(d_qk=512, k_cache=dl.u8((8, 64, 1, 584), device_type=dl.CUDA)), "k_cache", "cache.block_stride_bytes"),
        (dict(indices=dl.i32((B, S_Q, 0), device_type=dl.CUDA)), "indices", "topk"),
        (dict(indices=dl.i32((B, S_Q, 128), strides=(0, 128, 1), device_type=dl.CUDA)), "indices",
         "indices_batch_stride"),
        (dict(extra_k_cache=dl.u8((4, 32, 1, 656), strides=(31 * 656, 656, 656, 1), device_type=dl.CUDA),
              extra_indices_in_kvcache=dl.i32((B, S_Q, 8), device_type=dl.CUDA)), "extra_k_cache",
         "extra_cache.block_stride_bytes"),
        (dict(extra_k_cache=dl.u8((4, 32, 1, 656), device_type=dl.CUDA)), "extra_indices_in_kvcache",
         "extra_indices"),
        (dict(extra_k_cache=dl.u8((4, 32, 1, 656), device_type=dl.CUDA),
              extra_indices_in_kvcache=dl.i32((B, S_Q, 0), device_type=dl.CUDA)), "extra_indices_in_kvcache",
         "extra_topk"),
        (dict(extra_indices_in_kvcache=dl.i32((B, S_Q, 8), device_type=dl.CUDA)), "extra_indices_in_kvcache",
         "extra_indices"),
        (dict(extra_topk_length=dl.i32((B,), device_type=dl.CUDA)), "extra_topk_length", "extra_topk_length"),
        (dict(softmax_scale=-0.5), "softmax_scale", "softmax_scale"),
        (dict(softmax_scale=float("nan")), "softmax_scale", "softmax_scale"),
        (dict(softmax_scale=float("inf")), "softmax_scale", "softmax_scale"),
    ],
)
def test_sparse_decode_checks_of_hmla_validate(kw, arg, field):
    meta = hmla.get_mla_metadata()[0]
    with pytest.raises(ValueError) as e:
        sparse_call(meta, **kw)
    msg = str(e.value)
    assert msg.startswith(f"hmla.flash_mla_with_kvcache: argument '{arg}': hmla::sparse_decode: argument '{field}' is "), msg
    assert ", expected " in msg, msg
    assert meta.have_initialized is False and meta.workspace is None  # nothing recorded, nothing allocated


def test_sparse_decode_message_of_a_too_small_page_stride():
    with pytest.raises(ValueError) as e:
        sparse_call(d_qk=512, k_cache=dl.u8((8, 64, 1, 584), device_type=dl.CUDA))
    assert "argument 'cache.block_stride_bytes' is 37376, expected a multiple of 16 bytes, >= 37440" in str(e.value)


def test_sparse_decode_extra_lists_without_extra_cache_say_so():
    with pytest.raises(ValueError, match="given without extra_cache.data"):
        sparse_call(extra_indices_in_kvcache=dl.i32((B, S_Q, 8), device_type=dl.CUDA))


def test_fp8_without_indices_is_rejected():
    meta, _ = hmla.get_mla_metadata()
    a = sparse_args()
    with pytest.raises(ValueError, match="'is_fp8_kvcache' is True but 'indices' is None"):
        hmla.flash_mla_with_kvcache(a["q"], a["k_cache"], None, None, 512, meta, is_fp8_kvcache=True)


# ------------------------------------------------------------------------------------ sparse prefill
def prefill(**kw):
    dev = dict(device_type=dl.CUDA)
    a = dict(q=dl.bf16((32, 64, 576), **dev), kv=dl.bf16((100, 1, 576), **dev), indices=dl.i32((32, 1, 128), **dev),
             sm_scale=576 ** -0.5)
    a.update(kw)
    return hmla.flash_mla_sparse_fwd(**a)


def test_sparse_prefill_valid_arguments_pass_every_check():
    dev = dict(device_type=dl.CUDA)
    for kw in ({}, dict(q=dl.bf16((32, 128, 512), **dev), kv=dl.bf16((100, 1, 512), **dev),
                        attn_sink=dl.f32((128,), **dev), topk_length=dl.i32((32,), **dev))):
        a = dict(q=dl.bf16((32, 64, 576), **dev), kv=dl.bf16((100, 1, 576), **dev),
                 indices=dl.i32((32, 1, 128), **dev), sm_scale=576 ** -0.5, d_v=512, attn_sink=None,
                 topk_length=None, indexer_topk=0)
        a.update(kw)
        hmla._interface._check_sparse_prefill(**a, fn="flash_mla_sparse_fwd")


@pytest.mark.parametrize(
    "kw, exc, arg",
    [
        (dict(sm_scale=None), TypeError, "sm_scale"),
        (dict(d_v=576), ValueError, "d_v"),
        (dict(indexer_topk=100), ValueError, "indexer_topk"),
        (dict(q=dl.f16((32, 64, 576), device_type=dl.CUDA)), TypeError, "q"),
        (dict(q=dl.bf16((32, 64, 576))), ValueError, "q"),
        (dict(kv=dl.bf16((100, 2, 576), device_type=dl.CUDA)), ValueError, "kv"),
        (dict(kv=dl.bf16((100, 1, 512), device_type=dl.CUDA)), ValueError, "kv"),
        (dict(indices=dl.i32((31, 1, 128), device_type=dl.CUDA)), ValueError, "indices"),
        (dict(indices=dl.f32((32, 1, 128), device_type=dl.CUDA)), TypeError, "indices"),
        (dict(attn_sink=dl.f32((63,), device_type=dl.CUDA)), ValueError, "attn_sink"),
        (dict(topk_length=dl.i32((33,), device_type=dl.CUDA)), ValueError, "topk_length"),
    ],
)
def test_sparse_prefill_bad_arguments(kw, exc, arg):
    with pytest.raises(exc) as e:
        prefill(**kw)
    assert f"argument '{arg}'" in str(e.value), str(e.value)


def test_sparse_prefill_indexer_topk_h128():
    dev = dict(device_type=dl.CUDA)
    with pytest.raises(ValueError, match="indexer_topk"):
        prefill(q=dl.bf16((32, 128, 576), **dev), indexer_topk=512)


def test_sparse_prefill_batched_form_is_keyword_only():
    sig = inspect.signature(hmla.flash_mla_sparse_fwd)
    assert list(sig.parameters)[:8] == ["q", "kv", "indices", "sm_scale", "d_v", "attn_sink", "topk_length",
                                        "indexer_topk"]
    for name in ("cu_seqlens_q", "seq_kv_offset", "seq_kv_len"):
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert sig.parameters[name].default is None


def seqs(n=3, **kw):
    dev = dict(device_type=dl.CUDA)
    a = dict(cu_seqlens_q=dl.i32((n + 1,), **dev), seq_kv_offset=dl.i32((n,), **dev), seq_kv_len=dl.i32((n,), **dev))
    a.update(kw)
    return a


def test_sparse_prefill_batched_form_valid_arguments_pass_every_check():
    dev = dict(device_type=dl.CUDA)
    for n in (1, 3, 32):  # up to one sequence per query token
        a = dict(q=dl.bf16((32, 64, 576), **dev), kv=dl.bf16((100, 1, 576), **dev),
                 indices=dl.i32((32, 1, 128), **dev), sm_scale=576 ** -0.5, d_v=512, attn_sink=None,
                 topk_length=None, indexer_topk=0)
        hmla._interface._check_sparse_prefill(**a, fn="flash_mla_sparse_fwd", **seqs(n))


@pytest.mark.parametrize(
    "kw, exc, arg",
    [
        (dict(seq_kv_offset=None), ValueError, "seq_kv_offset"),  # all three or none
        (dict(cu_seqlens_q=None, seq_kv_len=None), ValueError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=dl.f32((4,), device_type=dl.CUDA)), TypeError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=dl.i32((4, 1), device_type=dl.CUDA)), ValueError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=dl.i32((4,))), ValueError, "cu_seqlens_q"),  # host memory
        (dict(cu_seqlens_q=dl.i32((1,), device_type=dl.CUDA)), ValueError, "cu_seqlens_q"),  # no sequence
        (dict(cu_seqlens_q=dl.i32((34,), device_type=dl.CUDA)), ValueError, "cu_seqlens_q"),  # more than s_q
        (dict(seq_kv_offset=dl.i32((4,), device_type=dl.CUDA)), ValueError, "seq_kv_offset"),
        (dict(seq_kv_offset=dl.i32((3,))), ValueError, "seq_kv_offset"),
        (dict(seq_kv_len=dl.u8((12,), device_type=dl.CUDA)), TypeError, "seq_kv_len"),
        (dict(seq_kv_len=dl.i32((2,), device_type=dl.CUDA)), ValueError, "seq_kv_len"),
    ],
)
def test_sparse_prefill_batched_form_bad_arguments(kw, exc, arg):
    with pytest.raises(exc) as e:
        prefill(**seqs(**kw))
    assert f"argument '{arg}'" in str(e.value), str(e.value)


# ------------------------------------------------------------------------------------ torch CPU (if installed)
def test_torch_cpu_tensors_are_rejected_with_names():
    torch = pytest.importorskip("torch")
    meta, _ = hmla.get_mla_metadata()
    q = torch.zeros(B, S_Q, H_Q, D, dtype=torch.bfloat16)
    k = torch.zeros(10, 64, 1, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'q' is on the CPU"):
        hmla.flash_mla_with_kvcache(q, k, torch.zeros(B, 5, dtype=torch.int32), torch.zeros(B, dtype=torch.int32),
                                    512, meta, causal=True)
    s = hmla.check_dense_decode_args(q, k, torch.zeros(B, 5, dtype=torch.int32), torch.zeros(B, dtype=torch.int32),
                                     require_cuda=False)
    assert s["dtype"] == "bfloat16"
    with pytest.raises(TypeError, match="argument 'q' has dtype float32"):
        hmla.check_dense_decode_args(q.float(), k, torch.zeros(B, 5, dtype=torch.int32),
                                     torch.zeros(B, dtype=torch.int32), require_cuda=False)


# ------------------------------------------------------------------- the PyTorch fast path's table
def _fast_call_table():
    """hmla._C's C function table for hmla._torch_fast (python/src/fast_call.h), read with ctypes."""
    import ctypes

    class RawArray(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * 8),
                    ("strides", ctypes.c_int64 * 8), ("dtype_code", ctypes.c_uint8), ("dtype_bits", ctypes.c_uint8),
                    ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    arrays = ctypes.POINTER(ctypes.POINTER(RawArray))
    # PYFUNCTYPE: called with the GIL held, and the Python error the function sets is raised.
    dense = ctypes.PYFUNCTYPE(ctypes.c_int, arrays, ctypes.py_object, ctypes.c_double, ctypes.c_int, ctypes.c_size_t)
    sparse = ctypes.PYFUNCTYPE(ctypes.c_int, arrays, ctypes.py_object, ctypes.c_double, ctypes.c_size_t)

    class FastCall(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("dense", dense), ("sparse", sparse)]

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = FastCall.from_address(get(hmla._C._fast_call, b"hmla._C._fast_call"))
    return table, RawArray


def test_fast_call_table_turns_errors_into_python_exceptions():
    import ctypes

    table, RawArray = _fast_call_table()
    assert table.version == 1
    raw = (ctypes.POINTER(RawArray) * 10)()  # every argument None
    # No schedule: a TypeError naming the argument, raised through the C interface (not a crash,
    # not a bare RuntimeError).
    with pytest.raises(TypeError, match="argument 'tile_scheduler_metadata' holds no hmla schedule"):
        table.dense(raw, None, 0.0, 0, 0)
    with pytest.raises(TypeError, match="argument 'tile_scheduler_metadata' holds no hmla schedule"):
        table.sparse(raw, object(), 0.0, 0)
