// Helpers shared by the CPU tests of the reference: a seeded RNG, random bf16/fp16 data, NaN
// fill values, and an FP8 token decoder written independently of src/reference (straight from the
// layout description), so the attention tests do not lean on unpack_token.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hmla/reference.h"

namespace hmla::test {

constexpr uint16_t kBF16NaN = 0x7fc0;
constexpr uint16_t kFP16NaN = 0x7e00;
constexpr double kInf = std::numeric_limits<double>::infinity();

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  int integer(int lo, int hi_inclusive) {
    return std::uniform_int_distribution<int>(lo, hi_inclusive)(engine_);
  }
  bool coin(double p_true) { return uniform(0.0, 1.0) < p_true; }
  // Never zero: magnitude in [0.05, 1] * amplitude, random sign.
  float nonzero(double amplitude = 1.0) {
    const double m = uniform(0.05, 1.0) * amplitude;
    return static_cast<float>(coin(0.5) ? m : -m);
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

inline uint16_t encode_half(DType dtype, float v) {
  return dtype == DType::kFP16 ? reference::float_to_fp16(v) : reference::float_to_bf16(v);
}
inline double decode_half(DType dtype, uint16_t bits) {
  return dtype == DType::kFP16 ? reference::fp16_to_float(bits) : reference::bf16_to_float(bits);
}

// Random non-zero half value of roughly the given amplitude.
inline uint16_t random_half(Rng& rng, DType dtype, double amplitude = 1.0) {
  return encode_half(dtype, rng.nonzero(amplitude));
}
inline uint16_t random_bf16(Rng& rng, double amplitude = 1.0) {
  return random_half(rng, DType::kBF16, amplitude);
}

// ---- independent FP8 token decoding (from the layout text, not from src/reference) ----

// OCP e4m3fn: sign, 4-bit exponent (bias 7), 3-bit mantissa; exponent 0 is subnormal
// (m/8 * 2^-6); S.1111.111 is NaN.
inline double test_e4m3_value(uint8_t code) {
  const int s = code >> 7;
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

inline double test_bf16_value(const uint8_t* p) {  // little endian bytes
  const uint32_t bits = (static_cast<uint32_t>(p[1]) << 24) | (static_cast<uint32_t>(p[0]) << 16);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float test_f32_value(const uint8_t* p) {
  const uint32_t bits = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                        (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Dequantised token t of a page as doubles (d_qk values). The NoPE product is rounded to float as
// the layout's contract says (e4m3 * float32 scale in float32).
inline std::vector<double> test_dequant_token(SparseCacheLayout layout, const uint8_t* page,
                                              int page_size, int t) {
  std::vector<double> out;
  if (layout == SparseCacheLayout::kV32) {
    const uint8_t* tok = page + static_cast<int64_t>(t) * 656;
    for (int i = 0; i < 512; ++i) {
      const float scale = test_f32_value(tok + 512 + 4 * (i / 128));
      out.push_back(static_cast<float>(test_e4m3_value(tok[i]) * scale));
    }
    for (int i = 0; i < 64; ++i) out.push_back(test_bf16_value(tok + 528 + 2 * i));
  } else {
    const uint8_t* tok = page + static_cast<int64_t>(t) * 576;
    const uint8_t* sc = page + static_cast<int64_t>(page_size) * 576 + static_cast<int64_t>(t) * 8;
    for (int i = 0; i < 448; ++i) {
      const uint8_t e = sc[i / 64];
      const double scale = e == 0xff ? std::numeric_limits<double>::quiet_NaN() : std::pow(2.0, e - 127);
      out.push_back(test_e4m3_value(tok[i]) * scale);
    }
    for (int i = 0; i < 64; ++i) out.push_back(test_bf16_value(tok + 448 + 2 * i));
  }
  return out;
}

// |a - b| <= tol * (1 + |b|), with equal infinities accepted.
inline bool close_to(double a, double b, double tol) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= tol * (1.0 + std::fabs(b));
}

// Two-pass softmax of a score vector that may contain -inf (masked entries); returns the weights
// (exactly 0 for masked entries) and sets lse (+inf when everything is masked) and max.
inline std::vector<double> two_pass_softmax(const std::vector<double>& scores, double& lse,
                                            double& max_score) {
  max_score = -kInf;
  for (double s : scores) max_score = std::max(max_score, s);
  std::vector<double> w(scores.size(), 0.0);
  if (max_score == -kInf) {
    lse = kInf;
    return w;
  }
  double sum = 0.0;
  for (size_t j = 0; j < scores.size(); ++j) {
    if (scores[j] == -kInf) continue;
    w[j] = std::exp(scores[j] - max_score);
    sum += w[j];
  }
  for (double& x : w) x /= sum;
  lse = max_score + std::log(sum);
  return w;
}

// exp(lse) / (exp(lse) + exp(sink)), written with the larger exponent factored out.
inline double sink_factor(double lse, double sink) {
  if (sink == -kInf) return 1.0;
  if (sink == kInf) return 0.0;
  const double m = std::max(lse, sink);
  const double a = std::exp(lse - m);
  const double c = std::exp(sink - m);
  return a / (a + c);
}

}  // namespace hmla::test
