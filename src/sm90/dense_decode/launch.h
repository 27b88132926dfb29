// Entry points of the sm90 dense decode kernel, one per element type (each in its own
// instantiation file so they compile in parallel).
#pragma once

#include <cuda_runtime_api.h>

#include "hmla/dense_decode.h"

namespace hmla::sm90::dense_decode {

void launch_bf16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream);
void launch_fp16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream);

}  // namespace hmla::sm90::dense_decode
