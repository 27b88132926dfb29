// The plan kernel: reads cache_seqlens on the device and writes the work partition of
// decode_schedule.h into the caller's workspace. One tiny launch, capturable in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "scheduler/decode_schedule.h"

namespace hmla::detail {

void launch_decode_scheduler(const int32_t* cache_seqlens, int batch, int num_sm_parts,
                             void* workspace, const WorkspaceLayout& layout, cudaStream_t stream);

// Merges the pieces of split requests (combine.cu). Launched right after the attention kernel
// with programmatic dependent launch; a no-op for requests that were not split.
struct CombineParams {
  int batch;
  int h_kv;
  int d_v;
  int num_sm_parts;
  RowTiling tiling;
  const int32_t* req_num_splits;
  const int32_t* req_split_base;
  const int32_t* split_list;
  const float* lse_accum;
  const void* o_accum;  // 16-bit partial outputs (the output dtype)
  void* out;
  int64_t out_batch_stride, out_token_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
};
template <typename Element>
void launch_combine(const CombineParams& params, cudaStream_t stream);

}  // namespace hmla::detail
