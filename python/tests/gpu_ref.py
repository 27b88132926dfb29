"""Inputs and the PyTorch float32 reference of dense MLA decode, for the GPU tests.

The reference follows docs/API.md, contract 1: for each request b, query token t and head h,
score_j = scale * <q, k_j> over the first n_t keys (n_t = s_k without causal, clamp(s_k - s_q + t + 1)
with causal), out = softmax(score) @ V (V = first 512 columns of K), lse = log(sum_j exp(score_j));
a query with no key gets out = 0 and lse = +inf. Query head h reads KV head h // (h_q / h_kv).
"""

import math


def make_case(torch, b, s_q, h_q, h_kv, seqlens, page=64, dtype=None, capacity=None, poison=True, seed=0):
    """q [b, s_q, h_q, 576], k_cache [num_blocks, page, h_kv, 576] with a shuffled block table.

    capacity: tokens each request's block-table row can hold (default: the longest length).
    poison: fill every cache row that no query may read with NaN (hmla must never read them).
    """
    dtype = dtype or torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(seed)
    capacity = capacity or max(max(seqlens), 1)
    max_blocks = max(1, math.ceil(capacity / page))
    num_blocks = b * max_blocks + 3
    k_cache = torch.randn(num_blocks, page, h_kv, 576, generator=g, device="cuda").to(dtype)
    perm = torch.randperm(num_blocks, generator=g, device="cuda")[: b * max_blocks]
    block_table = perm.view(b, max_blocks).to(torch.int32)
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, s_q, h_q, 576, generator=g, device="cuda").to(dtype)
    if poison:
        used = torch.zeros(num_blocks, page, dtype=torch.bool, device="cuda")
        for i, n in enumerate(seqlens):
            for j in range(math.ceil(n / page)):
                blk = int(block_table[i, j])
                used[blk, : min(page, n - j * page)] = True
        k_cache[~used] = float("nan")
    return q, k_cache, block_table, cache_seqlens


def reference(torch, q, k_cache, block_table, cache_seqlens, causal, softmax_scale=None):
    """(out float32 [b, s_q, h_q, 512], lse float32 [b, h_q, s_q])."""
    b, s_q, h_q, d = q.shape
    page, h_kv = k_cache.shape[1], k_cache.shape[2]
    rep = h_q // h_kv
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(b, s_q, h_q, 512, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h_q, s_q), float("inf"), dtype=torch.float32, device=q.device)
    seqlens = cache_seqlens.tolist()
    for i in range(b):
        n = seqlens[i]
        if n == 0:
            continue
        nblk = math.ceil(n / page)
        kv = k_cache[block_table[i, :nblk].long()].reshape(nblk * page, h_kv, d)[:n].float()
        kv = kv.repeat_interleave(rep, dim=1)  # [n, h_q, d]
        s = torch.einsum("thd,nhd->htn", q[i].float(), kv) * scale  # [h_q, s_q, n]
        if causal and s_q > 1:
            t = torch.arange(s_q, device=q.device)[:, None]
            j = torch.arange(n, device=q.device)[None, :]
            s = s.masked_fill((j >= n - s_q + t + 1)[None], float("-inf"))
        lse_i = torch.logsumexp(s, dim=-1)  # [h_q, s_q]
        lonely = torch.isneginf(lse_i)
        p = torch.exp(s - torch.where(lonely, 0.0, lse_i)[..., None])
        o = torch.einsum("htn,nhd->thd", p, kv[..., :512])
        o = torch.where(lonely.transpose(0, 1)[..., None], 0.0, o)
        out[i] = o
        lse[i] = torch.where(lonely, float("inf"), lse_i)
    return out, lse


def assert_close(torch, out, lse, ref_out, ref_lse, dtype):
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert not torch.isnan(out).any(), "NaN in out"
    inf = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf), "lse is +inf exactly for queries without keys"
    torch.testing.assert_close(lse[~inf], ref_lse[~inf], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
    a, r = out.double().flatten(), ref_out.double().flatten()
    if r.norm() > 0:
        cos = float((a @ r) / (a.norm() * r.norm()))
        assert cos > 0.9999, f"cosine similarity {cos}"
