"""GPU tests of hmla.merge_attention_states / merge_attention_states_n with PyTorch tensors, against a
float64 PyTorch reference of the definition: random states with empty (+inf / -inf), all-empty and NaN
rows, n-way (lists and stacked arrays) against pairwise folding, in place, strided layouts, the
split-softmax property (merging the attention over two halves of the keys gives the whole), and
argument errors."""

import math

import pytest

import hmla

pytestmark = pytest.mark.gpu


def ref_merge(torch, outs, lses):
    """(out float64 [b, s_q, h, d_v], lse float64 [b, h, s_q]) by the definition in docs/API.md."""
    o = torch.stack([x.double() for x in outs])  # n, b, s, h, d
    l = torch.stack([x.double().transpose(1, 2) for x in lses])  # n, b, s, h
    keyed = ~torch.isinf(l)  # NaN counts: it must reach the output
    lk = torch.where(keyed, l, torch.full_like(l, -math.inf))
    m = lk.amax(0)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    total = torch.exp(lk - m_safe).sum(0)
    lse = m_safe + torch.log(total)
    none = torch.isinf(m) & (m < 0)
    lse = torch.where(none, torch.full_like(lse, math.inf), lse)
    w = torch.where(keyed, torch.exp(lk - lse), torch.zeros_like(lk))
    out = (w[..., None] * torch.where(keyed[..., None], o, torch.zeros_like(o))).sum(0)
    out = torch.where(none[..., None], torch.zeros_like(out), out)
    return out, lse.transpose(1, 2)


def assert_merged(torch, out, lse, ref_out, ref_lse, dtype):
    rel = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    got = out.double()
    assert torch.equal(torch.isnan(got), torch.isnan(ref_out))
    finite = ~torch.isnan(ref_out)
    err = (got - ref_out).abs()[finite]
    bound = (rel * 1.01 * ref_out.abs() + 1e-5)[finite]
    assert bool((err <= bound).all()), f"max out error {err.max().item()}"
    lse = lse.double()
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    ok = torch.isfinite(ref_lse)
    assert bool(((lse - ref_lse).abs()[ok] <= 2e-5 + 2e-6 * ref_lse.abs()[ok]).all())
    assert bool((lse[torch.isinf(ref_lse)] > 0).all())


def make_states(torch, n, b, s_q, h, d_v, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    outs = [(torch.rand(b, s_q, h, d_v, generator=g, device="cuda") * 2 - 1).to(dtype) for _ in range(n)]
    lses = [torch.rand(b, h, s_q, generator=g, device="cuda") * 16 - 4 for _ in range(n)]
    rows = b * h * s_q
    flat = [x.view(-1) for x in lses]
    for r in range(0, rows, 7):  # one state empty, its out NaN (never read)
        i = (r // 7) % n
        flat[i][r] = math.inf if r % 2 else -math.inf
        bb, hh, tt = r // (h * s_q), (r // s_q) % h, r % s_q
        outs[i][bb, tt, hh] = float("nan")
    for r in range(3, rows, 11):  # every state empty
        for i in range(n):
            flat[i][r] = math.inf
    for r in range(5, rows, 13):  # a NaN lse
        flat[r % n][r] = float("nan")
    return outs, lses


@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(4, 1, 128, 512), (3, 5, 7, 136), (1, 2, 3, 520)])
def test_pairwise_matches_reference(torch_cuda, dtype_name, shape):
    torch = torch_cuda
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    (oa, ob), (la, lb) = make_states(torch, 2, *shape, dtype)
    out, lse = hmla.merge_attention_states(oa, la, ob, lb)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == oa.shape and lse.shape == la.shape
    ref_out, ref_lse = ref_merge(torch, [oa, ob], [la, lb])
    assert_merged(torch, out, lse, ref_out, ref_lse, dtype)
    # in place into a: the same bits
    oa2, la2 = oa.clone(), la.clone()
    r_out, r_lse = hmla.merge_attention_states(oa2, la2, ob, lb, out=oa2, lse=la2)
    assert r_out is oa2 and r_lse is la2
    torch.cuda.synchronize()
    assert torch.equal(oa2.view(torch.int16), out.view(torch.int16))
    assert torch.equal(la2.view(torch.int32), lse.view(torch.int32))


def test_n_way_lists_stacked_and_folding(torch_cuda):
    torch = torch_cuda
    dtype = torch.bfloat16
    n, shape = 6, (2, 3, 16, 512)
    outs, lses = make_states(torch, n, *shape, dtype, seed=3)
    out, lse = hmla.merge_attention_states_n(outs, lses)
    assert_merged(torch, out, lse, *ref_merge(torch, outs, lses), dtype)
    s_out, s_lse = hmla.merge_attention_states_n(torch.stack(outs), torch.stack(lses))
    assert torch.equal(s_out.view(torch.int16), out.view(torch.int16))
    acc_out, acc_lse = hmla.merge_attention_states(outs[0], lses[0], outs[1], lses[1])
    for i in range(2, n):
        hmla.merge_attention_states(acc_out, acc_lse, outs[i], lses[i], out=acc_out, lse=acc_lse)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(acc_out), torch.isnan(out))
    ok = ~torch.isnan(out)
    assert bool(((acc_out.double() - out.double()).abs()[ok] <= (n + 1) * 2.0 ** -8).all())


def test_strided_layouts(torch_cuda):
    torch = torch_cuda
    b, s_q, h, d_v = 3, 4, 8, 512
    (oa, ob), (la, lb) = make_states(torch, 2, b, s_q, h, d_v, torch.float16, seed=5)
    wide = torch.full((b, s_q, h, d_v + 64), float("nan"), dtype=torch.float16, device="cuda")
    wide[..., :d_v] = oa
    oa_strided = wide[..., :d_v]
    lb_token_major = lb.transpose(1, 2).contiguous().transpose(1, 2)  # [b, h, s_q] view of [b, s_q, h]
    assert not lb_token_major.is_contiguous()
    out_wide = torch.zeros(b, s_q, h, d_v + 64, dtype=torch.float16, device="cuda")
    out, lse = hmla.merge_attention_states(oa_strided, la, ob, lb_token_major, out=out_wide[..., :d_v])
    ref = hmla.merge_attention_states(oa, la, ob, lb)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), ref[0].view(torch.int16))
    assert torch.equal(lse.view(torch.int32), ref[1].view(torch.int32))
    assert bool((out_wide[..., d_v:] == 0).all())  # the padding is untouched


def test_split_softmax_merges_to_the_whole(torch_cuda):
    torch = torch_cuda
    b, s_q, h, d_v, keys = 2, 2, 16, 512, 300
    g = torch.Generator(device="cuda").manual_seed(9)
    scores = torch.randn(b, s_q, h, keys, generator=g, device="cuda", dtype=torch.float64) * 3
    values = torch.rand(b, keys, d_v, generator=g, device="cuda", dtype=torch.float64) * 2 - 1

    def attend(lo, hi):
        sc = scores[..., lo:hi]
        p = torch.softmax(sc, -1)
        out = torch.einsum("bshk,bkd->bshd", p, values[:, lo:hi])
        return out, torch.logsumexp(sc, -1).transpose(1, 2)

    whole, whole_lse = attend(0, keys)
    (oa, la), (ob, lb) = attend(0, 123), attend(123, keys)
    out, lse = hmla.merge_attention_states(oa.to(torch.bfloat16), la.float(), ob.to(torch.bfloat16), lb.float())
    assert bool(((out.double() - whole).abs() <= 2.0 ** -7).all())
    assert bool(((lse.double() - whole_lse).abs() <= 1e-5).all())


def test_argument_errors(torch_cuda):
    torch = torch_cuda
    (oa, ob), (la, lb) = make_states(torch, 2, 2, 1, 4, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="outs\\[1\\]"):
        hmla.merge_attention_states(oa, la, ob[:, :, :2], lb)
    with pytest.raises(TypeError, match="outs\\[1\\]"):
        hmla.merge_attention_states(oa, la, ob.half(), lb)
    with pytest.raises(TypeError, match="lses\\[0\\]"):
        hmla.merge_attention_states(oa, la.double(), ob, lb)
    with pytest.raises(ValueError, match="outs"):
        hmla.merge_attention_states_n([oa] * 33, [la] * 33)
    with pytest.raises(ValueError, match="d_v"):
        hmla.merge_attention_states(oa[..., :60], la, ob[..., :60], lb)
    with pytest.raises(ValueError, match="host"):
        hmla.merge_attention_states(oa.cpu(), la.cpu(), ob.cpu(), lb.cpu())
