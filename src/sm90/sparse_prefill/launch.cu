// Host side of sparse prefill on sm90: the parameters, in the sparse decode kernel's parameter block
// (the prefill kernel shares its Q load, row view and output writer).
//   - The kv rows are an FP8 cache's place taken by bf16 rows: pages of one token
//     (block_stride_bytes = the row stride), so an index addresses its row and indices outside
//     [0, s_kv) are invalid exactly as in decode.
//   - Each query token is a request of its own, batch entry = token and s_q = 1, which maps out
//     [s_q, h_q, 512] and lse / max_logits [s_q, h_q] onto decode's [batch, s_q, h, d] and
//     [batch, h, s_q].
//   - The batched form passes its three arrays through: the cache stays all of kv, and each CTA
//     narrows it to its token's sequence on the device (sequence_rows in the kernel), since the
//     host cannot read the arrays without a synchronisation.
#include "sm90/sparse_prefill/launch.h"

#include "common/cuda_check.h"
#include "sm90/sparse_decode/launch.h"

namespace hmla::sm90::sparse_prefill {

void launch(const SparsePrefillParams& params, cudaStream_t stream) {
  using sparse_decode::KernelParams;
  KernelParams kp{};
  kp.requests = params.s_q;
  kp.s_q = 1;
  const CUtensorMap q_map = sparse_decode::q_map_and_fields(params.q, params.d_qk, params.h_q, 1, params.s_q,
                                                            params.q_head_stride, params.q_token_stride,
                                                            params.q_token_stride, params.softmax_scale, kp);
  kp.work.tokens_per_batch = 1;
  kp.work.topk = params.topk;
  kp.work.topk_length = params.topk_length;
  kp.cache.data = reinterpret_cast<const uint8_t*>(params.kv);
  kp.cache.num_slots = params.s_kv;
  kp.cache.page_size = 1;
  kp.cache.page_shift = 0;
  kp.cache.block_stride_bytes = params.kv_token_stride * 2;
  kp.indices = params.indices;
  kp.indices_batch_stride = params.indices_token_stride;
  kp.indices_token_stride = 0;
  kp.attn_sink = params.attn_sink;
  kp.out = params.out;
  kp.out_batch_stride = params.out_token_stride;
  kp.out_token_stride = 0;
  kp.out_head_stride = params.out_head_stride;
  kp.lse = params.lse;
  kp.lse_batch_stride = params.h_q;
  kp.lse_head_stride = 1;
  kp.max_logits = params.max_logits;
  kp.num_m_blocks = (params.h_q + 63) / 64;
  kp.num_seqs = params.num_seqs;
  kp.cu_seqlens_q = params.cu_seqlens_q;
  kp.seq_kv_offset = params.seq_kv_offset;
  kp.seq_kv_len = params.seq_kv_len;

  if (params.d_qk == 576)
    launch_kernel<576>(q_map, kp, stream);
  else
    launch_kernel<512>(q_map, kp, stream);
  HMLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmla::sm90::sparse_prefill
