// Token-sparse MLA decode over an FP8 paged cache (DeepSeek-V3.2 and V4 layouts, hmla/params.h):
// plan once per decoding step, run once per layer.
//
//   size_t bytes = hmla::sparse_decode_workspace_bytes(batch, s_q, h_q);
//   // caller allocates `bytes` of device memory once (it is reused for every step)
//   hmla::DecodeSchedule s = hmla::sparse_decode_plan(params, ws, bytes, stream);
//   for (layer ...) hmla::sparse_decode_run(params_of_layer, s, stream);
//
// The plan launches one small kernel that reads topk_length / extra_topk_length on the device (when
// given) and writes the split of the batch's work over the SMs into the workspace; run only reads it.
// Neither allocates nor synchronises, so both can be captured in a CUDA graph. Each query token
// (batch entry, s_q position) is one request of the schedule: its work is its main list plus its
// extra list, in tiles of 64 indices. The workspace also holds the partial results of split
// requests, so two runs that share one schedule must not overlap in time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hmla/decode_schedule.h"
#include "hmla/launch_replay.h"
#include "hmla/params.h"

namespace hmla {

// Bytes of device workspace for this shape. num_sms 0 means the current device's SM count.
size_t sparse_decode_workspace_bytes(int batch, int s_q, int h_q, int num_sms = 0);

// Writes the schedule for params (batch, s_q, h_q, topk, topk_length, extra cache presence,
// extra_topk, extra_topk_length; the other fields are not read) into workspace.
DecodeSchedule sparse_decode_plan(const SparseDecodeParams& params, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream, int num_sms = 0);

// The schedule sparse_decode_plan returns for this shape, rebuilt without planning again (nothing is
// launched or read), as dense_decode_schedule. The workspace must hold that plan.
DecodeSchedule sparse_decode_schedule(int batch, int s_q, int h_q, void* workspace, size_t workspace_bytes,
                                      int num_sms = 0);

// Runs the attention for one layer. topk_length / extra_topk_length must hold the values the plan
// saw, and batch, s_q, h_q, topk, extra_topk and the extra cache's presence must be the plan's.
void sparse_decode_run(const SparseDecodeParams& params, const DecodeSchedule& schedule,
                       cudaStream_t stream);
// The same run with its two kernels replayed as the stream's graph in `replay` (hmla/launch_replay.h):
// about half the host time of the launches, for eager callers; same results.
void sparse_decode_run(const SparseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream,
                      LaunchReplay& replay);

// Checks params alone (layout, shapes, strides, pointers, alignment) and throws
// hmla::InvalidArgument on the first problem; sparse_decode_run calls it.
void validate(const SparseDecodeParams& params);

}  // namespace hmla
