// Host side of sparse prefill on sm90. The kernel is the sparse decode kernel in prefill mode
// (src/sm90/sparse_decode/: PrefillConfig, copy_producer_loop; docs/SPARSE_PREFILL.md): the same
// consumers, bf16 rows copied by cp.async instead of FP8 rows dequantised, one CTA per (query token,
// head tile) instead of a plan.
#pragma once

#include <cuda_runtime_api.h>

#include "hmla/params.h"

namespace hmla::sm90::sparse_prefill {

// Validated params in; the attention, outputs written directly.
void launch(const SparsePrefillParams& params, cudaStream_t stream);

}  // namespace hmla::sm90::sparse_prefill
