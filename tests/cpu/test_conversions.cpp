// Number formats of the reference: bf16, fp16, OCP e4m3fn, UE8M0, load_half/store_half.
// Known bit patterns, ties to even, NaN/inf/saturation, exhaustive decode->encode identities, and
// random values against a brute-force "nearest representable, ties to the even code" search. All
// comparisons are exact (bit equality).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "hmla/reference.h"
#include "reference_test_util.h"

namespace hmla {
namespace {

using namespace reference;

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float p2(int e) { return std::ldexp(1.0f, e); }
constexpr float kFInf = std::numeric_limits<float>::infinity();
const float kFNaN = std::numeric_limits<float>::quiet_NaN();

// Brute force: nearest of the sorted non-negative finite values (index = code), ties to the even
// code; values past the last one by at least half of the last step go to `overflow_code`.
// Returns the code of |v| (sign handled by the caller).
uint32_t brute_nearest(const std::vector<double>& values, double v, uint32_t overflow_code,
                       double overflow_threshold) {
  if (v >= overflow_threshold) return overflow_code;
  auto it = std::lower_bound(values.begin(), values.end(), v);
  if (it == values.end()) return static_cast<uint32_t>(values.size() - 1);
  const uint32_t hi = static_cast<uint32_t>(it - values.begin());
  if (*it == v || hi == 0) return hi;
  const uint32_t lo = hi - 1;
  const double dlo = v - values[lo];
  const double dhi = values[hi] - v;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo % 2 == 0) ? lo : hi;
}

// Random floats spread over many binades, plus every midpoint between consecutive values of
// `values` and its float neighbours (the exact ties and the values just beside them).
std::vector<float> probe_values(const std::vector<double>& values, int min_exp, int max_exp,
                                uint64_t seed, int random_count) {
  test::Rng rng(seed);
  std::vector<float> probes;
  for (int k = 0; k < random_count; ++k) {
    const double e = rng.uniform(min_exp, max_exp);
    probes.push_back(static_cast<float>(std::exp2(e)));
  }
  const size_t stride = std::max<size_t>(1, values.size() / 4096);
  for (size_t k = 0; k + 1 < values.size(); k += stride) {
    const float mid = static_cast<float>((values[k] + values[k + 1]) / 2);
    if (static_cast<double>(mid) != (values[k] + values[k + 1]) / 2) continue;  // not a float
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.f));
    probes.push_back(std::nextafter(mid, kFInf));
  }
  return probes;
}

// ------------------------------------------------------------------------------------------ bf16

TEST(ConversionsBF16, KnownBitPatterns) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(0.5f), 0x3F00);
  EXPECT_EQ(float_to_bf16(3.0f), 0x4040);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(kFInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(-kFInf), 0xFF80);
  EXPECT_EQ(float_to_bf16(p2(-133)), 0x0001);  // smallest bf16 subnormal
  EXPECT_EQ(float_to_bf16(p2(-149)), 0x0000);  // below half of it
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);              // below the tie
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x0001), p2(-133));
  EXPECT_EQ(bf16_to_float(0x7F80), kFInf);
}

TEST(ConversionsBF16, TiesToEven) {
  EXPECT_EQ(float_to_bf16(1.0f + p2(-8)), 0x3F80);               // 1 | 1+2^-7: keep even 0x3F80
  EXPECT_EQ(float_to_bf16(1.0f + 3 * p2(-8)), 0x3F82);           // 0x3F81 | 0x3F82: even
  EXPECT_EQ(float_to_bf16(1.0f + p2(-8) + p2(-20)), 0x3F81);     // just above the tie
  EXPECT_EQ(float_to_bf16(-(1.0f + 3 * p2(-8))), 0xBF82);
  EXPECT_EQ(float_to_bf16(1.5f * p2(-133)), 0x0002);              // subnormal tie 1|2: 2
  EXPECT_EQ(float_to_bf16(2.5f * p2(-133)), 0x0002);              // subnormal tie 2|3: 2
}

TEST(ConversionsBF16, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(kFNaN))));
  // A payload only in the 16 bits that are dropped must not become an infinity.
  const uint16_t low_payload = float_to_bf16(from_bits(0x7F800001));
  EXPECT_TRUE(std::isnan(bf16_to_float(low_payload))) << std::hex << low_payload;
  const uint16_t neg = float_to_bf16(from_bits(0xFFC00000));
  EXPECT_EQ(neg, 0xFFC0);
  for (uint32_t code : {0x7F81u, 0x7FC0u, 0xFFFFu, 0x7FFFu}) {
    EXPECT_TRUE(std::isnan(bf16_to_float(static_cast<uint16_t>(code))));
  }
}

TEST(ConversionsBF16, AllCodesDecodeEncodeIdentity) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = bf16_to_float(static_cast<uint16_t>(code));
    const uint16_t back = float_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(back))) << code;
      EXPECT_EQ(back & 0x8000, code & 0x8000) << code;
    } else {
      ASSERT_EQ(back, code);
    }
  }
}

TEST(ConversionsBF16, MatchesBruteForceNearest) {
  std::vector<double> values;  // positive finite bf16 values, index = code
  for (uint32_t c = 0; c <= 0x7F7F; ++c) values.push_back(bf16_to_float(static_cast<uint16_t>(c)));
  const double max = values.back();
  const double threshold = max + std::ldexp(1.0, 127 - 8);  // max + half an ulp: ties to inf
  for (float v : probe_values(values, -140, 128, 1, 200000)) {
    if (std::isinf(v)) continue;
    const uint32_t expect = brute_nearest(values, v, 0x7F80, threshold);
    ASSERT_EQ(float_to_bf16(v), expect) << v;
    ASSERT_EQ(float_to_bf16(-v), expect | 0x8000) << -v;
  }
}

// ------------------------------------------------------------------------------------------ fp16

TEST(ConversionsFP16, KnownBitPatterns) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(0.1f), 0x2E66);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // tie with the next step rounds to even: inf
  EXPECT_EQ(float_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(float_to_fp16(-kFInf), 0xFC00);
  EXPECT_EQ(float_to_fp16(p2(-14)), 0x0400);   // smallest normal
  EXPECT_EQ(float_to_fp16(p2(-24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), p2(-24));
  EXPECT_EQ(fp16_to_float(0x03FF), 1023 * p2(-24));
  EXPECT_EQ(fp16_to_float(0xFC00), -kFInf);
}

TEST(ConversionsFP16, TiesToEven) {
  EXPECT_EQ(float_to_fp16(p2(-25)), 0x0000);               // 0 | 2^-24: even 0
  EXPECT_EQ(float_to_fp16(p2(-25) * 1.0000001f), 0x0001);  // above the tie
  EXPECT_EQ(float_to_fp16(3 * p2(-25)), 0x0002);           // 1 | 2: even 2
  EXPECT_EQ(float_to_fp16(1.0f + p2(-11)), 0x3C00);
  EXPECT_EQ(float_to_fp16(1.0f + 3 * p2(-11)), 0x3C02);
  EXPECT_EQ(float_to_fp16(2047 * p2(-25)), 0x0400);        // subnormal carries into the normal
}

TEST(ConversionsFP16, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(kFNaN))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(from_bits(0x7F800001)))));
  EXPECT_EQ(float_to_fp16(from_bits(0xFFC00000)) & 0xFE00, 0xFE00);
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7C01)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0xFE00)));
}

TEST(ConversionsFP16, AllCodesDecodeEncodeIdentity) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const float f = fp16_to_float(static_cast<uint16_t>(code));
    const uint16_t back = float_to_fp16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(back))) << code;
      EXPECT_EQ(back & 0x8000, code & 0x8000) << code;
    } else {
      ASSERT_EQ(back, code);
    }
  }
}

TEST(ConversionsFP16, MatchesBruteForceNearest) {
  std::vector<double> values;
  for (uint32_t c = 0; c <= 0x7BFF; ++c) values.push_back(fp16_to_float(static_cast<uint16_t>(c)));
  const double threshold = 65520.0;
  for (float v : probe_values(values, -27, 17, 2, 200000)) {
    const uint32_t expect = brute_nearest(values, v, 0x7C00, threshold);
    ASSERT_EQ(float_to_fp16(v), expect) << v;
    ASSERT_EQ(float_to_fp16(-v), expect | 0x8000) << -v;
  }
}

// ------------------------------------------------------------------------------------------ e4m3

TEST(ConversionsE4M3, KnownBitPatterns) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(float_to_e4m3(1.875f), 0x3F);
  EXPECT_EQ(float_to_e4m3(2.0f), 0x40);
  EXPECT_EQ(float_to_e4m3(240.0f), 0x77);
  EXPECT_EQ(float_to_e4m3(256.0f), 0x78);
  EXPECT_EQ(float_to_e4m3(0.75f), 0x34);
  EXPECT_EQ(float_to_e4m3(p2(-9)), 0x01);      // smallest subnormal
  EXPECT_EQ(float_to_e4m3(7 * p2(-9)), 0x07);  // largest subnormal
  EXPECT_EQ(float_to_e4m3(p2(-6)), 0x08);      // smallest normal
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(-p2(-11)), 0x80);    // underflows to -0
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x01), p2(-9));
  EXPECT_EQ(e4m3_to_float(0x08), p2(-6));
  EXPECT_EQ(e4m3_to_float(0xB4), -0.75f);
}

TEST(ConversionsE4M3, TiesToEven) {
  EXPECT_EQ(float_to_e4m3(p2(-10)), 0x00);             // 0 | 1 quantum: even 0
  EXPECT_EQ(float_to_e4m3(p2(-10) * 1.0001f), 0x01);   // above the tie
  EXPECT_EQ(float_to_e4m3(3 * p2(-10)), 0x02);         // 1 | 2: 2
  EXPECT_EQ(float_to_e4m3(5 * p2(-10)), 0x02);         // 2 | 3: 2
  EXPECT_EQ(float_to_e4m3(15 * p2(-10)), 0x08);        // 7 | 8 (first normal): 8
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);             // 1 | 1.125
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);             // 1.125 | 1.25
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7E);              // 416 | 448
  EXPECT_EQ(float_to_e4m3(-1.1875f), 0xBA);
}

TEST(ConversionsE4M3, SaturatesAndKeepsNaN) {
  for (float v : {448.5f, 464.0f, 465.0f, 480.0f, 1e6f, std::numeric_limits<float>::max(), kFInf}) {
    EXPECT_EQ(float_to_e4m3(v), 0x7E) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0xFE) << -v;
  }
  EXPECT_EQ(float_to_e4m3(kFNaN) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_e4m3(-kFNaN), 0xFF);
  EXPECT_EQ(float_to_e4m3(from_bits(0x7F800001)), 0x7F);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(ConversionsE4M3, DecodeAllCodesFromTheFormatDefinition) {
  double previous = -1.0;
  for (uint32_t code = 0; code < 256; ++code) {
    const double expect = test::test_e4m3_value(static_cast<uint8_t>(code));
    const float got = e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(expect)) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), expect) << code;
    EXPECT_EQ(std::signbit(got), code >= 0x80) << code;
    if (code < 0x7F) {  // positive codes increase strictly
      EXPECT_GT(expect, previous) << code;
      previous = expect;
    }
  }
}

TEST(ConversionsE4M3, AllCodesRoundTrip) {
  for (uint32_t code = 0; code < 256; ++code) {
    const float f = e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(f)) {
      EXPECT_EQ(float_to_e4m3(f) & 0x7F, 0x7F) << code;
      continue;
    }
    EXPECT_EQ(float_to_e4m3(f), code) << code;
  }
}

TEST(ConversionsE4M3, MatchesBruteForceNearest) {
  std::vector<double> values;  // codes 0x00..0x7E
  for (uint32_t c = 0; c <= 0x7E; ++c) values.push_back(e4m3_to_float(static_cast<uint8_t>(c)));
  // Saturating: everything above 448 goes to 448, so the "overflow" code is 0x7E too.
  for (float v : probe_values(values, -14, 11, 3, 200000)) {
    const uint32_t expect = v > 448.0f ? 0x7Eu : brute_nearest(values, v, 0x7E, kFInf);
    ASSERT_EQ(float_to_e4m3(v), expect) << v;
    ASSERT_EQ(float_to_e4m3(-v), expect | 0x80) << -v;
  }
}

// ----------------------------------------------------------------------------------------- ue8m0

TEST(ConversionsUE8M0, Decode) {
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(128), 2.0f);
  EXPECT_EQ(ue8m0_to_float(124), 0.125f);
  EXPECT_EQ(ue8m0_to_float(0), p2(-127));
  EXPECT_EQ(ue8m0_to_float(254), p2(127));
  EXPECT_TRUE(std::isnan(ue8m0_to_float(255)));
  for (int b = 0; b < 255; ++b) EXPECT_EQ(ue8m0_to_float(b), p2(b - 127)) << b;
}

TEST(ConversionsUE8M0, CeilToPowerOfTwo) {
  EXPECT_EQ(float_to_ue8m0_ceil(1.0f), 127);
  EXPECT_EQ(float_to_ue8m0_ceil(std::nextafter(1.0f, 2.0f)), 128);
  EXPECT_EQ(float_to_ue8m0_ceil(0.75f), 127);
  EXPECT_EQ(float_to_ue8m0_ceil(0.5f), 126);
  EXPECT_EQ(float_to_ue8m0_ceil(3.0f), 129);
  EXPECT_EQ(float_to_ue8m0_ceil(1.0f / 448.0f), 119);  // 2^-9 < 1/448 <= 2^-8
  for (int e = -126; e <= 127; ++e) {
    EXPECT_EQ(float_to_ue8m0_ceil(p2(e)), 127 + e) << e;
    EXPECT_EQ(float_to_ue8m0_ceil(p2(e) * 0.75f), 127 + e) << e;
    if (e < 127) { EXPECT_EQ(float_to_ue8m0_ceil(p2(e) * 1.25f), 128 + e) << e; }
  }
  // Edges (documented choices): <= 2^-127 (zero, negatives) -> 0x00; nothing representable -> 0xff.
  EXPECT_EQ(float_to_ue8m0_ceil(p2(-127)), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(p2(-140)), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(0.0f), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(-1.0f), 0);
  EXPECT_EQ(float_to_ue8m0_ceil(std::numeric_limits<float>::max()), 0xFF);
  EXPECT_EQ(float_to_ue8m0_ceil(kFInf), 0xFF);
  EXPECT_EQ(float_to_ue8m0_ceil(kFNaN), 0xFF);
}

// ------------------------------------------------------------------------------ load/store_half

TEST(ConversionsHalfBuffers, LoadAndStoreByDtype) {
  uint16_t buf[4] = {0, 0, 0, 0};
  store_half(DType::kBF16, buf, 1, 1.0f + 3 * p2(-8));
  store_half(DType::kFP16, buf, 2, 0.1f);
  store_half(DType::kFP16, buf, 3, 1e6f);
  EXPECT_EQ(buf[0], 0);
  EXPECT_EQ(buf[1], 0x3F82);
  EXPECT_EQ(buf[2], 0x2E66);
  EXPECT_EQ(buf[3], 0x7C00);
  EXPECT_EQ(load_half(DType::kBF16, buf, 1), 1.0f + p2(-6));
  EXPECT_EQ(load_half(DType::kFP16, buf, 2), fp16_to_float(0x2E66));
  EXPECT_EQ(load_half(DType::kFP16, buf, 3), kFInf);
  EXPECT_EQ(to_bits(load_half(DType::kBF16, buf, 0)), 0u);
}

}  // namespace
}  // namespace hmla
