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
// The batched (varlen) form: the same call over several sequences, each with its own kv range
// (overlapping ones among them), checked bit for bit against one flat call per sequence on the
// sub-problem (the same CTAs compute the same tiles) and against the reference on it. Indices past a
// sequence's kv length but inside kv name NaN rows wherever possible (other sequences' ranges
// included), so an unmasked one shows. Device-side garbage in the three arrays: defined outputs
// (docs/API.md, contract 3) and no out-of-bounds read.
// Cases: SparsePrefillGrid, a pairwise covering list over d_qk {576, 512} x h_q {1, 16, 64, 100, 128}
// x topk {1, 64, 100, 2048, 5000} x s_q {1, 63, 1000} x s_kv {1, 4096, 131072} x sink x topk_length
// {none, random with 0, past topk} x invalid {0, 10, 100 %} x padded strides (every value of every
// axis, every pair of two); SparsePrefill, named cases; the varlen and sanitizer suites below. The
// reference checks every token of a case when that costs at most 1.5e9 multiply-adds, else an even
// sample of them (first and last included).
// SparsePrefillFuzz: random cases (tests/gpu/fuzz.h; *Fuzz* runs it with the decode families').
// Filter: *SparsePrefill*; the sanitizer subset is *SparsePrefillSanitizer*.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz.h"
#include "gpu_test_util.h"
#include "pairwise.h"
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
  // Reference multiply-adds before run_case checks an even sample of the tokens instead of all.
  double ref_budget = 1.5e9;
};

// GPU outputs against the reference's, accumulated over rows; tolerances in the file comment.
struct Comparison {
  double diff2 = 0, ref2 = 0;
  int64_t bad = 0;
  std::string first_bad;

  void note(const std::string& what) {
    if (bad++ == 0) first_bad = what;
  }
  double rel() const { return ref2 > 0 ? std::sqrt(diff2 / ref2) : 0.0; }
  bool ok() const { return bad == 0 && rel() <= 4e-3; }

  // One query token, all h_q heads: out at got_out + h * out_head_stride, lse / max_logits [h_q];
  // the reference's out dense [h_q][512]. A reference lse of +inf is a token with no valid key.
  void token(const std::string& at, int h_q, const uint16_t* got_out, int64_t out_head_stride, const float* lse,
             const float* max_logits, const float* ref_out, const float* ref_lse, const float* ref_max) {
    for (int h = 0; h < h_q; ++h) {
      const std::string head = at + " head " + std::to_string(h);
      const uint16_t* got = got_out + h * out_head_stride;
      const float* want = ref_out + static_cast<int64_t>(h) * 512;
      if (std::isinf(ref_lse[h]) && ref_lse[h] > 0) {
        for (int d = 0; d < 512; ++d)
          if (got[d] != 0 && got[d] != 0x8000) note(head + ": out not 0 without a key");
        if (!(std::isinf(lse[h]) && lse[h] > 0)) note(head + ": lse " + std::to_string(lse[h]) + ", expected +inf");
        if (!(std::isinf(max_logits[h]) && max_logits[h] < 0))
          note(head + ": max_logits " + std::to_string(max_logits[h]) + ", expected -inf");
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
          note(head + " d " + std::to_string(d) + ": out " + std::to_string(g) + ", reference " + std::to_string(want[d]));
      }
      if (!(std::fabs(lse[h] - ref_lse[h]) <= 2e-4 * std::max(1.f, std::fabs(ref_lse[h]))))
        note(head + ": lse " + std::to_string(lse[h]) + ", reference " + std::to_string(ref_lse[h]));
      if (!(std::fabs(max_logits[h] - ref_max[h]) <= 2e-4 * std::max(1.f, std::fabs(ref_max[h]))))
        note(head + ": max_logits " + std::to_string(max_logits[h]) + ", reference " + std::to_string(ref_max[h]));
    }
  }
};

// The outputs of one call on the device, poisoned with NaN until the call writes them, and their
// host copies after it.
struct PrefillOutputs {
  int s_q, h_q;
  int64_t out_token_stride, out_head_stride;
  DeviceBuffer d_out, d_lse, d_max;
  std::vector<uint16_t> out;
  std::vector<float> lse, max_logits;

  PrefillOutputs(int s_q_, int h_q_, int64_t out_head_stride_)
      : s_q(s_q_), h_q(h_q_), out_token_stride(out_head_stride_ * h_q_), out_head_stride(out_head_stride_),
        d_out(static_cast<size_t>(s_q_) * out_token_stride * 2), d_lse(static_cast<size_t>(s_q_) * h_q_ * 4),
        d_max(static_cast<size_t>(s_q_) * h_q_ * 4) {
    const std::vector<uint16_t> out_poison(static_cast<size_t>(s_q) * out_token_stride,
                                           hmla_test::out_poison_bits(hmla::DType::kBF16));
    const std::vector<uint32_t> f32_poison(static_cast<size_t>(s_q) * h_q, hmla_test::kLsePoisonBits);
    d_out.upload(out_poison.data(), out_poison.size() * 2);
    d_lse.upload(f32_poison.data(), f32_poison.size() * 4);
    d_max.upload(f32_poison.data(), f32_poison.size() * 4);
  }
  // Points p's outputs at rows [token0, ...) of these buffers.
  void attach(hmla::SparsePrefillParams& p, int token0 = 0) const {
    p.out = d_out.as<uint16_t>() + token0 * out_token_stride;
    p.out_token_stride = out_token_stride;
    p.out_head_stride = out_head_stride;
    p.lse = d_lse.as<float>() + static_cast<int64_t>(token0) * h_q;
    p.max_logits = d_max.as<float>() + static_cast<int64_t>(token0) * h_q;
  }
  void download() {
    out.resize(static_cast<size_t>(s_q) * out_token_stride);
    lse.resize(static_cast<size_t>(s_q) * h_q);
    max_logits.resize(lse.size());
    d_out.download(out.data(), out.size() * 2);
    d_lse.download(lse.data(), lse.size() * 4);
    d_max.download(max_logits.data(), max_logits.size() * 4);
  }
  // Padding between out's heads keeps the poison: nothing is written there.
  void check_padding(Comparison& cmp) const {
    const uint16_t poison = hmla_test::out_poison_bits(hmla::DType::kBF16);
    for (int s = 0; s < s_q; ++s)
      for (int h = 0; h < h_q; ++h)
        for (int64_t d = 512; d < out_head_stride; ++d)
          if (out[s * out_token_stride + h * out_head_stride + d] != poison) cmp.note("a write into out's padding");
  }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

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

  // The tokens the reference checks: every one when that costs at most c.ref_budget multiply-adds,
  // else an even sample that fits it, the first and the last token included.
  const double token_cost = static_cast<double>(c.h_q) * c.topk * (c.d_qk + 512);
  const int n_check =
      static_cast<int>(std::min<double>(c.s_q, std::max(2.0, std::floor(c.ref_budget / token_cost))));
  std::vector<int> checked(n_check);
  for (int i = 0; i < n_check; ++i)
    checked[i] = n_check == c.s_q ? i : static_cast<int>(static_cast<int64_t>(i) * (c.s_q - 1) / (n_check - 1));

  // The reference, on the host copies of the checked tokens.
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
  ref.s_q = n_check;
  std::vector<uint16_t> ref_q(static_cast<size_t>(n_check) * c.h_q * c.d_qk);
  std::vector<int32_t> ref_indices(static_cast<size_t>(n_check) * c.topk), ref_lengths_checked;
  for (int i = 0; i < n_check; ++i) {
    const size_t t = static_cast<size_t>(checked[i]);
    std::copy_n(q.begin() + t * c.h_q * c.d_qk, c.h_q * c.d_qk, ref_q.begin() + static_cast<size_t>(i) * c.h_q * c.d_qk);
    std::copy_n(indices.begin() + t * c.topk, c.topk, ref_indices.begin() + static_cast<size_t>(i) * c.topk);
    if (!ref_lengths.empty()) ref_lengths_checked.push_back(ref_lengths[t]);
  }
  std::vector<uint16_t> ref_out(static_cast<size_t>(n_check) * out_token_stride);
  std::vector<float> ref_out_f32(static_cast<size_t>(n_check) * c.h_q * 512);
  std::vector<float> ref_lse(static_cast<size_t>(n_check) * c.h_q), ref_max(ref_lse.size());
  ref.q = ref_q.data();
  ref.kv = kv.data();
  ref.indices = ref_indices.data();
  ref.topk_length = ref_lengths_checked.empty() ? nullptr : ref_lengths_checked.data();
  ref.attn_sink = sink.empty() ? nullptr : sink.data();
  ref.out = ref_out.data();
  ref.max_logits = ref_max.data();
  ref.lse = ref_lse.data();
  hmla::reference::sparse_prefill(ref, ref_out_f32.data());

  // The GPU, outputs poisoned.
  DeviceBuffer d_q(q.size() * 2), d_kv(kv.size() * 2), d_idx(indices.size() * 4);
  DeviceBuffer d_len(std::max<size_t>(lengths.size(), 1) * 4), d_sink(std::max<size_t>(sink.size(), 1) * 4);
  d_q.upload(q.data(), q.size() * 2);
  d_kv.upload(kv.data(), kv.size() * 2);
  d_idx.upload(indices.data(), indices.size() * 4);
  if (!lengths.empty()) d_len.upload(lengths.data(), lengths.size() * 4);
  if (!sink.empty()) d_sink.upload(sink.data(), sink.size() * 4);
  p.q = d_q.as<uint16_t>();
  p.kv = d_kv.as<uint16_t>();
  p.indices = d_idx.as<int32_t>();
  p.topk_length = lengths.empty() ? nullptr : d_len.as<int32_t>();
  p.attn_sink = sink.empty() ? nullptr : d_sink.as<float>();

  // Both forms: whole items only (no workspace), and, where the shape has fewer items than SMs, its
  // items in pieces merged in the kernel (a workspace filled with NaN: the kernel must write every
  // byte it reads).
  const size_t workspace_bytes = hmla::sparse_prefill_workspace_bytes(p);
  DeviceBuffer d_workspace(workspace_bytes);
  for (const bool cut : {false, true}) {
    if (cut && workspace_bytes == 0) continue;
    const std::string form = std::string(c.name) + (cut ? " (items cut)" : " (whole items)");
    if (cut) HMLA_TEST_CUDA_CHECK(cudaMemset(d_workspace.get(), 0xff, workspace_bytes));
    p.workspace = cut ? d_workspace.get() : nullptr;
    p.workspace_bytes = cut ? workspace_bytes : 0;
    PrefillOutputs got(c.s_q, c.h_q, out_head_stride);
    got.attach(p);
    hmla::sparse_prefill_run(p, nullptr);
    HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
    got.download();

    Comparison cmp;
    for (int i = 0; i < n_check; ++i) {
      const int64_t s = checked[i];
      const int64_t sh = s * c.h_q, rh = static_cast<int64_t>(i) * c.h_q;
      cmp.token("token " + std::to_string(s), c.h_q, got.out.data() + s * out_token_stride, out_head_stride,
                got.lse.data() + sh, got.max_logits.data() + sh, ref_out_f32.data() + rh * 512, ref_lse.data() + rh,
                ref_max.data() + rh);
    }
    got.check_padding(cmp);
    EXPECT_EQ(cmp.bad, 0) << form << ": " << cmp.bad << " bad values, first: " << cmp.first_bad;
    EXPECT_LE(cmp.rel(), 4e-3) << form << ": relative L2 error of out";
  }
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
      // Two full rounds and a last one of 4 items on 132 SMs (with full rounds nothing is cut).
      {"d576_h64_s268_topk2048", 576, 64, 268, 8192, 2048, 0.1, Lengths::kRandom, Sink::kFinite, false},
  };
}

// A pairwise covering list over the axes of issue 26's test list: every value of every axis and every
// pair of values of two axes in at least one case (tests/gpu/pairwise.h). The reference checks a
// sample of the tokens of the large cases (s_q 1000 with topk 5000: run_case's budget).
std::vector<PrefillCase> pairwise_cases() {
  const int d_qks[] = {576, 512};
  const int h_qs[] = {1, 16, 64, 100, 128};
  const int topks[] = {1, 64, 100, 2048, 5000};
  const int s_qs[] = {1, 63, 1000};
  const int s_kvs[] = {1, 4096, 131072};
  const Sink sinks[] = {Sink::kNone, Sink::kFinite, Sink::kMinusInf, Sink::kPlusInf};
  const Lengths lengths[] = {Lengths::kNone, Lengths::kRandom, Lengths::kPastTopk};
  const double invalid_rates[] = {0.0, 0.1, 1.0};
  const char* sink_names[] = {"nosink", "sink", "sinkneginf", "sinkposinf"};
  const char* length_names[] = {"", "_len", "_lenpast"};
  enum { kDqk, kHq, kTopk, kSq, kSkv, kSink, kLengths, kInvalid, kPadded };
  const std::vector<hmla_test::PairwiseAxis> axes = {{"d_qk", 2},  {"h_q", 5},     {"topk", 5},
                                                      {"s_q", 3},   {"s_kv", 3},    {"sink", 4},
                                                      {"lengths", 3}, {"invalid", 3}, {"padded", 2}};
  std::vector<PrefillCase> out;
  for (const std::vector<int>& r : hmla_test::pairwise_rows(axes, hmla_test::hash_string("prefill-pairwise"))) {
    PrefillCase c;
    c.d_qk = d_qks[r[kDqk]];
    c.h_q = h_qs[r[kHq]];
    c.topk = topks[r[kTopk]];
    c.s_q = s_qs[r[kSq]];
    c.s_kv = s_kvs[r[kSkv]];
    c.sink = sinks[r[kSink]];
    c.lengths = lengths[r[kLengths]];
    c.invalid_rate = invalid_rates[r[kInvalid]];
    c.padded = r[kPadded] != 0;
    c.name = "grid" + std::to_string(out.size()) + "_d" + std::to_string(c.d_qk) + "_h" + std::to_string(c.h_q) +
             "_s" + std::to_string(c.s_q) + "_skv" + std::to_string(c.s_kv) + "_topk" + std::to_string(c.topk) + "_" +
             sink_names[r[kSink]] + length_names[r[kLengths]] + "_invalid" +
             std::to_string(static_cast<int>(c.invalid_rate * 100)) + (c.padded ? "_padded" : "");
    out.push_back(c);
  }
  return out;
}

class SparsePrefillGrid : public ::testing::TestWithParam<PrefillCase> {};
TEST_P(SparsePrefillGrid, MatchesReference) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Pairwise, SparsePrefillGrid, ::testing::ValuesIn(pairwise_cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& i) { return i.param.name; });

class SparsePrefill : public ::testing::TestWithParam<PrefillCase> {};
TEST_P(SparsePrefill, MatchesReference) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, SparsePrefill, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& i) { return i.param.name; });

// Small cases for compute-sanitizer (memcheck: no read of an invalid index or NaN row; racecheck).
// The last two give every CTA of the persistent grid several items (s_q * head tiles > 132), items
// without a key among them (token 0's length is 0), so the hand-over between items is checked too.
class SparsePrefillSanitizer : public ::testing::TestWithParam<PrefillCase> {};
TEST_P(SparsePrefillSanitizer, MatchesReference) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(
    Subset, SparsePrefillSanitizer,
    ::testing::Values(PrefillCase{"sanitizer_d576_h64", 576, 64, 3, 300, 100, 0.3, Lengths::kRandom, Sink::kFinite, true},
                      PrefillCase{"sanitizer_d512_h16", 512, 16, 5, 70, 65, 0.5, Lengths::kPastTopk, Sink::kNone, false},
                      PrefillCase{"sanitizer_d576_h100_items", 576, 100, 150, 200, 130, 0.2, Lengths::kRandom,
                                  Sink::kFinite, false},
                      PrefillCase{"sanitizer_d512_h64_items", 512, 64, 300, 90, 64, 0.1, Lengths::kRandom,
                                  Sink::kNone, true},
                      // Fewer items than SMs, each cut into pieces (with a workspace) and merged.
                      PrefillCase{"sanitizer_d576_h128_pieces", 576, 128, 2, 700, 600, 0.2, Lengths::kRandom,
                                  Sink::kFinite, false}),
    [](const ::testing::TestParamInfo<PrefillCase>& i) { return i.param.name; });

// Random cases (tests/gpu/fuzz.h): d_qk, h_q 1..128, s_q 1..8 or up to 400 (several items per CTA of
// the persistent grid), s_kv 1..5000, topk 1..600 with the tile edges, invalid rates up to 100 %,
// topk_length modes, sinks, padded strides; the reference on every token or a sample.
PrefillCase random_prefill_case(uint64_t seed, int64_t index) {
  Rng rng(hmla_test::mix_seed(seed ^ 0x50524546494c4cull, static_cast<uint64_t>(index)));
  PrefillCase c;
  c.name = hmla_test::fmt("PrefillFuzz_%016" PRIx64 "_%lld", seed, static_cast<long long>(index));
  c.d_qk = hmla_test::chance(rng, 50) ? 576 : 512;
  const int h_qs[] = {1, 2, 16, 17, 63, 64, 65, 100, 128};
  c.h_q = hmla_test::pick(rng, h_qs);
  c.s_q = hmla_test::chance(rng, 80) ? rng.uniform_int(1, 8) : rng.uniform_int(100, 400);
  const int s_kvs[] = {1, 2, 63, 64, 65, 129};
  c.s_kv = hmla_test::chance(rng, 30) ? hmla_test::pick(rng, s_kvs) : rng.uniform_int(1, 5000);
  const int topks[] = {1, 2, 63, 64, 65, 127, 128, 129, 192};
  c.topk = hmla_test::chance(rng, 40) ? hmla_test::pick(rng, topks) : rng.uniform_int(1, 600);
  const double invalid_rates[] = {0.0, 0.0, 0.1, 0.3, 1.0};
  c.invalid_rate = hmla_test::pick(rng, invalid_rates);
  const Lengths lengths[] = {Lengths::kNone, Lengths::kNone, Lengths::kRandom, Lengths::kPastTopk};
  c.lengths = hmla_test::pick(rng, lengths);
  const Sink sinks[] = {Sink::kNone, Sink::kNone, Sink::kFinite, Sink::kMinusInf, Sink::kPlusInf};
  c.sink = hmla_test::pick(rng, sinks);
  c.padded = hmla_test::chance(rng, 30);
  c.ref_budget = hmla_test::kFuzzRefBudget;
  return c;
}

std::string describe(const PrefillCase& c) {
  return hmla_test::fmt("%s: d_qk=%d h_q=%d s_q=%d s_kv=%d topk=%d invalid=%g lengths=%d sink=%d padded=%d",
                        c.name.c_str(), c.d_qk, c.h_q, c.s_q, c.s_kv, c.topk, c.invalid_rate,
                        static_cast<int>(c.lengths), static_cast<int>(c.sink), c.padded ? 1 : 0);
}

// A workspace smaller than sparse_prefill_workspace_bytes is an InvalidArgument naming
// workspace_bytes, checked before anything launches; an exact one is accepted.
TEST(SparsePrefillWorkspace, TooSmallIsRejected) {
  hmla::SparsePrefillParams p;
  p.s_q = 2;  // 4 items of 16 pairs: cut on any GPU of 8 SMs or more
  p.s_kv = 4096;
  p.h_q = 128;
  p.topk = 2048;
  const size_t need = hmla::sparse_prefill_workspace_bytes(p);
  ASSERT_GT(need, 0u);
  DeviceBuffer q(static_cast<size_t>(p.s_q) * p.h_q * p.d_qk * 2), kv(static_cast<size_t>(p.s_kv) * p.d_qk * 2);
  DeviceBuffer idx(static_cast<size_t>(p.s_q) * p.topk * 4), out(static_cast<size_t>(p.s_q) * p.h_q * 512 * 2);
  DeviceBuffer lse(static_cast<size_t>(p.s_q) * p.h_q * 4), max_logits(lse.bytes()), ws(need);
  p.q = q.as<uint16_t>();
  p.q_token_stride = static_cast<int64_t>(p.h_q) * p.d_qk;
  p.q_head_stride = p.d_qk;
  p.kv = kv.as<uint16_t>();
  p.kv_token_stride = p.d_qk;
  p.indices = idx.as<int32_t>();
  p.indices_token_stride = p.topk;
  p.out = out.as<uint16_t>();
  p.out_token_stride = static_cast<int64_t>(p.h_q) * 512;
  p.out_head_stride = 512;
  p.lse = lse.as<float>();
  p.max_logits = max_logits.as<float>();
  p.workspace = ws.get();
  p.workspace_bytes = need - 1;
  try {
    hmla::validate(p);
    ADD_FAILURE() << "a workspace of " << need - 1 << " bytes was accepted; " << need << " are needed";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("workspace_bytes"), std::string::npos) << e.what();
  }
  p.workspace_bytes = need;
  EXPECT_NO_THROW(hmla::validate(p));
}

TEST(SparsePrefillFuzz, RandomCasesMatchReference) {
  hmla_test::fuzz(
      "sparse prefill", "SparsePrefillFuzz.*",
      [](uint64_t s, int64_t i) { return describe(random_prefill_case(s, i)); },
      [](uint64_t s, int64_t i) { run_case(random_prefill_case(s, i)); });
}


// ------------------------------------------------------------------------ the batched (varlen) form

struct Seq {
  int n_q;                // query tokens
  int kv_offset, kv_len;  // its kv rows; kv_len >= 1, so that the flat call on it is valid
};

struct VarlenCase {
  std::string name;
  int d_qk, h_q, s_kv, topk;
  std::vector<Seq> seqs;
  Lengths lengths;
  Sink sink;
  bool padded;
};

// The host inputs of a batched call (q, kv and indices of all sequences, their arrays).
struct VarlenInputs {
  int s_q = 0;
  int64_t kv_stride = 0, out_head_stride = 0;
  std::vector<int32_t> cu, offset, len;
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> indices, lengths, ref_lengths;
  std::vector<float> sink;
};

// Per index slot of a token of sequence i: 60 % valid (j in [0, kv_len)); 25 % past the sequence
// but inside kv, on a row that no valid index names (NaN) where one exists, which is often in
// another sequence's range; 15 % the other invalid kinds, including the first index past the
// sequence (kv_len) and past kv (s_kv - kv_offset). Only named rows hold values.
VarlenInputs make_varlen_inputs(const VarlenCase& c) {
  Rng rng(hmla_test::hash_string(c.name));
  VarlenInputs in;
  in.kv_stride = c.d_qk + (c.padded ? 8 : 0);
  in.out_head_stride = 512 + (c.padded ? 8 : 0);
  in.cu.push_back(0);
  for (const Seq& sq : c.seqs) {
    in.cu.push_back(in.cu.back() + sq.n_q);
    in.offset.push_back(sq.kv_offset);
    in.len.push_back(sq.kv_len);
  }
  in.s_q = in.cu.back();
  in.q.resize(static_cast<size_t>(in.s_q) * c.h_q * c.d_qk);
  for (auto& x : in.q) x = hmla_test::float_to_bf16_bits(static_cast<float>(rng.normal()));

  in.indices.assign(static_cast<size_t>(in.s_q) * c.topk, -1);
  std::vector<char> referenced(c.s_kv, 0);
  std::vector<std::pair<size_t, int>> past;  // (slot, sequence) of the indices past a sequence, inside kv
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const Seq& sq = c.seqs[i];
    const int32_t other[] = {-1, std::numeric_limits<int32_t>::min(), -5, sq.kv_len, c.s_kv - sq.kv_offset,
                             std::numeric_limits<int32_t>::max()};
    for (int t = in.cu[i]; t < in.cu[i + 1]; ++t) {
      for (int k = 0; k < c.topk; ++k) {
        const size_t slot = static_cast<size_t>(t) * c.topk + k;
        const double u = rng.uniform();
        if (u < 0.6) {
          in.indices[slot] = rng.uniform_int(0, sq.kv_len - 1);
          referenced[sq.kv_offset + in.indices[slot]] = 1;
        } else if (u < 0.85 && sq.kv_offset + sq.kv_len < c.s_kv) {
          past.emplace_back(slot, static_cast<int>(i));
        } else {
          in.indices[slot] = other[rng.uniform_int(0, 5)];
        }
      }
    }
  }
  for (const auto& [slot, i] : past) {
    const Seq& sq = c.seqs[i];
    int j = rng.uniform_int(sq.kv_len, c.s_kv - sq.kv_offset - 1);
    for (int tries = 0; tries < 32 && referenced[sq.kv_offset + j]; ++tries)
      j = rng.uniform_int(sq.kv_len, c.s_kv - sq.kv_offset - 1);
    in.indices[slot] = j;
  }
  const uint16_t nan_bits = hmla_test::input_nan_bits(hmla::DType::kBF16);
  in.kv.assign(static_cast<size_t>(c.s_kv) * in.kv_stride, nan_bits);
  for (int64_t r = 0; r < c.s_kv; ++r)
    if (referenced[r])
      for (int d = 0; d < c.d_qk; ++d)
        in.kv[r * in.kv_stride + d] = hmla_test::float_to_bf16_bits(static_cast<float>(rng.normal()));

  if (c.lengths != Lengths::kNone) {
    for (int t = 0; t < in.s_q; ++t) {
      const int l = c.lengths == Lengths::kPastTopk ? c.topk + rng.uniform_int(1, 1000)
                                                    : (t == 0 ? 0 : rng.uniform_int(0, c.topk));
      in.lengths.push_back(l);
      in.ref_lengths.push_back(std::min(l, c.topk));
    }
  }
  if (c.sink != Sink::kNone) {
    for (int h = 0; h < c.h_q; ++h)
      in.sink.push_back(c.sink == Sink::kFinite     ? static_cast<float>(rng.normal())
                        : c.sink == Sink::kMinusInf ? -INFINITY
                                                    : INFINITY);
  }
  return in;
}

// The inputs on the device, and the parameters of a call over all of them (outputs unset).
struct VarlenDevice {
  DeviceBuffer q, kv, indices, lengths, sink, cu, offset, len;
  hmla::SparsePrefillParams p;

  VarlenDevice(const VarlenCase& c, const VarlenInputs& in)
      : q(in.q.size() * 2), kv(in.kv.size() * 2), indices(in.indices.size() * 4), lengths(in.lengths.size() * 4),
        sink(in.sink.size() * 4), cu(in.cu.size() * 4), offset(in.offset.size() * 4), len(in.len.size() * 4) {
    q.upload(in.q.data(), in.q.size() * 2);
    kv.upload(in.kv.data(), in.kv.size() * 2);
    indices.upload(in.indices.data(), in.indices.size() * 4);
    if (!in.lengths.empty()) lengths.upload(in.lengths.data(), in.lengths.size() * 4);
    if (!in.sink.empty()) sink.upload(in.sink.data(), in.sink.size() * 4);
    cu.upload(in.cu.data(), in.cu.size() * 4);
    offset.upload(in.offset.data(), in.offset.size() * 4);
    len.upload(in.len.data(), in.len.size() * 4);
    p.s_q = in.s_q;
    p.s_kv = c.s_kv;
    p.h_q = c.h_q;
    p.d_qk = c.d_qk;
    p.d_v = 512;
    p.q = q.as<uint16_t>();
    p.q_token_stride = static_cast<int64_t>(c.h_q) * c.d_qk;
    p.q_head_stride = c.d_qk;
    p.kv = kv.as<uint16_t>();
    p.kv_token_stride = in.kv_stride;
    p.indices = indices.as<int32_t>();
    p.topk = c.topk;
    p.indices_token_stride = c.topk;
    p.topk_length = in.lengths.empty() ? nullptr : lengths.as<int32_t>();
    p.attn_sink = in.sink.empty() ? nullptr : sink.as<float>();
    p.softmax_scale = 0.f;
  }
  // The batched call over every sequence.
  hmla::SparsePrefillParams batched(int num_seqs) const {
    hmla::SparsePrefillParams b = p;
    b.num_seqs = num_seqs;
    b.cu_seqlens_q = cu.as<int32_t>();
    b.seq_kv_offset = offset.as<int32_t>();
    b.seq_kv_len = len.as<int32_t>();
    return b;
  }
  // The flat call on the sub-problem of tokens [token0, token0 + n_q) and kv rows [kv_offset, +
  // kv_len): the parameters of the same data, the pointers moved.
  hmla::SparsePrefillParams flat(int token0, int n_q, int kv_offset, int kv_len) const {
    hmla::SparsePrefillParams f = p;
    f.s_q = n_q;
    f.s_kv = kv_len;
    f.q = p.q + token0 * p.q_token_stride;
    f.kv = p.kv + kv_offset * p.kv_token_stride;
    f.indices = p.indices + token0 * p.indices_token_stride;
    if (f.topk_length != nullptr) f.topk_length = p.topk_length + token0;
    return f;
  }
};

// The reference on the sub-problem of tokens [token0, token0 + n_q) over kv rows [kv_offset, +
// kv_len) (kv_len 0 allowed: every index invalid). ref_out dense [s_q][h_q][512], lse / max [s_q][h_q].
void reference_rows(const VarlenCase& c, const VarlenInputs& in, int token0, int n_q, int kv_offset, int kv_len,
                    std::vector<float>& ref_out, std::vector<float>& ref_lse, std::vector<float>& ref_max) {
  hmla::SparsePrefillParams r;
  r.s_q = n_q;
  r.s_kv = kv_len;
  r.h_q = c.h_q;
  r.d_qk = c.d_qk;
  r.d_v = 512;
  r.q_token_stride = static_cast<int64_t>(c.h_q) * c.d_qk;
  r.q_head_stride = c.d_qk;
  r.q = in.q.data() + token0 * r.q_token_stride;
  r.kv_token_stride = in.kv_stride;
  r.kv = in.kv.data() + static_cast<int64_t>(kv_offset) * in.kv_stride;
  r.topk = c.topk;
  r.indices_token_stride = c.topk;
  r.indices = in.indices.data() + static_cast<int64_t>(token0) * c.topk;
  r.topk_length = in.ref_lengths.empty() ? nullptr : in.ref_lengths.data() + token0;
  r.attn_sink = in.sink.empty() ? nullptr : in.sink.data();
  const int64_t rows = static_cast<int64_t>(token0) * c.h_q;
  r.lse = ref_lse.data() + rows;
  r.max_logits = ref_max.data() + rows;
  hmla::reference::sparse_prefill(r, ref_out.data() + rows * 512);
}

void run_varlen_case(const VarlenCase& c) {
  const VarlenInputs in = make_varlen_inputs(c);
  const int num_seqs = static_cast<int>(c.seqs.size());
  VarlenDevice dev(c, in);

  PrefillOutputs batched(in.s_q, c.h_q, in.out_head_stride);
  hmla::SparsePrefillParams b = dev.batched(num_seqs);
  batched.attach(b);
  hmla::sparse_prefill_run(b, nullptr);
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  batched.download();

  PrefillOutputs flat(in.s_q, c.h_q, in.out_head_stride);
  std::vector<float> ref_out(static_cast<size_t>(in.s_q) * c.h_q * 512);
  std::vector<float> ref_lse(static_cast<size_t>(in.s_q) * c.h_q), ref_max(ref_lse.size());
  for (int i = 0; i < num_seqs; ++i) {
    const Seq& sq = c.seqs[i];
    ASSERT_GE(sq.kv_len, 1) << c.name << ": a flat call needs s_kv >= 1";
    ASSERT_LE(sq.kv_offset + sq.kv_len, c.s_kv) << c.name;
    if (sq.n_q == 0) continue;
    hmla::SparsePrefillParams f = dev.flat(in.cu[i], sq.n_q, sq.kv_offset, sq.kv_len);
    flat.attach(f, in.cu[i]);
    hmla::sparse_prefill_run(f, nullptr);
    reference_rows(c, in, in.cu[i], sq.n_q, sq.kv_offset, sq.kv_len, ref_out, ref_lse, ref_max);
  }
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  flat.download();

  // The same CTA computes the same tiles from the same data in both: equal bit for bit, NaN
  // poison in the padding included.
  EXPECT_TRUE(batched.out == flat.out) << c.name << ": out differs from the per-sequence calls";
  EXPECT_TRUE(bitwise_equal(batched.lse, flat.lse)) << c.name << ": lse differs from the per-sequence calls";
  EXPECT_TRUE(bitwise_equal(batched.max_logits, flat.max_logits))
      << c.name << ": max_logits differs from the per-sequence calls";

  Comparison cmp;
  for (int i = 0; i < num_seqs; ++i) {
    for (int t = in.cu[i]; t < in.cu[i + 1]; ++t) {
      const int64_t sh = static_cast<int64_t>(t) * c.h_q;
      cmp.token("sequence " + std::to_string(i) + " token " + std::to_string(t), c.h_q,
                batched.out.data() + t * batched.out_token_stride, batched.out_head_stride, batched.lse.data() + sh,
                batched.max_logits.data() + sh, ref_out.data() + sh * 512, ref_lse.data() + sh, ref_max.data() + sh);
    }
  }
  batched.check_padding(cmp);
  EXPECT_EQ(cmp.bad, 0) << c.name << ": " << cmp.bad << " bad values, first: " << cmp.first_bad;
  EXPECT_LE(cmp.rel(), 4e-3) << c.name << ": relative L2 error of out";
}

std::vector<VarlenCase> varlen_cases() {
  std::vector<Seq> many;  // a decode-sized batch: 33 sequences of 1-5 tokens, overlapping kv ranges
  for (int i = 0; i < 33; ++i) many.push_back({1 + i % 5, 50 * i, 100 + (i * 37) % 200});
  return {
      // A single-token sequence inside another's range; the last range ends at s_kv.
      {"varlen_d576_h64_4seqs", 576, 64, 3000, 200, {{37, 0, 1000}, {1, 500, 1200}, {64, 1700, 64}, {20, 2000, 1000}},
       Lengths::kRandom, Sink::kFinite, false},
      // Several tiles per token, and a sequence with no query token between two others.
      {"varlen_d512_h128_topk2048", 512, 128, 6000, 2048, {{3, 0, 4000}, {1, 4000, 2000}, {0, 100, 10}, {4, 2500, 2500}},
       Lengths::kNone, Sink::kNone, false},
      // h_q < 64, padded rows, a sequence of one kv row, lengths past topk.
      {"varlen_d576_h16_padded", 576, 16, 700, 65, {{5, 600, 100}, {1, 0, 1}, {40, 0, 700}, {2, 699, 1}},
       Lengths::kPastTopk, Sink::kMinusInf, true},
      // FlashMLA's flat form as one sequence: offset 0, all of kv.
      {"varlen_d512_h100_one_seq", 512, 100, 4096, 100, {{50, 0, 4096}}, Lengths::kRandom, Sink::kPlusInf, true},
      {"varlen_d576_h64_33seqs", 576, 64, 2000, 64, many, Lengths::kRandom, Sink::kFinite, false},
  };
}

class SparsePrefillVarlen : public ::testing::TestWithParam<VarlenCase> {};
TEST_P(SparsePrefillVarlen, MatchesPerSequenceCalls) { run_varlen_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Cases, SparsePrefillVarlen, ::testing::ValuesIn(varlen_cases()),
                         [](const ::testing::TestParamInfo<VarlenCase>& i) { return i.param.name; });

class SparsePrefillSanitizerVarlen : public ::testing::TestWithParam<VarlenCase> {};
TEST_P(SparsePrefillSanitizerVarlen, MatchesPerSequenceCalls) { run_varlen_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(
    Subset, SparsePrefillSanitizerVarlen,
    ::testing::Values(VarlenCase{"sanitizer_varlen_d576_h64", 576, 64, 300, 100, {{2, 0, 150}, {1, 100, 200}, {3, 250, 50}},
                                 Lengths::kRandom, Sink::kFinite, true}),
    [](const ::testing::TestParamInfo<VarlenCase>& i) { return i.param.name; });

// Device-side garbage in the three arrays (docs/API.md, contract 3): a token in no sequence has no
// valid key; offsets are clamped into [0, s_kv] and lengths into [0, s_kv - offset]. With a
// non-decreasing cu_seqlens_q the token's sequence is exact; without, it is one whose range holds
// the token, or none. Every kv row that no reading of the arrays could name is NaN.
struct Garbage {
  std::string name;
  std::vector<int32_t> cu, offset, len;
  bool monotone;
};

TEST(SparsePrefillSanitizerVarlenDeviceValues, DefinedOutputs) {
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min(), kMax = std::numeric_limits<int32_t>::max();
  const Garbage garbage[] = {
      // tokens before cu[0] and from cu[num_seqs] on; a negative offset, a length past kv, an
      // offset past kv
      {"monotone", {5, 12, 12, 30, 35}, {-7, 100, 250, 1000}, {50, 5, 2000, 10}, true},
      // extreme values: int32 limits in every array (offset + length past int32)
      {"extremes", {kMin, -1, 10, 10, kMax}, {0, kMax, 0, 280}, {300, kMax, -5, kMax}, true},
      // ranges out of order and overlapping
      {"not_monotone", {0, 30, 10, 20, 25}, {0, 50, 100, 150}, {50, 50, 50, 50}, false},
  };
  const int s_q = 40, s_kv = 300;
  for (const Garbage& g : garbage) {
    SCOPED_TRACE(g.name);
    const int num_seqs = static_cast<int>(g.offset.size());
    VarlenCase c{"device_values_" + g.name, 576, 64, s_kv, 64, {}, Lengths::kNone, Sink::kNone, false};
    // The (clamped) kv range of each sequence whose range [cu[i], cu[i + 1]) holds token t.
    auto clamped = [&](int i) {
      const int64_t o = std::clamp<int64_t>(g.offset[i], 0, s_kv);
      const int64_t l = std::clamp<int64_t>(g.len[i], 0, s_kv - o);
      return std::pair<int, int>(l == 0 ? 0 : static_cast<int>(o), static_cast<int>(l));
    };
    std::vector<std::vector<std::pair<int, int>>> candidates(s_q);
    for (int t = 0; t < s_q; ++t)
      for (int i = 0; i < num_seqs; ++i)
        if (g.cu[i] <= t && t < g.cu[i + 1]) candidates[t].push_back(clamped(i));

    Rng rng(hmla_test::hash_string(c.name));
    VarlenInputs in;
    in.s_q = s_q;
    in.kv_stride = c.d_qk;
    in.out_head_stride = 512;
    in.cu = g.cu;
    in.offset = g.offset;
    in.len = g.len;
    in.q.resize(static_cast<size_t>(s_q) * c.h_q * c.d_qk);
    for (auto& x : in.q) x = hmla_test::float_to_bf16_bits(static_cast<float>(rng.normal()));
    in.indices.resize(static_cast<size_t>(s_q) * c.topk);
    for (auto& x : in.indices) x = rng.uniform_int(-3, 63);  // past the 50-row sequences' ends too
    std::vector<char> referenced(s_kv, 0);
    for (int t = 0; t < s_q; ++t)
      for (const auto& [o, l] : candidates[t])
        for (int k = 0; k < c.topk; ++k) {
          const int32_t j = in.indices[static_cast<size_t>(t) * c.topk + k];
          if (j >= 0 && j < l) referenced[o + j] = 1;
        }
    in.kv.assign(static_cast<size_t>(s_kv) * in.kv_stride, hmla_test::input_nan_bits(hmla::DType::kBF16));
    for (int64_t r = 0; r < s_kv; ++r)
      if (referenced[r])
        for (int d = 0; d < c.d_qk; ++d)
          in.kv[r * in.kv_stride + d] = hmla_test::float_to_bf16_bits(static_cast<float>(rng.normal()));

    VarlenDevice dev(c, in);
    PrefillOutputs got(s_q, c.h_q, in.out_head_stride);
    hmla::SparsePrefillParams b = dev.batched(num_seqs);
    got.attach(b);
    hmla::sparse_prefill_run(b, nullptr);
    HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
    got.download();

    std::vector<float> ref_out(static_cast<size_t>(s_q) * c.h_q * 512);
    std::vector<float> ref_lse(static_cast<size_t>(s_q) * c.h_q), ref_max(ref_lse.size());
    for (int t = 0; t < s_q; ++t) {
      // A token in no sequence is the sub-problem over no kv row. Without monotone ranges the
      // search may also miss the ranges that hold the token.
      std::vector<std::pair<int, int>> allowed = candidates[t];
      if (allowed.empty() || !g.monotone) allowed.push_back({0, 0});
      if (g.monotone) ASSERT_EQ(allowed.size(), 1u) << "token " << t;
      bool matched = false;
      std::string why;
      for (const auto& [o, l] : allowed) {
        reference_rows(c, in, t, 1, o, l, ref_out, ref_lse, ref_max);
        const int64_t sh = static_cast<int64_t>(t) * c.h_q;
        Comparison cmp;
        cmp.token("token " + std::to_string(t), c.h_q, got.out.data() + t * got.out_token_stride, got.out_head_stride,
                  got.lse.data() + sh, got.max_logits.data() + sh, ref_out.data() + sh * 512, ref_lse.data() + sh,
                  ref_max.data() + sh);
        if (cmp.ok()) {
          matched = true;
          break;
        }
        why += " [kv rows " + std::to_string(o) + " + " + std::to_string(l) + ": " + std::to_string(cmp.bad) +
               " bad, first: " + cmp.first_bad + "]";
      }
      EXPECT_TRUE(matched) << "token " << t << " matches none of its sequences:" << why;
    }
  }
}
}  // namespace
