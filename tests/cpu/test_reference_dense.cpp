// reference::dense_decode against an independent formulation written here: each request's keys
// gathered into a dense matrix, the full score matrix with -inf masking for causal / empty queries,
// and a two-pass softmax (the reference streams the keys with a one-pass online softmax).
//
// Tolerances: the reference's float64 outputs (Float64Outputs) agree with the formulation here to
// |a - b| <= 1e-12 * (1 + |b|) for out and lse; empty queries give exactly out 0, lse +inf. The
// rounded outputs are checked exactly against the reference's own float64 values (out_f32 and lse
// = float(x), out = dtype(float(x))), and against the formulation here within one output ulp.
// Every case fills unused cache rows, pages, stride padding and q padding with NaN and the
// block-table tails with huge garbage: a NaN in any output or a crash means a bad read.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "hmla/reference.h"
#include "reference_test_util.h"

namespace hmla {
namespace {

using namespace reference;
using test::kInf;

struct DenseCase {
  DType dtype = DType::kBF16;
  int s_q = 1;
  int h_q = 8;
  int h_kv = 1;
  int d_qk = 576;
  int d_v = 512;
  int page_size = 64;
  std::vector<int> seqlens;
  bool causal = false;
  float softmax_scale = 0.f;
  double amplitude = 1.0;
  uint64_t seed = 1;
};

constexpr uint16_t kOutSentinel = 0x1234;
constexpr float kLseSentinel = -12345.f;

struct DenseSetup {
  DenseDecodeParams p;
  std::vector<uint16_t> q, k, out;
  std::vector<int32_t> block_table, seqlens;
  std::vector<float> lse;

  explicit DenseSetup(const DenseCase& c) {
    test::Rng rng(c.seed);
    const uint16_t nan = c.dtype == DType::kFP16 ? test::kFP16NaN : test::kBF16NaN;
    const int batch = static_cast<int>(c.seqlens.size());
    p.dtype = c.dtype;
    p.batch = batch;
    p.s_q = c.s_q;
    p.h_q = c.h_q;
    p.h_kv = c.h_kv;
    p.d_qk = c.d_qk;
    p.d_v = c.d_v;
    p.page_size = c.page_size;
    p.causal = c.causal;
    p.softmax_scale = c.softmax_scale;

    // q with padding after every head, token and request (NaN)
    p.q_head_stride = c.d_qk + 3;
    p.q_token_stride = c.h_q * p.q_head_stride + 5;
    p.q_batch_stride = c.s_q * p.q_token_stride + 7;
    q.assign(std::max<int64_t>(1, batch * p.q_batch_stride), nan);
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < c.s_q; ++i)
        for (int h = 0; h < c.h_q; ++h)
          for (int d = 0; d < c.d_qk; ++d)
            q[b * p.q_batch_stride + i * p.q_token_stride + h * p.q_head_stride + d] =
                test::random_half(rng, c.dtype, c.amplitude);

    // pages: the ones requests use, in shuffled order, plus 3 never used (all NaN)
    std::vector<int> pages_per_req(batch);
    int total_pages = 0, max_pages = 0;
    for (int b = 0; b < batch; ++b) {
      pages_per_req[b] = (c.seqlens[b] + c.page_size - 1) / c.page_size;
      total_pages += pages_per_req[b];
      max_pages = std::max(max_pages, pages_per_req[b]);
    }
    p.num_blocks = total_pages + 3;
    std::vector<int32_t> ids(p.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng.engine());

    p.k_head_stride = c.d_qk + 4;
    p.k_token_stride = c.h_kv * p.k_head_stride + 8;
    p.k_block_stride = c.page_size * p.k_token_stride + 16;
    k.assign(p.num_blocks * p.k_block_stride, nan);

    p.max_blocks_per_seq = max_pages + 2;
    p.block_table_batch_stride = p.max_blocks_per_seq + 1;
    const int32_t garbage[] = {1 << 30, -123456, INT_MAX, INT_MIN, p.num_blocks};
    block_table.assign(std::max(1, batch) * p.block_table_batch_stride, 0);
    for (size_t n = 0; n < block_table.size(); ++n) block_table[n] = garbage[n % 5];
    int next = 0;
    for (int b = 0; b < batch; ++b) {
      for (int n = 0; n < pages_per_req[b]; ++n) {
        const int32_t page = ids[next++];
        block_table[b * p.block_table_batch_stride + n] = page;
      }
      for (int j = 0; j < c.seqlens[b]; ++j) {
        const int32_t page = block_table[b * p.block_table_batch_stride + j / c.page_size];
        for (int kv = 0; kv < c.h_kv; ++kv)
          for (int d = 0; d < c.d_qk; ++d)
            k[page * p.k_block_stride + (j % c.page_size) * p.k_token_stride +
              kv * p.k_head_stride + d] = test::random_half(rng, c.dtype);
      }
    }
    seqlens.assign(c.seqlens.begin(), c.seqlens.end());

    p.out_head_stride = c.d_v + 2;
    p.out_token_stride = c.h_q * p.out_head_stride + 6;
    p.out_batch_stride = c.s_q * p.out_token_stride + 10;
    out.assign(std::max<int64_t>(1, batch * p.out_batch_stride), kOutSentinel);
    p.lse_head_stride = c.s_q + 1;
    p.lse_batch_stride = c.h_q * p.lse_head_stride + 2;
    lse.assign(std::max<int64_t>(1, batch * p.lse_batch_stride), kLseSentinel);

    p.q = q.data();
    p.k_cache = k.data();
    p.block_table = block_table.data();
    p.cache_seqlens = seqlens.data();
    p.out = out.data();
    p.lse = lse.data();
  }
};

// The independent formulation: returns out [batch, s_q, h_q, d_v] and lse [batch, h_q, s_q].
void dense_expected(const DenseSetup& s, std::vector<double>& out, std::vector<double>& lse) {
  const DenseDecodeParams& p = s.p;
  const double scale = p.softmax_scale != 0.f ? p.softmax_scale : 1.0 / std::sqrt(double(p.d_qk));
  out.assign(static_cast<size_t>(p.batch) * p.s_q * p.h_q * p.d_v, 0.0);
  lse.assign(static_cast<size_t>(p.batch) * p.h_q * p.s_q, 0.0);
  const int heads_per_kv = p.h_q / p.h_kv;
  for (int b = 0; b < p.batch; ++b) {
    const int sk = s.seqlens[b];
    // K of this request as a dense [sk, h_kv, d_qk] matrix
    std::vector<double> K(static_cast<size_t>(sk) * p.h_kv * p.d_qk);
    for (int j = 0; j < sk; ++j) {
      const int32_t page = s.block_table[b * p.block_table_batch_stride + j / p.page_size];
      for (int kv = 0; kv < p.h_kv; ++kv)
        for (int d = 0; d < p.d_qk; ++d)
          K[(static_cast<size_t>(j) * p.h_kv + kv) * p.d_qk + d] = test::decode_half(
              p.dtype, s.k[page * p.k_block_stride + (j % p.page_size) * p.k_token_stride +
                           kv * p.k_head_stride + d]);
    }
    for (int h = 0; h < p.h_q; ++h) {
      const int kv = h / heads_per_kv;
      // full score matrix [s_q, sk] with -inf where the key is not visible
      std::vector<std::vector<double>> S(p.s_q, std::vector<double>(sk, -kInf));
      for (int i = 0; i < p.s_q; ++i) {
        const int64_t qb = b * p.q_batch_stride + i * p.q_token_stride + h * p.q_head_stride;
        for (int j = 0; j < sk; ++j) {
          // causal: query i sits at position sk - s_q + i, and sees keys up to it
          const bool visible = !(p.causal && p.s_q > 1) || j <= sk - p.s_q + i;
          if (!visible) continue;
          double dot = 0;
          for (int d = 0; d < p.d_qk; ++d)
            dot += test::decode_half(p.dtype, s.q[qb + d]) *
                   K[(static_cast<size_t>(j) * p.h_kv + kv) * p.d_qk + d];
          S[i][j] = scale * dot;
        }
      }
      for (int i = 0; i < p.s_q; ++i) {
        double l = 0, m = 0;
        const std::vector<double> w = test::two_pass_softmax(S[i], l, m);
        lse[(static_cast<size_t>(b) * p.h_q + h) * p.s_q + i] = l;
        double* o = &out[((static_cast<size_t>(b) * p.s_q + i) * p.h_q + h) * p.d_v];
        for (int j = 0; j < sk; ++j) {
          if (w[j] == 0) continue;
          for (int d = 0; d < p.d_v; ++d) o[d] += w[j] * K[(static_cast<size_t>(j) * p.h_kv + kv) * p.d_qk + d];
        }
      }
    }
  }
}

double one_ulp(DType dtype, double v) {  // one ulp of the output type at v (normal range)
  const int mant = dtype == DType::kFP16 ? 10 : 7;
  int e = 0;
  std::frexp(std::max(std::fabs(v), 1e-30), &e);
  return std::ldexp(1.0, e - 1 - mant);
}

void run_dense_case(const DenseCase& c) {
  DenseSetup s(c);
  const DenseDecodeParams& p = s.p;
  const size_t n_out = static_cast<size_t>(p.batch) * p.s_q * p.h_q * p.d_v;
  const size_t n_lse = static_cast<size_t>(p.batch) * p.h_q * p.s_q;
  std::vector<float> out_f32(n_out, -1.f);
  std::vector<double> out64(n_out, -1.0), lse64(n_lse, -1.0);
  Float64Outputs f64;
  f64.out = out64.data();
  f64.lse = lse64.data();
  dense_decode(p, out_f32.data(), f64);

  std::vector<double> exp_out, exp_lse;
  dense_expected(s, exp_out, exp_lse);

  std::vector<bool> out_written(s.out.size(), false), lse_written(s.lse.size(), false);
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.s_q; ++i)
      for (int h = 0; h < p.h_q; ++h) {
        const size_t li = (static_cast<size_t>(b) * p.h_q + h) * p.s_q + i;
        const int64_t lpos = b * p.lse_batch_stride + h * p.lse_head_stride + i;
        lse_written[lpos] = true;
        ASSERT_TRUE(test::close_to(lse64[li], exp_lse[li], 1e-12))
            << "lse b" << b << " i" << i << " h" << h << ": " << lse64[li] << " vs " << exp_lse[li];
        ASSERT_EQ(s.lse[lpos], static_cast<float>(lse64[li]));
        for (int d = 0; d < p.d_v; ++d) {
          const size_t oi = ((static_cast<size_t>(b) * p.s_q + i) * p.h_q + h) * p.d_v + d;
          const int64_t opos = b * p.out_batch_stride + i * p.out_token_stride + h * p.out_head_stride + d;
          out_written[opos] = true;
          ASSERT_TRUE(test::close_to(out64[oi], exp_out[oi], 1e-12))
              << "out b" << b << " i" << i << " h" << h << " d" << d << ": " << out64[oi] << " vs "
              << exp_out[oi];
          ASSERT_EQ(out_f32[oi], static_cast<float>(out64[oi]));
          ASSERT_EQ(s.out[opos], test::encode_half(p.dtype, out_f32[oi]));
          ASSERT_LE(std::fabs(test::decode_half(p.dtype, s.out[opos]) - exp_out[oi]),
                    one_ulp(p.dtype, exp_out[oi]) + 1e-300);
          if (exp_lse[li] == kInf) { ASSERT_EQ(out64[oi], 0.0); }
        }
      }
  for (size_t k = 0; k < s.out.size(); ++k)
    if (!out_written[k]) { ASSERT_EQ(s.out[k], kOutSentinel) << "out padding " << k; }
  for (size_t k = 0; k < s.lse.size(); ++k)
    if (!lse_written[k]) { ASSERT_EQ(s.lse[k], kLseSentinel) << "lse padding " << k; }

  // The plain entry point writes the same bits.
  DenseSetup again(c);
  dense_decode(again.p);
  EXPECT_EQ(again.out, s.out);
  EXPECT_EQ(again.lse, s.lse);

  // Zero-length requests: every query of theirs is empty.
  for (int b = 0; b < p.batch; ++b) {
    if (s.seqlens[b] != 0) continue;
    for (int h = 0; h < p.h_q; ++h) {
      EXPECT_EQ(s.lse[b * p.lse_batch_stride + h * p.lse_head_stride], INFINITY);
    }
  }
}

TEST(ReferenceDenseDecode, Bf16Page64SingleKvHead) {
  DenseCase c;
  c.seqlens = {1, 130, 64};
  c.h_q = 16;
  c.seed = 101;
  run_dense_case(c);
}

TEST(ReferenceDenseDecode, Bf16Page16GroupedHeadsWithZeroLength) {
  DenseCase c;
  c.page_size = 16;
  c.h_q = 8;
  c.h_kv = 2;
  c.seqlens = {0, 37, 16, 5};
  c.softmax_scale = 0.2f;  // peaky softmax
  c.seed = 102;
  run_dense_case(c);
}

TEST(ReferenceDenseDecode, Fp16Page1SmallDims) {
  DenseCase c;
  c.dtype = DType::kFP16;
  c.page_size = 1;
  c.h_q = 4;
  c.h_kv = 4;
  c.d_qk = 64;
  c.d_v = 32;
  c.seqlens = {9, 0, 3};
  c.amplitude = 4.0;
  c.seed = 103;
  run_dense_case(c);
}

TEST(ReferenceDenseDecode, CausalMtpWithEmptyFirstQueries) {
  DenseCase c;
  c.page_size = 8;
  c.s_q = 3;
  c.h_q = 8;
  c.causal = true;
  // request 0: s_k 2 < s_q, query 0 sees no key (out 0, lse +inf), query 1 one key, query 2 two
  c.seqlens = {2, 3, 20, 0};
  c.seed = 104;
  run_dense_case(c);
}

TEST(ReferenceDenseDecode, CausalMtpGroupedFp16) {
  DenseCase c;
  c.dtype = DType::kFP16;
  c.page_size = 4;
  c.s_q = 4;
  c.h_q = 6;
  c.h_kv = 3;
  c.d_qk = 96;
  c.d_v = 64;
  c.causal = true;
  c.seqlens = {1, 11};
  c.softmax_scale = 0.5f;
  c.seed = 105;
  run_dense_case(c);
}

TEST(ReferenceDenseDecode, NonCausalMultiTokenSeesAllKeys) {
  DenseCase c;
  c.page_size = 64;
  c.s_q = 2;
  c.h_q = 4;
  c.seqlens = {70, 1};
  c.seed = 106;
  run_dense_case(c);
}

TEST(ReferenceDenseDecode, CausalSingleTokenIsPlainDecode) {
  DenseCase c;
  c.page_size = 16;
  c.s_q = 1;
  c.h_q = 4;
  c.causal = true;
  c.seqlens = {33};
  c.seed = 107;
  run_dense_case(c);
}

// FlashMLA's shapes: 128 heads, page 64, MTP with 2 query tokens, a few hundred keys.
TEST(ReferenceDenseDecode, FlashMlaShapeH128Page64CausalMtp) {
  DenseCase c;
  c.page_size = 64;
  c.s_q = 2;
  c.h_q = 128;
  c.causal = true;
  c.seqlens = {300, 129, 0, 1};
  c.seed = 109;
  run_dense_case(c);
}

// A page id outside [0, num_blocks) inside the needed range is a hard error, not a read.
TEST(ReferenceDenseDecode, OutOfRangePageInsideNeededRangeThrows) {
  DenseCase c;
  c.page_size = 16;
  c.h_q = 2;
  c.seqlens = {20, 5};
  c.seed = 108;
  for (int32_t bad : {-1, 1 << 30}) {
    DenseSetup s(c);
    s.block_table[1] = bad;  // request 0's second page (keys 16..19)
    try {
      dense_decode(s.p);
      ADD_FAILURE() << "no throw for page " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "block_table");
    }
    for (uint16_t v : s.out) ASSERT_EQ(v, kOutSentinel);  // nothing written
  }
  {
    DenseSetup s(c);
    s.block_table[s.p.block_table_batch_stride] = s.p.num_blocks;  // request 1's only page
    EXPECT_THROW(dense_decode(s.p), InvalidArgument);
  }
  {
    DenseSetup s(c);
    s.seqlens[0] = s.p.max_blocks_per_seq * s.p.page_size + 1;
    EXPECT_THROW(dense_decode(s.p), InvalidArgument);
    s.seqlens[0] = -1;
    EXPECT_THROW(dense_decode(s.p), InvalidArgument);
  }
  {
    DenseSetup s(c);
    s.p.h_kv = 3;  // 2 % 3 != 0
    EXPECT_THROW(dense_decode(s.p), InvalidArgument);
  }
}

}  // namespace
}  // namespace hmla
