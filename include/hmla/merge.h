// Merging partial attention results: the same query rows attended over disjoint sets of keys (the
// shards of a context split over GPUs, a shared prefix and each request's own suffix in cascade
// attention, the chunks of a long prefill) give one result per set; merged, they are the attention
// over the union, as if it had been computed at once.
//
//   hmla::AttentionState a = hmla::AttentionState::contiguous(out_a, lse_a, s_q, h, d_v);
//   hmla::AttentionState b = hmla::AttentionState::contiguous(out_b, lse_b, s_q, h, d_v);
//   hmla::AttentionOutput o = hmla::AttentionOutput::contiguous(out, lse, s_q, h, d_v);
//   hmla::merge_attention_states(hmla::DType::kBF16, batch, s_q, h, d_v, a, b, o, stream);
//
// Each state is out [batch, s_q, h, d_v] (bf16 or fp16, normalised: the softmax-weighted mean of
// its values) with lse [batch, h, s_q] (float32, natural log of the sum of exp(score)), the layouts
// the decode entry points return; strides make any other layout work. Per row:
//   lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s
// A state with lse = +inf (hmla's "no key") or -inf (the convention of libraries that return the
// log of an empty sum) contributes nothing, and its out is never read. A row where no state has a
// key gets out = 0 and lse = +inf. A NaN lse makes the row's out and lse NaN; a NaN in the out of a
// state that contributes makes that element NaN (as the unsplit attention would be).
//
// The output may be one of the states' own buffers (the same pointer with the same strides), which
// merges in place: merge_attention_states(..., a, b, {a's out, a's lse}, ...) leaves the union in a.
// Outputs that overlap a state in any other way are undefined. Neither entry point allocates or
// synchronises; both can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "hmla/types.h"

namespace hmla {

// One partial result (device memory). Strides are in elements of the buffer's own type; the last
// dimension of out is contiguous.
struct AttentionState {
  const void* out = nullptr;  // [batch, s_q, h, d_v], bf16 or fp16
  int64_t out_batch_stride = 0;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  const float* lse = nullptr;  // [batch, h, s_q]
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
  int64_t lse_token_stride = 1;

  // The decode entry points' layouts, densely packed.
  static AttentionState contiguous(const void* out, const float* lse, int s_q, int h, int d_v) {
    AttentionState s;
    s.out = out;
    s.out_head_stride = d_v;
    s.out_token_stride = int64_t{h} * d_v;
    s.out_batch_stride = int64_t{s_q} * h * d_v;
    s.lse = lse;
    s.lse_token_stride = 1;
    s.lse_head_stride = s_q;
    s.lse_batch_stride = int64_t{h} * s_q;
    return s;
  }
};

// Where the merged result goes (device memory), in the same shapes.
struct AttentionOutput {
  void* out = nullptr;  // [batch, s_q, h, d_v], the states' dtype
  int64_t out_batch_stride = 0;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  float* lse = nullptr;  // [batch, h, s_q]; null: only out is written
  int64_t lse_batch_stride = 0;
  int64_t lse_head_stride = 0;
  int64_t lse_token_stride = 1;

  static AttentionOutput contiguous(void* out, float* lse, int s_q, int h, int d_v) {
    const AttentionState s = AttentionState::contiguous(out, lse, s_q, h, d_v);
    AttentionOutput o;
    o.out = out;
    o.out_batch_stride = s.out_batch_stride;
    o.out_token_stride = s.out_token_stride;
    o.out_head_stride = s.out_head_stride;
    o.lse = lse;
    o.lse_batch_stride = s.lse_batch_stride;
    o.lse_head_stride = s.lse_head_stride;
    o.lse_token_stride = s.lse_token_stride;
    return o;
  }
};

// Most states one call merges (their views travel in the kernel's parameters). More states merge
// in several calls: the merge of a merge is the merge of all (up to the rounding of out in between).
constexpr int kMaxMergeStates = 32;

// The n-way merge: num_states views (a host array, read during the call only) into output.
struct MergeAttentionParams {
  DType dtype = DType::kBF16;
  int batch = 0;
  int s_q = 1;
  int h = 0;
  int d_v = 512;  // any multiple of 8

  int num_states = 0;  // 1..kMaxMergeStates
  const AttentionState* states = nullptr;

  AttentionOutput output;
};

// Merges params.states into params.output on `stream` (one kernel launch).
void merge_attention_states(const MergeAttentionParams& params, cudaStream_t stream);

// The two-state merge: a and b into output.
void merge_attention_states(DType dtype, int batch, int s_q, int h, int d_v, const AttentionState& a,
                            const AttentionState& b, const AttentionOutput& output, cudaStream_t stream);

// Checks params alone (shape, dtype, pointers, alignment, strides, how the output may alias a
// state) and throws hmla::InvalidArgument on the first problem; merge_attention_states calls it.
void validate(const MergeAttentionParams& params);

}  // namespace hmla
