// FP8 dequantisation of the sparse KV caches (both layouts of hmla/params.h), on the CUDA cores.
// The kernels' K tiles are bf16: every e4m3 value is widened exactly (e4m3 -> f16 is one
// instruction per pair and exact), multiplied by its tile's scale in float32 and rounded once to
// bf16, so a dequantised value equals float_to_bf16(e4m3_to_float(code) * scale) of the reference
// (tests/gpu/test_fp8_dequant.cu checks all 256 codes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace hmla::dev {

// 2^(byte - 127); 0xff is NaN. Byte 0 is the one subnormal, 2^-127.
__device__ __forceinline__ float ue8m0_to_float(uint32_t byte) {
  byte &= 0xffu;
  if (byte == 0xffu) return __int_as_float(0x7fc00000);
  return __int_as_float(byte == 0u ? 0x00400000 : static_cast<int>(byte << 23));
}

// Two e4m3 values (the low and high byte of `pair`) times scale, as one bf16x2 word (low value in
// the low half).
__device__ __forceinline__ uint32_t dequant2_e4m3_to_bf16(uint32_t pair, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// 16 e4m3 values (one 16-byte load, byte i = value i) times scale: values 0-7 as bf16 in lo, 8-15 in hi.
__device__ __forceinline__ void dequant16_e4m3_to_bf16(uint4 raw, float scale, uint4& lo, uint4& hi) {
  lo.x = dequant2_e4m3_to_bf16(raw.x, scale);
  lo.y = dequant2_e4m3_to_bf16(raw.x >> 16, scale);
  lo.z = dequant2_e4m3_to_bf16(raw.y, scale);
  lo.w = dequant2_e4m3_to_bf16(raw.y >> 16, scale);
  hi.x = dequant2_e4m3_to_bf16(raw.z, scale);
  hi.y = dequant2_e4m3_to_bf16(raw.z >> 16, scale);
  hi.z = dequant2_e4m3_to_bf16(raw.w, scale);
  hi.w = dequant2_e4m3_to_bf16(raw.w >> 16, scale);
}

}  // namespace hmla::dev
