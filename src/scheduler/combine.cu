#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/cuda_check.h"
#include "common/device_primitives.cuh"
#include "scheduler/decode_scheduler.h"

namespace hmla::detail {
namespace {

constexpr int kCombineWarps = 4;  // one query row per CTA, 4 columns per thread: small batches spread wide
constexpr int kMaxCombinePieces = 1024;  // pieces of one request: at most one per part (<= SMs)

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

// Grid: (split request, kv head, query row of that head: token-major). The number of split
// requests is known only on the device; only real query rows get a CTA (tiles padded to 64 rows
// would launch 4x more CTAs for h_q = 16, and those idle CTAs cost more than the merge itself).
// One warp turns the pieces' LSEs into weights, then each thread merges 4 columns so the loads
// stay coalesced.
//
// The split list comes from the plan, which finished before the attention kernel started (that
// launch does not overlap its predecessor), so it is read before waiting for the attention kernel:
// the CTAs without a split request (most of them; all of them when no request is split) retire
// while the attention kernel still runs instead of being launched one after another after it.
template <typename Element>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(CombineParams p) {
  const int count = p.split_list[0];
  if (static_cast<int>(blockIdx.x) >= count) return;
  dev::pdl_wait_for_prerequisites();
  const int req = p.split_list[1 + blockIdx.x];
  const int kv = blockIdx.y;
  const int token = blockIdx.z / p.tiling.heads_per_kv;
  const int head_in_kv = blockIdx.z % p.tiling.heads_per_kv;
  // The tile and tile row that hold (token, head_in_kv): the inverse of RowTiling::row.
  const int m = (token / p.tiling.tokens_per_tile) * p.tiling.head_tiles + head_in_kv / kTileRows;
  const int r = (token % p.tiling.tokens_per_tile) * p.tiling.heads_per_tile + head_in_kv % kTileRows;
  const int lane = threadIdx.x % 32;

  const int n = p.req_num_splits[req];
  const int base = p.req_split_base[req];
  const size_t rows_per_slot = static_cast<size_t>(p.h_kv) * p.tiling.num_m_blocks * kTileRows;
  const size_t row = (static_cast<size_t>(kv) * p.tiling.num_m_blocks + m) * kTileRows + r;
  const float* lse_of = p.lse_accum + static_cast<size_t>(base) * rows_per_slot + row;

  // The pieces' weights exp(lse_s - lse) go to shared memory once (one warp), so the merge loop
  // below has no dependent global load between its o_accum loads, of which 16 are in flight.
  __shared__ float weight[kMaxCombinePieces];
  __shared__ float row_lse;
  if (threadIdx.x < 32) {
    float max_lse = -INFINITY;
    for (int s = lane; s < n; s += 32) max_lse = fmaxf(max_lse, lse_of[s * rows_per_slot]);
    for (int o = 16; o > 0; o >>= 1) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, o));
    float sum = 0.f;
    if (max_lse != -INFINITY) {
      for (int s = lane; s < n; s += 32) sum += __expf(lse_of[s * rows_per_slot] - max_lse);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    // A piece with no visible key has LSE -inf; a row with none in any piece gets out 0, LSE +inf.
    const float lse = sum > 0.f ? max_lse + logf(sum) : INFINITY;
    for (int s = lane; s < n; s += 32) weight[s] = sum > 0.f ? __expf(lse_of[s * rows_per_slot] - lse) : 0.f;
    if (lane == 0) row_lse = lse;
  }
  __syncthreads();
  const float lse = row_lse;

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int col = threadIdx.x * 4;
  if (lse != INFINITY && col < p.d_v) {
    const float* src = p.o_accum + (static_cast<size_t>(base) * rows_per_slot + row) * p.d_v + col;
    const size_t slot_stride = rows_per_slot * p.d_v;
#pragma unroll 16
    for (int s = 0; s < n; ++s) {
      const float w = weight[s];
      const float4 v = *reinterpret_cast<const float4*>(src + s * slot_stride);
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
  }
  const int head = kv * p.tiling.heads_per_kv + head_in_kv;
  Element* dst = static_cast<Element*>(p.out) + req * p.out_batch_stride + token * p.out_token_stride +
                 head * p.out_head_stride;
  if (col < p.d_v) store4<Element>(dst + col, acc.x, acc.y, acc.z, acc.w);
  if (threadIdx.x == 0) p.lse[req * p.lse_batch_stride + head * p.lse_head_stride + token] = lse;
}

}  // namespace

template <typename Element>
void launch_combine(const CombineParams& params, cudaStream_t stream) {
  // A request has at most one piece per part; the merge keeps one weight per piece in shared memory.
  if (params.num_sm_parts > kMaxCombinePieces)
    throw CudaError("hmla: " + std::to_string(params.num_sm_parts) + " SM parts exceed the combine's " +
                    std::to_string(kMaxCombinePieces) + " pieces per request");
  cudaLaunchConfig_t config{};
  // x: one slot per part (the split requests are at most that many, and only the device knows how
  // many there are). The spare CTAs retire before the programmatic wait, while the attention
  // kernel runs, so they cost little once it ends.
  config.gridDim = dim3(params.num_sm_parts, params.h_kv, params.tiling.s_q * params.tiling.heads_per_kv);
  config.blockDim = dim3(kCombineWarps * 32);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  HMLA_CUDA_CHECK(cudaLaunchKernelEx(&config, combine_kernel<Element>, params));
}

template void launch_combine<__nv_bfloat16>(const CombineParams&, cudaStream_t);
template void launch_combine<__half>(const CombineParams&, cudaStream_t);

}  // namespace hmla::detail
