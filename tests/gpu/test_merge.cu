// hmla::merge_attention_states on the device against the float64 reference
// (hmla::reference::merge_attention_states), into NaN-poisoned outputs whose strided padding holds a
// sentinel: random states, shapes whose rows, heads and d_v are not multiples of the kernel's warps
// and chunks, 1 to 32 states (every parameter capacity), rows with an empty state (lse +inf or -inf,
// its out all NaN: never read), rows where every state is empty (out 0, lse +inf, no NaN), a NaN lse
// (the row is NaN), a NaN in the out of a state with a key (that element is NaN), states whose
// weights underflow, strided layouts, the in-place form, and the n-way merge against pairwise
// folding.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "hmla/merge.h"
#include "merge_test_util.h"
#include "hmla/reference.h"

namespace {

using hmla::AttentionOutput;
using hmla::AttentionState;
using hmla::DType;
using hmla::MergeAttentionParams;
using hmla_test::DeviceBuffer;

constexpr float kInf = INFINITY;

using Shape = hmla::test::MergeShape;

// Element strides of one [batch, s_q, h, d_v] out and its [batch, h, s_q] lse. padded: out rows
// padded by 8 elements and batch entries by 40; lse [batch, s_q, h] (heads contiguous) with gaps.
struct Layout {
  int64_t out_batch, out_token, out_head, lse_batch, lse_head, lse_token;
  size_t out_elems, lse_elems;
  static Layout make(const Shape& s, bool padded) {
    Layout l{};
    if (!padded) {
      l.out_head = s.d_v;
      l.out_token = int64_t{s.h} * s.d_v;
      l.out_batch = int64_t{s.s_q} * s.h * s.d_v;
      l.lse_token = 1;
      l.lse_head = s.s_q;
      l.lse_batch = int64_t{s.h} * s.s_q;
    } else {
      l.out_head = s.d_v + 8;
      l.out_token = int64_t{s.h} * (s.d_v + 8);
      l.out_batch = int64_t{s.s_q} * s.h * (s.d_v + 8) + 40;
      l.lse_head = 1;
      l.lse_token = s.h + 3;
      l.lse_batch = int64_t{s.s_q} * (s.h + 3) + 5;
    }
    l.out_elems = static_cast<size_t>(s.batch) * l.out_batch;
    l.lse_elems = static_cast<size_t>(s.batch) * l.lse_batch;
    return l;
  }
  int64_t out_at(int b, int t, int head) const { return b * out_batch + t * out_token + head * out_head; }
  int64_t lse_at(int b, int t, int head) const { return b * lse_batch + head * lse_head + t * lse_token; }
};

// One state or output: host copy, device copy, and views of either.
struct Tensors {
  Layout layout;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  DeviceBuffer d_out, d_lse;

  Tensors(const Shape& s, bool padded, uint16_t out_fill, float lse_fill)
      : layout(Layout::make(s, padded)), out(layout.out_elems, out_fill), lse(layout.lse_elems, lse_fill) {
    d_out.allocate(out.size() * 2);
    d_lse.allocate(lse.size() * 4);
  }
  void upload() {
    d_out.upload(out.data(), out.size() * 2);
    d_lse.upload(lse.data(), lse.size() * 4);
  }
  void download() {
    HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
    d_out.download(out.data(), out.size() * 2);
    d_lse.download(lse.data(), lse.size() * 4);
  }
  AttentionState state(bool device) const {
    AttentionState v;
    v.out = device ? d_out.get() : out.data();
    v.out_batch_stride = layout.out_batch;
    v.out_token_stride = layout.out_token;
    v.out_head_stride = layout.out_head;
    v.lse = device ? d_lse.as<const float>() : lse.data();
    v.lse_batch_stride = layout.lse_batch;
    v.lse_head_stride = layout.lse_head;
    v.lse_token_stride = layout.lse_token;
    return v;
  }
  AttentionOutput output(bool device) {
    const AttentionState v = state(device);
    AttentionOutput o;
    o.out = device ? d_out.get() : static_cast<void*>(out.data());
    o.out_batch_stride = v.out_batch_stride;
    o.out_token_stride = v.out_token_stride;
    o.out_head_stride = v.out_head_stride;
    o.lse = device ? d_lse.as<float>() : lse.data();
    o.lse_batch_stride = v.lse_batch_stride;
    o.lse_head_stride = v.lse_head_stride;
    o.lse_token_stride = v.lse_token_stride;
    return o;
  }
};

struct Case {
  const char* name;
  Shape shape;
  int num_states;
  bool padded;  // odd-numbered states and the output use the padded layout
};

// Random states with the special rows planted by row number r = (b * s_q + t) * h + head:
//   r % 11 == 3: every state empty (+inf and -inf alternating), outs all NaN
//   r % 13 == 5: state r % n has a NaN lse
//   r % 7 == 2:  state (r + 1) % n empty, its out NaN (n > 1)
//   r % 17 == 4: one NaN element in state r % n's out (column r % d_v)
//   r % 5 == 1:  state r % n's lse raised by 120, so the others' weights underflow in float
std::vector<Tensors> make_states(const Case& c, uint64_t seed) {
  const Shape& s = c.shape;
  const uint16_t nan_bits = hmla_test::input_nan_bits(s.dtype);
  std::vector<Tensors> states;
  states.reserve(c.num_states);
  for (int i = 0; i < c.num_states; ++i) states.emplace_back(s, c.padded && i % 2 == 1, nan_bits, NAN);
  hmla_test::Rng rng(seed);
  const int n = c.num_states;
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.s_q; ++t)
      for (int head = 0; head < s.h; ++head) {
        const int64_t r = (static_cast<int64_t>(b) * s.s_q + t) * s.h + head;
        for (int i = 0; i < n; ++i) {
          Tensors& st = states[i];
          const int64_t o = st.layout.out_at(b, t, head);
          for (int k = 0; k < s.d_v; ++k)
            st.out[o + k] = hmla_test::to_half_bits(s.dtype, static_cast<float>(2 * rng.uniform() - 1));
          st.lse[st.layout.lse_at(b, t, head)] = static_cast<float>(16 * rng.uniform() - 4);
        }
        auto empty = [&](int i, float lse) {
          Tensors& st = states[i];
          st.lse[st.layout.lse_at(b, t, head)] = lse;
          const int64_t o = st.layout.out_at(b, t, head);
          for (int k = 0; k < s.d_v; ++k) st.out[o + k] = nan_bits;
        };
        if (r % 11 == 3) {
          for (int i = 0; i < n; ++i) empty(i, i % 2 == 0 ? kInf : -kInf);
          continue;
        }
        if (r % 13 == 5) states[r % n].lse[states[r % n].layout.lse_at(b, t, head)] = NAN;
        if (r % 7 == 2 && n > 1) empty((r + 1) % n, (r / 7) % 2 == 0 ? kInf : -kInf);
        if (r % 17 == 4) states[r % n].out[states[r % n].layout.out_at(b, t, head) + r % s.d_v] = nan_bits;
        if (r % 5 == 1) states[r % n].lse[states[r % n].layout.lse_at(b, t, head)] += 120.f;
      }
  for (Tensors& st : states) st.upload();
  return states;
}

std::vector<AttentionState> views_of(const std::vector<Tensors>& states, bool device) {
  std::vector<AttentionState> v;
  for (const Tensors& t : states) v.push_back(t.state(device));
  return v;
}

// A poisoned output: NaN payloads no kernel writes in the rows, a finite sentinel in the padding.
Tensors poisoned_output(const Shape& s, bool padded) {
  Tensors o(s, padded, hmla_test::kOutSentinelBits, hmla_test::bits_float(hmla_test::kLseSentinelBits));
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.s_q; ++t)
      for (int head = 0; head < s.h; ++head) {
        const int64_t at = o.layout.out_at(b, t, head);
        for (int k = 0; k < s.d_v; ++k) o.out[at + k] = hmla_test::out_poison_bits(s.dtype);
        o.lse[o.layout.lse_at(b, t, head)] = hmla_test::bits_float(hmla_test::kLsePoisonBits);
      }
  o.upload();
  return o;
}

// Compares the device's output with the reference's (out_f32 dense, lse in the reference output's
// layout); the padding must still hold the sentinel. Returns the number of mismatches (reported up to 10).
int64_t compare(const Shape& s, const Tensors& got, const std::vector<float>& want_out, const Tensors& want_lse,
                const std::string& what) {
  const double rel = (s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11)) * 1.01;
  int64_t bad = 0;
  auto report = [&](const std::string& msg) {
    if (++bad <= 10) ADD_FAILURE() << what << ": " << msg;
  };
  std::vector<bool> in_row(got.out.size(), false);
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.s_q; ++t)
      for (int head = 0; head < s.h; ++head) {
        const std::string at = "(b " + std::to_string(b) + ", t " + std::to_string(t) + ", head " +
                               std::to_string(head) + ")";
        const int64_t o = got.layout.out_at(b, t, head);
        const size_t dense = ((static_cast<size_t>(b) * s.s_q + t) * s.h + head) * s.d_v;
        for (int k = 0; k < s.d_v; ++k) {
          in_row[o + k] = true;
          const uint16_t bits = got.out[o + k];
          const double g = hmla_test::half_bits_to_float(s.dtype, bits);
          const double w = want_out[dense + k];
          if (bits == hmla_test::out_poison_bits(s.dtype)) report("out " + at + " col " + std::to_string(k) + " never written");
          else if (std::isnan(w) != std::isnan(g)) report("out " + at + " col " + std::to_string(k) + " is " + std::to_string(g) + ", reference " + std::to_string(w));
          else if (!std::isnan(w) && !(std::fabs(g - w) <= rel * std::fabs(w) + 1e-5))
            report("out " + at + " col " + std::to_string(k) + " is " + std::to_string(g) + ", reference " + std::to_string(w));
        }
        const float gl = got.lse[got.layout.lse_at(b, t, head)];
        const float wl = want_lse.lse[want_lse.layout.lse_at(b, t, head)];
        const bool same_special = (std::isnan(gl) && std::isnan(wl)) || (std::isinf(wl) && gl == wl);
        if (hmla_test::float_bits(gl) == hmla_test::kLsePoisonBits) report("lse " + at + " never written");
        else if (!same_special && !(std::fabs(gl - wl) <= 2e-5 + 2e-6 * std::fabs(wl)))
          report("lse " + at + " is " + std::to_string(gl) + ", reference " + std::to_string(wl));
      }
  for (size_t i = 0; i < got.out.size(); ++i)
    if (!in_row[i] && got.out[i] != hmla_test::kOutSentinelBits) report("out padding at " + std::to_string(i) + " written");
  return bad;
}

const Case kCases[] = {
    {"bf16_rows_not_multiple_of_warps", {DType::kBF16, 7, 3, 5, 136}, 2, false},
    {"fp16_decode_shape_padded", {DType::kFP16, 3, 2, 128, 512}, 2, true},
    {"bf16_decode_b32_h128", {DType::kBF16, 32, 1, 128, 512}, 2, false},
    {"bf16_d_v_beyond_one_pass", {DType::kBF16, 2, 5, 3, 520}, 3, true},
    {"fp16_one_state_d_v_8", {DType::kFP16, 2, 1, 1, 8}, 1, false},
    {"bf16_eight_states", {DType::kBF16, 4, 2, 16, 512}, 8, true},
    {"bf16_nine_states", {DType::kBF16, 2, 3, 7, 264}, 9, false},
    {"fp16_thirty_two_states", {DType::kFP16, 1, 4, 9, 512}, 32, true},
};

class MergeGpu : public ::testing::TestWithParam<Case> {};

TEST_P(MergeGpu, MatchesReference) {
  const Case& c = GetParam();
  const Shape& s = c.shape;
  std::vector<Tensors> states = make_states(c, hmla_test::hash_string(c.name));
  Tensors out = poisoned_output(s, c.padded);
  hmla_test::Stream stream;
  hmla::merge_attention_states(hmla::test::merge_params(s, views_of(states, true), out.output(true)), stream.get());
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  hmla_test::abort_if_context_broken(c.name);
  out.download();

  Tensors ref(s, c.padded, 0, 0.f);
  std::vector<float> ref_f32(static_cast<size_t>(s.batch) * s.s_q * s.h * s.d_v);
  hmla::reference::merge_attention_states(hmla::test::merge_params(s, views_of(states, false), ref.output(false)), ref_f32.data());
  EXPECT_EQ(compare(s, out, ref_f32, ref, c.name), 0);
}

// In place into state 0, and (two states) the pairwise entry point: the same result as the n-way
// merge into a separate output, bit for bit.
TEST_P(MergeGpu, InPlaceAndPairwiseEqualNWay) {
  const Case& c = GetParam();
  const Shape& s = c.shape;
  std::vector<Tensors> states = make_states(c, hmla_test::hash_string(c.name) + 1);
  Tensors separate = poisoned_output(s, false);
  hmla_test::Stream stream;
  hmla::merge_attention_states(hmla::test::merge_params(s, views_of(states, true), separate.output(true)), stream.get());
  if (c.num_states == 2) {
    Tensors pair = poisoned_output(s, true);
    hmla::merge_attention_states(s.dtype, s.batch, s.s_q, s.h, s.d_v, states[0].state(true), states[1].state(true),
                                 pair.output(true), stream.get());
    HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    pair.download();
    separate.download();
    for (int b = 0; b < s.batch; ++b)
      for (int t = 0; t < s.s_q; ++t)
        for (int head = 0; head < s.h; ++head) {
          for (int k = 0; k < s.d_v; ++k)
            ASSERT_EQ(pair.out[pair.layout.out_at(b, t, head) + k], separate.out[separate.layout.out_at(b, t, head) + k]);
          const float a = pair.lse[pair.layout.lse_at(b, t, head)], e = separate.lse[separate.layout.lse_at(b, t, head)];
          ASSERT_TRUE(hmla_test::float_bits(a) == hmla_test::float_bits(e) || (std::isnan(a) && std::isnan(e)));
        }
  }
  hmla::merge_attention_states(hmla::test::merge_params(s, views_of(states, true), states[0].output(true)), stream.get());
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  separate.download();
  states[0].download();
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.s_q; ++t)
      for (int head = 0; head < s.h; ++head) {
        for (int k = 0; k < s.d_v; ++k) {
          const uint16_t got = states[0].out[states[0].layout.out_at(b, t, head) + k];
          const uint16_t want = separate.out[separate.layout.out_at(b, t, head) + k];
          ASSERT_TRUE(got == want || (hmla_test::half_is_nan(s.dtype, got) && hmla_test::half_is_nan(s.dtype, want)))
              << "b " << b << " t " << t << " head " << head << " col " << k;
        }
        const float got = states[0].lse[states[0].layout.lse_at(b, t, head)];
        const float want = separate.lse[separate.layout.lse_at(b, t, head)];
        ASSERT_TRUE(hmla_test::float_bits(got) == hmla_test::float_bits(want) || (std::isnan(got) && std::isnan(want)));
      }
}

// Folding the states pairwise (each step in place into an accumulator) gives the n-way result up
// to the rounding of out at each step.
TEST_P(MergeGpu, NWayEqualsPairwiseFolding) {
  const Case& c = GetParam();
  if (c.num_states < 3) GTEST_SKIP() << "folding needs three states or more";
  const Shape& s = c.shape;
  std::vector<Tensors> states = make_states(c, hmla_test::hash_string(c.name) + 2);
  Tensors all = poisoned_output(s, false), acc = poisoned_output(s, c.padded);
  hmla_test::Stream stream;
  hmla::merge_attention_states(hmla::test::merge_params(s, views_of(states, true), all.output(true)), stream.get());
  hmla::merge_attention_states(s.dtype, s.batch, s.s_q, s.h, s.d_v, states[0].state(true), states[1].state(true),
                               acc.output(true), stream.get());
  for (int i = 2; i < c.num_states; ++i)
    hmla::merge_attention_states(s.dtype, s.batch, s.s_q, s.h, s.d_v, acc.state(true), states[i].state(true),
                                 acc.output(true), stream.get());
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  all.download();
  acc.download();
  const double ulp = s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double tol = (c.num_states + 1) * ulp;  // one rounding per step, values bounded by 1
  int64_t bad = 0;
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.s_q; ++t)
      for (int head = 0; head < s.h; ++head) {
        for (int k = 0; k < s.d_v; ++k) {
          const double g = hmla_test::half_bits_to_float(s.dtype, acc.out[acc.layout.out_at(b, t, head) + k]);
          const double w = hmla_test::half_bits_to_float(s.dtype, all.out[all.layout.out_at(b, t, head) + k]);
          if (std::isnan(g) != std::isnan(w) || (!std::isnan(w) && !(std::fabs(g - w) <= tol))) ++bad;
        }
        const float g = acc.lse[acc.layout.lse_at(b, t, head)], w = all.lse[all.layout.lse_at(b, t, head)];
        // each step rounds the LSE to float and adds the error of __expf / logf
        const double lse_tol = 1e-5 + c.num_states * (1e-6 + 2e-7 * std::fabs(w));
        if (!((std::isnan(g) && std::isnan(w)) || g == w || std::fabs(g - w) <= lse_tol)) ++bad;
      }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, MergeGpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
