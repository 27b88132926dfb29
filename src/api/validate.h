// Internal argument checks shared by the decode entry points (dense and token-sparse).
//
// hmla::validate(const DenseDecodeParams&) (public, hmla/dense_decode.h) checks what dense_decode_run
// receives; validate_plan_args checks what dense_decode_plan receives. hmla::validate(const
// SparseDecodeParams&) (hmla/sparse_decode.h) and validate_sparse_plan_args do the same for sparse
// decode, and hmla::validate(const MergeAttentionParams&) (hmla/merge.h) for the merge. All throw
// hmla::InvalidArgument on the first problem. The full list of checks is in
// docs/API.md ("Validation", "Sparse decode validation", "Merge validation"); keep them in step.
#pragma once

#include <cstddef>
#include <string>
#include <cstdint>

#include "hmla/decode_schedule.h"
#include "hmla/params.h"

namespace hmla::detail {

// Entry point names that appear at the start of every message.
inline constexpr const char* kDenseDecodeWhere = "hmla::dense_decode";
inline constexpr const char* kDenseDecodePlanWhere = "hmla::dense_decode_plan";

// Shape limits of the dense decode kernels.
inline constexpr int kMaxSeqQ = 16;     // s_q (1 + speculative tokens)
inline constexpr int kMaxHeadsQ = 128;  // h_q
inline constexpr int kDenseDQK = 576;
inline constexpr int kDenseDV = 512;

// Checks the arguments of dense_decode_plan: cache_seqlens, the shape (as validate_plan_shape), then
// the workspace. required_bytes is dense_decode_workspace_bytes for the same shape.
void validate_plan_args(const int32_t* cache_seqlens, int batch, int s_q, int h_q, int h_kv,
                        const void* workspace, size_t workspace_bytes, size_t required_bytes);

// The shape checks alone (batch in [1, kMaxPlanRequests], s_q in [1, 16], h_q in [1, 128], h_kv >= 1
// dividing h_q),
// for code that needs a valid shape before it can compute required_bytes (the workspace size).
// `where` names the entry point in the message.
void validate_plan_shape(const char* where, int batch, int s_q, int h_q, int h_kv);

// num_sms as the sizing and plan calls take it: 0 is the current device's SM count, < 0 an error.
int resolve_num_sms(const char* where, int num_sms);

// A plan's workspace: a 16-byte aligned pointer and at least required_bytes; sized_by names the
// sizing call and its shape, for the message.
void validate_workspace(const char* where, const void* workspace, size_t workspace_bytes, size_t required_bytes,
                        const std::string& sized_by);

// ---- token-sparse decode

inline constexpr const char* kSparseDecodeWhere = "hmla::sparse_decode";
inline constexpr const char* kSparsePrefillWhere = "hmla::sparse_prefill";
inline constexpr const char* kSparseDecodePlanWhere = "hmla::sparse_decode_plan";

// Every (batch entry, query token) is one request of the sparse schedule; the planner takes at most
// this many (kMaxPlanRequests, scheduler/decode_schedule.h).
inline constexpr int kMaxSparseRequests = 16384;  // batch * s_q
inline constexpr int kSparseDV = 512;

// The shape checks of sparse decode alone (batch >= 1, s_q >= 1, batch * s_q <= kMaxSparseRequests,
// reported as argument "batch", h_q in [1, 128]), for code that needs a valid shape before it can
// compute the workspace size. `where` names the entry point in the message.
void validate_sparse_plan_shape(const char* where, int batch, int s_q, int h_q);

// Checks what sparse_decode_plan reads of params (the shape, topk, topk_length, the extra cache's
// presence, extra_topk, extra_topk_length), then the workspace. required_bytes is
// sparse_decode_workspace_bytes for the same shape.
void validate_sparse_plan_args(const SparseDecodeParams& params, const void* workspace,
                               size_t workspace_bytes, size_t required_bytes);

// A run's schedule must be a plan's result for the run's shape; `plan` names that plan entry point.
void check_schedule_matches(const char* where, const char* plan, const DecodeSchedule& schedule, int batch,
                            int s_q, int h_q, int h_kv);

// ---- merging partial attention results (hmla/merge.h)

inline constexpr const char* kMergeWhere = "hmla::merge_attention_states";
// One warp per query row, 8 warps per CTA, and at most 2^31 - 1 CTAs in a grid.
inline constexpr int64_t kMaxMergeRows = int64_t{0x7fffffff} * 8;

}  // namespace hmla::detail
