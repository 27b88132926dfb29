// Token-sparse MLA prefill on Hopper (docs/API.md, "Contract 3"; FlashMLA's flash_mla_sparse_fwd):
// every query token attends, with all h_q heads, to the bf16 kv rows its index list names. Nothing
// to plan: a persistent grid over the (query token, 64-head tile) items, graph-capturable,
// allocating nothing. An optional caller-owned workspace lets a call with fewer items than SMs
// (short prompts, small chunks, long index lists) cut its items along their index lists over the
// SMs they would leave idle.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "hmla/params.h"

namespace hmla {

// Validates params, then runs the attention on stream (out, max_logits and lse written; with a
// workspace, one memset of its counters before the kernel).
void sparse_prefill_run(const SparsePrefillParams& params, cudaStream_t stream);

// Checks params alone (shapes, strides, pointers, the workspace's size) and throws
// hmla::InvalidArgument on the first problem; sparse_prefill_run calls it.
void validate(const SparsePrefillParams& params);

// The workspace bytes that params' shape (s_q, h_q, topk) needs on the current device to cut its
// items; 0 when there is nothing to cut (as many items as SMs or more, or lists of one pair of
// 64-key tiles). At most ~9 MB on a 132-SM H100 or H200.
size_t sparse_prefill_workspace_bytes(const SparsePrefillParams& params);

}  // namespace hmla
