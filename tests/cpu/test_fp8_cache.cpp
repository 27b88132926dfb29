// FP8 cache layouts: sizes, byte-exact packing of hand-built tokens (expected bytes written out by
// hand from the layout description), page placement, and round-trip error bounds on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hmla/reference.h"
#include "reference_test_util.h"

namespace hmla {
namespace {

using namespace reference;
using Layout = SparseCacheLayout;

constexpr uint8_t kSentinel = 0xA5;

uint16_t bf(float v) {  // exact bf16 bits of a value that is representable
  const uint16_t bits = float_to_bf16(v);
  EXPECT_EQ(bf16_to_float(bits), v) << "test value not representable in bf16: " << v;
  return bits;
}

void append_f32(std::vector<uint8_t>& bytes, float v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);  // little endian host
  bytes.insert(bytes.end(), b, b + 4);
}
void append_u32_le(std::vector<uint8_t>& bytes, uint32_t v) {
  for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<uint8_t>(v >> (8 * k)));
}
void append_u16_le(std::vector<uint8_t>& bytes, uint16_t v) {
  bytes.push_back(static_cast<uint8_t>(v & 0xff));
  bytes.push_back(static_cast<uint8_t>(v >> 8));
}
void append_n(std::vector<uint8_t>& bytes, uint8_t value, int n) { bytes.insert(bytes.end(), n, value); }

void expect_bytes(const uint8_t* got, const std::vector<uint8_t>& expect, const char* what) {
  for (size_t k = 0; k < expect.size(); ++k) {
    ASSERT_EQ(got[k], expect[k]) << what << ": byte " << k;
  }
}

void expect_untouched(const std::vector<uint8_t>& page, size_t begin, size_t end) {
  for (size_t k = begin; k < end; ++k) ASSERT_EQ(page[k], kSentinel) << "byte " << k;
}

// ------------------------------------------------------------------------------------------ sizes

TEST(FP8CacheLayout, Sizes) {
  EXPECT_EQ(sparse_cache_d_qk(Layout::kV32), 576);
  EXPECT_EQ(sparse_cache_d_qk(Layout::kModel1), 512);
  EXPECT_EQ(sparse_cache_d_nope(Layout::kV32), 512);
  EXPECT_EQ(sparse_cache_d_nope(Layout::kModel1), 448);
  EXPECT_EQ(sparse_token_bytes(Layout::kV32), 656);
  EXPECT_EQ(sparse_token_bytes(Layout::kModel1), 584);

  EXPECT_EQ(sparse_page_bytes(Layout::kV32, 1), 656);
  EXPECT_EQ(sparse_page_bytes(Layout::kV32, 64), 64 * 656);  // 41984
  // kModel1: round_up(page_size * 584, 576).
  EXPECT_EQ(sparse_page_bytes(Layout::kModel1, 1), 1152);     // 584 -> 2 * 576
  EXPECT_EQ(sparse_page_bytes(Layout::kModel1, 3), 2304);     // 1752 -> 4 * 576
  EXPECT_EQ(sparse_page_bytes(Layout::kModel1, 64), 37440);   // 37376 -> 65 * 576
  EXPECT_EQ(sparse_page_bytes(Layout::kModel1, 72), 42048);   // 42048 = 73 * 576 exactly
  EXPECT_EQ(sparse_page_bytes(Layout::kModel1, 256), 149760); // 149504 -> 260 * 576

  EXPECT_THROW(sparse_page_bytes(static_cast<Layout>(7), 64), InvalidArgument);
  EXPECT_THROW(sparse_page_bytes(Layout::kV32, 0), InvalidArgument);
  std::vector<uint16_t> token(576, 0);
  std::vector<uint8_t> page(sparse_page_bytes(Layout::kModel1, 4));
  EXPECT_THROW(pack_token(Layout::kModel1, token.data(), page.data(), 4, 4), InvalidArgument);
  EXPECT_THROW(pack_token(Layout::kModel1, token.data(), page.data(), 4, -1), InvalidArgument);
}

// ------------------------------------------------------------------------------ kV32 byte layout

// Token A: scales 1, 2^-4, (zero tile -> 1), 4; every value lands exactly on an e4m3 code.
std::vector<uint16_t> v32_token_a() {
  std::vector<uint16_t> t(576);
  // tile 0, amax 448 -> scale 1
  t[0] = bf(448.f); t[1] = bf(1.f); t[2] = bf(-2.f); t[3] = bf(0.5f); t[4] = bf(-448.f);
  for (int k = 5; k < 128; ++k) t[k] = bf(0.25f);
  // tile 1, amax 28 = 448 * 2^-4 -> scale 0.0625
  t[128] = bf(28.f); t[129] = bf(1.f); t[130] = bf(-0.0625f);
  for (int k = 131; k < 256; ++k) t[k] = bf(3.f);
  // tile 2, all zero (one negative zero) -> scale 1 (documented choice)
  for (int k = 256; k < 384; ++k) t[k] = bf(0.f);
  t[300] = 0x8000;
  // tile 3, amax 1792 = 448 * 4 -> scale 4
  t[384] = bf(-1792.f); t[385] = bf(-3.f); t[386] = bf(std::ldexp(1.f, -7));
  for (int k = 387; k < 512; ++k) t[k] = bf(4.f);
  for (int k = 0; k < 63; ++k) t[512 + k] = static_cast<uint16_t>(0x4000 + 3 * k);
  t[575] = 0xFFC1;  // a NaN RoPE value is copied verbatim
  return t;
}

std::vector<uint8_t> v32_token_a_bytes() {
  std::vector<uint8_t> e;
  // NoPE codes
  e.insert(e.end(), {0x7E, 0x38, 0xC0, 0x30, 0xFE});  // 448, 1, -2, 0.5, -448
  append_n(e, 0x28, 123);                             // 0.25
  e.insert(e.end(), {0x7E, 0x58, 0xB8});              // 448, 16, -1 (values / 2^-4)
  append_n(e, 0x64, 125);                             // 3 / 2^-4 = 48
  append_n(e, 0x00, 128);
  e[256 + 44] = 0x80;                                 // -0
  e.insert(e.end(), {0xFE, 0xB4, 0x01});              // -448, -0.75, 2^-9 (values / 4)
  append_n(e, 0x38, 125);                             // 4 / 4 = 1
  // scales as float32 bit patterns
  append_u32_le(e, 0x3F800000);  // 1
  append_u32_le(e, 0x3D800000);  // 0.0625
  append_u32_le(e, 0x3F800000);  // 1
  append_u32_le(e, 0x40800000);  // 4
  for (int k = 0; k < 63; ++k) append_u16_le(e, static_cast<uint16_t>(0x4000 + 3 * k));
  append_u16_le(e, 0xFFC1);
  return e;
}

// Token B: scale 3/448 (not a power of two) in every tile: 3 -> 448, 1 -> 149.33 -> 144.
std::vector<uint16_t> v32_token_b() {
  std::vector<uint16_t> t(576, bf(1.f));
  for (int tile = 0; tile < 4; ++tile) t[tile * 128 + 7] = bf(-3.f);
  for (int k = 0; k < 64; ++k) t[512 + k] = bf(-1.5f);
  return t;
}

std::vector<uint8_t> v32_token_b_bytes() {
  std::vector<uint8_t> e;
  for (int tile = 0; tile < 4; ++tile) {
    append_n(e, 0x71, 7);  // 144 = 1.125 * 2^7
    e.push_back(0xFE);     // -448
    append_n(e, 0x71, 120);
  }
  for (int tile = 0; tile < 4; ++tile) append_f32(e, 3.0f / 448.0f);
  for (int k = 0; k < 64; ++k) append_u16_le(e, 0xBFC0);  // -1.5
  return e;
}

TEST(FP8CacheLayout, V32ByteExactTokens) {
  const int page_size = 4;
  std::vector<uint8_t> page(sparse_page_bytes(Layout::kV32, page_size), kSentinel);
  const auto a = v32_token_a();
  const auto b = v32_token_b();
  pack_token(Layout::kV32, a.data(), page.data(), page_size, 2);
  const auto ea = v32_token_a_bytes();
  ASSERT_EQ(ea.size(), 656u);
  expect_bytes(page.data() + 2 * 656, ea, "token A at slot 2");
  expect_untouched(page, 0, 2 * 656);
  expect_untouched(page, 3 * 656, page.size());

  pack_token(Layout::kV32, b.data(), page.data(), page_size, 0);
  expect_bytes(page.data(), v32_token_b_bytes(), "token B at slot 0");
  expect_bytes(page.data() + 2 * 656, ea, "token A still at slot 2");
  expect_untouched(page, 656, 2 * 656);

  // Dequantisation: token A is exact (power-of-two scales, values on codes).
  std::vector<float> out(576);
  unpack_token(Layout::kV32, page.data(), page_size, 2, out.data());
  for (int k = 0; k < 575; ++k) EXPECT_EQ(out[k], bf16_to_float(a[k])) << k;
  EXPECT_TRUE(std::isnan(out[575]));
  EXPECT_TRUE(std::signbit(out[300]));
  // Token B: code value times the float32 scale, in float32.
  unpack_token(Layout::kV32, page.data(), page_size, 0, out.data());
  const float scale = 3.0f / 448.0f;
  EXPECT_EQ(out[0], 144.0f * scale);
  EXPECT_EQ(out[7], -448.0f * scale);
  EXPECT_EQ(out[512], -1.5f);
}

// ---------------------------------------------------------------------------- kModel1 byte layout

// Tile scales: 1 (amax 448), 2^-3 (amax 56), 1 (amax 300), 2 (amax 450), zero tile -> 1,
// 2^-10 (amax 0.4375), 2^-8 (amax 1: 1/448 rounds up to 2^-8).
std::vector<uint16_t> model1_token() {
  std::vector<uint16_t> t(512);
  auto fill = [&](int begin, int end, float v) {
    for (int k = begin; k < end; ++k) t[k] = bf(v);
  };
  t[0] = bf(448.f); t[1] = bf(1.f); fill(2, 64, -0.5f);
  t[64] = bf(56.f); t[65] = bf(0.125f); fill(66, 128, -1.f);
  t[128] = bf(300.f); fill(129, 192, 2.f);
  t[192] = bf(450.f); fill(193, 256, -3.f);
  fill(256, 320, 0.f);
  t[320] = bf(0.4375f); fill(321, 384, std::ldexp(1.f, -10));
  t[384] = bf(1.f); fill(385, 448, -0.5f);
  for (int k = 0; k < 64; ++k) t[448 + k] = static_cast<uint16_t>(0x3C00 + 5 * k);
  return t;
}

std::vector<uint8_t> model1_token_data_bytes() {
  std::vector<uint8_t> e;
  e.insert(e.end(), {0x7E, 0x38}); append_n(e, 0xB0, 62);  // 448, 1, -0.5          (scale 1)
  e.insert(e.end(), {0x7E, 0x38}); append_n(e, 0xD0, 62);  // 448, 1, -8            (scale 2^-3)
  e.push_back(0x79); append_n(e, 0x40, 63);                // 300 -> 288, 2          (scale 1)
  e.push_back(0x76); append_n(e, 0xBC, 63);                // 225 -> 224, -1.5       (scale 2)
  append_n(e, 0x00, 64);                                   // zeros                  (scale 1)
  e.push_back(0x7E); append_n(e, 0x38, 63);                // 448, 1                 (scale 2^-10)
  e.push_back(0x78); append_n(e, 0xF0, 63);                // 256, -128              (scale 2^-8)
  for (int k = 0; k < 64; ++k) append_u16_le(e, static_cast<uint16_t>(0x3C00 + 5 * k));
  return e;
}

const std::vector<uint8_t> kModel1ScaleBytes = {0x7F, 0x7C, 0x7F, 0x80, 0x7F, 0x75, 0x77, 0x00};

TEST(FP8CacheLayout, Model1ByteExactTokenAndScalePlacement) {
  const int page_size = 3;
  const size_t page_bytes = sparse_page_bytes(Layout::kModel1, page_size);
  ASSERT_EQ(page_bytes, 2304u);
  std::vector<uint8_t> page(page_bytes, kSentinel);
  const auto tok = model1_token();
  pack_token(Layout::kModel1, tok.data(), page.data(), page_size, 1);

  const auto data = model1_token_data_bytes();
  ASSERT_EQ(data.size(), 576u);
  expect_bytes(page.data() + 1 * 576, data, "token data at slot 1");
  // token t's scales at page_size * 576 + t * 8 = 1728 + 8
  expect_bytes(page.data() + 1736, kModel1ScaleBytes, "token scales at 1736");
  expect_untouched(page, 0, 576);
  expect_untouched(page, 2 * 576, 1736);
  expect_untouched(page, 1744, page.size());

  // Another token in the last slot: its scales at 1728 + 16; slot 1 stays as it was.
  std::vector<uint16_t> ones(512, bf(1.f));
  pack_token(Layout::kModel1, ones.data(), page.data(), page_size, 2);
  expect_bytes(page.data() + 1 * 576, data, "slot 1 data unchanged");
  expect_bytes(page.data() + 1736, kModel1ScaleBytes, "slot 1 scales unchanged");
  std::vector<uint8_t> ones_data(448, 0x78);  // 1 / 2^-8 = 256
  for (int k = 0; k < 64; ++k) append_u16_le(ones_data, 0x3F80);
  expect_bytes(page.data() + 2 * 576, ones_data, "slot 2 data");
  expect_bytes(page.data() + 1744, {0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x00}, "slot 2 scales");
  expect_untouched(page, 1752, page.size());

  std::vector<float> out(512);
  unpack_token(Layout::kModel1, page.data(), page_size, 1, out.data());
  // Values on codes come back exactly; 300 -> 288 and 450 -> 448.
  for (int k = 0; k < 512; ++k) {
    float expect = bf16_to_float(tok[k]);
    if (k == 128) expect = 288.f;
    if (k == 192) expect = 448.f;
    EXPECT_EQ(out[k], expect) << k;
  }
}

// --------------------------------------------------------------------------- round trips, random

// Round-trip bound per NoPE value x of a tile with scale s (after dequantisation dq):
//   |dq - x| <= 2^-4 * |x| + 2^-10 * s + 2^-20 * |x|
// 2^-4 |x|: half an e4m3 step in the normal range (3 mantissa bits); 2^-10 s: half the subnormal
// step 2^-9 times s; 2^-20 |x|: the float32 rounding of x / s and of code * s (kV32) with margin.
// RoPE values come back bit for bit. Every token also matches the test's own byte decoder.
void round_trip_random(Layout layout, uint64_t seed) {
  test::Rng rng(seed);
  const int d_qk = sparse_cache_d_qk(layout);
  const int d_nope = sparse_cache_d_nope(layout);
  const int tile = layout == Layout::kV32 ? 128 : 64;
  for (int page_size : {1, 5, 64}) {
    const int64_t stride = sparse_page_bytes(layout, page_size);
    std::vector<uint8_t> page(stride, kSentinel);
    std::vector<std::vector<uint16_t>> tokens(page_size);
    for (int t = 0; t < page_size; ++t) {
      auto& tok = tokens[t];
      tok.resize(d_qk);
      for (int c = 0; c < d_nope / tile; ++c) {
        const double amplitude = std::exp2(rng.uniform(-20, 10));
        for (int k = 0; k < tile; ++k) {
          // Mostly ordinary values, some tiny ones (e4m3 subnormal range after scaling).
          const double a = rng.coin(0.1) ? amplitude * 1e-3 : amplitude;
          tok[c * tile + k] = test::random_bf16(rng, a);
        }
      }
      for (int k = d_nope; k < d_qk; ++k) tok[k] = test::random_bf16(rng, 4.0);
      pack_token(layout, tok.data(), page.data(), page_size, t);
    }
    std::vector<float> out(d_qk);
    for (int t = 0; t < page_size; ++t) {
      const auto& tok = tokens[t];
      unpack_token(layout, page.data(), page_size, t, out.data());
      const auto independent = test::test_dequant_token(layout, page.data(), page_size, t);
      for (int c = 0; c < d_nope / tile; ++c) {
        double amax = 0;
        for (int k = 0; k < tile; ++k) amax = std::max(amax, std::fabs(double(bf16_to_float(tok[c * tile + k]))));
        double s;
        if (layout == Layout::kV32) {
          float sf;
          std::memcpy(&sf, page.data() + t * 656 + 512 + 4 * c, 4);
          s = sf;
          EXPECT_EQ(sf, static_cast<float>(amax) / 448.0f);
        } else {
          const uint8_t e = page[page_size * 576 + t * 8 + c];
          s = std::ldexp(1.0, e - 127);
          // the smallest power of two >= amax / 448
          EXPECT_GE(s, amax / 448 * (1 - 1e-7));
          EXPECT_LT(s, 2 * amax / 448);
        }
        for (int k = 0; k < tile; ++k) {
          const int i = c * tile + k;
          const double x = bf16_to_float(tok[i]);
          const double dq = out[i];
          const double bound = std::ldexp(std::fabs(x), -4) + std::ldexp(s, -10) + std::ldexp(std::fabs(x), -20);
          ASSERT_LE(std::fabs(dq - x), bound) << "page_size " << page_size << " token " << t << " value " << i;
        }
      }
      for (int i = 0; i < d_qk; ++i) ASSERT_EQ(static_cast<double>(out[i]), independent[i]) << i;
      for (int i = d_nope; i < d_qk; ++i) ASSERT_EQ(float_to_bf16(out[i]), tok[i]) << i;
    }
    if (layout == Layout::kModel1) expect_untouched(page, page_size * 584, page.size());
  }
}

TEST(FP8CacheLayout, V32RandomRoundTripWithinBound) { round_trip_random(Layout::kV32, 11); }
TEST(FP8CacheLayout, Model1RandomRoundTripWithinBound) { round_trip_random(Layout::kModel1, 12); }

// Tokens built from e4m3 codes times a power-of-two scale, with a tile's amax exactly 448 * scale,
// survive pack/unpack bit for bit in both layouts.
TEST(FP8CacheLayout, RepresentableTokensAreExact) {
  test::Rng rng(13);
  for (Layout layout : {Layout::kV32, Layout::kModel1}) {
    const int d_qk = sparse_cache_d_qk(layout);
    const int d_nope = sparse_cache_d_nope(layout);
    const int tile = layout == Layout::kV32 ? 128 : 64;
    const int page_size = 2;
    std::vector<uint8_t> page(sparse_page_bytes(layout, page_size), kSentinel);
    std::vector<uint16_t> tok(d_qk);
    for (int c = 0; c < d_nope / tile; ++c) {
      const float s = std::ldexp(1.0f, rng.integer(-12, 6));
      for (int k = 0; k < tile; ++k) {
        const uint8_t code = static_cast<uint8_t>(rng.integer(0, 0xFD)) ;
        const uint8_t safe = (code & 0x7F) == 0x7F ? 0x7E : code;
        tok[c * tile + k] = bf(e4m3_to_float(safe) * s);
      }
      tok[c * tile + rng.integer(0, tile - 1)] = bf(448.f * s);
    }
    for (int k = d_nope; k < d_qk; ++k) tok[k] = test::random_bf16(rng);
    pack_token(layout, tok.data(), page.data(), page_size, 1);
    std::vector<float> out(d_qk);
    unpack_token(layout, page.data(), page_size, 1, out.data());
    for (int i = 0; i < d_qk; ++i) ASSERT_EQ(out[i], bf16_to_float(tok[i])) << i;
  }
}

}  // namespace
}  // namespace hmla
