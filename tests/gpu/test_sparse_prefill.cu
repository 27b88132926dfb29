// Sparse prefill (hmla::sparse_prefill_run) against the float64 reference (hmla::reference::
// sparse_prefill) on the GPU.
//   * Inputs: random bf16 q and kv, with NaN in every kv row no index names (the kernel must never
//     read them) and in the padding of kv rows.
//   * Indices: invalid ones of every kind (-1, INT_MIN, -5, s_kv, s_kv + 7, INT_MAX) mixed in at a
//     stated rate (0 %, 10 %, 30 %, 100 %), and duplicates (drawn with replacement).
//   * topk_length: none, random in [0, topk] including 0, or past topk (the kernel clamps it; the
//     reference is given the clamped value).
//   * Sinks: none, finite, -inf, +inf.
//   * Outputs: poisoned with NaN before the run.
// Tolerances: over a case, ||out - ref||_2 / ||ref||_2 <= 4e-3 (P and out are rounded to bf16, as
// in the sparse decode tests); every element within 2e-2 * |ref| + 4e-3 * max|ref row|; lse and
// max_logits within 2e-4 * max(1, |ref|) (the scores are float32 sums of bf16 products). A token
// with no valid key: out exactly 0, lse +inf, max_logits -inf.
// Filter: *SparsePrefill*; the sanitizer subset is *SparsePrefillSanitizer*.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "hmla/reference.h"
#include "hmla/sparse_prefill.h"

namespace {

using hmla_test::DeviceBuffer;
using hmla_test::Rng;

enum class Lengths { kNone, kRandom, kPastTopk };
enum class Sink { kNone, kFinite, kMinusInf, kPlusInf };

struct PrefillCase {
  std::string name;
  int d_qk, h_q, s_q, s_kv, topk;
  double invalid_rate;
  Lengths lengths;
  Sink sink;
  bool padded;  // kv rows and out heads with 8 elements of padding
};

void run_case(const PrefillCase& c) {
  Rng rng(hmla_test::hash_string(c.name));
  const int64_t kv_stride = c.d_qk + (c.padded ? 8 : 0);
  const int64_t out_head_stride = 512 + (c.padded ? 8 : 0);
  const int64_t out_token_stride = out_head_stride * c.h_q;
  const uint16_t nan_bits = hmla_test::input_nan_bits(hmla::DType::kBF16);

  std::vector<uint16_t> q(static_cast<size_t>(c.s_q) * c.h_q * c.d_qk);
  for (size_t i = 0; i < q.size(); ++i) q[i] = hmla_test::float_to_bf16_bits(static_cast<float>(rng.normal()));

  std::vector<int32_t> indices(static_cast<size_t>(c.s_q) * c.topk);
  const int32_t invalid[] = {-1, std::numeric_limits<int32_t>::min(), -5, c.s_kv, c.s_kv + 7,
                             std::numeric_limits<int32_t>::max()};
  std::vector<char> referenced(c.s_kv, 0);
  for (auto& x : indices) {
    if (rng.uniform() < c.invalid_rate) {
      x = invalid[rng.uniform_int(0, 5)];
    } else {
      x = rng.uniform_int(0, c.s_kv - 1);
      referenced[x] = 1;
    }
  }
  std::vector<uint16_t> kv(static_cast<size_t>(c.s_kv) * kv_stride, nan_bits);
  for (int64_t t = 0; t < c.s_kv; ++t)
    if (referenced[t])
      for (int d = 0; d < c.d_qk; ++d)
        kv[t * kv_stride + d] = hmla_test::float_to_bf16_bits(static_cast<float>(rng.normal()));

  std::vector<int32_t> lengths, ref_lengths;
  if (c.lengths != Lengths::kNone) {
    for (int s = 0; s < c.s_q; ++s) {
      const int l = c.lengths == Lengths::kPastTopk ? c.topk + rng.uniform_int(1, 1000)
                                                    : (s == 0 ? 0 : rng.uniform_int(0, c.topk));
      lengths.push_back(l);
      ref_lengths.push_back(std::min(l, c.topk));
    }
  }
  std::vector<float> sink;
  if (c.sink != Sink::kNone) {
    for (int h = 0; h < c.h_q; ++h)
      sink.push_back(c.sink == Sink::kFinite     ? static_cast<float>(rng.normal())
                     : c.sink == Sink::kMinusInf ? -INFINITY
                                                 : INFINITY);
  }

  // The reference, on the host copies.
  hmla::SparsePrefillParams p;
  p.s_q = c.s_q;
  p.s_kv = c.s_kv;
  p.h_q = c.h_q;
  p.d_qk = c.d_qk;
  p.d_v = 512;
  p.q_token_stride = static_cast<int64_t>(c.h_q) * c.d_qk;
  p.q_head_stride = c.d_qk;
  p.kv_token_stride = kv_stride;
  p.topk = c.topk;
  p.indices_token_stride = c.topk;
  p.softmax_scale = 0.f;  // 1 / sqrt(d_qk)
  p.out_token_stride = out_token_stride;
  p.out_head_stride = out_head_stride;
  hmla::SparsePrefillParams ref = p;
  std::vector<uint16_t> ref_out(static_cast<size_t>(c.s_q) * out_token_stride);
  std::vector<float> ref_out_f32(static_cast<size_t>(c.s_q) * c.h_q * 512);
  std::vector<float> ref_lse(static_cast<size_t>(c.s_q) * c.h_q), ref_max(ref_lse.size());
  ref.q = q.data();
  ref.kv = kv.data();
  ref.indices = indices.data();
  ref.topk_length = ref_lengths.empty() ? nullptr : ref_lengths.data();
  ref.attn_sink = sink.empty() ? nullptr : sink.data();
  ref.out = ref_out.data();
  ref.max_logits = ref_max.data();
  ref.lse = ref_lse.data();
  hmla::reference::sparse_prefill(ref, ref_out_f32.data());

  // The GPU, outputs poisoned.
  DeviceBuffer d_q(q.size() * 2), d_kv(kv.size() * 2), d_idx(indices.size() * 4);
  DeviceBuffer d_len(std::max<size_t>(lengths.size(), 1) * 4), d_sink(std::max<size_t>(sink.size(), 1) * 4);
  DeviceBuffer d_out(ref_out.size() * 2), d_lse(ref_lse.size() * 4), d_max(ref_max.size() * 4);
  d_q.upload(q.data(), q.size() * 2);
  d_kv.upload(kv.data(), kv.size() * 2);
  d_idx.upload(indices.data(), indices.size() * 4);
  if (!lengths.empty()) d_len.upload(lengths.data(), lengths.size() * 4);
  if (!sink.empty()) d_sink.upload(sink.data(), sink.size() * 4);
  const std::vector<uint16_t> out_poison(ref_out.size(), hmla_test::out_poison_bits(hmla::DType::kBF16));
  const std::vector<uint32_t> f32_poison(ref_lse.size(), hmla_test::kLsePoisonBits);
  d_out.upload(out_poison.data(), out_poison.size() * 2);
  d_lse.upload(f32_poison.data(), f32_poison.size() * 4);
  d_max.upload(f32_poison.data(), f32_poison.size() * 4);
  p.q = d_q.as<uint16_t>();
  p.kv = d_kv.as<uint16_t>();
  p.indices = d_idx.as<int32_t>();
  p.topk_length = lengths.empty() ? nullptr : d_len.as<int32_t>();
  p.attn_sink = sink.empty() ? nullptr : d_sink.as<float>();
  p.out = d_out.as<uint16_t>();
  p.lse = d_lse.as<float>();
  p.max_logits = d_max.as<float>();
  hmla::sparse_prefill_run(p, nullptr);
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> out(ref_out.size());
  std::vector<float> lse(ref_lse.size()), max_logits(ref_max.size());
  d_out.download(out.data(), out.size() * 2);
  d_lse.download(lse.data(), lse.size() * 4);
  d_max.download(max_logits.data(), max_logits.size() * 4);

  double diff2 = 0, ref2 = 0;
  int64_t bad = 0;
  std::string first_bad;
  auto note = [&](const std::string& what) {
    if (bad++ == 0) first_bad = what;
  };
  for (int s = 0; s < c.s_q; ++s) {
    for (int h = 0; h < c.h_q; ++h) {
      const int64_t sh = static_cast<int64_t>(s) * c.h_q + h;
      const std::string at = "token " + std::to_string(s) + " head " + std::to_string(h);
      const uint16_t* got = out.data() + s * out_token_stride + h * out_head_stride;
      const float* want = ref_out_f32.data() + sh * 512;
      if (std::isinf(ref_lse[sh]) && ref_lse[sh] > 0) {  // no valid key
        for (int d = 0; d < 512; ++d)
          if (got[d] != 0 && got[d] != 0x8000) note(at + ": out not 0 without a key");
        if (!(std::isinf(lse[sh]) && lse[sh] > 0)) note(at + ": lse " + std::to_string(lse[sh]) + ", expected +inf");
        if (!(std::isinf(max_logits[sh]) && max_logits[sh] < 0))
          note(at + ": max_logits " + std::to_string(max_logits[sh]) + ", expected -inf");
        continue;
      }
      float row_max = 0;
      for (int d = 0; d < 512; ++d) row_max = std::max(row_max, std::fabs(want[d]));
      for (int d = 0; d < 512; ++d) {
        const float g = hmla_test::bf16_bits_to_float(got[d]);
        const double e = static_cast<double>(g) - want[d];
        diff2 += e * e;
        ref2 += static_cast<double>(want[d]) * want[d];
        if (!(std::fabs(e) <= 2e-2 * std::fabs(want[d]) + 4e-3 * row_max + 1e-7))
          note(at + " d " + std::to_string(d) + ": out " + std::to_string(g) + ", reference " + std::to_string(want[d]));
      }
      if (!(std::fabs(lse[sh] - ref_lse[sh]) <= 2e-4 * std::max(1.f, std::fabs(ref_lse[sh]))))
        note(at + ": lse " + std::to_string(lse[sh]) + ", reference " + std::to_string(ref_lse[sh]));
      if (!(std::fabs(max_logits[sh] - ref_max[sh]) <= 2e-4 * std::max(1.f, std::fabs(ref_max[sh]))))
        note(at + ": max_logits " + std::to_string(max_logits[sh]) + ", reference " + std::to_string(ref_max[sh]));
    }
  }
  // Padding between out's heads keeps the poison: nothing is written there.
  if (c.padded)
    for (int s = 0; s < c.s_q; ++s)
      for (int h = 0; h < c.h_q; ++h)
        for (int d = 512; d < out_head_stride; ++d)
          if (out[s * out_token_stride + h * out_head_stride + d] != out_poison[0]) note("a write into out's padding");
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0;
  EXPECT_EQ(bad, 0) << c.name << ": " << bad << " bad values, first: " << first_bad;
  EXPECT_LE(rel, 4e-3) << c.name << ": relative L2 error of out";
}

std::vector<PrefillCase> cases() {
  // Every value of every axis, and the pairs that matter (d_qk x h_q, topk x lengths, sink x
  // all-invalid), at sizes the float64 reference checks in seconds.
  return {
      {"d576_h64_s1_topk64", 576, 64, 1, 4096, 64, 0.0, Lengths::kNone, Sink::kNone, false},
      {"d576_h128_s63_topk100", 576, 128, 63, 4096, 100, 0.1, Lengths::kRandom, Sink::kFinite, false},
      {"d512_h64_s63_topk100", 512, 64, 63, 4096, 100, 0.1, Lengths::kNone, Sink::kMinusInf, true},
      {"d512_h128_s4_topk2048", 512, 128, 4, 131072, 2048, 0.1, Lengths::kRandom, Sink::kNone, false},
      {"d576_h16_s257_topk64", 576, 16, 257, 4096, 64, 0.3, Lengths::kNone, Sink::kPlusInf, true},
      {"d512_h16_s63_topk1", 512, 16, 63, 1, 1, 0.0, Lengths::kNone, Sink::kNone, false},
      {"d576_h1_s63_topk100", 576, 1, 63, 4096, 100, 0.1, Lengths::kPastTopk, Sink::kFinite, false},
      {"d512_h100_s5_topk5000", 512, 100, 5, 131072, 5000, 0.1, Lengths::kRandom, Sink::kFinite, true},
      {"d576_h100_s3_topk2048", 576, 100, 3, 4096, 2048, 0.0, Lengths::kPastTopk, Sink::kMinusInf, false},
      {"d576_h64_s16_all_invalid", 576, 64, 16, 4096, 100, 1.0, Lengths::kNone, Sink::kFinite, false},
      {"d512_h128_s8_all_invalid_lengths", 512, 128, 8, 1, 64, 1.0, Lengths::kRandom, Sink::kPlusInf, false},
      {"d576_h128_s2_topk5000", 576, 128, 2, 131072, 5000, 0.3, Lengths::kNone, Sink::kNone, true},
  };
}

class SparsePrefill : public ::testing::TestWithParam<PrefillCase> {};
TEST_P(SparsePrefill, MatchesReference) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, SparsePrefill, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& i) { return i.param.name; });

// Small cases for compute-sanitizer (memcheck: no read of an invalid index or NaN row).
class SparsePrefillSanitizer : public ::testing::TestWithParam<PrefillCase> {};
TEST_P(SparsePrefillSanitizer, MatchesReference) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(
    Subset, SparsePrefillSanitizer,
    ::testing::Values(PrefillCase{"sanitizer_d576_h64", 576, 64, 3, 300, 100, 0.3, Lengths::kRandom, Sink::kFinite, true},
                      PrefillCase{"sanitizer_d512_h16", 512, 16, 5, 70, 65, 0.5, Lengths::kPastTopk, Sink::kNone, false}),
    [](const ::testing::TestParamInfo<PrefillCase>& i) { return i.param.name; });

}  // namespace
