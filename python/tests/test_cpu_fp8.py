"""CPU tests of the FP8 cache helpers against an independent NumPy reading of the byte layouts
(docs/API.md, "FP8 layout kV32" / "FP8 layout kModel1") and of the C++ reference's unpack."""

import numpy as np
import pytest

import hmla


def bf16_round(x):
    """float32 -> bf16 bit patterns (round to nearest even), NumPy only."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u >> 16) & 1) + np.uint32(0x7FFF)
    return ((u + r) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def e4m3_decode(codes):
    c = codes.astype(np.int32)
    sign = np.where(c >> 7, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    val = np.where((exp == 15) & (man == 7), np.nan, val)
    return (sign * val).astype(np.float32)


def decode_v32(pages, page_size):
    nb = pages.shape[0]
    out = np.empty((nb, page_size, 576), np.float32)
    for b in range(nb):
        for t in range(page_size):
            tok = pages[b, t * 656:(t + 1) * 656]
            scales = tok[512:528].copy().view("<f4")
            nope = e4m3_decode(tok[:512]).reshape(4, 128) * scales[:, None]
            out[b, t, :512] = nope.reshape(-1)
            out[b, t, 512:] = bf16_to_f32(tok[528:656].copy().view("<u2"))
    return out


def decode_model1(pages, page_size):
    nb = pages.shape[0]
    out = np.empty((nb, page_size, 512), np.float32)
    for b in range(nb):
        for t in range(page_size):
            data = pages[b, t * 576:(t + 1) * 576]
            sc = pages[b, page_size * 576 + t * 8: page_size * 576 + t * 8 + 8]
            assert sc[7] == 0
            scales = np.ldexp(np.float32(1), sc[:7].astype(np.int32) - 127).astype(np.float32)
            nope = e4m3_decode(data[:448]).reshape(7, 64) * scales[:, None]
            out[b, t, :448] = nope.reshape(-1)
            out[b, t, 448:] = bf16_to_f32(data[448:576].copy().view("<u2"))
    return out


def make_cache(d_qk, num_blocks=3, page_size=16, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((num_blocks, page_size, 1, d_qk)) * rng.uniform(0.01, 30, (num_blocks, page_size, 1, 1)))
    x = x.astype(np.float32)
    x[0, 0] = 0.0  # an all-zero token: every tile gets scale 1
    return bf16_round(x)


@pytest.mark.parametrize("layout, d_qk, bpt", [("v32", 576, 656), ("model1", 512, 584)])
def test_pack_matches_layout_and_reference(layout, d_qk, bpt):
    bits = make_cache(d_qk)
    nb, ps = bits.shape[:2]
    packed = hmla.pack_fp8_cache(bits)  # uint16 input = bf16 bit patterns; layout from head_dim
    page_bytes = ps * 656 if layout == "v32" else -(-ps * 584 // 576) * 576
    assert packed.dtype == np.uint8
    assert packed.shape == (nb, ps, 1, bpt)
    assert packed.strides == (page_bytes, bpt, bpt, 1)
    pages = hmla.pack_fp8_cache(bits, layout=layout, return_pages=True)
    assert pages.shape == (nb, page_bytes)
    assert np.array_equal(np.lib.stride_tricks.as_strided(pages, packed.shape, packed.strides), packed)

    ours = (decode_v32 if layout == "v32" else decode_model1)(pages, ps)
    ref = hmla.unpack_fp8_cache(packed)  # hmla::reference::unpack_token
    assert ref.shape == (nb, ps, 1, d_qk) and ref.dtype == np.float32
    np.testing.assert_array_equal(ours, ref.reshape(nb, ps, d_qk))

    x = bf16_to_f32(bits.reshape(nb, ps, d_qk))
    n_nope = 512 if layout == "v32" else 448
    tile = 128 if layout == "v32" else 64
    # RoPE values are stored as bf16, bit for bit
    np.testing.assert_array_equal(ours[..., n_nope:], x[..., n_nope:])
    # NoPE values: within one e4m3 rounding step of the tile's scale
    xt = x[..., :n_nope].reshape(nb, ps, -1, tile)
    amax = np.abs(xt).max(-1, keepdims=True)
    err = np.abs(ours[..., :n_nope].reshape(xt.shape) - xt)
    assert np.all(err <= amax * 2.0 ** -4 + 1e-30)
    # the all-zero token decodes to zeros
    assert not ours[0, 0].any()


def test_scales_follow_the_contract():
    bits = make_cache(576, num_blocks=1, page_size=4, seed=1)
    pages = hmla.pack_fp8_cache(bits, return_pages=True)
    x = bf16_to_f32(bits.reshape(4, 576))
    for t in range(4):
        scales = pages[0, t * 656 + 512: t * 656 + 528].copy().view("<f4")
        amax = np.abs(x[t, :512].reshape(4, 128)).max(-1)
        want = np.where(amax > 0, (amax / np.float32(448)).astype(np.float32), np.float32(1))
        np.testing.assert_array_equal(scales, want)
    bits = make_cache(512, num_blocks=1, page_size=4, seed=2)
    pages = hmla.pack_fp8_cache(bits, return_pages=True)
    x = bf16_to_f32(bits.reshape(4, 512))
    for t in range(4):
        sc = pages[0, 4 * 576 + t * 8: 4 * 576 + t * 8 + 7].astype(np.int32)
        amax = np.abs(x[t, :448].reshape(7, 64)).max(-1)
        need = (amax / np.float32(448)).astype(np.float32)
        scale = np.ldexp(1.0, sc - 127)
        ok = np.where(amax > 0, (scale >= need) & (scale / 2 < need), sc == 127)
        assert ok.all()


def test_model1_page_padding():
    assert hmla._C.sparse_page_bytes(1, 64) == 37440
    assert hmla._C.sparse_page_bytes(0, 64) == 64 * 656
    bits = make_cache(512, num_blocks=2, page_size=64)
    assert hmla.pack_fp8_cache(bits).strides[0] == 37440


def test_input_dtypes_and_ranks():
    bits = make_cache(576, num_blocks=2, page_size=8)
    x32 = bf16_to_f32(bits)
    a = hmla.pack_fp8_cache(bits)
    b = hmla.pack_fp8_cache(x32)  # float32 rounded to bf16 by the C++ reference: same bytes
    np.testing.assert_array_equal(a, b)
    c = hmla.pack_fp8_cache(bits[:, :, 0, :])  # 3-D input -> 3-D view
    assert c.shape == (2, 8, 656)
    np.testing.assert_array_equal(c, a[:, :, 0, :])
    assert hmla.unpack_fp8_cache(c).shape == (2, 8, 576)
    # float8 view of the bytes (as FlashMLA users keep it) unpacks the same
    np.testing.assert_array_equal(hmla.unpack_fp8_cache(a.view(np.int8)), hmla.unpack_fp8_cache(a))


def test_fp8_cache_view_numpy():
    bits = make_cache(512, num_blocks=2, page_size=32)
    pages = hmla.pack_fp8_cache(bits, return_pages=True)
    view = hmla.fp8_cache_view(pages, 32, "model1")
    np.testing.assert_array_equal(view, hmla.pack_fp8_cache(bits))
    np.testing.assert_array_equal(hmla.unpack_fp8_cache(pages, layout="model1", page_block_size=32),
                                  hmla.unpack_fp8_cache(view))


def test_fp8_errors():
    with pytest.raises(ValueError, match="cannot infer the FP8 layout from head_dim 128"):
        hmla.pack_fp8_cache(np.zeros((1, 4, 1, 128), np.uint16))
    with pytest.raises(ValueError, match="argument 'layout'"):
        hmla.pack_fp8_cache(np.zeros((1, 4, 1, 576), np.uint16), layout="v4")
    with pytest.raises(ValueError, match="head_dim 576, layout 'model1' needs 512"):
        hmla.pack_fp8_cache(np.zeros((1, 4, 1, 576), np.uint16), layout="model1")
    with pytest.raises(TypeError, match="argument 'k_cache' has dtype int32"):
        hmla.pack_fp8_cache(np.zeros((1, 4, 1, 576), np.int32))
    with pytest.raises(ValueError, match="h_kv = 1"):
        hmla.pack_fp8_cache(np.zeros((1, 4, 2, 576), np.uint16))
    with pytest.raises(ValueError, match="'page_block_size' is required"):
        hmla.unpack_fp8_cache(np.zeros((2, 656 * 4), np.uint8))
    with pytest.raises(TypeError, match="1-byte elements"):
        hmla.unpack_fp8_cache(np.zeros((2, 4, 1, 656), np.float32))
    with pytest.raises(ValueError, match="cannot infer the FP8 layout from 600 bytes per token"):
        hmla.unpack_fp8_cache(np.zeros((2, 4, 1, 600), np.uint8))
    with pytest.raises(ValueError, match="whole pages"):
        hmla.unpack_fp8_cache(np.zeros((2, 4, 1, 700), np.uint8)[..., :656])


def test_torch_cpu_round_trip():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 16, 1, 576).to(torch.bfloat16)
    packed = hmla.pack_fp8_cache(x)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8
    assert packed.shape == (2, 16, 1, 656)
    back = hmla.unpack_fp8_cache(packed)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float32
    np.testing.assert_array_equal(back.numpy(), hmla.unpack_fp8_cache(packed.numpy()))
    err = (back - x.float()).abs().max().item()
    assert err <= x.float().abs().max().item() * 2 ** -4
    assert torch.equal(back[..., 512:], x.float()[..., 512:])
    pages = hmla.pack_fp8_cache(x.float()[..., :512], return_pages=True)  # float32 -> bf16 -> model1
    view = hmla.fp8_cache_view(pages, 16, "model1")
    assert view.stride() == (pages.stride(0), 584, 584, 1)
    with pytest.raises(ValueError, match="CPU tensor"):
        hmla.pack_fp8_cache(x.to("meta"))
