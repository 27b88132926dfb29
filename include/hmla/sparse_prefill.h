// Token-sparse MLA prefill on Hopper (docs/API.md, "Contract 3"; FlashMLA's flash_mla_sparse_fwd):
// every query token attends, with all h_q heads, to the bf16 kv rows its index list names. Nothing
// to plan and no workspace: one launch of a persistent grid over the (query token, 64-head tile)
// items, graph-capturable, allocating nothing.
#pragma once

#include <cuda_runtime_api.h>

#include "hmla/params.h"

namespace hmla {

// Validates params, then runs the attention on stream (out, max_logits and lse written).
void sparse_prefill_run(const SparsePrefillParams& params, cudaStream_t stream);

// Checks params alone (shapes, strides, pointers) and throws hmla::InvalidArgument on the first
// problem; sparse_prefill_run calls it.
void validate(const SparsePrefillParams& params);

}  // namespace hmla
