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

#include <algorithm>

#include "common/cuda_check.h"
#include "common/device_attributes.h"
#include "sm90/sparse_decode/launch.h"

namespace hmla::sm90::sparse_prefill {

namespace {
size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

// The last round costs a whole item's time while it leaves idle the SMs it has no item for. With
// fewer items than SMs it is the only round (s_q 2 at h_q 128: 4 items on 4 SMs for the whole call):
// then each item runs as up to 32 pieces of its pairs on as many SMs, and the last piece to finish
// merges them (the decode combine's math). Measured on an H100 (docs/PERF.md, "The last round cut"):
// s_q 2 h_q 128 topk 16384 430 -> 85 us, s_q 16 h_q 64 topk 2048 66 -> 44 us. After full rounds
// (4096 items on 132 SMs: 31 rounds and 4 items, ~3 % of the h_q 64 anchor rows) the merge, one
// CTA reading up to 32 pieces' rows a warp per row, took about what the cut saved (0.98-1.02 of
// whole items, within the card's noise), so those rounds stay whole.
ItemRounds ItemRounds::plan(int s_q, int h_q, int topk, int sms, bool with_workspace) {
  ItemRounds r;
  const int items = s_q * ((h_q + 63) / 64);
  r.grid = std::min(items, sms);
  r.units = items;
  const int full_rounds = items / sms;
  const int last_round = items - full_rounds * sms;
  const int pairs = (topk + 127) / 128;
  const int pieces = full_rounds == 0 ? std::min({sms / last_round, kMaxPieces, pairs}) : 0;
  if (!with_workspace || pieces < 2) return r;
  r.tail_first = full_rounds * sms;
  r.tail_items = last_round;
  r.pieces = pieces;
  r.units = r.tail_first + last_round * pieces;
  r.grid = full_rounds > 0 ? sms : last_round * pieces;
  const size_t rows = static_cast<size_t>(last_round) * pieces * 64;
  r.counters = 0;
  r.lse = round_up(sizeof(int) * static_cast<size_t>(last_round));
  r.max = r.lse + round_up(sizeof(float) * rows);
  r.o = r.max + round_up(sizeof(float) * rows);
  r.bytes = r.o + round_up(2 * 512 * rows);
  return r;
}

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

  const ItemRounds rounds = ItemRounds::plan(params.s_q, params.h_q, params.topk, detail::current_device_sm_count(),
                                             params.workspace != nullptr);
  kp.units = rounds.units;
  kp.tail_first = rounds.tail_first;
  kp.tail_pieces = rounds.pieces;
  if (rounds.tail_items > 0) {
    char* ws = static_cast<char*>(params.workspace);
    kp.tail_counters = reinterpret_cast<int*>(ws + rounds.counters);
    kp.lse_accum = reinterpret_cast<float*>(ws + rounds.lse);
    kp.max_accum = reinterpret_cast<float*>(ws + rounds.max);
    kp.o_accum = ws + rounds.o;
    kp.rows_per_slot = 64;
    // Each cut item's pieces count themselves on its counter; the last one merges.
    HMLA_CUDA_CHECK(cudaMemsetAsync(kp.tail_counters, 0, sizeof(int) * rounds.tail_items, stream));
  }

  if (params.d_qk == 576)
    launch_kernel<576>(q_map, kp, rounds.grid, stream);
  else
    launch_kernel<512>(q_map, kp, rounds.grid, stream);
  HMLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmla::sm90::sparse_prefill
