"""A decode step written against FlashMLA's Python interface, with no hmla-specific code.

test_gpu_flashmla_script.py runs this file unchanged with ``import hmla as flash_mla`` in effect
(``sys.modules["flash_mla"] = hmla``). It uses both of FlashMLA's call styles, checks its outputs
against a plain PyTorch computation, and prints "OK" at the end.
"""

import math

import torch

import flash_mla
from flash_mla import flash_mla_with_kvcache, get_mla_metadata


def attention_reference(q, blocked_k, block_table, cache_seqlens, dv, causal):
    b, s_q, h_q, d = q.shape
    h_kv = blocked_k.shape[2]
    out = torch.empty(b, s_q, h_q, dv, dtype=torch.float32, device=q.device)
    for i in range(b):
        n = int(cache_seqlens[i])
        k = blocked_k[block_table[i]].reshape(-1, h_kv, d)[:n].float().repeat_interleave(h_q // h_kv, dim=1)
        scores = torch.einsum("shd,nhd->hsn", q[i].float(), k) / math.sqrt(d)
        if causal:
            allowed = torch.arange(n, device=q.device)[None, :] <= (n - s_q + torch.arange(s_q, device=q.device))[:, None]
            scores = scores.masked_fill(~allowed[None], float("-inf"))
        out[i] = torch.einsum("hsn,nhd->shd", torch.softmax(scores, dim=-1), k[..., :dv])
    return out


def main():
    torch.manual_seed(0)
    b, s_q, h_q, h_kv, d, dv = 16, 2, 128, 1, 576, 512
    block_size = 64
    cache_seqlens = torch.randint(s_q, 3000, (b,), dtype=torch.int32, device="cuda")
    max_seqlen_pad = math.ceil(int(cache_seqlens.max()) / 256) * 256
    block_table = torch.arange(b * max_seqlen_pad // block_size, dtype=torch.int32, device="cuda").view(b, -1)
    blocked_k = torch.randn(block_table.numel(), block_size, h_kv, d, dtype=torch.bfloat16, device="cuda")
    qs = [torch.randn(b, s_q, h_q, d, dtype=torch.bfloat16, device="cuda") for _ in range(3)]

    # Older FlashMLA style: metadata from the lengths, reused by every layer.
    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    outs = []
    for q in qs:  # "layers"
        o, lse = flash_mla_with_kvcache(q, blocked_k, block_table, cache_seqlens, dv,
                                        tile_scheduler_metadata, num_splits, causal=True)
        outs.append(o)
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32

    # Current FlashMLA style: empty metadata, planned by the first call.
    sched_meta, _ = flash_mla.get_mla_metadata()
    o_new, _ = flash_mla.flash_mla_with_kvcache(qs[0], blocked_k, block_table, cache_seqlens, dv, sched_meta,
                                                None, softmax_scale=d ** -0.5, causal=True)
    assert torch.equal(o_new, outs[0])

    for q, o in zip(qs, outs):
        ref = attention_reference(q, blocked_k, block_table, cache_seqlens, dv, causal=True)
        cos = torch.nn.functional.cosine_similarity(o.float().flatten(), ref.flatten(), dim=0).item()
        assert cos > 0.9999, cos
        assert (o.float() - ref).abs().max().item() < 3e-2
    print("OK")


if __name__ == "__main__":
    main()
