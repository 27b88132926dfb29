// CPU reference of dense MLA decode over a paged bf16/fp16 cache (FlashMLA's dense path).
//
// For request b (s_k = cache_seqlens[b]), query token i and head h (kv head h / (h_q / h_kv)):
//   keys j in [0, n_i) with n_i = s_k, or, causal with s_q > 1, n_i = clamp(s_k - s_q + i + 1, 0, s_k)
//   key j: page block_table[b][j / page_size], row j % page_size, head kv
//   score_j = scale * <q, k_j[0, d_qk)>           (scale 0 -> 1/sqrt(d_qk), in double)
//   out = sum_j softmax(score)_j * k_j[0, d_v),  lse = log(sum_j exp(score_j))
//   n_i == 0: out = 0, lse = +inf.
// All arithmetic is double. The softmax is one pass over the keys with a running maximum (the tests
// check it against a two-pass formulation over a materialised score matrix).
//
// Only the block-table entries of pages that hold one of request b's first s_k keys are read; each
// must lie in [0, num_blocks), else hmla::InvalidArgument (the reference never reads out of range).
// Entries after those are never touched, and neither is any cache row outside the keys a query
// attends to. A null out or lse pointer skips that output.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hmla/reference.h"

namespace hmla::reference {
namespace {

constexpr const char* kWhere = "hmla::reference::dense_decode";

// One-pass softmax-weighted sum: keeps the running maximum m, the sum l of exp(score - m) and the
// weighted sum acc of values scaled by exp(-m); a new maximum rescales l and acc.
struct OnlineSoftmax {
  double m = -std::numeric_limits<double>::infinity();
  double l = 0.0;
  double* acc = nullptr;
  int dim = 0;

  void reset(double* storage, int d) {
    m = -std::numeric_limits<double>::infinity();
    l = 0.0;
    acc = storage;
    dim = d;
    for (int k = 0; k < dim; ++k) acc[k] = 0.0;
  }

  void add(double score, const double* value) {
    if (score > m) {
      const double rescale = std::exp(m - score);  // 0 for the first key (m = -inf)
      l = l * rescale + 1.0;
      for (int k = 0; k < dim; ++k) acc[k] = acc[k] * rescale + value[k];
      m = score;
    } else {
      const double p = std::exp(score - m);
      l += p;
      for (int k = 0; k < dim; ++k) acc[k] += p * value[k];
    }
  }
};

void require(bool ok, const char* argument, const std::string& got, const std::string& expected) {
  if (!ok) throw InvalidArgument(kWhere, argument, got, expected);
}

std::string str(int64_t v) { return std::to_string(v); }

void check_params(const DenseDecodeParams& p) {
  require(p.dtype == DType::kBF16 || p.dtype == DType::kFP16, "dtype",
          str(static_cast<int>(p.dtype)), "kBF16 or kFP16");
  require(p.batch >= 0, "batch", str(p.batch), ">= 0");
  require(p.s_q >= 1, "s_q", str(p.s_q), ">= 1");
  require(p.h_q >= 1, "h_q", str(p.h_q), ">= 1");
  require(p.h_kv >= 1, "h_kv", str(p.h_kv), ">= 1");
  require(p.h_q % p.h_kv == 0, "h_q", str(p.h_q), "a multiple of h_kv = " + str(p.h_kv));
  require(p.d_qk >= 1, "d_qk", str(p.d_qk), ">= 1");
  require(p.d_v >= 1 && p.d_v <= p.d_qk, "d_v", str(p.d_v), "in [1, d_qk = " + str(p.d_qk) + "]");
  require(p.page_size >= 1, "page_size", str(p.page_size), ">= 1");
  require(p.num_blocks >= 0, "num_blocks", str(p.num_blocks), ">= 0");
  require(p.max_blocks_per_seq >= 0, "max_blocks_per_seq", str(p.max_blocks_per_seq), ">= 0");
  if (p.batch > 0) {
    require(p.q != nullptr, "q", "null", "a host pointer");
    require(p.cache_seqlens != nullptr, "cache_seqlens", "null", "a host pointer");
  }
}

}  // namespace

void dense_decode(const DenseDecodeParams& p, float* out_f32, const Float64Outputs& f64) {
  check_params(p);
  const double scale =
      p.softmax_scale != 0.f ? static_cast<double>(p.softmax_scale) : 1.0 / std::sqrt(double(p.d_qk));
  const int group = p.h_q / p.h_kv;
  const double inf = std::numeric_limits<double>::infinity();

  std::vector<double> q(static_cast<size_t>(group) * p.d_qk);
  std::vector<double> key(p.d_qk);
  std::vector<double> acc(static_cast<size_t>(group) * p.d_v);
  std::vector<OnlineSoftmax> state(group);
  std::vector<int32_t> pages;

  // Checks every request before writing anything, so a bad argument leaves the outputs untouched.
  for (int b = 0; b < p.batch; ++b) {
    const int s_k = p.cache_seqlens[b];
    require(s_k >= 0, "cache_seqlens", "[" + str(b) + "] = " + str(s_k), ">= 0");
    require(static_cast<int64_t>(s_k) <= static_cast<int64_t>(p.max_blocks_per_seq) * p.page_size,
            "cache_seqlens", "[" + str(b) + "] = " + str(s_k),
            "<= max_blocks_per_seq * page_size = " +
                str(static_cast<int64_t>(p.max_blocks_per_seq) * p.page_size));
    // The last query token attends to all s_k keys, so these are exactly the pages any query needs.
    const int num_pages = (s_k + p.page_size - 1) / p.page_size;
    if (num_pages > 0) {
      require(p.block_table != nullptr, "block_table", "null", "a host pointer");
      require(p.k_cache != nullptr, "k_cache", "null", "a host pointer");
    }
    for (int n = 0; n < num_pages; ++n) {
      const int32_t page = p.block_table[b * p.block_table_batch_stride + n];
      require(page >= 0 && page < p.num_blocks, "block_table",
              "[" + str(b) + "][" + str(n) + "] = " + str(page),
              "a page id in [0, num_blocks = " + str(p.num_blocks) + ")");
    }
  }

  for (int b = 0; b < p.batch; ++b) {
    const int s_k = p.cache_seqlens[b];
    const int num_pages = (s_k + p.page_size - 1) / p.page_size;
    pages.assign(num_pages, 0);
    for (int n = 0; n < num_pages; ++n) pages[n] = p.block_table[b * p.block_table_batch_stride + n];

    for (int i = 0; i < p.s_q; ++i) {
      int n_keys = s_k;
      if (p.causal && p.s_q > 1) {
        n_keys = s_k - p.s_q + i + 1;
        if (n_keys < 0) n_keys = 0;
      }
      for (int kv = 0; kv < p.h_kv; ++kv) {
        for (int g = 0; g < group; ++g) {
          const int h = kv * group + g;
          const int64_t q_base = b * p.q_batch_stride + i * p.q_token_stride + h * p.q_head_stride;
          for (int d = 0; d < p.d_qk; ++d) q[g * p.d_qk + d] = load_half(p.dtype, p.q, q_base + d);
          state[g].reset(acc.data() + static_cast<size_t>(g) * p.d_v, p.d_v);
        }
        for (int j = 0; j < n_keys; ++j) {
          const int64_t k_base = pages[j / p.page_size] * p.k_block_stride +
                                 (j % p.page_size) * p.k_token_stride + kv * p.k_head_stride;
          for (int d = 0; d < p.d_qk; ++d) key[d] = load_half(p.dtype, p.k_cache, k_base + d);
          for (int g = 0; g < group; ++g) {
            const double* qg = q.data() + static_cast<size_t>(g) * p.d_qk;
            double dot = 0.0;
            for (int d = 0; d < p.d_qk; ++d) dot += qg[d] * key[d];
            state[g].add(scale * dot, key.data());
          }
        }
        for (int g = 0; g < group; ++g) {
          const int h = kv * group + g;
          const OnlineSoftmax& s = state[g];
          const bool empty = n_keys == 0;
          const double lse = empty ? inf : s.m + std::log(s.l);
          const int64_t out_base =
              b * p.out_batch_stride + i * p.out_token_stride + h * p.out_head_stride;
          const int64_t dense_base = ((static_cast<int64_t>(b) * p.s_q + i) * p.h_q + h) * p.d_v;
          for (int d = 0; d < p.d_v; ++d) {
            const double o = empty ? 0.0 : s.acc[d] / s.l;
            const float o32 = static_cast<float>(o);
            if (p.out != nullptr) store_half(p.dtype, p.out, out_base + d, o32);
            if (out_f32 != nullptr) out_f32[dense_base + d] = o32;
            if (f64.out != nullptr) f64.out[dense_base + d] = o;
          }
          if (p.lse != nullptr) {
            p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = static_cast<float>(lse);
          }
          if (f64.lse != nullptr) f64.lse[(static_cast<int64_t>(b) * p.h_q + h) * p.s_q + i] = lse;
        }
      }
    }
  }
}

void dense_decode(const DenseDecodeParams& params, float* out_f32) {
  dense_decode(params, out_f32, Float64Outputs{});
}

}  // namespace hmla::reference
