// reference::sparse_decode and reference::sparse_prefill against an independent formulation
// written here: every list position gets a score (-inf when the entry is invalid or past the list
// length), then a two-pass softmax; the FP8 keys are decoded by the test's own byte decoder
// (test_dequant_token) rather than unpack_token; the sink factor is evaluated as
// exp(lse - M) / (exp(lse - M) + exp(sink - M)). The reference streams keys with a one-pass online
// softmax and applies the sink as 1 / (1 + exp(sink - lse)).
//
// Tolerances: the reference's float64 out / lse / max_logits agree with the formulation here to
// |a - b| <= 1e-12 * (1 + |b|); no-key queries give exactly out 0, lse +inf, max_logits -inf; a
// +inf sink gives exactly 0. Rounded outputs equal the reference's float64 values rounded to float
// (then bf16 for out), bit for bit. Unused cache slots, stride padding and list entries past the
// lengths point at NaN data (0xff bytes / NaN rows): any NaN in an output means a bad read.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hmla/reference.h"
#include "reference_test_util.h"

namespace hmla {
namespace {

using namespace reference;
using Layout = SparseCacheLayout;
using test::kInf;

constexpr uint16_t kOutSentinel = 0x1234;
constexpr float kSentinelF = -12345.f;
const float kSinks[] = {0.3f, -INFINITY, INFINITY, 2.5f, -1.0f, 40.f};

// ------------------------------------------------------------------------------ an FP8 paged cache

struct Fp8Cache {
  Layout layout;
  int page_size = 0;
  int num_blocks = 0;
  int64_t stride = 0;
  std::vector<uint8_t> bytes;
  std::vector<int> packed_slots;  // slots holding a token
  std::vector<int> nan_slots;     // slots never written (all 0xff)

  Fp8Cache(Layout l, int ps, int nb, test::Rng& rng) : layout(l), page_size(ps), num_blocks(nb) {
    stride = sparse_page_bytes(l, ps) + 64;  // padded pages
    bytes.assign(stride * nb, 0xff);
    const int d_qk = sparse_cache_d_qk(l);
    std::vector<uint16_t> token(d_qk);
    for (int slot = 0; slot < ps * nb; ++slot) {
      const bool last_page = slot / ps == nb - 1;  // the last page stays NaN
      if (last_page || rng.coin(0.2)) {
        nan_slots.push_back(slot);
        continue;
      }
      const double amplitude = rng.uniform(0.5, 2.0);
      for (auto& v : token) v = test::random_bf16(rng, amplitude);
      pack_token(l, token.data(), bytes.data() + (slot / ps) * stride, ps, slot % ps);
      packed_slots.push_back(slot);
    }
  }
  SparseKVCache view() const {
    SparseKVCache c;
    c.data = bytes.data();
    c.num_blocks = num_blocks;
    c.page_size = page_size;
    c.block_stride_bytes = stride;
    return c;
  }
  int64_t slots() const { return static_cast<int64_t>(page_size) * num_blocks; }
  std::vector<double> token(int index) const {
    std::vector<double> t = test::test_dequant_token(layout, bytes.data() + (index / page_size) * stride,
                                                     page_size, index % page_size);
    for (double v : t) EXPECT_TRUE(std::isfinite(v)) << "test set-up: index " << index << " is not packed";
    return t;
  }
};

// One index list of `len` used entries out of `topk` (+ `pad` never-read stride padding): valid
// packed slots, duplicates, invalid values; entries past `len` and the padding point at NaN slots.
void fill_list(int32_t* list, int topk, int pad, int len, const Fp8Cache& c, test::Rng& rng,
               bool all_invalid) {
  const int64_t n = c.slots();
  const int64_t invalid[] = {-1, n, n + 5, INT_MAX, INT_MIN, -c.page_size};
  for (int t = 0; t < topk + pad; ++t) {
    if (t >= len) {
      list[t] = c.nan_slots[rng.integer(0, static_cast<int>(c.nan_slots.size()) - 1)];
    } else if (all_invalid || rng.coin(0.2)) {
      list[t] = static_cast<int32_t>(invalid[rng.integer(0, 5)]);
    } else if (t > 0 && list[t - 1] >= 0 && list[t - 1] < n && rng.coin(0.15)) {
      list[t] = list[t - 1];  // duplicate: counts twice
    } else {
      list[t] = c.packed_slots[rng.integer(0, static_cast<int>(c.packed_slots.size()) - 1)];
    }
  }
}

// ----------------------------------------------------------------------------------- sparse decode

struct DecodeCase {
  Layout layout = Layout::kV32;
  int batch = 3;
  int s_q = 2;
  int h_q = 6;
  int page_size = 16;
  int num_blocks = 5;
  int topk = 24;
  bool topk_length = false;
  bool extra = false;
  int extra_page_size = 4;
  int extra_num_blocks = 6;
  int extra_topk = 10;
  bool extra_topk_length = false;
  bool sink = false;
  float softmax_scale = 0.f;
  uint64_t seed = 1;
};

struct DecodeSetup {
  SparseDecodeParams p;
  Fp8Cache cache, extra;
  std::vector<uint16_t> q, out;
  std::vector<int32_t> indices, topk_length, extra_indices, extra_topk_length;
  std::vector<float> sink, lse;
  // (b, i) whose lists are all invalid: expected to have no key at all
  int empty_b = 0, empty_i = 0;

  DecodeSetup(const DecodeCase& c, test::Rng& rng)
      : cache(c.layout, c.page_size, c.num_blocks, rng),
        extra(c.layout, c.extra_page_size, c.extra ? c.extra_num_blocks : 1, rng) {
    const int d_qk = sparse_cache_d_qk(c.layout);
    p.layout = c.layout;
    p.batch = c.batch;
    p.s_q = c.s_q;
    p.h_q = c.h_q;
    p.d_qk = d_qk;
    p.d_v = 512;
    p.softmax_scale = c.softmax_scale;

    p.q_head_stride = d_qk + 2;
    p.q_token_stride = c.h_q * p.q_head_stride + 4;
    p.q_batch_stride = c.s_q * p.q_token_stride + 6;
    q.assign(c.batch * p.q_batch_stride, test::kBF16NaN);
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.s_q; ++i)
        for (int h = 0; h < c.h_q; ++h)
          for (int d = 0; d < d_qk; ++d)
            q[b * p.q_batch_stride + i * p.q_token_stride + h * p.q_head_stride + d] =
                test::random_bf16(rng);

    empty_b = c.batch - 1;
    empty_i = c.s_q - 1;

    p.cache = cache.view();
    p.topk = c.topk;
    p.indices_token_stride = c.topk + 3;
    p.indices_batch_stride = c.s_q * p.indices_token_stride + 1;
    indices.assign(c.batch * p.indices_batch_stride, -1);
    topk_length.assign(c.batch, c.topk);
    if (c.topk_length) {
      for (int b = 0; b < c.batch; ++b) topk_length[b] = rng.integer(0, c.topk);
      topk_length[0] = 0;  // request 0: nothing from the main cache
      if (c.batch > 1) topk_length[1] = c.topk;
      p.topk_length = topk_length.data();
    }
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.s_q; ++i)
        fill_list(indices.data() + b * p.indices_batch_stride + i * p.indices_token_stride, c.topk, 3,
                  topk_length[b], cache, rng, b == empty_b && i == empty_i);

    if (c.extra) {
      p.extra_cache = extra.view();
      p.extra_topk = c.extra_topk;
      p.extra_indices_token_stride = c.extra_topk + 2;
      p.extra_indices_batch_stride = c.s_q * p.extra_indices_token_stride + 3;
      extra_indices.assign(c.batch * p.extra_indices_batch_stride, -1);
      extra_topk_length.assign(c.batch, c.extra_topk);
      if (c.extra_topk_length) {
        for (int b = 0; b < c.batch; ++b) extra_topk_length[b] = rng.integer(0, c.extra_topk);
        extra_topk_length[0] = c.extra_topk;  // request 0 lives on the extra cache only
        p.extra_topk_length = extra_topk_length.data();
      }
      for (int b = 0; b < c.batch; ++b)
        for (int i = 0; i < c.s_q; ++i)
          fill_list(extra_indices.data() + b * p.extra_indices_batch_stride +
                        i * p.extra_indices_token_stride,
                    c.extra_topk, 2, extra_topk_length[b], extra, rng, b == empty_b && i == empty_i);
      p.extra_indices = extra_indices.data();
    }
    if (c.sink) {
      for (int h = 0; h < c.h_q; ++h) sink.push_back(kSinks[h % 6]);
      p.attn_sink = sink.data();
    }

    p.out_head_stride = 512 + 8;
    p.out_token_stride = c.h_q * p.out_head_stride + 2;
    p.out_batch_stride = c.s_q * p.out_token_stride + 4;
    out.assign(c.batch * p.out_batch_stride, kOutSentinel);
    p.lse_head_stride = c.s_q + 2;
    p.lse_batch_stride = c.h_q * p.lse_head_stride + 1;
    lse.assign(c.batch * p.lse_batch_stride, kSentinelF);

    p.q = q.data();
    p.indices = indices.data();
    p.out = out.data();
    p.lse = lse.data();
  }
};

// Scores over the concatenated list positions (-inf for skipped ones) and their keys.
struct ListKeys {
  std::vector<std::vector<double>> keys;  // empty vector for skipped positions
};

void collect(const Fp8Cache& c, const int32_t* list, int topk, int len, ListKeys& out) {
  for (int t = 0; t < topk; ++t) {
    const int64_t idx = list[t];
    const bool used = t < len && idx >= 0 && idx < c.slots();
    out.keys.push_back(used ? c.token(static_cast<int>(idx)) : std::vector<double>());
  }
}

// Two-pass attention of one query row over the list, then the sink.
void attend_expected(const std::vector<double>& q, const ListKeys& lk, double scale, const float* sink,
                     int h, std::vector<double>& o, double& lse, double& max_score) {
  std::vector<double> scores(lk.keys.size(), -kInf);
  for (size_t t = 0; t < lk.keys.size(); ++t) {
    if (lk.keys[t].empty()) continue;
    double dot = 0;
    for (size_t d = 0; d < q.size(); ++d) dot += q[d] * lk.keys[t][d];
    scores[t] = scale * dot;
  }
  const std::vector<double> w = test::two_pass_softmax(scores, lse, max_score);
  o.assign(512, 0.0);
  for (size_t t = 0; t < w.size(); ++t) {
    if (w[t] == 0) continue;
    for (int d = 0; d < 512; ++d) o[d] += w[t] * lk.keys[t][d];
  }
  if (sink != nullptr && lse != kInf) {
    const double f = test::sink_factor(lse, sink[h]);
    for (double& x : o) x *= f;
  }
}

void run_decode_case(const DecodeCase& c) {
  test::Rng rng(c.seed);
  DecodeSetup s(c, rng);
  const SparseDecodeParams& p = s.p;
  const size_t n_out = static_cast<size_t>(p.batch) * p.s_q * p.h_q * 512;
  const size_t n_lse = static_cast<size_t>(p.batch) * p.h_q * p.s_q;
  std::vector<float> out_f32(n_out, -1.f);
  std::vector<double> out64(n_out, -1.0), lse64(n_lse, -1.0);
  Float64Outputs f64;
  f64.out = out64.data();
  f64.lse = lse64.data();
  sparse_decode(p, out_f32.data(), f64);

  const double scale = p.softmax_scale != 0.f ? p.softmax_scale : 1.0 / std::sqrt(double(p.d_qk));
  std::vector<bool> out_written(s.out.size(), false), lse_written(s.lse.size(), false);
  int empty = 0, nonempty = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.s_q; ++i) {
      ListKeys lk;
      collect(s.cache, s.indices.data() + b * p.indices_batch_stride + i * p.indices_token_stride,
              p.topk, s.topk_length[b], lk);
      if (c.extra)
        collect(s.extra,
                s.extra_indices.data() + b * p.extra_indices_batch_stride + i * p.extra_indices_token_stride,
                p.extra_topk, s.extra_topk_length[b], lk);
      for (int h = 0; h < p.h_q; ++h) {
        std::vector<double> qrow(p.d_qk);
        for (int d = 0; d < p.d_qk; ++d)
          qrow[d] = bf16_to_float(s.q[b * p.q_batch_stride + i * p.q_token_stride + h * p.q_head_stride + d]);
        std::vector<double> eo;
        double lse_e = 0, emax = 0;
        attend_expected(qrow, lk, scale, p.attn_sink, h, eo, lse_e, emax);
        (lse_e == kInf ? empty : nonempty)++;
        if (b == s.empty_b && i == s.empty_i) { EXPECT_EQ(lse_e, kInf) << "test set-up"; }

        const size_t li = (static_cast<size_t>(b) * p.h_q + h) * p.s_q + i;
        const int64_t lpos = b * p.lse_batch_stride + h * p.lse_head_stride + i;
        lse_written[lpos] = true;
        ASSERT_TRUE(test::close_to(lse64[li], lse_e, 1e-12)) << "lse b" << b << " i" << i << " h" << h
                                                            << ": " << lse64[li] << " vs " << lse_e;
        ASSERT_EQ(s.lse[lpos], static_cast<float>(lse64[li]));
        const bool zero_out = lse_e == kInf || (p.attn_sink != nullptr && p.attn_sink[h] == INFINITY);
        for (int d = 0; d < 512; ++d) {
          const size_t oi = ((static_cast<size_t>(b) * p.s_q + i) * p.h_q + h) * 512 + d;
          const int64_t opos = b * p.out_batch_stride + i * p.out_token_stride + h * p.out_head_stride + d;
          out_written[opos] = true;
          ASSERT_TRUE(test::close_to(out64[oi], eo[d], 1e-12))
              << "out b" << b << " i" << i << " h" << h << " d" << d << ": " << out64[oi] << " vs " << eo[d];
          if (zero_out) { ASSERT_EQ(out64[oi], 0.0); }
          ASSERT_EQ(out_f32[oi], static_cast<float>(out64[oi]));
          ASSERT_EQ(s.out[opos], float_to_bf16(out_f32[oi]));
        }
      }
    }
  EXPECT_GT(empty, 0);
  EXPECT_GT(nonempty, 0);
  for (size_t k = 0; k < s.out.size(); ++k)
    if (!out_written[k]) { ASSERT_EQ(s.out[k], kOutSentinel) << "out padding " << k; }
  for (size_t k = 0; k < s.lse.size(); ++k)
    if (!lse_written[k]) { ASSERT_EQ(s.lse[k], kSentinelF) << "lse padding " << k; }
}

TEST(ReferenceSparseDecode, V32InvalidIndices) {
  DecodeCase c;
  c.seed = 201;
  run_decode_case(c);
}

TEST(ReferenceSparseDecode, Model1InvalidIndices) {
  DecodeCase c;
  c.layout = Layout::kModel1;
  c.page_size = 64;
  c.num_blocks = 3;
  c.seed = 202;
  run_decode_case(c);
}

TEST(ReferenceSparseDecode, V32TopkLengthAndSinks) {
  DecodeCase c;
  c.topk_length = true;
  c.sink = true;
  c.batch = 4;
  c.softmax_scale = 0.15f;  // peaky softmax
  c.seed = 203;
  run_decode_case(c);
}

TEST(ReferenceSparseDecode, Model1TopkLengthAndSinks) {
  DecodeCase c;
  c.layout = Layout::kModel1;
  c.topk_length = true;
  c.sink = true;
  c.h_q = 12;
  c.seed = 204;
  run_decode_case(c);
}

TEST(ReferenceSparseDecode, V32ExtraCache) {
  DecodeCase c;
  c.extra = true;
  c.extra_topk_length = true;
  c.topk_length = true;
  c.sink = true;
  c.seed = 205;
  run_decode_case(c);
}

TEST(ReferenceSparseDecode, Model1ExtraCacheOwnPageSize) {
  DecodeCase c;
  c.layout = Layout::kModel1;
  c.page_size = 8;
  c.num_blocks = 4;
  c.extra = true;
  c.extra_page_size = 3;
  c.extra_num_blocks = 5;
  c.extra_topk = 7;
  c.extra_topk_length = true;
  c.sink = false;
  c.seed = 206;
  run_decode_case(c);
}

// FlashMLA-like shapes: 64 heads, page 64, topk 128.
TEST(ReferenceSparseDecode, V32ShapeH64Topk128) {
  DecodeCase c;
  c.batch = 3;  // request 0: topk_length 0; request 2: all-invalid list; request 1: full list
  c.s_q = 1;
  c.h_q = 64;
  c.page_size = 64;
  c.num_blocks = 6;
  c.topk = 128;
  c.topk_length = true;
  c.sink = true;
  c.seed = 209;
  run_decode_case(c);
}

TEST(ReferenceSparseDecode, Model1ShapeH64Topk128WithExtra) {
  DecodeCase c;
  c.layout = Layout::kModel1;
  c.batch = 2;
  c.s_q = 2;
  c.h_q = 64;
  c.page_size = 64;
  c.num_blocks = 4;
  c.topk = 128;
  c.extra = true;
  c.extra_page_size = 64;
  c.extra_num_blocks = 3;
  c.extra_topk = 64;
  c.sink = true;
  c.seed = 210;
  run_decode_case(c);
}

// Duplicates are not merged: list [a, a, b] weighs a twice. Written out by hand for one head.
TEST(ReferenceSparseDecode, DuplicateIndexCountsTwice) {
  for (Layout layout : {Layout::kV32, Layout::kModel1}) {
    test::Rng rng(207);
    Fp8Cache cache(layout, 4, 2, rng);
    ASSERT_GE(cache.packed_slots.size(), 2u);
    const int a = cache.packed_slots[0], bb = cache.packed_slots[1];
    const int d_qk = sparse_cache_d_qk(layout);
    std::vector<uint16_t> q(d_qk);
    for (auto& v : q) v = test::random_bf16(rng);
    std::vector<int32_t> list = {a, a, bb};
    std::vector<uint16_t> out(512);
    float lse = 0;
    SparseDecodeParams p;
    p.layout = layout;
    p.batch = 1;
    p.s_q = 1;
    p.h_q = 1;
    p.d_qk = d_qk;
    p.q = q.data();
    p.q_head_stride = d_qk;
    p.q_token_stride = d_qk;
    p.q_batch_stride = d_qk;
    p.cache = cache.view();
    p.indices = list.data();
    p.topk = 3;
    p.indices_token_stride = 3;
    p.indices_batch_stride = 3;
    p.out = out.data();
    p.out_head_stride = 512;
    p.out_token_stride = 512;
    p.out_batch_stride = 512;
    p.lse = &lse;
    p.lse_head_stride = 1;
    p.lse_batch_stride = 1;
    std::vector<double> out64(512), lse64(1);
    Float64Outputs f64;
    f64.out = out64.data();
    f64.lse = lse64.data();
    sparse_decode(p, nullptr, f64);

    const auto ka = cache.token(a), kb = cache.token(bb);
    double sa = 0, sb = 0;
    for (int d = 0; d < d_qk; ++d) {
      sa += bf16_to_float(q[d]) * ka[d];
      sb += bf16_to_float(q[d]) * kb[d];
    }
    sa /= std::sqrt(double(d_qk));
    sb /= std::sqrt(double(d_qk));
    const double ea = 2 * std::exp(sa), eb = std::exp(sb);
    EXPECT_NEAR(lse64[0], std::log(ea + eb), 1e-12);
    for (int d = 0; d < 512; ++d) EXPECT_NEAR(out64[d], (ea * ka[d] + eb * kb[d]) / (ea + eb), 1e-12) << d;
  }
}

TEST(ReferenceSparseDecode, RejectsBadArguments) {
  test::Rng rng(208);
  DecodeCase c;
  c.topk_length = true;
  {
    DecodeSetup s(c, rng);
    s.topk_length[1] = c.topk + 1;
    EXPECT_THROW(sparse_decode(s.p), InvalidArgument);
  }
  {
    DecodeSetup s(c, rng);
    s.p.d_qk = 512;  // kV32 needs 576
    EXPECT_THROW(sparse_decode(s.p), InvalidArgument);
  }
  {
    DecodeSetup s(c, rng);
    s.p.cache.block_stride_bytes = sparse_page_bytes(Layout::kV32, c.page_size) - 1;
    EXPECT_THROW(sparse_decode(s.p), InvalidArgument);
  }
}

// ---------------------------------------------------------------------------------- sparse prefill

struct PrefillCase {
  int d_qk = 576;
  int s_q = 10;
  int s_kv = 40;
  int h_q = 8;
  int topk = 16;
  bool topk_length = false;
  bool sink = false;
  float softmax_scale = 0.f;
  uint64_t seed = 1;
};

void run_prefill_case(const PrefillCase& c) {
  test::Rng rng(c.seed);
  SparsePrefillParams p;
  p.s_q = c.s_q;
  p.s_kv = c.s_kv;
  p.h_q = c.h_q;
  p.d_qk = c.d_qk;
  p.d_v = 512;
  p.softmax_scale = c.softmax_scale;

  // kv rows with NaN padding; a few rows entirely NaN, only ever named past a list's length
  p.kv_token_stride = c.d_qk + 8;
  std::vector<uint16_t> kv(c.s_kv * p.kv_token_stride, test::kBF16NaN);
  std::vector<int> good_rows, nan_rows;
  for (int r = 0; r < c.s_kv; ++r) {
    if (r % 7 == 3) {
      nan_rows.push_back(r);
      continue;
    }
    good_rows.push_back(r);
    for (int d = 0; d < c.d_qk; ++d) kv[r * p.kv_token_stride + d] = test::random_bf16(rng);
  }
  p.q_head_stride = c.d_qk + 2;
  p.q_token_stride = c.h_q * p.q_head_stride + 4;
  std::vector<uint16_t> q(c.s_q * p.q_token_stride, test::kBF16NaN);
  for (int s = 0; s < c.s_q; ++s)
    for (int h = 0; h < c.h_q; ++h)
      for (int d = 0; d < c.d_qk; ++d) q[s * p.q_token_stride + h * p.q_head_stride + d] = test::random_bf16(rng);

  p.topk = c.topk;
  p.indices_token_stride = c.topk + 2;
  std::vector<int32_t> indices(c.s_q * p.indices_token_stride);
  std::vector<int32_t> topk_length(c.s_q, c.topk);
  if (c.topk_length) {
    for (int s = 0; s < c.s_q; ++s) topk_length[s] = rng.integer(0, c.topk);
    topk_length[0] = 0;
    topk_length[1] = c.topk;
    p.topk_length = topk_length.data();
  }
  const int32_t invalid[] = {-1, c.s_kv, c.s_kv + 100, INT_MAX, INT_MIN};
  const int all_invalid_token = c.s_q - 1;
  for (int s = 0; s < c.s_q; ++s) {
    int32_t* list = indices.data() + s * p.indices_token_stride;
    for (int t = 0; t < p.indices_token_stride; ++t) {
      if (t >= topk_length[s]) {
        list[t] = nan_rows[rng.integer(0, static_cast<int>(nan_rows.size()) - 1)];
      } else if (s == all_invalid_token || rng.coin(0.2)) {
        list[t] = invalid[rng.integer(0, 4)];
      } else if (t > 0 && list[t - 1] >= 0 && list[t - 1] < c.s_kv && rng.coin(0.1)) {
        list[t] = list[t - 1];
      } else {
        list[t] = good_rows[rng.integer(0, static_cast<int>(good_rows.size()) - 1)];
      }
    }
  }
  std::vector<float> sink;
  if (c.sink) {
    for (int h = 0; h < c.h_q; ++h) sink.push_back(kSinks[h % 6]);
    p.attn_sink = sink.data();
  }
  p.out_head_stride = 512 + 4;
  p.out_token_stride = c.h_q * p.out_head_stride + 8;
  std::vector<uint16_t> out(c.s_q * p.out_token_stride, kOutSentinel);
  std::vector<float> max_logits(c.s_q * c.h_q, kSentinelF), lse(c.s_q * c.h_q, kSentinelF);
  p.q = q.data();
  p.kv = kv.data();
  p.indices = indices.data();
  p.out = out.data();
  p.max_logits = max_logits.data();
  p.lse = lse.data();

  const size_t n_out = static_cast<size_t>(c.s_q) * c.h_q * 512;
  std::vector<float> out_f32(n_out);
  std::vector<double> out64(n_out), lse64(c.s_q * c.h_q), max64(c.s_q * c.h_q);
  Float64Outputs f64;
  f64.out = out64.data();
  f64.lse = lse64.data();
  f64.max_logits = max64.data();
  sparse_prefill(p, out_f32.data(), f64);

  const double scale = c.softmax_scale != 0.f ? c.softmax_scale : 1.0 / std::sqrt(double(c.d_qk));
  std::vector<bool> out_written(out.size(), false);
  int empty = 0;
  for (int s = 0; s < c.s_q; ++s) {
    ListKeys lk;
    const int32_t* list = indices.data() + s * p.indices_token_stride;
    for (int t = 0; t < c.topk; ++t) {
      const bool used = t < topk_length[s] && list[t] >= 0 && list[t] < c.s_kv;
      std::vector<double> key;
      if (used)
        for (int d = 0; d < c.d_qk; ++d) key.push_back(bf16_to_float(kv[list[t] * p.kv_token_stride + d]));
      lk.keys.push_back(key);
    }
    for (int h = 0; h < c.h_q; ++h) {
      std::vector<double> qrow(c.d_qk);
      for (int d = 0; d < c.d_qk; ++d) qrow[d] = bf16_to_float(q[s * p.q_token_stride + h * p.q_head_stride + d]);
      std::vector<double> eo;
      double lse_e = 0, emax = 0;
      attend_expected(qrow, lk, scale, p.attn_sink, h, eo, lse_e, emax);
      if (lse_e == kInf) ++empty;
      if (s == 0 && c.topk_length) { EXPECT_EQ(lse_e, kInf); }
      if (s == all_invalid_token) { EXPECT_EQ(lse_e, kInf); }
      const size_t sh = static_cast<size_t>(s) * c.h_q + h;
      ASSERT_TRUE(test::close_to(lse64[sh], lse_e, 1e-12)) << s << " " << h;
      ASSERT_EQ(lse[sh], static_cast<float>(lse64[sh]));
      if (emax == -kInf) {
        ASSERT_EQ(max64[sh], -kInf);
      } else {
        ASSERT_TRUE(test::close_to(max64[sh], emax, 1e-12)) << s << " " << h;
      }
      ASSERT_EQ(max_logits[sh], static_cast<float>(max64[sh]));
      const bool zero_out = lse_e == kInf || (p.attn_sink != nullptr && p.attn_sink[h] == INFINITY);
      for (int d = 0; d < 512; ++d) {
        const size_t oi = sh * 512 + d;
        const int64_t opos = s * p.out_token_stride + h * p.out_head_stride + d;
        out_written[opos] = true;
        ASSERT_TRUE(test::close_to(out64[oi], eo[d], 1e-12)) << s << " " << h << " " << d;
        if (zero_out) { ASSERT_EQ(out64[oi], 0.0); }
        ASSERT_EQ(out_f32[oi], static_cast<float>(out64[oi]));
        ASSERT_EQ(out[opos], float_to_bf16(out_f32[oi]));
      }
    }
  }
  EXPECT_GT(empty, 0);
  for (size_t k = 0; k < out.size(); ++k)
    if (!out_written[k]) { ASSERT_EQ(out[k], kOutSentinel) << "out padding " << k; }
}

TEST(ReferenceSparsePrefill, D576InvalidIndices) {
  PrefillCase c;
  c.seed = 301;
  run_prefill_case(c);
}

TEST(ReferenceSparsePrefill, D512InvalidIndices) {
  PrefillCase c;
  c.d_qk = 512;
  c.seed = 302;
  run_prefill_case(c);
}

TEST(ReferenceSparsePrefill, D576TopkLengthAndSinks) {
  PrefillCase c;
  c.topk_length = true;
  c.sink = true;
  c.h_q = 12;
  c.softmax_scale = 0.2f;
  c.seed = 303;
  run_prefill_case(c);
}

TEST(ReferenceSparsePrefill, D512TopkLengthAndSinks) {
  PrefillCase c;
  c.d_qk = 512;
  c.topk_length = true;
  c.sink = true;
  c.topk = 40;
  c.s_kv = 100;
  c.seed = 304;
  run_prefill_case(c);
}

TEST(ReferenceSparsePrefill, D512ShapeH64Topk128) {
  PrefillCase c;
  c.d_qk = 512;
  c.s_q = 16;
  c.h_q = 64;
  c.s_kv = 300;
  c.topk = 128;
  c.topk_length = true;
  c.sink = true;
  c.seed = 305;
  run_prefill_case(c);
}

// The batched form is, token for token, the flat form over the token's sequence: its q / index
// rows and outputs, kv cut to [seq_kv_offset, + seq_kv_len). Same arithmetic, so equal bit for bit.
// The sequences' kv ranges overlap and the indices run past each sequence's length into the others'
// rows and past kv, which must count as invalid.
TEST(ReferenceSparsePrefill, BatchedFormIsPerSequenceFlatForm) {
  test::Rng rng(306);
  const int d_qk = 576, h_q = 4, s_kv = 60, topk = 24;
  // One sequence of no token, one of a single token and no kv row.
  const std::vector<int32_t> cu = {0, 5, 5, 6, 13};
  const std::vector<int32_t> offset = {0, 10, 20, 25}, len = {30, 10, 0, 25};
  const int num_seqs = 4, s_q = cu.back();
  const int64_t kv_stride = d_qk, q_stride = int64_t{h_q} * d_qk, out_stride = int64_t{h_q} * 512;
  std::vector<uint16_t> kv(s_kv * kv_stride), q(s_q * q_stride);
  for (auto& v : kv) v = test::random_bf16(rng);
  for (auto& v : q) v = test::random_bf16(rng);
  std::vector<int32_t> indices(s_q * topk), topk_length(s_q);
  for (int s = 0; s < s_q; ++s) {
    topk_length[s] = rng.integer(topk / 2, topk);
    for (int t = 0; t < topk; ++t) indices[s * topk + t] = rng.integer(-2, s_kv + 2);
  }
  std::vector<float> sink(h_q);
  for (int h = 0; h < h_q; ++h) sink[h] = kSinks[h % 6];

  SparsePrefillParams p;
  p.s_q = s_q;
  p.s_kv = s_kv;
  p.h_q = h_q;
  p.d_qk = d_qk;
  p.q = q.data();
  p.q_token_stride = q_stride;
  p.q_head_stride = d_qk;
  p.kv = kv.data();
  p.kv_token_stride = kv_stride;
  p.indices = indices.data();
  p.topk = topk;
  p.indices_token_stride = topk;
  p.topk_length = topk_length.data();
  p.attn_sink = sink.data();
  p.out_token_stride = out_stride;
  p.out_head_stride = 512;
  std::vector<uint16_t> out(s_q * out_stride, kOutSentinel), flat_out(out.size(), kOutSentinel);
  std::vector<float> lse(s_q * h_q, kSentinelF), max_logits(lse.size(), kSentinelF);
  std::vector<float> flat_lse(lse.size(), kSentinelF), flat_max(lse.size(), kSentinelF);

  SparsePrefillParams batched = p;
  batched.num_seqs = num_seqs;
  batched.cu_seqlens_q = cu.data();
  batched.seq_kv_offset = offset.data();
  batched.seq_kv_len = len.data();
  batched.out = out.data();
  batched.lse = lse.data();
  batched.max_logits = max_logits.data();
  sparse_prefill(batched);

  int lonely = 0;
  for (int i = 0; i < num_seqs; ++i) {
    SparsePrefillParams f = p;
    f.s_q = cu[i + 1] - cu[i];
    f.s_kv = len[i];
    f.q = q.data() + cu[i] * q_stride;
    f.kv = kv.data() + offset[i] * kv_stride;
    f.indices = indices.data() + cu[i] * topk;
    f.topk_length = topk_length.data() + cu[i];
    f.out = flat_out.data() + cu[i] * out_stride;
    f.lse = flat_lse.data() + cu[i] * h_q;
    f.max_logits = flat_max.data() + cu[i] * h_q;
    sparse_prefill(f);
    if (len[i] == 0) lonely += f.s_q;
  }
  EXPECT_EQ(lonely, 1);  // the single token of the sequence with no kv
  EXPECT_EQ(out, flat_out);
  EXPECT_EQ(lse, flat_lse);
  EXPECT_EQ(max_logits, flat_max);
  EXPECT_EQ(lse[5 * h_q], kInf);  // token 5 is the single one of sequence 2, which has no kv
  // Not the flat form over all of kv: some index of a sequence names a row outside its range.
  SparsePrefillParams flat = p;
  std::vector<float> all_lse(lse.size());
  flat.out = nullptr;
  flat.lse = all_lse.data();
  sparse_prefill(flat);
  EXPECT_NE(lse, all_lse);
}

TEST(ReferenceSparsePrefill, BatchedFormRejectsBadDeviceValues) {
  const int d_qk = 512, h_q = 1, s_kv = 8, topk = 2, s_q = 4;
  std::vector<uint16_t> kv(s_kv * d_qk, 0), q(s_q * h_q * d_qk, 0), out(s_q * h_q * 512);
  std::vector<int32_t> indices(s_q * topk, 0);
  std::vector<float> lse(s_q * h_q), max_logits(lse.size());
  struct Bad {
    std::vector<int32_t> cu, offset, len;
    const char* argument;
  };
  const Bad bad[] = {
      {{1, 2, 4}, {0, 0}, {1, 1}, "cu_seqlens_q"},   // cu[0] != 0
      {{0, 3, 2}, {0, 0}, {1, 1}, "cu_seqlens_q"},   // decreasing
      {{0, 2, 3}, {0, 0}, {1, 1}, "cu_seqlens_q"},   // cu[num_seqs] != s_q
      {{0, 2, 4}, {-1, 0}, {1, 1}, "seq_kv_offset"},
      {{0, 2, 4}, {0, 9}, {1, 0}, "seq_kv_offset"},  // past s_kv
      {{0, 2, 4}, {0, 0}, {-1, 1}, "seq_kv_len"},
      {{0, 2, 4}, {0, 5}, {1, 4}, "seq_kv_len"},     // offset + len > s_kv
  };
  for (const Bad& b : bad) {
    SparsePrefillParams p;
    p.s_q = s_q;
    p.s_kv = s_kv;
    p.h_q = h_q;
    p.d_qk = d_qk;
    p.q = q.data();
    p.q_token_stride = d_qk;
    p.q_head_stride = d_qk;
    p.kv = kv.data();
    p.kv_token_stride = d_qk;
    p.indices = indices.data();
    p.topk = topk;
    p.indices_token_stride = topk;
    p.out = out.data();
    p.out_token_stride = 512;
    p.out_head_stride = 512;
    p.lse = lse.data();
    p.max_logits = max_logits.data();
    p.num_seqs = 2;
    p.cu_seqlens_q = b.cu.data();
    p.seq_kv_offset = b.offset.data();
    p.seq_kv_len = b.len.data();
    try {
      sparse_prefill(p);
      ADD_FAILURE() << "accepted bad " << b.argument;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), b.argument) << e.what();
    }
  }
}

}  // namespace
}  // namespace hmla
