"""A sparse decode step written against FlashMLA's Python interface, with no hmla-specific code.

test_gpu_flashmla_script.py runs this file unchanged with ``import hmla as flash_mla`` in effect. The
calls are those of shared/anchors/compare/compare.py (positional ``None`` for block_table,
cache_seqlens and num_splits; keyword sparse arguments; one metadata object per shape reused across
index sets). The FP8 caches come from a quantiser with FlashMLA's layout and page strides
(sparse_ref.quantize, standing where compare.py imports FlashMLA's tests/quant.py); top-k positions
become cache indices through a block table as FlashMLA's abs_indices2indices_in_kvcache does.
Outputs are checked against a float64 computation; prints "OK" at the end.
"""

import torch

import flash_mla
import sparse_ref


def positions_to_cache_indices(positions, block_table, page):
    b, s_q, topk = positions.shape
    invalid = positions == -1
    p = positions.clamp_min(0).long()
    blocks = torch.gather(block_table.long(), 1, (p // page).view(b, -1)).view(b, s_q, topk)
    return torch.where(invalid, -1, blocks * page + p % page).int()


class Scope:
    def __init__(self, b, s_q, s_k, page, topk, d_qk, n_sets):
        nblk = (s_k + page - 1) // page
        self.block_table = torch.randperm(b * nblk, device="cuda").view(b, nblk).int()
        kv = (torch.randn(b * nblk, page, 1, d_qk, device="cuda") * 0.1).to(torch.bfloat16)
        self.kvq, self.deq = sparse_ref.quantize(torch, kv, sparse_ref.layout_of(d_qk))
        self.indices = []
        for _ in range(n_sets):
            pos = torch.rand(b * s_q, s_k, device="cuda").topk(topk, dim=-1).indices.view(b, s_q, topk).int()
            pos[:, :, -3:] = -1  # padding entries
            self.indices.append(positions_to_cache_indices(pos, self.block_table, page).contiguous())


def check(q, out, lse, scopes, k, sm, sink):
    ref_out, ref_lse = sparse_ref.reference(torch, q, [(s.deq, s.indices[k], None) for s in scopes], sm, sink)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref_out.flatten(), dim=0).item()
    assert cos > 0.9999, cos
    assert (out.double() - ref_out).abs().max().item() < 3e-2
    assert (lse.double() - ref_lse).abs().max().item() < 1e-2


def main():
    torch.manual_seed(0)
    cfgs = [  # (h_q, s_q, d_qk, main (s_k, page, topk), extra (s_k, page, topk) or None)
        (128, 2, 576, (4096, 64, 2048), None),
        (64, 1, 576, (2048, 64, 512), None),
        (64, 2, 512, (4096, 256, 128), (2048, 64, 512)),
        (16, 2, 512, (4096, 256, 128), (2048, 64, 512)),
    ]
    b = 4
    for h_q, s_q, d_qk, m, e in cfgs:
        main_scope = Scope(b, s_q, m[0], m[1], m[2], d_qk, 2)
        extra = Scope(b, s_q, e[0], e[1], e[2], d_qk, 2) if e else None
        q = torch.randn(b, s_q, h_q, d_qk, device="cuda").to(torch.bfloat16)
        sink = torch.randn(h_q, dtype=torch.float32, device="cuda")
        sm = d_qk ** -0.55
        meta = flash_mla.get_mla_metadata()[0]
        for k in (0, 1, 0):
            out, lse = flash_mla.flash_mla_with_kvcache(
                q, main_scope.kvq, None, None, 512, meta, None, softmax_scale=sm, causal=False,
                is_fp8_kvcache=True, indices=main_scope.indices[k], attn_sink=sink,
                extra_k_cache=extra.kvq if extra else None,
                extra_indices_in_kvcache=extra.indices[k] if extra else None)
            check(q, out, lse, [main_scope] + ([extra] if extra else []), k, sm, sink)
    print("OK")


if __name__ == "__main__":
    main()
