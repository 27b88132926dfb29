// CPU reference of merge_attention_states (hmla/merge.h), straight from the definition in float64.
//
// Row (b, t, head) of state s: o_s = out_s[b][t][head][0, d_v), l_s = lse_s[b][head][t].
//   K = { s : l_s finite };  any l_s NaN: out = NaN, lse = NaN
//   K empty: out = 0, lse = +inf
//   else: m = max_K l_s, lse = m + log(sum_K exp(l_s - m)), out = sum_K exp(l_s - lse) * o_s
// States outside K are never read beyond their lse. Each row is read completely before it is
// written, so the output may be a state's own buffers.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hmla/reference.h"

namespace hmla::reference {
namespace {

constexpr const char* kWhere = "hmla::reference::merge_attention_states";

void require(bool ok, const std::string& argument, const std::string& got, const std::string& expected) {
  if (!ok) throw InvalidArgument(kWhere, argument, got, expected);
}

std::string str(int64_t v) { return std::to_string(v); }

void check_params(const MergeAttentionParams& p) {
  require(p.dtype == DType::kBF16 || p.dtype == DType::kFP16, "dtype", str(static_cast<int>(p.dtype)),
          "kBF16 or kFP16");
  require(p.batch >= 0, "batch", str(p.batch), ">= 0");
  require(p.s_q >= 1, "s_q", str(p.s_q), ">= 1");
  require(p.h >= 1, "h", str(p.h), ">= 1");
  require(p.d_v >= 1, "d_v", str(p.d_v), ">= 1");
  require(p.num_states >= 1, "num_states", str(p.num_states), ">= 1");
  require(p.states != nullptr, "states", "null", "a host array of num_states views");
  if (p.batch == 0) return;
  for (int i = 0; i < p.num_states; ++i) {
    const std::string name = "states[" + std::to_string(i) + "]";
    require(p.states[i].out != nullptr, name + ".out", "null", "a host pointer");
    require(p.states[i].lse != nullptr, name + ".lse", "null", "a host pointer");
  }
}

}  // namespace

void merge_attention_states(const MergeAttentionParams& p, float* out_f32) {
  check_params(p);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const AttentionOutput& o = p.output;
  std::vector<double> lse_of(p.num_states);
  std::vector<double> row(p.d_v);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t t = 0; t < p.s_q; ++t) {
      for (int64_t head = 0; head < p.h; ++head) {
        bool has_nan = false;
        double max_lse = -inf;
        for (int s = 0; s < p.num_states; ++s) {
          const AttentionState& st = p.states[s];
          lse_of[s] = st.lse[b * st.lse_batch_stride + head * st.lse_head_stride + t * st.lse_token_stride];
          if (std::isnan(lse_of[s])) has_nan = true;
          else if (std::isfinite(lse_of[s]) && lse_of[s] > max_lse) max_lse = lse_of[s];
        }
        double lse;
        if (has_nan) {
          lse = nan;
          for (double& v : row) v = nan;
        } else if (max_lse == -inf) {
          lse = inf;
          for (double& v : row) v = 0.0;
        } else {
          double sum = 0.0;
          for (int s = 0; s < p.num_states; ++s)
            if (std::isfinite(lse_of[s])) sum += std::exp(lse_of[s] - max_lse);
          lse = max_lse + std::log(sum);
          for (double& v : row) v = 0.0;
          for (int s = 0; s < p.num_states; ++s) {
            if (!std::isfinite(lse_of[s])) continue;
            const AttentionState& st = p.states[s];
            const double w = std::exp(lse_of[s] - lse);
            const int64_t base = b * st.out_batch_stride + t * st.out_token_stride + head * st.out_head_stride;
            for (int k = 0; k < p.d_v; ++k) row[k] += w * load_half(p.dtype, st.out, base + k);
          }
        }
        const int64_t out_base = b * o.out_batch_stride + t * o.out_token_stride + head * o.out_head_stride;
        const int64_t dense_base = ((b * p.s_q + t) * p.h + head) * p.d_v;
        for (int k = 0; k < p.d_v; ++k) {
          const float v = static_cast<float>(row[k]);
          if (o.out != nullptr) store_half(p.dtype, o.out, out_base + k, v);
          if (out_f32 != nullptr) out_f32[dense_base + k] = v;
        }
        if (o.lse != nullptr)
          o.lse[b * o.lse_batch_stride + head * o.lse_head_stride + t * o.lse_token_stride] = static_cast<float>(lse);
      }
    }
  }
}

}  // namespace hmla::reference
