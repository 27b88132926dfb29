// The per-row math of merging partial attention results, shared by the decode combine
// (scheduler/combine.cu: the pieces of split requests) and the public merge_attention_states
// (scheduler/merge_states.cu: results the caller computed), so both merge the same way: the same
// LSE reduction, the same weights, the same NaN and "no key" rules.
//
// A piece is (o_s, lse_s) with o_s normalised (the softmax-weighted mean of its values) and lse_s the
// natural log of its sum of exp(score). Merged: lse = log(sum_s exp(lse_s)), o = sum_s w_s o_s with
// w_s = exp(lse_s - lse). Here a piece with no key has lse_s = -inf (weight 0); a row with no key in
// any piece gets lse = +inf (hmla's output convention) and o = 0. A NaN lse makes the row NaN, as it
// would have made the unsplit attention NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace hmla::dev {

constexpr float kNoKeyLse = INFINITY;  // +inf: the LSE of a merged row with no key

// The LSE of one row merged over its n pieces, by one warp; `any`: some piece saw a key. Lane l
// brings piece l's LSE (-inf from n on): the caller keeps it for that piece's weight, so the first 32
// pieces' LSEs are read once. piece_lse(s) reads piece s's LSE for s >= 32 (only those are asked for).
template <typename PieceLse>
__device__ __forceinline__ float merged_lse(float lane_lse, const PieceLse& piece_lse, int n, int lane, bool& any) {
  if (__any_sync(0xffffffffu, lane_lse != lane_lse)) {  // a piece attended to a NaN
    any = true;
    return __int_as_float(0x7fc00000);
  }
  float max_lse = lane_lse;
  for (int s = lane + 32; s < n; s += 32) max_lse = fmaxf(max_lse, piece_lse(s));
  for (int o = 16; o > 0; o >>= 1) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, o));
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    sum = __expf(lane_lse - max_lse);
    for (int s = lane + 32; s < n; s += 32) sum += __expf(piece_lse(s) - max_lse);
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  // No piece with a key: the sum is exactly 0. (Pieces from 32 on with NaN LSEs reach the sum and
  // make it NaN, so the row is NaN then too.)
  any = sum != 0.f;
  return any ? max_lse + logf(sum) : kNoKeyLse;
}

// A piece's weight in the merged row whose LSE merged_lse returned.
__device__ __forceinline__ float piece_weight(float piece_lse, float row_lse, bool any) {
  return any ? __expf(piece_lse - row_lse) : 0.f;
}

// ---- 16-bit values (bf16 / fp16) to and from floats, in 8- and 16-byte words

template <typename Element>
__device__ __forceinline__ void store4(Element* dst, float a, float b, float c, float d);
template <>
__device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16* dst, float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 v{*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi)};
  *reinterpret_cast<uint2*>(dst) = v;
}
template <>
__device__ __forceinline__ void store4<__half>(__half* dst, float a, float b, float c, float d) {
  __half2 lo = __floats2half2_rn(a, b), hi = __floats2half2_rn(c, d);
  uint2 v{*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi)};
  *reinterpret_cast<uint2*>(dst) = v;
}

// Two 16-bit values (one 32-bit word) as floats.
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t word) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
}

// Four consecutive 16-bit values as floats (one 8-byte load).
template <typename Element>
__device__ __forceinline__ float4 load4(const Element* src) {
  const uint2 v = *reinterpret_cast<const uint2*>(src);
  const float2 lo = unpack2<Element>(v.x), hi = unpack2<Element>(v.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Eight consecutive 16-bit values (one 16-byte word) as floats.
template <typename Element>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = unpack2<Element>(words[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

}  // namespace hmla::dev
