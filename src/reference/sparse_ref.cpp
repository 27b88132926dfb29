// CPU reference of the token-sparse contracts: decode over an FP8 paged cache and prefill over a
// bf16 cache.
//
// sparse_decode, for request b and query token i:
//   the query attends to the concatenation of two lists: indices[b][i][0, L) with L = topk_length[b]
//   (or topk), then, when an extra cache is given, extra_indices[b][i][0, L') of the extra cache.
//   An index is page * page_size + offset of its own cache; one < 0 or >= num_blocks * page_size
//   is invalid and skipped without being read. Entries past L are never read either.
//   Decision: duplicates are not merged. A valid index that appears twice is two keys (its
//   exp(score) counts twice in the softmax), exactly as a kernel that walks the list would do.
//   Keys are the dequantised tokens (unpack_token, d_qk values); V is their first 512 values
//   (kModel1: the 448 NoPE values then the first 64 RoPE values).
// sparse_prefill, for query token s: the same over indices[s][0, topk_length[s] or topk) into the
//   bf16 rows kv[0, s_kv) (invalid: < 0 or >= s_kv); also writes max_logits = the largest scaled
//   score (-inf with no valid key). In the batched form, token s of sequence i indexes the rows
//   kv[seq_kv_offset[i], + seq_kv_len[i]) instead (invalid: < 0 or >= seq_kv_len[i]).
// Both: score = scale * <q, k> (scale 0 -> 1/sqrt(d_qk), in double); out = softmax(score) @ V;
//   lse = log(sum exp(score)), natural log; attn_sink (per head) then multiplies out by
//   exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink - lse)), which is 0 for sink = +inf and
//   1 for sink = -inf; lse is not changed. A query with no valid key: out = 0, lse = +inf
//   (max_logits = -inf), whatever the sink.
// All arithmetic is double, the softmax is one pass with a running maximum. Each needed token is
// dequantised once per query token and reused by every head. A null out / lse / max_logits pointer
// skips that output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hmla/reference.h"

namespace hmla::reference {
namespace {

constexpr int kDv = 512;

std::string str(int64_t v) { return std::to_string(v); }

void require(bool ok, const char* where, const char* argument, const std::string& got,
             const std::string& expected) {
  if (!ok) throw InvalidArgument(where, argument, got, expected);
}

struct HeadResult {
  double max_score;  // -inf with no key
  double lse;        // +inf with no key
};

// Attention of h_q query rows (q, [h_q, d_qk]) over n key rows (keys, [n, d_qk]), V = the first
// kDv columns of each key. Writes out64 [h_q, kDv] (after the sink) and one HeadResult per head.
void attend(const std::vector<double>& q, int h_q, int d_qk, const std::vector<double>& keys, int n,
            double scale, const float* attn_sink, std::vector<double>& out64,
            std::vector<HeadResult>& results) {
  const double inf = std::numeric_limits<double>::infinity();
  out64.assign(static_cast<size_t>(h_q) * kDv, 0.0);
  results.assign(h_q, HeadResult{-inf, inf});
  for (int h = 0; h < h_q; ++h) {
    const double* qh = q.data() + static_cast<size_t>(h) * d_qk;
    double* acc = out64.data() + static_cast<size_t>(h) * kDv;
    // One pass: running maximum m, l = sum exp(score - m), acc = sum exp(score - m) * v.
    double m = -inf;
    double l = 0.0;
    for (int t = 0; t < n; ++t) {
      const double* k = keys.data() + static_cast<size_t>(t) * d_qk;
      double dot = 0.0;
      for (int d = 0; d < d_qk; ++d) dot += qh[d] * k[d];
      const double score = scale * dot;
      if (score > m) {
        const double rescale = std::exp(m - score);  // 0 for the first key
        l = l * rescale + 1.0;
        for (int d = 0; d < kDv; ++d) acc[d] = acc[d] * rescale + k[d];
        m = score;
      } else {
        const double p = std::exp(score - m);
        l += p;
        for (int d = 0; d < kDv; ++d) acc[d] += p * k[d];
      }
    }
    if (n == 0) continue;  // out 0, lse +inf, max -inf
    const double lse = m + std::log(l);
    double factor = 1.0 / l;
    if (attn_sink != nullptr) factor /= 1.0 + std::exp(static_cast<double>(attn_sink[h]) - lse);
    for (int d = 0; d < kDv; ++d) acc[d] *= factor;
    results[h] = HeadResult{m, lse};
  }
}

double resolve_scale(float softmax_scale, int d_qk) {
  return softmax_scale != 0.f ? static_cast<double>(softmax_scale)
                              : 1.0 / std::sqrt(static_cast<double>(d_qk));
}

// ------------------------------------------------------------------------------- sparse decode

constexpr const char* kDecode = "hmla::reference::sparse_decode";

void check_cache(const SparseKVCache& c, SparseCacheLayout layout, const char* name) {
  const std::string arg(name);
  require(c.data != nullptr, kDecode, name, "null", "a host pointer");
  require(c.page_size >= 1, kDecode, (arg + ".page_size").c_str(), str(c.page_size), ">= 1");
  require(c.num_blocks >= 0, kDecode, (arg + ".num_blocks").c_str(), str(c.num_blocks), ">= 0");
  const int64_t page_bytes = sparse_page_bytes(layout, c.page_size);
  require(c.block_stride_bytes >= page_bytes, kDecode, (arg + ".block_stride_bytes").c_str(),
          str(c.block_stride_bytes), ">= the layout's page bytes " + str(page_bytes));
}

void check_lengths(const int32_t* lengths, int batch, int topk, const char* name) {
  if (lengths == nullptr) return;
  for (int b = 0; b < batch; ++b) {
    require(lengths[b] >= 0 && lengths[b] <= topk, kDecode, name,
            "[" + str(b) + "] = " + str(lengths[b]), "in [0, " + str(topk) + "]");
  }
}

void check_decode(const SparseDecodeParams& p) {
  require(p.layout == SparseCacheLayout::kV32 || p.layout == SparseCacheLayout::kModel1, kDecode,
          "layout", str(static_cast<int>(p.layout)), "kV32 (0) or kModel1 (1)");
  const int d_qk = sparse_cache_d_qk(p.layout);
  require(p.d_qk == d_qk, kDecode, "d_qk", str(p.d_qk), str(d_qk) + " for this layout");
  require(p.d_v == kDv, kDecode, "d_v", str(p.d_v), str(kDv));
  require(p.batch >= 0, kDecode, "batch", str(p.batch), ">= 0");
  require(p.s_q >= 1, kDecode, "s_q", str(p.s_q), ">= 1");
  require(p.h_q >= 1, kDecode, "h_q", str(p.h_q), ">= 1");
  require(p.topk >= 0, kDecode, "topk", str(p.topk), ">= 0");
  if (p.batch == 0) return;
  require(p.q != nullptr, kDecode, "q", "null", "a host pointer");
  check_cache(p.cache, p.layout, "cache");
  require(p.topk == 0 || p.indices != nullptr, kDecode, "indices", "null", "a host pointer");
  check_lengths(p.topk_length, p.batch, p.topk, "topk_length");
  if (p.extra_cache.data != nullptr) {
    require(p.extra_topk >= 0, kDecode, "extra_topk", str(p.extra_topk), ">= 0");
    check_cache(p.extra_cache, p.layout, "extra_cache");
    require(p.extra_topk == 0 || p.extra_indices != nullptr, kDecode, "extra_indices", "null",
            "a host pointer");
    check_lengths(p.extra_topk_length, p.batch, p.extra_topk, "extra_topk_length");
  }
}

// Appends the dequantised tokens of one query's list to keys; returns how many were appended.
int gather_fp8(SparseCacheLayout layout, int d_qk, const SparseKVCache& cache, const int32_t* list,
               int length, std::vector<float>& token, std::vector<double>& keys) {
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.page_size;
  int count = 0;
  for (int t = 0; t < length; ++t) {
    const int64_t index = list[t];
    if (index < 0 || index >= num_slots) continue;
    const int64_t page = index / cache.page_size;
    const int offset = static_cast<int>(index % cache.page_size);
    unpack_token(layout, cache.data + page * cache.block_stride_bytes, cache.page_size, offset,
                 token.data());
    keys.insert(keys.end(), token.begin(), token.begin() + d_qk);
    ++count;
  }
  return count;
}

// ------------------------------------------------------------------------------ sparse prefill

constexpr const char* kPrefill = "hmla::reference::sparse_prefill";

void check_prefill(const SparsePrefillParams& p) {
  require(p.d_qk == 576 || p.d_qk == 512, kPrefill, "d_qk", str(p.d_qk), "576 or 512");
  require(p.d_v == kDv, kPrefill, "d_v", str(p.d_v), str(kDv));
  require(p.s_q >= 0, kPrefill, "s_q", str(p.s_q), ">= 0");
  require(p.s_kv >= 0, kPrefill, "s_kv", str(p.s_kv), ">= 0");
  require(p.h_q >= 1, kPrefill, "h_q", str(p.h_q), ">= 1");
  require(p.topk >= 0, kPrefill, "topk", str(p.topk), ">= 0");
  if (p.s_q == 0) return;
  require(p.q != nullptr, kPrefill, "q", "null", "a host pointer");
  require(p.s_kv == 0 || p.kv != nullptr, kPrefill, "kv", "null", "a host pointer");
  require(p.topk == 0 || p.indices != nullptr, kPrefill, "indices", "null", "a host pointer");
  if (p.topk_length != nullptr) {
    for (int s = 0; s < p.s_q; ++s) {
      require(p.topk_length[s] >= 0 && p.topk_length[s] <= p.topk, kPrefill, "topk_length",
              "[" + str(s) + "] = " + str(p.topk_length[s]), "in [0, " + str(p.topk) + "]");
    }
  }
  // The batched form: what the caller promises of the device arrays (the kernel's clamping of
  // other values is a kernel test's business, not the reference's).
  require(p.num_seqs >= 0, kPrefill, "num_seqs", str(p.num_seqs), ">= 0");
  if (p.num_seqs == 0) return;
  require(p.cu_seqlens_q != nullptr, kPrefill, "cu_seqlens_q", "null", "a host pointer");
  require(p.seq_kv_offset != nullptr, kPrefill, "seq_kv_offset", "null", "a host pointer");
  require(p.seq_kv_len != nullptr, kPrefill, "seq_kv_len", "null", "a host pointer");
  require(p.cu_seqlens_q[0] == 0, kPrefill, "cu_seqlens_q", "[0] = " + str(p.cu_seqlens_q[0]), "0");
  for (int i = 0; i < p.num_seqs; ++i) {
    const int32_t begin = p.cu_seqlens_q[i], end = p.cu_seqlens_q[i + 1];
    require(end >= begin, kPrefill, "cu_seqlens_q", "[" + str(i + 1) + "] = " + str(end),
            ">= cu_seqlens_q[" + str(i) + "] = " + str(begin) + " (non-decreasing)");
    const int32_t offset = p.seq_kv_offset[i], len = p.seq_kv_len[i];
    require(offset >= 0 && offset <= p.s_kv, kPrefill, "seq_kv_offset", "[" + str(i) + "] = " + str(offset),
            "in [0, s_kv = " + str(p.s_kv) + "]");
    require(len >= 0 && int64_t{offset} + len <= p.s_kv, kPrefill, "seq_kv_len", "[" + str(i) + "] = " + str(len),
            "in [0, s_kv - seq_kv_offset[" + str(i) + "] = " + str(p.s_kv - offset) + "]");
  }
  require(p.cu_seqlens_q[p.num_seqs] == p.s_q, kPrefill, "cu_seqlens_q",
          "[" + str(p.num_seqs) + "] = " + str(p.cu_seqlens_q[p.num_seqs]), "s_q = " + str(p.s_q));
}

void load_bf16_row(const uint16_t* src, int n, double* dst) {
  for (int d = 0; d < n; ++d) dst[d] = bf16_to_float(src[d]);
}

}  // namespace

void sparse_decode(const SparseDecodeParams& p, float* out_f32, const Float64Outputs& f64) {
  check_decode(p);
  const double scale = resolve_scale(p.softmax_scale, p.d_qk);
  const bool has_extra = p.extra_cache.data != nullptr;

  std::vector<double> q(static_cast<size_t>(p.h_q) * p.d_qk);
  std::vector<float> token(p.d_qk);
  std::vector<double> keys;
  std::vector<double> out64;
  std::vector<HeadResult> results;

  for (int b = 0; b < p.batch; ++b) {
    for (int i = 0; i < p.s_q; ++i) {
      keys.clear();
      int n = 0;
      const int length = p.topk_length != nullptr ? p.topk_length[b] : p.topk;
      if (length > 0) {
        n += gather_fp8(p.layout, p.d_qk, p.cache,
                        p.indices + b * p.indices_batch_stride + i * p.indices_token_stride,
                        length, token, keys);
      }
      if (has_extra) {
        const int extra_length =
            p.extra_topk_length != nullptr ? p.extra_topk_length[b] : p.extra_topk;
        if (extra_length > 0) {
          n += gather_fp8(
              p.layout, p.d_qk, p.extra_cache,
              p.extra_indices + b * p.extra_indices_batch_stride + i * p.extra_indices_token_stride,
              extra_length, token, keys);
        }
      }
      for (int h = 0; h < p.h_q; ++h) {
        load_bf16_row(p.q + b * p.q_batch_stride + i * p.q_token_stride + h * p.q_head_stride,
                      p.d_qk, q.data() + static_cast<size_t>(h) * p.d_qk);
      }
      attend(q, p.h_q, p.d_qk, keys, n, scale, p.attn_sink, out64, results);

      for (int h = 0; h < p.h_q; ++h) {
        const int64_t out_base =
            b * p.out_batch_stride + i * p.out_token_stride + h * p.out_head_stride;
        const int64_t dense_base = ((static_cast<int64_t>(b) * p.s_q + i) * p.h_q + h) * kDv;
        for (int d = 0; d < kDv; ++d) {
          const double o = out64[static_cast<size_t>(h) * kDv + d];
          const float o32 = static_cast<float>(o);
          if (p.out != nullptr) p.out[out_base + d] = float_to_bf16(o32);
          if (out_f32 != nullptr) out_f32[dense_base + d] = o32;
          if (f64.out != nullptr) f64.out[dense_base + d] = o;
        }
        if (p.lse != nullptr) {
          p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] =
              static_cast<float>(results[h].lse);
        }
        if (f64.lse != nullptr) {
          f64.lse[(static_cast<int64_t>(b) * p.h_q + h) * p.s_q + i] = results[h].lse;
        }
      }
    }
  }
}

void sparse_prefill(const SparsePrefillParams& p, float* out_f32, const Float64Outputs& f64) {
  check_prefill(p);
  const double scale = resolve_scale(p.softmax_scale, p.d_qk);

  std::vector<double> q(static_cast<size_t>(p.h_q) * p.d_qk);
  std::vector<double> keys;
  std::vector<double> out64;
  std::vector<HeadResult> results;

  for (int s = 0; s < p.s_q; ++s) {
    const int length = p.topk_length != nullptr ? p.topk_length[s] : p.topk;
    const int32_t* list = p.indices + s * p.indices_token_stride;
    // The rows token s may index: all of kv, or its sequence's (the last one starting at or before s;
    // the empty sequences that start there too come before it).
    const uint16_t* kv = p.kv;
    int64_t s_kv = p.s_kv;
    if (p.num_seqs > 0) {
      const int32_t* cu = p.cu_seqlens_q;
      const int seq = static_cast<int>(std::upper_bound(cu, cu + p.num_seqs + 1, s) - cu) - 1;
      kv = p.kv + p.seq_kv_offset[seq] * p.kv_token_stride;
      s_kv = p.seq_kv_len[seq];
    }
    keys.clear();
    int n = 0;
    for (int t = 0; t < length; ++t) {
      const int32_t index = list[t];
      if (index < 0 || index >= s_kv) continue;
      keys.resize(keys.size() + p.d_qk);
      load_bf16_row(kv + index * p.kv_token_stride, p.d_qk, keys.data() + static_cast<size_t>(n) * p.d_qk);
      ++n;
    }
    for (int h = 0; h < p.h_q; ++h) {
      load_bf16_row(p.q + s * p.q_token_stride + h * p.q_head_stride, p.d_qk,
                    q.data() + static_cast<size_t>(h) * p.d_qk);
    }
    attend(q, p.h_q, p.d_qk, keys, n, scale, p.attn_sink, out64, results);

    for (int h = 0; h < p.h_q; ++h) {
      const int64_t out_base = s * p.out_token_stride + h * p.out_head_stride;
      const int64_t dense_base = (static_cast<int64_t>(s) * p.h_q + h) * kDv;
      for (int d = 0; d < kDv; ++d) {
        const double o = out64[static_cast<size_t>(h) * kDv + d];
        const float o32 = static_cast<float>(o);
        if (p.out != nullptr) p.out[out_base + d] = float_to_bf16(o32);
        if (out_f32 != nullptr) out_f32[dense_base + d] = o32;
        if (f64.out != nullptr) f64.out[dense_base + d] = o;
      }
      const int64_t sh = static_cast<int64_t>(s) * p.h_q + h;
      if (p.lse != nullptr) p.lse[sh] = static_cast<float>(results[h].lse);
      if (p.max_logits != nullptr) p.max_logits[sh] = static_cast<float>(results[h].max_score);
      if (f64.lse != nullptr) f64.lse[sh] = results[h].lse;
      if (f64.max_logits != nullptr) f64.max_logits[sh] = results[h].max_score;
    }
  }
}

void sparse_decode(const SparseDecodeParams& params, float* out_f32) {
  sparse_decode(params, out_f32, Float64Outputs{});
}

void sparse_prefill(const SparsePrefillParams& params, float* out_f32) {
  sparse_prefill(params, out_f32, Float64Outputs{});
}

}  // namespace hmla::reference
