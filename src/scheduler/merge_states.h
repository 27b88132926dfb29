// The kernel behind hmla::merge_attention_states (hmla/merge.h): partial attention results the
// caller computed, merged row by row with the decode combine's math (scheduler/merge_math.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "hmla/merge.h"

namespace hmla::detail {

// Launches the merge for params, which the caller has validated.
void launch_merge_states(const MergeAttentionParams& params, cudaStream_t stream);

}  // namespace hmla::detail
