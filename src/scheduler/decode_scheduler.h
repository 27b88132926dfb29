// The plan kernel and the combine kernel: the split-KV layer every decode family shares.
// The plan reads each request's amount of work on the device (DecodeWork) and writes the work
// partition of decode_schedule.h into the caller's workspace. One small launch, capturable in a
// CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "hmla/decode_schedule.h"
#include "scheduler/decode_schedule.h"

namespace hmla::detail {

void launch_decode_scheduler(const DecodeWork& work, int requests, int num_sm_parts, void* workspace,
                             const WorkspaceLayout& layout, cudaStream_t stream);

// The schedule a plan returns: its shape and the views of the workspace that `layout` places.
DecodeSchedule schedule_in_workspace(int batch, int s_q, int h_q, int h_kv, int num_sm_parts, int num_m_blocks,
                                     void* workspace, size_t workspace_bytes, const WorkspaceLayout& layout);

// Merges the pieces of split requests (combine.cu). Launched right after the attention kernel
// with programmatic dependent launch; a no-op for requests that were not split.
// Request r of the schedule writes batch entry r / tokens_per_batch, query token
// r % tokens_per_batch (+ the tile's own token offset): dense plans have one request per batch
// entry (tokens_per_batch 1), sparse plans one per query token (tokens_per_batch = s_q).
// attn_sink (optional, [h_q]) scales each merged row by 1 / (1 + exp(sink - lse)).
struct CombineParams {
  int batch;  // requests of the schedule
  int tokens_per_batch;
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
  const float* attn_sink;
};
// The combine's parameters for a schedule's split requests and the output view they merge into.
struct OutputView {
  void* out;
  int64_t out_batch_stride, out_token_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
};
CombineParams combine_params(const DecodeSchedule& schedule, int requests, int tokens_per_batch, int h_kv,
                             const RowTiling& tiling, const OutputView& output, const float* attn_sink);

template <typename Element>
void launch_combine(const CombineParams& params, cudaStream_t stream);

}  // namespace hmla::detail
