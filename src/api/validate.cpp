// Argument checks of the dense decode entry points (host only; nothing here touches device memory).
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

#include "hmla/dense_decode.h"
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

constexpr int64_t kHalfBytes = 2;           // bf16 and fp16
constexpr int64_t kVectorBytes = 16;        // 16-byte vector loads/stores and TMA granularity
constexpr int64_t kTmaMaxStrideBytes = int64_t{1} << 40;  // cuTensorMapEncode: stride < 2^40 bytes
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

[[noreturn]] void fail(const char* where, const std::string& argument, const std::string& got,
                       const std::string& expected) {
  throw InvalidArgument(where, argument, got, expected);
}

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

void check_at_least(const char* where, const char* name, int64_t value, int64_t lo) {
  if (value < lo) fail(where, name, str(value), ">= " + str(lo));
}

void check_in_range(const char* where, const char* name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    fail(where, name, str(value), "in [" + str(lo) + ", " + str(hi) + "]");
  }
}

void check_pointer(const char* where, const char* name, const void* p, uintptr_t alignment) {
  if (p == nullptr) fail(where, name, "null", "a non-null device pointer");
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  if (address % alignment != 0) {
    fail(where, name, pointer_str(p) + " (address % " + std::to_string(alignment) + " = " +
                          std::to_string(address % alignment) + ")",
         "a " + std::to_string(alignment) + "-byte aligned device pointer");
  }
}

// A stride of a bf16/fp16 tensor read or written with 16-byte vectors (or TMA).
void check_vector_stride(const char* where, const char* name, int64_t stride) {
  const int64_t multiple = kVectorBytes / kHalfBytes;
  if (stride < 0 || stride % multiple != 0) {
    fail(where, name, str(stride),
         "a multiple of " + str(multiple) + " elements (" + str(kVectorBytes) + " bytes), >= 0");
  }
}

struct Dim {
  const char* name;  // the stride's field name
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
  std::stable_sort(dims, end, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t span = row_elems;
  for (Dim* d = dims; d != end; ++d) {
    if (d->stride < span) {
      fail(where, d->name, str(d->stride),
           ">= " + str(span) + " elements, so that the rows of " + tensor + " do not overlap");
    }
    span = sat_add(span, sat_mul(d->extent - 1, d->stride));
  }
}

bool is_supported_page_size(int page_size) {
  return page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128 ||
         page_size == 256;
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

void validate_plan_args(const int32_t* cache_seqlens, int batch, int s_q, int h_q, int h_kv,
                        const void* workspace, size_t workspace_bytes, size_t required_bytes) {
  const char* where = kDenseDecodePlanWhere;
  check_pointer(where, "cache_seqlens", cache_seqlens, alignof(int32_t));
  validate_plan_shape(where, batch, s_q, h_q, h_kv);
  check_pointer(where, "workspace", workspace, kVectorBytes);
  if (workspace_bytes < required_bytes) {
    fail(where, "workspace_bytes", std::to_string(workspace_bytes),
         ">= " + std::to_string(required_bytes) +
             " bytes (dense_decode_workspace_bytes for batch " + str(batch) + ", s_q " + str(s_q) +
             ", h_q " + str(h_q) + ", h_kv " + str(h_kv) + ")");
  }
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
  check_pointer(where, "q", p.q, kVectorBytes);
  check_vector_stride(where, "q_batch_stride", p.q_batch_stride);
  check_vector_stride(where, "q_token_stride", p.q_token_stride);
  check_vector_stride(where, "q_head_stride", p.q_head_stride);
  {
    Dim dims[] = {{"q_head_stride", p.h_q, p.q_head_stride},
                  {"q_token_stride", p.s_q, p.q_token_stride},
                  {"q_batch_stride", p.batch, p.q_batch_stride}};
    check_no_overlap(where, "q", dims, 3, p.d_qk);
  }

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
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale < 0.f) {
    fail(where, "softmax_scale", float_str(p.softmax_scale),
         "a finite value >= 0 (0 selects 1/sqrt(d_qk))");
  }

  // ---- out [batch, s_q, h_q, d_v], dtype of q, written with 16-byte vectors
  check_pointer(where, "out", p.out, kVectorBytes);
  check_vector_stride(where, "out_batch_stride", p.out_batch_stride);
  check_vector_stride(where, "out_token_stride", p.out_token_stride);
  check_vector_stride(where, "out_head_stride", p.out_head_stride);
  {
    Dim dims[] = {{"out_head_stride", p.h_q, p.out_head_stride},
                  {"out_token_stride", p.s_q, p.out_token_stride},
                  {"out_batch_stride", p.batch, p.out_batch_stride}};
    check_no_overlap(where, "out", dims, 3, p.d_v);
  }

  // ---- lse [batch, h_q, s_q] float32, s_q contiguous
  check_pointer(where, "lse", p.lse, alignof(float));
  check_at_least(where, "lse_batch_stride", p.lse_batch_stride, 0);
  check_at_least(where, "lse_head_stride", p.lse_head_stride, 0);
  {
    Dim dims[] = {{"lse_head_stride", p.h_q, p.lse_head_stride},
                  {"lse_batch_stride", p.batch, p.lse_batch_stride}};
    check_no_overlap(where, "lse", dims, 2, p.s_q);
  }
}

}  // namespace hmla
