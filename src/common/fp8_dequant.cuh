// FP8 dequantisation of the sparse KV caches (both layouts of hmla/params.h), on the CUDA cores, into
// the fp16 K tiles the sparse decode kernel multiplies.
//
// Why fp16 and not bf16: e4m3 -> f16 is exact and one instruction per pair of values, and the scale
// is then one (UE8M0) or two (float32) f16x2 multiplies, 2-3 instructions per pair against 6 to widen
// to float32, scale and round to bf16. The producers that do this set the kernel's pace, and 768 of
// their ~1500 instructions per warp and tile were the bf16 dequantisation (docs/PERF.md). fp16 keeps
// 11 significant bits to bf16's 8, so each dequantised value is closer to the cache's; its range is
// the limit (docs/SPARSE_DECODE.md, "Number formats"): a dequantised value beyond 65504 is inf, and
// magnitudes below 2^-14 lose bits down to 2^-24, below which they are 0.
//
// A scale is applied as f16 factors, never as one f16 number (a float32 scale below 6.1e-5 would be
// an f16 subnormal and lose its precision):
//   V3.2, float32 scale s = m * 2^e (m in [1, 2)): value * a * b with a = m * 2^ea rounded to f16
//     (2^-11 relative) and b = 2^eb exact, eb = max(e - clamp(e, -5, 7), -24), ea = e - eb: for
//     every scale a model's tokens give (e >= -29) value * a is a normal f16 for every e4m3 value
//     (2^-9 .. 448). Two roundings; 0 below 2^-24, inf above 65504.
//   MODEL1, UE8M0 byte u: 2^(u - 127) as f16, one exact multiply; a factor below 2^-24 is 0 (the
//     block's largest value is then below 448 * 2^-24: the block dequantises to 0), above 2^15 inf;
//     0xff is NaN.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace hmla::dev {

// f16x2 word (lo in the low half) of two floats, each rounded to nearest even.
__device__ __forceinline__ uint32_t f16x2_of(float lo, float hi) {
  uint32_t w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The V3.2 scale (float32 bits) as its two f16 factors: a in the low half, b in the high half.
// Zero and float32-subnormal scales give b = 0 (products 0, signs kept); inf gives inf, NaN NaN.
__device__ __forceinline__ uint32_t v32_scale_factors(uint32_t bits) {
  const int biased = static_cast<int>((bits >> 23) & 0xffu);
  if (biased == 0xff) return f16x2_of(__uint_as_float(bits), 1.f);  // inf or NaN
  if (biased == 0) return f16x2_of(bits & 0x80000000u ? -1.f : 1.f, 0.f);
  const int e = biased - 127;
  const int ea0 = e < -5 ? -5 : (e > 7 ? 7 : e);
  const int eb = max(e - ea0, -24);  // b stays an f16 (subnormal down to 2^-24); a takes the rest
  const int ea = e - eb;
  // a = +-m * 2^ea and b = 2^eb, built from their float32 fields (both normal floats).
  const float a = __uint_as_float((bits & 0x807fffffu) | static_cast<uint32_t>(ea + 127) << 23);
  const float b = __uint_as_float(static_cast<uint32_t>(eb + 127) << 23);
  return f16x2_of(a, b);
}

// 2^(u - 127) for the UE8M0 byte u, as f16 in both halves; 0xff is NaN.
__device__ __forceinline__ uint32_t ue8m0_factor(uint32_t byte) {
  byte &= 0xffu;
  if (byte == 0xffu) return 0x7e007e00u;
  const float f = __uint_as_float(byte << 23);  // byte 0 is 0 here, 2^-127 in the format: 0 in f16 either way
  return f16x2_of(f, f);
}

// Two e4m3 values (low and high byte of the low half of `pair`) as an exact f16x2 word.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 e4m3 values (one 16-byte load, byte i = value i) times a scale's factors, as f16: values 0-7 in
// lo, 8-15 in hi. kTwoFactors: `factors` is v32_scale_factors' (a, b); else ue8m0_factor's.
template <bool kTwoFactors>
__device__ __forceinline__ void dequant16_e4m3_to_f16(uint4 raw, uint32_t factors, uint4& lo, uint4& hi) {
  uint32_t first = factors, second = factors;
  if constexpr (kTwoFactors) {
    first = __byte_perm(factors, 0, 0x1010);   // a in both halves
    second = __byte_perm(factors, 0, 0x3232);  // b in both halves
  }
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t v = hmul2(e4m3x2_to_f16x2(words[i / 2] >> (16 * (i % 2))), first);
    if constexpr (kTwoFactors) v = hmul2(v, second);
    out[i] = v;
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// Two bf16 values as f16 (rounded to nearest; inf beyond 65504).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
  return f16x2_of(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// The same, times a power of two `factor` in float32 first (exact): Q's prescale.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2_scaled(uint32_t w, float factor) {
  return f16x2_of(__uint_as_float(w << 16) * factor, __uint_as_float(w & 0xffff0000u) * factor);
}

}  // namespace hmla::dev
