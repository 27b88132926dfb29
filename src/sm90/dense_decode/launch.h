// The sm90 dense decode kernel's parameters and entry points. The kernel is launched by
// launch_kernel, one instantiation file per element type (they compile in parallel); the host side
// is launch.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hmla/dense_decode.h"
#include "scheduler/decode_schedule.h"

namespace hmla::sm90::dense_decode {

struct KernelParams {
  int batch;
  int s_q;
  int h_kv;
  int page_size;
  // Keys the block table can hold, max_blocks_per_seq * page_size (capped at INT_MAX): a longer
  // cache_seqlens[b] attends to this many keys only, so no block-table entry past a row is read.
  int max_keys;
  bool causal;
  float scale_log2;  // softmax_scale * log2(e): scores are exponentiated with exp2
  detail::RowTiling tiling;
  const int32_t* seqlens;
  const int32_t* block_table;
  int64_t block_table_batch_stride;
  const detail::PartMetadata* parts;
  const int32_t* req_num_splits;
  const int32_t* req_split_base;
  float* lse_accum;
  void* o_accum;  // partial outputs in the element type
  void* out;
  int64_t out_batch_stride, out_token_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
};

template <typename Element>
void launch_kernel(const CUtensorMap& q_map, const CUtensorMap& k_map, const KernelParams& kp, dim3 grid,
                   cudaStream_t stream);

// Validated params and a matching schedule in; the attention and, for split requests, the combine.
void launch_bf16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream);
void launch_fp16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream);

}  // namespace hmla::sm90::dense_decode
