// The sm90 sparse decode kernel's parameters and entry points (one per FP8 layout, each in its own
// instantiation file so they compile in parallel). The host side is launch.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hmla/decode_schedule.h"
#include "hmla/params.h"
#include "scheduler/decode_schedule.h"

namespace hmla::sm90::sparse_decode {

// One paged FP8 cache as the kernel reads it.
struct SparseCacheView {
  const uint8_t* data;
  int64_t num_slots;  // num_blocks * page_size: indices at or past it are invalid
  int page_size;
  int page_shift;  // log2(page_size) when it is a power of two (every model's), else -1
  int64_t block_stride_bytes;
};

struct KernelParams {
  int requests;  // batch * s_q
  int s_q;
  int h_q;
  float scale_log2;  // softmax_scale * log2(e): scores are exponentiated with exp2
  int q_box_rows;    // heads per Q TMA box: min(h_q, 64)
  uint32_t q_tile_bytes;
  detail::DecodeWork work;
  SparseCacheView cache;
  const int32_t* indices;
  int64_t indices_batch_stride, indices_token_stride;
  SparseCacheView extra_cache;
  const int32_t* extra_indices;
  int64_t extra_indices_batch_stride, extra_indices_token_stride;
  const float* attn_sink;
  const detail::PartMetadata* parts;
  const int32_t* req_num_splits;
  const int32_t* req_split_base;
  size_t rows_per_slot;  // rows of one partial-result slot: num_m_blocks * 64
  float* lse_accum;
  void* o_accum;  // bf16 partial outputs
  uint16_t* out;  // bf16 bits
  int64_t out_batch_stride, out_token_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
  // Sparse prefill only (src/sm90/sparse_prefill/, which shares this parameter block): max_logits
  // [requests][h_q] at the lse's strides, and the head tiles per query token.
  float* max_logits;
  int num_m_blocks;
  // Sparse prefill's batched form (num_seqs > 0; SparsePrefillParams): `cache` is all of kv, and
  // each CTA narrows it to its token's sequence (sequence_rows). Last, so that the decode kernels'
  // parameters keep their offsets.
  int num_seqs;
  const int32_t* cu_seqlens_q;
  const int32_t* seq_kv_offset;
  const int32_t* seq_kv_len;
  // Sparse prefill's work units (ItemRounds, src/sm90/sparse_prefill/launch.h): whole items, then,
  // when tail_pieces > 1, unit tail_first + i is piece i % tail_pieces of item tail_first +
  // i / tail_pieces. A piece writes its partial rows to slot i of lse_accum, max_accum and o_accum
  // (rows_per_slot 64); the last piece of an item to count itself on tail_counters merges them.
  int units;
  int tail_first;
  int tail_pieces;
  float* max_accum;
  int* tail_counters;
};

template <SparseCacheLayout kLayout>
void launch_kernel(const CUtensorMap& q_map, const KernelParams& params, int num_m_blocks, int num_sm_parts,
                   cudaStream_t stream);

// The narrow form (h_q <= kHeads, kHeads 16 or 32): narrow_kernel.cuh.
template <SparseCacheLayout kLayout, int kHeads>
void launch_narrow_kernel(const CUtensorMap& q_map, const KernelParams& params, int num_sm_parts, cudaStream_t stream);

// The Q tensor map of q [batch][s_q][h_q][d_qk] bf16 (one box: 64 columns of one head tile of one
// token), and the Q fields of kp (h_q, scale, box rows, tile bytes).
CUtensorMap q_map_and_fields(const void* q, int d_qk, int h_q, int s_q, int batch, int64_t head_stride,
                             int64_t token_stride, int64_t batch_stride, float softmax_scale, KernelParams& kp);


// Validated params and a matching schedule in; the attention and, for split requests, the combine.
void launch(const SparseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream);

}  // namespace hmla::sm90::sparse_decode
