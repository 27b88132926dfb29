// merge_attention_states on the CPU: its argument validation (every bad field gives
// hmla::InvalidArgument naming it; validate() never dereferences a pointer, so fake aligned
// addresses stand in for device memory) and the float64 reference, checked against attention over
// the union of the keys computed directly, and against the rules for empty states, NaN, n-way
// merges, in-place merges and strided layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hmla/merge.h"
#include "merge_test_util.h"
#include "hmla/reference.h"
#include "hmla/types.h"
#include "reference_test_util.h"
#include "validation_test_util.h"

namespace {

using hmla::AttentionOutput;
using hmla::AttentionState;
using hmla::DType;
using hmla::MergeAttentionParams;
using hmla::test::Fake;
using hmla::test::ThrowsInvalid;

constexpr const char* kWhere = "hmla::merge_attention_states";
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNaNF = std::numeric_limits<float>::quiet_NaN();

// ------------------------------------------------------------------------------------ validation

constexpr int kBatch = 3, kSQ = 2, kH = 16, kDv = 512;

struct ValidParams {
  AttentionState states[hmla::kMaxMergeStates];
  MergeAttentionParams p;
  explicit ValidParams(int n = 2) {
    for (int i = 0; i < hmla::kMaxMergeStates; ++i)
      states[i] = AttentionState::contiguous(Fake<const void>(0x100000 * (i + 1)),
                                             Fake<const float>(0x7f0000000000 + 0x10000 * i), kSQ, kH, kDv);
    p.dtype = DType::kBF16;
    p.batch = kBatch;
    p.s_q = kSQ;
    p.h = kH;
    p.d_v = kDv;
    p.num_states = n;
    p.states = states;
    p.output = AttentionOutput::contiguous(Fake<void>(0x50000000), Fake<float>(0x60000000), kSQ, kH, kDv);
  }
};

TEST(MergeValidation, AcceptsContiguousStates) {
  for (int n : {1, 2, 3, 8, 9, hmla::kMaxMergeStates}) {
    ValidParams v(n);
    EXPECT_NO_THROW(hmla::validate(v.p)) << n;
  }
  ValidParams fp16;
  fp16.p.dtype = DType::kFP16;
  EXPECT_NO_THROW(hmla::validate(fp16.p));
}

TEST(MergeValidation, AcceptsOtherLayouts) {
  ValidParams v;
  // lse [batch, s_q, h] (heads contiguous), out with padded heads and a gap between batch entries
  AttentionState& s = v.states[1];
  s.lse_head_stride = 1;
  s.lse_token_stride = kH;
  s.lse_batch_stride = int64_t{kSQ} * kH + 5;
  s.out_head_stride = kDv + 8;
  s.out_token_stride = int64_t{kH} * (kDv + 8);
  s.out_batch_stride = int64_t{kSQ} * kH * (kDv + 8) + 64;
  // head-major output
  v.p.output.out_head_stride = int64_t{kBatch} * kSQ * kDv;
  v.p.output.out_batch_stride = int64_t{kSQ} * kDv;
  v.p.output.out_token_stride = kDv;
  EXPECT_NO_THROW(hmla::validate(v.p));
  // d_v any multiple of 8; no output lse
  v.p.d_v = 136;
  v.p.output.lse = nullptr;
  v.p.output.lse_head_stride = 0;
  EXPECT_NO_THROW(hmla::validate(v.p));
}

TEST(MergeValidation, AcceptsInPlaceOutput) {
  ValidParams v;
  for (int i : {0, 1}) {
    v.p.output.out = const_cast<void*>(v.states[i].out);
    v.p.output.lse = const_cast<float*>(v.states[i].lse);
    EXPECT_NO_THROW(hmla::validate(v.p)) << i;
  }
}

TEST(MergeValidation, RejectsShape) {
  {
    ValidParams v;
    v.p.dtype = static_cast<DType>(7);
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "dtype", "DType(7)"));
  }
  for (const char* field : {"batch", "s_q", "h"}) {
    ValidParams v;
    int& value = std::string(field) == "batch" ? v.p.batch : std::string(field) == "s_q" ? v.p.s_q : v.p.h;
    value = 0;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, field, "0"));
  }
  for (int d_v : {0, 4, 12, 513}) {
    ValidParams v;
    v.p.d_v = d_v;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "d_v", std::to_string(d_v)));
  }
  {
    ValidParams v;
    v.p.batch = 1 << 30;
    v.p.s_q = 1 << 10;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "batch", std::to_string(1 << 30)));
  }
}

TEST(MergeValidation, RejectsStateCountAndArray) {
  for (int n : {0, -1, hmla::kMaxMergeStates + 1}) {
    ValidParams v;
    v.p.num_states = n;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "num_states", std::to_string(n)));
  }
  ValidParams v;
  v.p.states = nullptr;
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states", "null"));
}

TEST(MergeValidation, RejectsStateOut) {
  {
    ValidParams v;
    v.states[1].out = nullptr;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[1].out", "null"));
  }
  {
    ValidParams v;
    v.states[0].out = Fake<const void>(0x100008);
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[0].out", "0x100008"));
  }
  {
    ValidParams v;
    v.states[1].out_head_stride = 516;  // not a 16-byte multiple
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[1].out_head_stride", "516"));
  }
  {
    ValidParams v;
    v.states[1].out_token_stride = -8;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[1].out_token_stride", "-8"));
  }
  {
    ValidParams v;
    v.states[0].out_batch_stride = 0;  // rows of different batch entries would coincide
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[0].out_batch_stride", "0"));
  }
}

TEST(MergeValidation, RejectsStateLse) {
  {
    ValidParams v;
    v.states[1].lse = nullptr;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[1].lse", "null"));
  }
  {
    ValidParams v;
    v.states[0].lse = Fake<const float>(0x7f0000000002);
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[0].lse", "0x7f0000000002"));
  }
  {
    ValidParams v;
    v.states[1].lse_batch_stride = -1;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[1].lse_batch_stride", "-1"));
  }
  {
    ValidParams v;
    v.states[1].lse_head_stride = 1;  // overlaps the s_q = 2 tokens of a head
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[1].lse_head_stride", "1"));
  }
  {
    ValidParams v;
    v.states[0].lse_token_stride = 0;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "states[0].lse_token_stride", "0"));
  }
}

TEST(MergeValidation, RejectsOutput) {
  {
    ValidParams v;
    v.p.output.out = nullptr;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "output.out", "null"));
  }
  {
    ValidParams v;
    v.p.output.out_head_stride = 0;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "output.out_head_stride", "0"));
  }
  {
    ValidParams v;
    v.p.output.lse = Fake<float>(0x60000001);
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "output.lse", "0x60000001"));
  }
  {
    ValidParams v;
    v.p.output.lse_head_stride = 0;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "output.lse_head_stride", "0"));
  }
}

TEST(MergeValidation, InPlaceOutputKeepsTheStateStrides) {
  {
    ValidParams v;
    v.p.output.out = const_cast<void*>(v.states[1].out);
    v.p.output.out_head_stride = kDv + 8;
    v.p.output.out_token_stride = int64_t{kH} * (kDv + 8);
    v.p.output.out_batch_stride = int64_t{kSQ} * kH * (kDv + 8);
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "output.out_batch_stride",
                              std::to_string(int64_t{kSQ} * kH * (kDv + 8))));
  }
  {
    ValidParams v;
    v.p.output.lse = const_cast<float*>(v.states[0].lse);
    v.p.output.lse_token_stride = kH;
    v.p.output.lse_head_stride = 1;
    EXPECT_TRUE(ThrowsInvalid([&] { hmla::validate(v.p); }, kWhere, "output.lse_head_stride", "1"));
  }
}

TEST(MergeValidation, EntryPointValidatesBeforeLaunching) {
  ValidParams v;
  v.p.num_states = 0;
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::merge_attention_states(v.p, nullptr); }, kWhere, "num_states", "0"));
  AttentionState bad = v.states[1];
  bad.lse = nullptr;
  EXPECT_TRUE(ThrowsInvalid(
      [&] { hmla::merge_attention_states(DType::kBF16, kBatch, kSQ, kH, kDv, v.states[0], bad, v.p.output, nullptr); },
      kWhere, "states[1].lse", "null"));
}

// ------------------------------------------------------------------------------------- reference

// Host buffers of one state (or output) with its view; `padded` picks a non-default layout: lse
// [batch, s_q, h] with gaps, out rows padded by 8 elements and batch entries by 24.
struct HostTensors {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  AttentionState view;
  int64_t out_index(int b, int t, int head) const {
    return b * view.out_batch_stride + t * view.out_token_stride + head * view.out_head_stride;
  }
  float& lse_at(int b, int t, int head) {
    return lse[b * view.lse_batch_stride + head * view.lse_head_stride + t * view.lse_token_stride];
  }
  AttentionOutput as_output() {
    AttentionOutput o;
    o.out = out.data();
    o.out_batch_stride = view.out_batch_stride;
    o.out_token_stride = view.out_token_stride;
    o.out_head_stride = view.out_head_stride;
    o.lse = lse.data();
    o.lse_batch_stride = view.lse_batch_stride;
    o.lse_head_stride = view.lse_head_stride;
    o.lse_token_stride = view.lse_token_stride;
    return o;
  }
};

using Shape = hmla::test::MergeShape;

HostTensors make_tensors(const Shape& s, bool padded) {
  HostTensors t;
  if (!padded) {
    t.view = AttentionState::contiguous(nullptr, nullptr, s.s_q, s.h, s.d_v);
  } else {
    t.view.out_head_stride = s.d_v + 8;
    t.view.out_token_stride = int64_t{s.h} * (s.d_v + 8);
    t.view.out_batch_stride = int64_t{s.s_q} * s.h * (s.d_v + 8) + 24;
    t.view.lse_head_stride = 1;
    t.view.lse_token_stride = s.h + 3;
    t.view.lse_batch_stride = int64_t{s.s_q} * (s.h + 3) + 7;
  }
  t.out.assign(static_cast<size_t>(s.batch) * t.view.out_batch_stride, 0x7fc1);  // padding: NaN
  t.lse.assign(static_cast<size_t>(s.batch) * t.view.lse_batch_stride, kNaNF);
  t.view.out = t.out.data();
  t.view.lse = t.lse.data();
  return t;
}

uint16_t to_half(DType dtype, float v) {
  return dtype == DType::kBF16 ? hmla::reference::float_to_bf16(v) : hmla::reference::float_to_fp16(v);
}

// Random normalised outputs in [-1, 1] and LSEs in [-4, 12].
void fill_random(HostTensors& t, const Shape& s, hmla::test::Rng& rng) {
  for (int b = 0; b < s.batch; ++b)
    for (int q = 0; q < s.s_q; ++q)
      for (int head = 0; head < s.h; ++head) {
        for (int k = 0; k < s.d_v; ++k)
          t.out[t.out_index(b, q, head) + k] = to_half(s.dtype, static_cast<float>(rng.uniform(-1, 1)));
        t.lse_at(b, q, head) = static_cast<float>(rng.uniform(-4, 12));
      }
}

float out_value(const Shape& s, const HostTensors& t, int b, int q, int head, int k) {
  return hmla::reference::load_half(s.dtype, t.out.data(), t.out_index(b, q, head) + k);
}

// Attention of one query over n keys, split into contiguous sets: each set's (out, lse) rounded as
// a kernel would write them, merged, equals the attention over all keys computed at once.
TEST(MergeReference, SplitSoftmaxMergesToTheWhole) {
  hmla::test::Rng rng(7);
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    const Shape s{dtype, 2, 3, 5, 24};
    const int keys = 40;
    const std::vector<int> cuts = {0, 7, 8, 29, keys};  // 4 sets, one of a single key
    const int n = static_cast<int>(cuts.size()) - 1;
    std::vector<HostTensors> parts;
    for (int i = 0; i < n; ++i) parts.push_back(make_tensors(s, i % 2 == 1));
    const int rows = s.batch * s.s_q * s.h;
    std::vector<double> whole(static_cast<size_t>(rows) * s.d_v), whole_lse(rows);
    for (int b = 0; b < s.batch; ++b)
      for (int q = 0; q < s.s_q; ++q)
        for (int head = 0; head < s.h; ++head) {
          std::vector<double> score(keys), value(static_cast<size_t>(keys) * s.d_v);
          for (double& x : score) x = rng.uniform(-6, 6);
          for (double& x : value) x = rng.uniform(-1, 1);
          const int row = (b * s.s_q + q) * s.h + head;
          auto attend = [&](int lo, int hi, double* out) {
            double m = -hmla::test::kInf, sum = 0;
            for (int j = lo; j < hi; ++j) m = std::max(m, score[j]);
            for (int j = lo; j < hi; ++j) sum += std::exp(score[j] - m);
            for (int k = 0; k < s.d_v; ++k) {
              double acc = 0;
              for (int j = lo; j < hi; ++j) acc += std::exp(score[j] - m) / sum * value[j * s.d_v + k];
              out[k] = acc;
            }
            return m + std::log(sum);
          };
          whole_lse[row] = attend(0, keys, &whole[static_cast<size_t>(row) * s.d_v]);
          std::vector<double> part(s.d_v);
          for (int i = 0; i < n; ++i) {
            parts[i].lse_at(b, q, head) = static_cast<float>(attend(cuts[i], cuts[i + 1], part.data()));
            for (int k = 0; k < s.d_v; ++k)
              parts[i].out[parts[i].out_index(b, q, head) + k] = to_half(dtype, static_cast<float>(part[k]));
          }
        }
    std::vector<AttentionState> views;
    for (auto& t : parts) views.push_back(t.view);
    HostTensors merged = make_tensors(s, false);
    std::vector<float> out_f32(static_cast<size_t>(rows) * s.d_v);
    hmla::reference::merge_attention_states(hmla::test::merge_params(s, views, merged.as_output()), out_f32.data());
    // Each part's out carries a rounding error of at most 2^-8 (bf16) or 2^-11 (fp16) of its value;
    // the merge is a convex combination, so the merged error stays below that times the largest
    // value (1), plus a little for the float LSEs.
    const double tol = (dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11)) * 1.01;
    for (int b = 0; b < s.batch; ++b)
      for (int q = 0; q < s.s_q; ++q)
        for (int head = 0; head < s.h; ++head) {
          const int row = (b * s.s_q + q) * s.h + head;
          EXPECT_NEAR(merged.lse_at(b, q, head), whole_lse[row], 2e-6 * (1 + std::fabs(whole_lse[row])));
          for (int k = 0; k < s.d_v; ++k)
            ASSERT_NEAR(out_f32[static_cast<size_t>(row) * s.d_v + k], whole[static_cast<size_t>(row) * s.d_v + k],
                        tol)
                << "row " << row << " col " << k;
        }
  }
}

// Per-row cases: a state with lse +inf or -inf contributes nothing (its out, all NaN, is not
// read); no state with a key gives out 0 and lse +inf; a NaN lse makes the row NaN; a NaN in the
// out of a state that contributes reaches only that element.
TEST(MergeReference, EmptyStatesNaNAndNoKey) {
  const Shape s{DType::kBF16, 1, 1, 6, 16};
  hmla::test::Rng rng(11);
  HostTensors a = make_tensors(s, false), b = make_tensors(s, true);
  fill_random(a, s, rng);
  fill_random(b, s, rng);
  auto fill_nan_out = [&](HostTensors& t, int head) {
    for (int k = 0; k < s.d_v; ++k) t.out[t.out_index(0, 0, head) + k] = 0x7fc1;
  };
  // head 0: b empty (+inf); head 1: b empty (-inf); head 2: both empty; head 3: a's lse NaN;
  // head 4: one NaN element in a's out; head 5: both keyed.
  b.lse_at(0, 0, 0) = kInfF;
  fill_nan_out(b, 0);
  b.lse_at(0, 0, 1) = -kInfF;
  fill_nan_out(b, 1);
  a.lse_at(0, 0, 2) = kInfF;
  b.lse_at(0, 0, 2) = -kInfF;
  fill_nan_out(a, 2);
  fill_nan_out(b, 2);
  a.lse_at(0, 0, 3) = kNaNF;
  a.out[a.out_index(0, 0, 4) + 5] = 0x7fc1;
  std::vector<AttentionState> views = {a.view, b.view};
  HostTensors m = make_tensors(s, false);
  hmla::reference::merge_attention_states(hmla::test::merge_params(s, views, m.as_output()));
  for (int head : {0, 1}) {
    EXPECT_EQ(m.lse_at(0, 0, head), a.lse_at(0, 0, head)) << head;
    for (int k = 0; k < s.d_v; ++k)
      EXPECT_EQ(m.out[m.out_index(0, 0, head) + k], a.out[a.out_index(0, 0, head) + k]) << head << " " << k;
  }
  EXPECT_EQ(m.lse_at(0, 0, 2), kInfF);
  for (int k = 0; k < s.d_v; ++k) EXPECT_EQ(out_value(s, m, 0, 0, 2, k), 0.f);
  EXPECT_TRUE(std::isnan(m.lse_at(0, 0, 3)));
  for (int k = 0; k < s.d_v; ++k) EXPECT_TRUE(std::isnan(out_value(s, m, 0, 0, 3, k)));
  EXPECT_TRUE(std::isfinite(m.lse_at(0, 0, 4)));
  for (int k = 0; k < s.d_v; ++k) EXPECT_EQ(std::isnan(out_value(s, m, 0, 0, 4, k)), k == 5) << k;
  for (int k = 0; k < s.d_v; ++k) EXPECT_TRUE(std::isfinite(out_value(s, m, 0, 0, 5, k)));
  // a merged with itself: the same out, lse + log 2
  std::vector<AttentionState> twice = {a.view, a.view};
  hmla::reference::merge_attention_states(hmla::test::merge_params(s, twice, m.as_output()));
  EXPECT_NEAR(m.lse_at(0, 0, 5), a.lse_at(0, 0, 5) + std::log(2.0), 1e-6);
  for (int k = 0; k < s.d_v; ++k) EXPECT_EQ(m.out[m.out_index(0, 0, 5) + k], a.out[a.out_index(0, 0, 5) + k]);
}

// Merging n states at once equals folding them pairwise (up to the rounding of out in between),
// in place into the first state, and equals the same merge over other layouts bit for bit.
TEST(MergeReference, NWayEqualsPairwiseFoldingInPlaceAndStrided) {
  const Shape s{DType::kFP16, 2, 3, 4, 40};
  hmla::test::Rng rng(5);
  const int n = 5;
  std::vector<HostTensors> states;
  for (int i = 0; i < n; ++i) {
    states.push_back(make_tensors(s, i % 2 == 0));
    fill_random(states.back(), s, rng);
  }
  states[2].lse_at(1, 2, 3) = kInfF;  // an empty state in one row
  std::vector<AttentionState> views;
  for (auto& t : states) views.push_back(t.view);

  HostTensors all = make_tensors(s, false), all_padded = make_tensors(s, true);
  std::vector<float> all_f32(static_cast<size_t>(s.batch) * s.s_q * s.h * s.d_v), padded_f32(all_f32.size());
  hmla::reference::merge_attention_states(hmla::test::merge_params(s, views, all.as_output()), all_f32.data());
  hmla::reference::merge_attention_states(hmla::test::merge_params(s, views, all_padded.as_output()), padded_f32.data());
  EXPECT_EQ(all_f32, padded_f32);

  // fold into a copy of state 0, in place
  HostTensors acc = states[0];
  acc.view.out = acc.out.data();
  acc.view.lse = acc.lse.data();
  std::vector<float> fold_f32(all_f32.size());
  for (int i = 1; i < n; ++i) {
    std::vector<AttentionState> pair = {acc.view, states[i].view};
    hmla::reference::merge_attention_states(hmla::test::merge_params(s, pair, acc.as_output()), fold_f32.data());
  }
  for (int b = 0; b < s.batch; ++b)
    for (int q = 0; q < s.s_q; ++q)
      for (int head = 0; head < s.h; ++head) {
        EXPECT_NEAR(acc.lse_at(b, q, head), all.lse_at(b, q, head), 1e-5);
        EXPECT_FLOAT_EQ(all_padded.lse_at(b, q, head), all.lse_at(b, q, head));
        for (int k = 0; k < s.d_v; ++k) {
          // four roundings of out to fp16 in the fold and one in the n-way merge, each within 2^-11
          // of values bounded by 1
          EXPECT_NEAR(out_value(s, acc, b, q, head, k), out_value(s, all, b, q, head, k), 5 * std::ldexp(1.0, -11));
          EXPECT_EQ(all_padded.out[all_padded.out_index(b, q, head) + k], all.out[all.out_index(b, q, head) + k]);
        }
      }
  // the padding of the strided output is untouched
  for (int b = 0; b < s.batch; ++b)
    for (int e = 0; e < 24; ++e)
      EXPECT_EQ(all_padded.out[all_padded.out_index(b, s.s_q - 1, s.h - 1) + s.d_v + 8 + e], 0x7fc1);
}

}  // namespace
