// Argument checks of the decode entry points, dense and token-sparse (host only; nothing here touches
// device memory).
//
// Every check throws hmla::InvalidArgument(where, argument, got, expected) with the struct field (or
// function parameter) name as `argument`. The checks are exactly what the kernels need to stay in
// bounds, aligned and race free, plus the rule that the rows of a tensor never overlap: a stride of 0
// on a dimension of extent > 1 is almost always a field the caller forgot to set, and it would
// otherwise give a silent wrong answer. docs/API.md ("Validation") lists them; keep both in step.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "common/device_attributes.h"
#include "hmla/dense_decode.h"
#include "hmla/merge.h"
#include "hmla/reference.h"
#include "hmla/sparse_decode.h"
#include "hmla/sparse_prefill.h"
#include "hmla/types.h"
#include "scheduler/decode_schedule.h"

namespace hmla {
namespace {

using detail::kDenseDecodePlanWhere;
using detail::kDenseDecodeWhere;
using detail::kDenseDQK;
using detail::kDenseDV;
using detail::kMaxHeadsQ;
using detail::kMaxPlanRequests;
using detail::kMaxSeqQ;
using detail::kMaxSparseRequests;
static_assert(kMaxSparseRequests == kMaxPlanRequests, "one sparse request per query token is one plan request");
using detail::kSparseDecodePlanWhere;
using detail::kSparseDecodeWhere;
using detail::kSparseDV;

constexpr int64_t kHalfBytes = 2;           // bf16 and fp16
constexpr int64_t kVectorBytes = 16;        // 16-byte vector loads/stores and TMA granularity
constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;  // cuTensorMapEncode: stride < 2^40 bytes
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

[[noreturn]] void fail(const char* where, const std::string& argument, const std::string& got,
                       const std::string& expected) {
  throw InvalidArgument(where, argument, got, expected);
}

// An argument's name as a prefix and a suffix ("out" + "_batch_stride", "cache" + ".data"), joined only
// when a check fails: a run entry point validates every call, and building the names on the success
// path (heap strings past the 15-character small-string buffer) was most of its validation time.
struct Field {
  const char* prefix;
  const char* suffix = "";
  Field(const char* name) : prefix(name) {}  // NOLINT: a plain name converts implicitly
  Field(const char* p, const char* s) : prefix(p), suffix(s) {}
  operator std::string() const { return std::string(prefix) + suffix; }  // NOLINT: fail() takes the joined name
};

std::string str(int64_t v) { return std::to_string(v); }

std::string float_str(float v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
  return buf;
}

std::string pointer_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

// Saturating arithmetic on non-negative values, so that absurd strides cannot wrap around.
int64_t sat_add(int64_t a, int64_t b) { return a > kInt64Max - b ? kInt64Max : a + b; }
int64_t sat_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kInt64Max / b ? kInt64Max : a * b;
}

void check_at_least(const char* where, Field name, int64_t value, int64_t lo) {
  if (value < lo) fail(where, name, str(value), ">= " + str(lo));
}

void check_in_range(const char* where, Field name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    fail(where, name, str(value), "in [" + str(lo) + ", " + str(hi) + "]");
  }
}

void check_pointer(const char* where, Field name, const void* p, uintptr_t alignment) {
  if (p == nullptr) fail(where, name, "null", "a non-null device pointer");
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  if (address % alignment != 0) {
    fail(where, name, pointer_str(p) + " (address % " + std::to_string(alignment) + " = " +
                          std::to_string(address % alignment) + ")",
         "a " + std::to_string(alignment) + "-byte aligned device pointer");
  }
}

// An optional input: null means absent; given, it must be aligned like a required one.
void check_optional_pointer(const char* where, Field name, const void* p, uintptr_t alignment) {
  if (p != nullptr) check_pointer(where, name, p, alignment);
}

// A stride of a bf16/fp16 tensor read or written with 16-byte vectors (or TMA).
void check_vector_stride(const char* where, Field name, int64_t stride) {
  const int64_t multiple = kVectorBytes / kHalfBytes;
  if (stride < 0 || stride % multiple != 0) {
    fail(where, name, str(stride),
         "a multiple of " + str(multiple) + " elements (" + str(kVectorBytes) + " bytes), >= 0");
  }
}

struct Dim {
  Field name;  // the stride's field name
  int64_t extent;
  int64_t stride;    // elements, already checked >= 0
};

// The rows (row_elems contiguous elements each) addressed by these dimensions must be pairwise
// disjoint. Dimensions of extent 1 are ignored (their stride is never multiplied by anything but 0).
// Sorted by stride, each dimension must step over everything the smaller ones span; this accepts every
// permutation of a dense layout and any padding between rows, pages or requests.
void check_no_overlap(const char* where, const char* tensor, Dim* dims, int count,
                      int64_t row_elems) {
  Dim* end = std::remove_if(dims, dims + count, [](const Dim& d) { return d.extent <= 1; });
  // A stable insertion sort by stride: at most three dimensions, and std::stable_sort would allocate.
  for (Dim* d = dims + 1; d < end; ++d)
    for (Dim* e = d; e != dims && e->stride < (e - 1)->stride; --e) std::swap(*e, *(e - 1));
  int64_t span = row_elems;
  for (Dim* d = dims; d != end; ++d) {
    if (d->stride < span) {
      fail(where, d->name, str(d->stride),
           ">= " + str(span) + " elements, so that the rows of " + tensor + " do not overlap");
    }
    span = sat_add(span, sat_mul(d->extent - 1, d->stride));
  }
}

// A [batch, s_q, h_q, row_elems] bf16/fp16 tensor (q, out) accessed with 16-byte vectors; the stride
// fields are named <tensor>_batch_stride, <tensor>_token_stride, <tensor>_head_stride.
void check_token_head_tensor(const char* where, const char* tensor, const void* data, int batch,
                             int s_q, int h_q, int64_t batch_stride, int64_t token_stride,
                             int64_t head_stride, int64_t row_elems) {
  const Field batch_name{tensor, "_batch_stride"}, token_name{tensor, "_token_stride"},
      head_name{tensor, "_head_stride"};
  check_pointer(where, tensor, data, kVectorBytes);
  check_vector_stride(where, batch_name, batch_stride);
  check_vector_stride(where, token_name, token_stride);
  check_vector_stride(where, head_name, head_stride);
  Dim dims[] = {{head_name, h_q, head_stride}, {token_name, s_q, token_stride}, {batch_name, batch, batch_stride}};
  check_no_overlap(where, tensor, dims, 3, row_elems);
}

// A [batch, h, s_q] float32 LSE tensor; the stride fields are named <tensor>_batch_stride,
// <tensor>_head_stride, <tensor>_token_stride.
void check_lse_tensor(const char* where, const char* tensor, const float* lse, int batch, int s_q, int h,
                      int64_t batch_stride, int64_t head_stride, int64_t token_stride) {
  const Field batch_name{tensor, "_batch_stride"}, head_name{tensor, "_head_stride"},
      token_name{tensor, "_token_stride"};
  check_pointer(where, tensor, lse, alignof(float));
  check_at_least(where, batch_name, batch_stride, 0);
  check_at_least(where, head_name, head_stride, 0);
  check_at_least(where, token_name, token_stride, 0);
  Dim dims[] = {{token_name, s_q, token_stride}, {head_name, h, head_stride}, {batch_name, batch, batch_stride}};
  check_no_overlap(where, tensor, dims, 3, 1);
}

// lse [batch, h_q, s_q] float32 of the decode kernels, s_q contiguous.
void check_lse(const char* where, const float* lse, int batch, int s_q, int h_q, int64_t batch_stride,
               int64_t head_stride) {
  check_lse_tensor(where, "lse", lse, batch, s_q, h_q, batch_stride, head_stride, 1);
}

void check_softmax_scale(const char* where, float scale) {
  if (!std::isfinite(scale) || scale < 0.f) {
    fail(where, "softmax_scale", float_str(scale), "a finite value >= 0 (0 selects 1/sqrt(d_qk))");
  }
}

bool is_supported_page_size(int page_size) {
  return page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128 ||
         page_size == 256;
}

// ---- token-sparse decode

// One FP8 paged cache. `prefix` is the field's name in SparseDecodeParams ("cache", "extra_cache").
// Indices are int32 page * page_size + offset, so the cache may hold at most 2^31 - 1 tokens.
void check_sparse_cache(const char* where, const char* prefix, const SparseKVCache& cache,
                        SparseCacheLayout layout) {
  const Field num_blocks{prefix, ".num_blocks"}, block_stride{prefix, ".block_stride_bytes"};
  check_pointer(where, Field{prefix, ".data"}, cache.data, kVectorBytes);
  check_at_least(where, num_blocks, cache.num_blocks, 1);
  check_at_least(where, Field{prefix, ".page_size"}, cache.page_size, 1);
  const int64_t tokens = int64_t{cache.num_blocks} * cache.page_size;
  if (tokens > kInt32Max) {
    fail(where, num_blocks, str(cache.num_blocks) + " (num_blocks * page_size = " + str(tokens) + " tokens)",
         "num_blocks * page_size <= " + str(kInt32Max) + " (indices are int32)");
  }
  const int64_t page_bytes = reference::sparse_page_bytes(layout, cache.page_size);
  if (cache.block_stride_bytes % kVectorBytes != 0 || cache.block_stride_bytes < page_bytes) {
    fail(where, block_stride, str(cache.block_stride_bytes),
         "a multiple of " + str(kVectorBytes) + " bytes, >= " + str(page_bytes) +
             " (the layout's page bytes for page_size " + str(cache.page_size) + ")");
  }
}

// A [batch, s_q, topk] int32 index list (main or extra); the names are the SparseDecodeParams fields.
void check_index_list(const char* where, const char* name, const int32_t* indices, const char* topk_name,
                      int topk, const char* batch_stride_name, int64_t batch_stride,
                      const char* token_stride_name, int64_t token_stride, int batch, int s_q) {
  check_pointer(where, name, indices, alignof(int32_t));
  check_at_least(where, topk_name, topk, 1);
  check_at_least(where, batch_stride_name, batch_stride, 0);
  check_at_least(where, token_stride_name, token_stride, 0);
  Dim dims[] = {{token_stride_name, s_q, token_stride}, {batch_stride_name, batch, batch_stride}};
  check_no_overlap(where, name, dims, 2, topk);
}

// Without an extra cache its lists must be absent too: a list given alone is a caller bug, and the
// kernels would silently ignore it.
void check_no_extra_lists(const char* where, const SparseDecodeParams& p) {
  if (p.extra_indices != nullptr) {
    fail(where, "extra_indices", pointer_str(p.extra_indices),
         "null (extra_indices given without extra_cache.data)");
  }
  if (p.extra_topk_length != nullptr) {
    fail(where, "extra_topk_length", pointer_str(p.extra_topk_length),
         "null (extra_topk_length given without extra_cache.data)");
  }
}

}  // namespace

namespace detail {

void validate_plan_shape(const char* where, int batch, int s_q, int h_q, int h_kv) {
  check_in_range(where, "batch", batch, 1, kMaxPlanRequests);
  check_in_range(where, "s_q", s_q, 1, kMaxSeqQ);
  check_in_range(where, "h_q", h_q, 1, kMaxHeadsQ);
  check_at_least(where, "h_kv", h_kv, 1);
  if (h_q % h_kv != 0) {
    fail(where, "h_kv", str(h_kv), "a divisor of h_q = " + str(h_q));
  }
}

void check_schedule_matches(const char* where, const char* plan, const DecodeSchedule& schedule, int batch,
                            int s_q, int h_q, int h_kv) {
  if (schedule.workspace == nullptr || schedule.tile_metadata == nullptr)
    fail(where, "schedule", "an empty schedule", std::string("the result of ") + plan);
  const struct {
    const char* name;
    int got, planned;
  } fields[] = {{"batch", batch, schedule.batch}, {"s_q", s_q, schedule.s_q}, {"h_q", h_q, schedule.h_q},
                {"h_kv", h_kv, schedule.h_kv}};
  for (const auto& f : fields)
    if (f.got != f.planned) fail(where, f.name, str(f.got), str(f.planned) + " (the value the schedule was planned for)");
}

void validate_plan_args(const int32_t* cache_seqlens, int batch, int s_q, int h_q, int h_kv,
                        const void* workspace, size_t workspace_bytes, size_t required_bytes) {
  const char* where = kDenseDecodePlanWhere;
  check_pointer(where, "cache_seqlens", cache_seqlens, alignof(int32_t));
  validate_plan_shape(where, batch, s_q, h_q, h_kv);
  validate_workspace(where, workspace, workspace_bytes, required_bytes,
                     "dense_decode_workspace_bytes for batch " + str(batch) + ", s_q " + str(s_q) + ", h_q " +
                         str(h_q) + ", h_kv " + str(h_kv));
}

int resolve_num_sms(const char* where, int num_sms) {
  if (num_sms < 0) fail(where, "num_sms", str(num_sms), ">= 0 (0: the current device's SM count)");
  return num_sms == 0 ? current_device_sm_count() : num_sms;
}

void validate_workspace(const char* where, const void* workspace, size_t workspace_bytes, size_t required_bytes,
                        const std::string& sized_by) {
  check_pointer(where, "workspace", workspace, kVectorBytes);
  if (workspace_bytes < required_bytes)
    fail(where, "workspace_bytes", std::to_string(workspace_bytes),
         ">= " + std::to_string(required_bytes) + " bytes (" + sized_by + ")");
}

void validate_sparse_plan_shape(const char* where, int batch, int s_q, int h_q) {
  check_at_least(where, "batch", batch, 1);
  check_at_least(where, "s_q", s_q, 1);
  const int64_t requests = int64_t{batch} * s_q;
  if (requests > kMaxSparseRequests) {
    fail(where, "batch", str(batch) + " (batch * s_q = " + str(requests) + " with s_q " + str(s_q) + ")",
         "batch * s_q <= " + str(kMaxSparseRequests));
  }
  check_in_range(where, "h_q", h_q, 1, kMaxHeadsQ);
}

void validate_sparse_plan_args(const SparseDecodeParams& p, const void* workspace,
                               size_t workspace_bytes, size_t required_bytes) {
  const char* where = kSparseDecodePlanWhere;
  validate_sparse_plan_shape(where, p.batch, p.s_q, p.h_q);
  check_at_least(where, "topk", p.topk, 1);
  check_optional_pointer(where, "topk_length", p.topk_length, alignof(int32_t));
  if (p.extra_cache.data != nullptr) {
    check_at_least(where, "extra_topk", p.extra_topk, 1);
    check_optional_pointer(where, "extra_topk_length", p.extra_topk_length, alignof(int32_t));
  } else {
    check_no_extra_lists(where, p);
  }
  validate_workspace(where, workspace, workspace_bytes, required_bytes,
                     "sparse_decode_workspace_bytes for batch " + str(p.batch) + ", s_q " + str(p.s_q) + ", h_q " +
                         str(p.h_q));
}

}  // namespace detail

void validate(const DenseDecodeParams& p) {
  const char* where = kDenseDecodeWhere;

  // ---- dtype and shape
  if (p.dtype != DType::kBF16 && p.dtype != DType::kFP16) {
    fail(where, "dtype", "DType(" + str(static_cast<int32_t>(p.dtype)) + ")",
         "bf16 (DType::kBF16) or fp16 (DType::kFP16)");
  }
  detail::validate_plan_shape(where, p.batch, p.s_q, p.h_q, p.h_kv);
  if (p.d_qk != kDenseDQK) fail(where, "d_qk", str(p.d_qk), str(kDenseDQK));
  if (p.d_v != kDenseDV) fail(where, "d_v", str(p.d_v), str(kDenseDV));

  // ---- q [batch, s_q, h_q, d_qk]
  check_token_head_tensor(where, "q", p.q, p.batch, p.s_q, p.h_q, p.q_batch_stride, p.q_token_stride,
                          p.q_head_stride, p.d_qk);

  // ---- k_cache [num_blocks, page_size, h_kv, d_qk], read through TMA
  check_pointer(where, "k_cache", p.k_cache, kVectorBytes);
  check_at_least(where, "num_blocks", p.num_blocks, 1);
  if (!is_supported_page_size(p.page_size)) {
    fail(where, "page_size", str(p.page_size), "one of 16, 32, 64, 128, 256");
  }
  for (const Dim& d : {Dim{"k_block_stride", p.num_blocks, p.k_block_stride},
                       Dim{"k_token_stride", p.page_size, p.k_token_stride},
                       Dim{"k_head_stride", p.h_kv, p.k_head_stride}}) {
    check_vector_stride(where, d.name, d.stride);
    if (d.stride >= kTmaMaxStrideBytes / kHalfBytes) {
      fail(where, d.name, str(d.stride),
           "< " + str(kTmaMaxStrideBytes / kHalfBytes) + " elements (TMA strides are < 2^40 bytes)");
    }
  }
  {
    Dim dims[] = {{"k_head_stride", p.h_kv, p.k_head_stride},
                  {"k_token_stride", p.page_size, p.k_token_stride},
                  {"k_block_stride", p.num_blocks, p.k_block_stride}};
    check_no_overlap(where, "k_cache", dims, 3, p.d_qk);
  }

  // ---- block_table [batch, max_blocks_per_seq] int32, cache_seqlens [batch] int32
  check_pointer(where, "block_table", p.block_table, alignof(int32_t));
  check_at_least(where, "max_blocks_per_seq", p.max_blocks_per_seq, 1);
  check_at_least(where, "block_table_batch_stride", p.block_table_batch_stride, 0);
  {
    Dim dims[] = {{"block_table_batch_stride", p.batch, p.block_table_batch_stride}};
    check_no_overlap(where, "block_table", dims, 1, p.max_blocks_per_seq);
  }
  check_pointer(where, "cache_seqlens", p.cache_seqlens, alignof(int32_t));

  // ---- softmax_scale (0: 1/sqrt(d_qk))
  check_softmax_scale(where, p.softmax_scale);

  // ---- out [batch, s_q, h_q, d_v], dtype of q, written with 16-byte vectors
  check_token_head_tensor(where, "out", p.out, p.batch, p.s_q, p.h_q, p.out_batch_stride,
                          p.out_token_stride, p.out_head_stride, p.d_v);

  // ---- lse [batch, h_q, s_q] float32, s_q contiguous
  check_lse(where, p.lse, p.batch, p.s_q, p.h_q, p.lse_batch_stride, p.lse_head_stride);
}

void validate(const SparseDecodeParams& p) {
  const char* where = kSparseDecodeWhere;

  // ---- layout and shape
  if (p.layout != SparseCacheLayout::kV32 && p.layout != SparseCacheLayout::kModel1) {
    fail(where, "layout", "SparseCacheLayout(" + str(static_cast<int32_t>(p.layout)) + ")",
         "SparseCacheLayout::kV32 or SparseCacheLayout::kModel1");
  }
  const int d_qk = reference::sparse_cache_d_qk(p.layout);
  if (p.d_qk != d_qk) {
    fail(where, "d_qk", str(p.d_qk),
         str(d_qk) + (p.layout == SparseCacheLayout::kV32 ? " (layout kV32)" : " (layout kModel1)"));
  }
  if (p.d_v != kSparseDV) fail(where, "d_v", str(p.d_v), str(kSparseDV));
  detail::validate_sparse_plan_shape(where, p.batch, p.s_q, p.h_q);

  // ---- q [batch, s_q, h_q, d_qk] bf16
  check_token_head_tensor(where, "q", p.q, p.batch, p.s_q, p.h_q, p.q_batch_stride, p.q_token_stride,
                          p.q_head_stride, p.d_qk);

  // ---- the main cache and its index lists
  check_sparse_cache(where, "cache", p.cache, p.layout);
  check_index_list(where, "indices", p.indices, "topk", p.topk, "indices_batch_stride",
                   p.indices_batch_stride, "indices_token_stride", p.indices_token_stride, p.batch,
                   p.s_q);
  check_optional_pointer(where, "topk_length", p.topk_length, alignof(int32_t));

  // ---- the extra cache (optional)
  if (p.extra_cache.data != nullptr) {
    check_sparse_cache(where, "extra_cache", p.extra_cache, p.layout);
    check_index_list(where, "extra_indices", p.extra_indices, "extra_topk", p.extra_topk,
                     "extra_indices_batch_stride", p.extra_indices_batch_stride,
                     "extra_indices_token_stride", p.extra_indices_token_stride, p.batch, p.s_q);
    check_optional_pointer(where, "extra_topk_length", p.extra_topk_length, alignof(int32_t));
  } else {
    check_no_extra_lists(where, p);
  }

  // ---- attn_sink [h_q] float32 (optional), softmax_scale (0: 1/sqrt(d_qk))
  check_optional_pointer(where, "attn_sink", p.attn_sink, alignof(float));
  check_softmax_scale(where, p.softmax_scale);

  // ---- out [batch, s_q, h_q, 512] bf16, written with 16-byte vectors
  check_token_head_tensor(where, "out", p.out, p.batch, p.s_q, p.h_q, p.out_batch_stride,
                          p.out_token_stride, p.out_head_stride, p.d_v);

  // ---- lse [batch, h_q, s_q] float32, s_q contiguous
  check_lse(where, p.lse, p.batch, p.s_q, p.h_q, p.lse_batch_stride, p.lse_head_stride);
}

void validate(const SparsePrefillParams& p) {
  const char* where = detail::kSparsePrefillWhere;

  // ---- shape: one request per query token, 64 heads per CTA
  check_at_least(where, "s_q", p.s_q, 1);
  if (int64_t{p.s_q} * ((p.h_q + 63) / 64) > kInt32Max)
    fail(where, "s_q", str(p.s_q), "s_q * ceil(h_q / 64) <= " + str(kInt32Max) + " (one work item per query token and head tile)");
  check_at_least(where, "s_kv", p.s_kv, 1);
  check_in_range(where, "h_q", p.h_q, 1, kMaxHeadsQ);
  if (p.d_qk != 576 && p.d_qk != 512) fail(where, "d_qk", str(p.d_qk), "576 or 512");
  if (p.d_v != kSparseDV) fail(where, "d_v", str(p.d_v), str(kSparseDV));

  // ---- q [s_q, h_q, d_qk] bf16 (a token-head tensor with batch 1)
  check_token_head_tensor(where, "q", p.q, 1, p.s_q, p.h_q, 0, p.q_token_stride, p.q_head_stride, p.d_qk);

  // ---- kv [s_kv, d_qk] bf16, rows copied 16 bytes at a time
  check_pointer(where, "kv", p.kv, kVectorBytes);
  check_vector_stride(where, "kv_token_stride", p.kv_token_stride);
  if (p.s_kv > 1 && p.kv_token_stride < p.d_qk)
    fail(where, "kv_token_stride", str(p.kv_token_stride), ">= d_qk = " + str(p.d_qk) + " (rows of kv do not overlap)");

  // ---- indices [s_q, topk] int32, topk_length [s_q] (optional)
  check_index_list(where, "indices", p.indices, "topk", p.topk, "indices_token_stride", p.indices_token_stride,
                   "indices_token_stride", 0, p.s_q, 1);
  check_optional_pointer(where, "topk_length", p.topk_length, alignof(int32_t));

  // ---- the batched form (optional): cu_seqlens_q [num_seqs + 1], seq_kv_offset and seq_kv_len
  // [num_seqs] int32. Their values are device data, which the kernel clamps.
  check_at_least(where, "num_seqs", p.num_seqs, 0);
  if (p.num_seqs > p.s_q)
    fail(where, "num_seqs", str(p.num_seqs), "<= s_q = " + str(p.s_q) + " (at most one sequence per query token)");
  const struct {
    const char* name;
    const int32_t* array;
  } seq_arrays[] = {
      {"cu_seqlens_q", p.cu_seqlens_q}, {"seq_kv_offset", p.seq_kv_offset}, {"seq_kv_len", p.seq_kv_len}};
  // An array given with num_seqs = 0 would be ignored, every token attending over all of kv: a
  // silent wrong answer for a caller who forgot num_seqs.
  for (const auto& a : seq_arrays) {
    if (p.num_seqs > 0)
      check_pointer(where, a.name, a.array, alignof(int32_t));
    else if (a.array != nullptr)
      fail(where, a.name, pointer_str(a.array),
           "null (num_seqs is 0, the flat form; set num_seqs for the batched form)");
  }

  // ---- attn_sink [h_q] float32 (optional), softmax_scale (0: 1/sqrt(d_qk))
  check_optional_pointer(where, "attn_sink", p.attn_sink, alignof(float));
  check_softmax_scale(where, p.softmax_scale);

  // ---- out [s_q, h_q, 512] bf16; max_logits and lse [s_q, h_q] float32, contiguous
  check_token_head_tensor(where, "out", p.out, 1, p.s_q, p.h_q, 0, p.out_token_stride, p.out_head_stride, p.d_v);
  check_pointer(where, "max_logits", p.max_logits, alignof(float));
  check_pointer(where, "lse", p.lse, alignof(float));

  // ---- workspace (optional): the last round's pieces, at least sparse_prefill_workspace_bytes
  check_optional_pointer(where, "workspace", p.workspace, 256);
  if (p.workspace != nullptr) {
    const size_t need = sparse_prefill_workspace_bytes(p);
    if (p.workspace_bytes < need)
      fail(where, "workspace_bytes", str(static_cast<int64_t>(p.workspace_bytes)),
           ">= " + str(static_cast<int64_t>(need)) + " (sparse_prefill_workspace_bytes for this shape and device)");
  }
}

void validate(const MergeAttentionParams& p) {
  const char* where = detail::kMergeWhere;

  // ---- dtype and shape
  if (p.dtype != DType::kBF16 && p.dtype != DType::kFP16) {
    fail(where, "dtype", "DType(" + str(static_cast<int32_t>(p.dtype)) + ")",
         "bf16 (DType::kBF16) or fp16 (DType::kFP16)");
  }
  check_at_least(where, "batch", p.batch, 1);
  check_at_least(where, "s_q", p.s_q, 1);
  check_at_least(where, "h", p.h, 1);
  const int64_t rows = sat_mul(sat_mul(p.batch, p.s_q), p.h);
  if (rows > detail::kMaxMergeRows) {
    fail(where, "batch", str(p.batch) + " (batch * s_q * h = " + str(rows) + ")",
         "batch * s_q * h <= " + str(detail::kMaxMergeRows));
  }
  const int64_t vector_elems = kVectorBytes / kHalfBytes;
  if (p.d_v < vector_elems || p.d_v % vector_elems != 0) {
    fail(where, "d_v", str(p.d_v), "a positive multiple of " + str(vector_elems) + " (16-byte vectors)");
  }

  // ---- the states: out [batch, s_q, h, d_v], lse [batch, h, s_q]
  check_in_range(where, "num_states", p.num_states, 1, kMaxMergeStates);
  if (p.states == nullptr) fail(where, "states", "null", "a host array of num_states AttentionState views");
  for (int i = 0; i < p.num_states; ++i) {
    const AttentionState& st = p.states[i];
    const std::string out_name = "states[" + std::to_string(i) + "].out";
    const std::string lse_name = "states[" + std::to_string(i) + "].lse";
    check_token_head_tensor(where, out_name.c_str(), st.out, p.batch, p.s_q, p.h, st.out_batch_stride,
                            st.out_token_stride, st.out_head_stride, p.d_v);
    check_lse_tensor(where, lse_name.c_str(), st.lse, p.batch, p.s_q, p.h, st.lse_batch_stride,
                     st.lse_head_stride, st.lse_token_stride);
  }

  // ---- the output, and how it may alias a state: exactly (in place) or not at all
  const AttentionOutput& o = p.output;
  check_token_head_tensor(where, "output.out", o.out, p.batch, p.s_q, p.h, o.out_batch_stride,
                          o.out_token_stride, o.out_head_stride, p.d_v);
  if (o.lse != nullptr) {
    check_lse_tensor(where, "output.lse", o.lse, p.batch, p.s_q, p.h, o.lse_batch_stride, o.lse_head_stride,
                     o.lse_token_stride);
  }
  for (int i = 0; i < p.num_states; ++i) {
    const AttentionState& st = p.states[i];
    const std::string state = "states[" + std::to_string(i) + "]";
    if (o.out == st.out) {
      const struct {
        const char* field;
        int64_t got, state;
      } strides[] = {{"output.out_batch_stride", o.out_batch_stride, st.out_batch_stride},
                     {"output.out_token_stride", o.out_token_stride, st.out_token_stride},
                     {"output.out_head_stride", o.out_head_stride, st.out_head_stride}};
      for (const auto& f : strides)
        if (f.got != f.state)
          fail(where, f.field, str(f.got),
               str(f.state) + " (output.out is " + state + ".out: an in-place merge keeps its strides)");
    }
    if (o.lse != nullptr && o.lse == st.lse) {
      const struct {
        const char* field;
        int64_t got, state;
      } strides[] = {{"output.lse_batch_stride", o.lse_batch_stride, st.lse_batch_stride},
                     {"output.lse_head_stride", o.lse_head_stride, st.lse_head_stride},
                     {"output.lse_token_stride", o.lse_token_stride, st.lse_token_stride}};
      for (const auto& f : strides)
        if (f.got != f.state)
          fail(where, f.field, str(f.got),
               str(f.state) + " (output.lse is " + state + ".lse: an in-place merge keeps its strides)");
    }
  }
}

}  // namespace hmla
