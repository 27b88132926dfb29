// hmla::merge_attention_states on the device: one warp per query row (batch entry, token, head),
// lane l merging columns 8 l .. 8 l + 7 of each 256-column chunk of every state that has a key.
//
// The op is a stream over the states' rows (read once) and the output (written once), so what
// matters is keeping loads in flight: each lane loads the rows of up to kStatesPerStep states and
// two chunks before it consumes any, and small CTAs let many warps share an SM. Rows are ordered
// head-fastest, so consecutive warps read neighbouring rows of the default layouts.
#include "scheduler/merge_states.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_check.h"
#include "scheduler/merge_math.cuh"

namespace hmla::detail {
namespace {

constexpr int kWarpsPerCta = 8;
constexpr int kLaneElems = 8;                        // one 16-byte vector of 16-bit values
constexpr int kChunkCols = 32 * kLaneElems;          // columns one warp covers with one vector per lane
constexpr int kChunksPerPass = 2;                    // d_v 512 (hmla's decode) is one pass
constexpr int kStatesPerStep = 4;                    // states whose rows load before any is consumed

// The states' views travel in the kernel's parameters (constant memory, read with the state index
// in a register); Capacity bounds their number, so a two-state merge does not ship 32 views.
template <int Capacity>
struct MergeKernelParams {
  int num_states;
  int s_q;
  int h;
  int d_v;
  int64_t rows;  // batch * s_q * h
  AttentionOutput output;
  AttentionState states[Capacity];
};

template <typename Element, int Capacity>
__global__ void __launch_bounds__(kWarpsPerCta * 32) merge_states_kernel(const __grid_constant__ MergeKernelParams<Capacity> p) {
  static_assert(Capacity <= 32, "one lane holds one state's LSE and weight");
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (row >= p.rows) return;
  const int lane = threadIdx.x % 32;
  const int head = static_cast<int>(row % p.h);
  const int token = static_cast<int>((row / p.h) % p.s_q);
  const int64_t batch = row / (static_cast<int64_t>(p.h) * p.s_q);
  const int n = p.num_states;

  // The shared math marks a piece without keys with -inf; hmla's outputs mark it with +inf.
  const auto keyed_lse = [&](int s) {
    const AttentionState& st = p.states[s];
    const float v = st.lse[batch * st.lse_batch_stride + head * st.lse_head_stride + token * st.lse_token_stride];
    return v == INFINITY ? -INFINITY : v;
  };
  const float lane_lse = lane < n ? keyed_lse(lane) : -INFINITY;
  bool any;
  const float lse = dev::merged_lse(lane_lse, keyed_lse, n, lane, any);
  const float my_weight = lane < n ? dev::piece_weight(lane_lse, lse, any) : 0.f;
  // States with a key (a NaN LSE counts: it must reach the output). The others are never read, so
  // an empty state's out may hold anything.
  const unsigned keyed = __ballot_sync(0xffffffffu, lane < n && lane_lse != -INFINITY);

  const AttentionOutput& o = p.output;
  Element* dst = static_cast<Element*>(o.out) + batch * o.out_batch_stride + token * o.out_token_stride +
                 head * o.out_head_stride;
  for (int pass = 0; pass < p.d_v; pass += kChunkCols * kChunksPerPass) {
    float acc[kChunksPerPass][kLaneElems];
#pragma unroll
    for (int c = 0; c < kChunksPerPass; ++c)
#pragma unroll
      for (int j = 0; j < kLaneElems; ++j) acc[c][j] = 0.f;
    for (int s0 = 0; s0 < n; s0 += kStatesPerStep) {
      uint4 raw[kStatesPerStep][kChunksPerPass];
#pragma unroll
      for (int i = 0; i < kStatesPerStep; ++i) {
        const int s = s0 + i;
        if (s >= n || !((keyed >> s) & 1u)) continue;
        const AttentionState& st = p.states[s];
        const Element* src = static_cast<const Element*>(st.out) + batch * st.out_batch_stride +
                             token * st.out_token_stride + head * st.out_head_stride;
#pragma unroll
        for (int c = 0; c < kChunksPerPass; ++c) {
          const int col = pass + c * kChunkCols + lane * kLaneElems;
          if (col < p.d_v) raw[i][c] = *reinterpret_cast<const uint4*>(src + col);
        }
      }
#pragma unroll
      for (int i = 0; i < kStatesPerStep; ++i) {
        const int s = s0 + i;
        if (s >= n || !((keyed >> s) & 1u)) continue;
        const float w = __shfl_sync(0xffffffffu, my_weight, s);
#pragma unroll
        for (int c = 0; c < kChunksPerPass; ++c) {
          if (pass + c * kChunkCols + lane * kLaneElems >= p.d_v) continue;
          float v[kLaneElems];
          dev::unpack8<Element>(raw[i][c], v);
#pragma unroll
          for (int j = 0; j < kLaneElems; ++j) acc[c][j] += w * v[j];
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kChunksPerPass; ++c) {
      const int col = pass + c * kChunkCols + lane * kLaneElems;
      if (col >= p.d_v) continue;
      dev::store4<Element>(dst + col, acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
      dev::store4<Element>(dst + col + 4, acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
    }
  }
  if (lane == 0 && o.lse != nullptr)
    o.lse[batch * o.lse_batch_stride + head * o.lse_head_stride + token * o.lse_token_stride] = lse;
}

template <typename Element, int Capacity>
void launch_with_capacity(const MergeAttentionParams& params, cudaStream_t stream) {
  MergeKernelParams<Capacity> kp{};
  kp.num_states = params.num_states;
  kp.s_q = params.s_q;
  kp.h = params.h;
  kp.d_v = params.d_v;
  kp.rows = static_cast<int64_t>(params.batch) * params.s_q * params.h;
  kp.output = params.output;
  for (int s = 0; s < params.num_states; ++s) kp.states[s] = params.states[s];
  const int64_t ctas = (kp.rows + kWarpsPerCta - 1) / kWarpsPerCta;
  merge_states_kernel<Element, Capacity><<<static_cast<unsigned>(ctas), kWarpsPerCta * 32, 0, stream>>>(kp);
  HMLA_CUDA_CHECK(cudaGetLastError());
}

template <typename Element>
void launch_for_element(const MergeAttentionParams& params, cudaStream_t stream) {
  if (params.num_states <= 2) return launch_with_capacity<Element, 2>(params, stream);
  if (params.num_states <= 8) return launch_with_capacity<Element, 8>(params, stream);
  launch_with_capacity<Element, kMaxMergeStates>(params, stream);
}

}  // namespace

void launch_merge_states(const MergeAttentionParams& params, cudaStream_t stream) {
  switch (params.dtype) {
    case DType::kBF16: launch_for_element<__nv_bfloat16>(params, stream); break;
    case DType::kFP16: launch_for_element<__half>(params, stream); break;
  }
}

}  // namespace hmla::detail
