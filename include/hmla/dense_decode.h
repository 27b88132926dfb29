// Dense MLA decode over a paged bf16/fp16 cache: plan once per decoding step, run once per layer.
//
//   size_t bytes = hmla::dense_decode_workspace_bytes(batch, s_q, h_q, h_kv);
//   // caller allocates `bytes` of device memory once (it is reused for every step)
//   hmla::DecodeSchedule s = hmla::dense_decode_plan(seqlens, batch, s_q, h_q, h_kv, ws, bytes, stream);
//   for (layer ...) hmla::dense_decode_run(params, s, stream);
//
// plan launches one small kernel that reads cache_seqlens on the device and writes the split of the
// batch's work over the SMs into the workspace; run only reads it. Neither allocates nor
// synchronises, so both can be captured in a CUDA graph. The workspace also holds the partial
// results of split requests, so two runs that share one schedule must not overlap in time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hmla/decode_schedule.h"
#include "hmla/launch_replay.h"
#include "hmla/params.h"

namespace hmla {

// Bytes of device workspace for this shape. num_sms 0 means the current device's SM count.
size_t dense_decode_workspace_bytes(int batch, int s_q, int h_q, int h_kv, int num_sms = 0);

// Writes the schedule for these sequence lengths (device pointer, [batch] int32) into workspace.
DecodeSchedule dense_decode_plan(const int32_t* cache_seqlens, int batch, int s_q, int h_q, int h_kv,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                 int num_sms = 0);

// The schedule dense_decode_plan returns for these arguments, rebuilt without planning again (nothing
// is launched or read): for a caller that keeps a planned workspace but not the returned value, such
// as a compiled graph whose plan and runs are separate nodes. The workspace must hold that plan.
DecodeSchedule dense_decode_schedule(int batch, int s_q, int h_q, int h_kv, void* workspace, size_t workspace_bytes,
                                     int num_sms = 0);

// Runs the attention for one layer. params.cache_seqlens must hold the lengths the plan saw.
void dense_decode_run(const DenseDecodeParams& params, const DecodeSchedule& schedule,
                      cudaStream_t stream);
// The same run with its two kernels replayed as the stream's graph in `replay` (hmla/launch_replay.h):
// about half the host time of the launches, for eager callers; same results.
void dense_decode_run(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream,
                      LaunchReplay& replay);

// Checks params alone (shapes, strides, pointers, dtype) and throws hmla::InvalidArgument on the
// first problem; dense_decode_run calls it. Exposed so callers and tests can validate up front.
void validate(const DenseDecodeParams& params);

}  // namespace hmla
