// The three MLA contracts as plain structs: raw pointers, sizes and element strides.
//
// The same structs describe device buffers (for the kernels) and host buffers (for the CPU reference
// in hmla/reference.h), so a test hands one description to both. Strides are in elements of the
// buffer's own type (bytes for the FP8 caches); the last dimension of every tensor is contiguous.
// Full semantics, shapes and error rules: docs/API.md.
#pragma once

#include <cstdint>

#include "hmla/types.h"

namespace hmla {

// ---------------------------------------------------------------------------------------------
// Dense decode over a paged bf16/fp16 cache (FlashMLA's flash_mla_with_kvcache, dense path).
//   q            [batch, s_q, h_q, d_qk]
//   k_cache      [num_blocks, page_size, h_kv, d_qk]; V is the first d_v columns of K.
//   block_table  [batch, max_blocks_per_seq] int32, page ids of each request in order
//   cache_seqlens[batch] int32, 0 allowed
//   out          [batch, s_q, h_q, d_v] (dtype of q), lse [batch, h_q, s_q] float32 (natural log)
// causal (s_q > 1): query i of a request attends to its first s_k - s_q + i + 1 keys.
// A query with no key gets out = 0 and lse = +inf.
struct DenseDecodeParams {
  DType dtype = DType::kBF16;
  int batch = 0;
  int s_q = 1;
  int h_q = 0;
  int h_kv = 1;
  int d_qk = 576;
  int d_v = 512;

  const void* q = nullptr;
  int64_t q_batch_stride = 0;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;

  const void* k_cache = nullptr;
  int num_blocks = 0;
  int page_size = 64;
  int64_t k_block_stride = 0;
  int64_t k_token_stride = 0;
  int64_t k_head_stride = 0;

  const int32_t* block_table = nullptr;
  int max_blocks_per_seq = 0;
  int64_t block_table_batch_stride = 0;

  const int32_t* cache_seqlens = nullptr;

  float softmax_scale = 0.f;  // 0 means 1/sqrt(d_qk)
  bool causal = false;

  void* out = nullptr;
  int64_t out_batch_stride = 0;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  float* lse = nullptr;  // [batch, h_q, s_q], s_q contiguous
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
};

// ---------------------------------------------------------------------------------------------
// FP8 cache layouts of the token-sparse kernels (bytes per token before page padding).
enum class SparseCacheLayout : int32_t {
  // DeepSeek-V3.2, d_qk 576: per token 512 e4m3 NoPE values, 4 float32 scales (one per 128
  // values), 64 bf16 RoPE values = 656 bytes, tokens back to back inside a page.
  kV32 = 0,
  // DeepSeek-V4 "MODEL1", d_qk 512: per page first every token's 448 e4m3 NoPE + 64 bf16 RoPE
  // (576 bytes), then every token's 8 UE8M0 scale bytes (7 used, one per 64 values), the page
  // padded to a multiple of 576 bytes.
  kModel1 = 1,
};

// One paged FP8 cache. block_stride_bytes is the distance between pages (>= the layout's page bytes).
struct SparseKVCache {
  const uint8_t* data = nullptr;
  int num_blocks = 0;
  int page_size = 0;
  int64_t block_stride_bytes = 0;
};

// Token-sparse decode over an FP8 cache (flash_mla_with_kvcache with indices).
//   q        [batch, s_q, h_q, d_qk] bf16 (d_qk 576 for kV32, 512 for kModel1), h_kv = 1, d_v = 512
//   indices  [batch, s_q, topk] int32, each page * page_size + offset; -1 and every value outside
//            the cache are invalid and skipped (never read)
//   topk_length [batch] (optional): only the first topk_length[i] indices of request i count
//   attn_sink [h_q] float32 (optional): out *= exp(lse) / (exp(lse) + exp(sink)); lse unchanged
//   extra cache (optional, same layout, own page size) with extra_indices [batch, s_q, extra_topk]
//            and extra_topk_length [batch]; the query attends to the union of both lists
//   out [batch, s_q, h_q, 512] bf16, lse [batch, h_q, s_q] float32
struct SparseDecodeParams {
  SparseCacheLayout layout = SparseCacheLayout::kV32;
  int batch = 0;
  int s_q = 1;
  int h_q = 0;
  int d_qk = 576;
  int d_v = 512;

  const uint16_t* q = nullptr;  // bf16 bits
  int64_t q_batch_stride = 0;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;

  SparseKVCache cache;
  const int32_t* indices = nullptr;
  int topk = 0;
  int64_t indices_batch_stride = 0;
  int64_t indices_token_stride = 0;
  const int32_t* topk_length = nullptr;

  SparseKVCache extra_cache;  // extra_cache.data == nullptr: no extra cache
  const int32_t* extra_indices = nullptr;
  int extra_topk = 0;
  int64_t extra_indices_batch_stride = 0;
  int64_t extra_indices_token_stride = 0;
  const int32_t* extra_topk_length = nullptr;

  const float* attn_sink = nullptr;
  float softmax_scale = 0.f;  // 0 means 1/sqrt(d_qk)

  uint16_t* out = nullptr;  // bf16 bits
  int64_t out_batch_stride = 0;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  float* lse = nullptr;  // [batch, h_q, s_q]
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
};

// ---------------------------------------------------------------------------------------------
// Token-sparse prefill (flash_mla_sparse_fwd).
//   q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16, indices [s_q, 1, topk] int32 (invalid: < 0 or
//   >= s_kv), d_qk in {576, 512}, d_v = 512, optional attn_sink [h_q] and topk_length [s_q].
//   out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] and lse [s_q, h_q] float32, of the scaled
//   scores; a query with no valid index: out 0, lse +inf, max_logits -inf.
// Batched (varlen) form, hmla only (num_seqs > 0): the s_q query tokens are num_seqs sequences,
//   sequence i being tokens [cu_seqlens_q[i], cu_seqlens_q[i + 1]); a token of sequence i indexes
//   only its own kv rows: index j is valid when 0 <= j < seq_kv_len[i] and names kv row
//   seq_kv_offset[i] + j. The three arrays are device data (docs/API.md, contract 3, says what
//   out-of-range values give); num_seqs = 0 is the flat form above.
struct SparsePrefillParams {
  int s_q = 0;
  int s_kv = 0;
  int h_q = 0;
  int d_qk = 576;
  int d_v = 512;

  const uint16_t* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;

  const uint16_t* kv = nullptr;
  int64_t kv_token_stride = 0;

  const int32_t* indices = nullptr;
  int topk = 0;
  int64_t indices_token_stride = 0;
  const int32_t* topk_length = nullptr;

  const float* attn_sink = nullptr;
  float softmax_scale = 0.f;

  uint16_t* out = nullptr;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  float* max_logits = nullptr;  // [s_q, h_q] contiguous
  float* lse = nullptr;         // [s_q, h_q] contiguous

  int num_seqs = 0;                        // 0: the flat form
  const int32_t* cu_seqlens_q = nullptr;   // [num_seqs + 1]: 0, ..., s_q
  const int32_t* seq_kv_offset = nullptr;  // [num_seqs]
  const int32_t* seq_kv_len = nullptr;     // [num_seqs]

  // Optional: a device buffer of at least sparse_prefill_workspace_bytes(params) bytes (256-byte
  // aligned; its contents need no initialisation). With it, a call with fewer work items (query
  // token, 64 heads) than SMs cuts each along its index list over the SMs it would leave idle and
  // merges the pieces in the kernel; without it (null), each item runs whole on one SM.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

}  // namespace hmla
