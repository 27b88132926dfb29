// Scalar number formats of the CPU reference: bf16, fp16, OCP float8_e4m3fn and UE8M0.
//
// Every encoder rounds to nearest, ties to even, and keeps NaN a NaN (with its sign). Decoders are
// exact. The rounding of fp16 and e4m3 goes through one helper that works on a double holding the
// exact input value (every float is exactly a double), so nothing is rounded twice.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hmla/reference.h"

namespace hmla::reference {
namespace {

uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Rounds x >= 0 to an integer, ties to even, without depending on the floating-point environment.
double round_half_even(double x) {
  const double lower = std::floor(x);
  const double frac = x - lower;  // exact: x and lower share an exponent range
  if (frac > 0.5) return lower + 1.0;
  if (frac < 0.5) return lower;
  return std::fmod(lower, 2.0) == 0.0 ? lower : lower + 1.0;
}

// Magnitude bits (exponent field << mant_bits | mantissa field) of the nearest value, ties to even,
// of a binary format with `mant_bits` stored mantissa bits and smallest normal exponent `emin`
// (the exponent field of 2^emin is 1, so its bias is 1 - emin). `a` must be finite and >= 0.
// Overflow is the caller's business: the result may exceed the largest finite code.
//
// With E = max(floor(log2 a), emin) the format's quantum around `a` is 2^(E - mant_bits); n, the
// rounded number of quanta, lies in [2^mant_bits, 2^(mant_bits+1)] for normal values and in
// [0, 2^mant_bits] for subnormal ones. Code = ((E + bias) << mant_bits) + n - 2^mant_bits covers
// both (for subnormals E + bias = 1), and a carry of n to 2^(mant_bits+1) lands on the next
// exponent's first code, as it should.
uint32_t round_magnitude(double a, int mant_bits, int emin) {
  if (a == 0.0) return 0;
  int frexp_exp = 0;
  std::frexp(a, &frexp_exp);  // a = f * 2^frexp_exp, f in [0.5, 1)
  int e = frexp_exp - 1;      // floor(log2 a)
  if (e < emin) e = emin;
  const double quanta = round_half_even(std::ldexp(a, mant_bits - e));
  const int bias = 1 - emin;
  return (static_cast<uint32_t>(e + bias) << mant_bits) + static_cast<uint32_t>(quanta) -
         (1u << mant_bits);
}

}  // namespace

// ---------------------------------------------------------------------------------------- bf16

float bf16_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if (std::isnan(value)) {
    // Keep the sign and the top payload bits; set the quiet bit so a payload living only in the
    // discarded low bits cannot turn the NaN into an infinity.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7fff plus the kept part's lowest bit rounds the discarded 16 bits to nearest, ties to
  // even; a carry out of the mantissa moves to the exponent (and from the largest float to inf).
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

// ---------------------------------------------------------------------------------------- fp16

float fp16_to_float(uint16_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) {
    // Infinity, or a NaN whose payload moves into the float's mantissa (quiet bit set).
    const uint32_t special = mantissa == 0 ? 0x7f800000u
                                           : 0x7fc00000u | (static_cast<uint32_t>(mantissa) << 13);
    return bits_float((negative ? 0x80000000u : 0u) | special);
  }
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), -24)
                              : std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
  return negative ? -magnitude : magnitude;
}

uint16_t float_to_fp16(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(value)) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((bits >> 13) & 0x3ffu));
  }
  const double a = std::fabs(static_cast<double>(value));
  if (std::isinf(a)) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t magnitude = round_magnitude(a, 10, -14);
  if (magnitude >= 0x7c00u) magnitude = 0x7c00u;  // rounds past 65504: infinity
  return static_cast<uint16_t>(sign | magnitude);
}

// ---------------------------------------------------------------------------------------- e4m3

float e4m3_to_float(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  if ((bits & 0x7fu) == 0x7fu) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return negative ? -nan : nan;
  }
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return negative ? -magnitude : magnitude;
}

uint8_t float_to_e4m3(float value) {
  const uint8_t sign = (float_bits(value) >> 31) != 0 ? 0x80u : 0x00u;
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7fu);
  const double a = std::fabs(static_cast<double>(value));
  if (a >= 448.0) return static_cast<uint8_t>(sign | 0x7eu);  // saturate (infinities too)
  return static_cast<uint8_t>(sign | round_magnitude(a, 3, -6));
}

// --------------------------------------------------------------------------------------- ue8m0

float ue8m0_to_float(uint8_t bits) {
  if (bits == 0xffu) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

// Smallest power of two >= the value, as a UE8M0 exponent byte. Decisions at the edges:
// NaN, +inf and anything above 2^127 (no such power is representable) give 0xff (NaN); every value
// <= 2^-127, zero and negative values included, gives 0x00 (2^-127, the smallest code).
uint8_t float_to_ue8m0_ceil(float positive_scale) {
  if (std::isnan(positive_scale)) return 0xffu;
  const double v = positive_scale;
  if (v <= std::ldexp(1.0, -127)) return 0x00u;
  if (v > std::ldexp(1.0, 127)) return 0xffu;
  int frexp_exp = 0;
  const double f = std::frexp(v, &frexp_exp);  // v = f * 2^frexp_exp, f in [0.5, 1)
  const int ceil_log2 = f == 0.5 ? frexp_exp - 1 : frexp_exp;
  return static_cast<uint8_t>(127 + ceil_log2);
}

// ---------------------------------------------------------------------------------- half buffers

float load_half(DType dtype, const void* base, int64_t index) {
  const uint16_t bits = static_cast<const uint16_t*>(base)[index];
  return dtype == DType::kFP16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

void store_half(DType dtype, void* base, int64_t index, float value) {
  static_cast<uint16_t*>(base)[index] =
      dtype == DType::kFP16 ? float_to_fp16(value) : float_to_bf16(value);
}

}  // namespace hmla::reference
