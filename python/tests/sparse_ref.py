"""FP8 caches as FlashMLA's quantiser lays them out, and the float64 reference of sparse decode.

``quantize(torch, kv, layout)`` follows the byte layouts of docs/API.md ("FP8 layout kV32 / kModel1")
with the scales FlashMLA's own quantiser picks (powers of two >= amax / 448) and its page strides:
V3.2 pages are followed by one unused token (block stride (page + 1) * 656), MODEL1 pages are padded
to a multiple of 576 bytes. It returns FlashMLA's view ``[num_blocks, page, 1, bytes_per_token]`` of
dtype float8_e4m3fn and the dequantised tokens in float64, computed from the codes and scales (not
by reading the bytes back), so the reference does not depend on any unpacking code.

``reference(torch, q, scopes, scale, sink)`` is contract 2 of docs/API.md in float64.
"""

import math

V32, MODEL1 = "v32", "model1"
_GEOMETRY = {  # d_qk, d_nope, tile, bytes per token
    V32: (576, 512, 128, 656),
    MODEL1: (512, 448, 64, 584),
}


def layout_of(d_qk):
    return V32 if d_qk == 576 else MODEL1


def quantize(torch, kv, layout):
    """kv [num_blocks, page, 1, d_qk] bf16 (CUDA) -> (FP8 view, dequantised [num_blocks * page, d_qk] float64)."""
    d_qk, d_nope, tile, bpt = _GEOMETRY[layout]
    num_blocks, page, _, d = kv.shape
    assert d == d_qk
    x = kv.view(num_blocks, page, d_qk)
    nope = x[..., :d_nope].float().view(num_blocks, page, d_nope // tile, tile)
    amax = nope.abs().amax(-1)
    scale = torch.exp2(torch.ceil(torch.log2((amax / 448.0).clamp_min(1e-4))))  # [nb, page, tiles]
    codes = (nope / scale[..., None]).to(torch.float8_e4m3fn)
    rope = x[..., d_nope:].contiguous()
    deq = torch.cat([(codes.double() * scale[..., None].double()).reshape(num_blocks, page, d_nope),
                     rope.double()], -1).reshape(num_blocks * page, d_qk)
    code_bytes = codes.reshape(num_blocks, page, d_nope).view(torch.uint8)
    rope_bytes = rope.view(torch.uint8)  # 2 bytes per value, little endian
    if layout == V32:
        buf = torch.zeros(num_blocks, page + 1, bpt, dtype=torch.uint8, device=kv.device)
        buf[:, :page, :d_nope] = code_bytes
        buf[:, :page, d_nope:d_nope + 16] = scale.float().contiguous().view(torch.uint8)
        buf[:, :page, d_nope + 16:] = rope_bytes
        view = buf[:, :page].view(num_blocks, page, 1, bpt)
    else:
        data_bytes = d_nope + 2 * (d_qk - d_nope)  # 576
        page_bytes = math.ceil(page * bpt / data_bytes) * data_bytes
        buf = torch.zeros(num_blocks, page_bytes, dtype=torch.uint8, device=kv.device)
        data = buf[:, :page * data_bytes].view(num_blocks, page, data_bytes)
        data[..., :d_nope] = code_bytes
        data[..., d_nope:] = rope_bytes
        exponents = torch.log2(scale).round().to(torch.int32) + 127
        scales = buf[:, page * data_bytes:page * bpt].view(num_blocks, page, 8)
        scales[..., :d_nope // tile] = exponents.to(torch.uint8)
        view = buf[:, :page * bpt].view(num_blocks, page, 1, bpt)
    return view.view(torch.float8_e4m3fn), deq


def reference(torch, q, scopes, scale, sink=None):
    """q [b, s_q, h_q, d] bf16; scopes: [(dequantised [n, d] float64, indices [b, s_q, t], lengths [b] or None)].

    Returns (out [b, s_q, h_q, 512] float64, lse [b, h_q, s_q] float64): out 0 and lse +inf for a query
    without a valid key; the sink scales out by 1 / (1 + exp(sink - lse)).
    """
    b, s_q, h_q, d = q.shape
    keys, valid = [], []
    for deq, idx, lengths in scopes:
        n = deq.shape[0]
        ok = (idx >= 0) & (idx < n)
        if lengths is not None:
            ok &= torch.arange(idx.shape[-1], device=idx.device)[None, None, :] < lengths.view(b, 1, 1)
        keys.append(deq[idx.long().clamp(0, n - 1)])  # [b, s_q, t, d]
        valid.append(ok)
    k, ok = torch.cat(keys, 2), torch.cat(valid, 2)
    s = torch.einsum("bshd,bstd->bsht", q.double(), k) * scale
    s = s.masked_fill(~ok[:, :, None, :], float("-inf"))
    lonely = ~ok.any(-1)[:, :, None].expand(b, s_q, h_q)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(lonely, 0.0, lse)[..., None])
    out = torch.einsum("bsht,bstd->bshd", p, k[..., :512])
    out = torch.where(lonely[..., None], 0.0, out)
    lse = torch.where(lonely, float("inf"), lse)
    if sink is not None:
        factor = 1.0 / (1.0 + torch.exp(sink.double().view(1, 1, h_q) - lse))
        out = out * torch.where(lonely, 1.0, factor)[..., None]
    return out, lse.transpose(1, 2)


def assert_close(torch, out, lse, ref_out, ref_lse):
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert not torch.isnan(out).any(), "NaN in out"
    inf = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf), "lse is +inf exactly for queries without valid keys"
    assert torch.all(lse[inf] > 0)
    torch.testing.assert_close(lse[~inf].double(), ref_lse[~inf], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    a, r = out.double().flatten(), ref_out.flatten()
    if r.norm() > 0:
        cos = float((a @ r) / (a.norm() * r.norm()))
        assert cos > 0.9999, f"cosine similarity {cos}"
