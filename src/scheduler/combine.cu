#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "common/cuda_check.h"
#include "common/device_primitives.cuh"
#include "common/launch.h"
#include "scheduler/decode_scheduler.h"
#include "scheduler/merge_math.cuh"

namespace hmla::detail {
namespace {

using dev::load4;
using dev::merged_lse;
using dev::piece_weight;
using dev::store4;
using dev::unpack8;

constexpr int kCombineWarps = 4;  // one query row per CTA, 4 columns per thread: small batches spread wide
// The CTA-per-row kernel splits a row's pieces over this many groups of kCombineWarps warps: four
// times the loads in flight per row, and at most 4 CTAs (rows) per SM. Its CTAs start on the SMs
// the attention kernel left idle or frees first; with 128 threads up to 16 rows piled onto each of
// those (b = 1, h_q 128: 128 rows of 64 pieces, 25.1 -> 30.2 us once the grid held only real rows;
// 23.1 us with four groups; docs/PERF.md).
constexpr int kCombineGroups = 4;
constexpr int kMaxCombinePieces = 1024;  // pieces of one request: at most one per part (<= SMs)
constexpr int kDv = 512;
constexpr int kRowWarpsPerCta = 8;  // the warp-per-row kernel: 8 rows per CTA
// From this many rows to merge (an upper bound the host knows), one warp per row: 32x fewer CTAs,
// all in the first wave. Below it, one CTA per row keeps more loads in flight per row, which rows
// of many pieces (small batches) need (measured with fp32 partials: b = 32 h_q 128, 4096 rows of 2-3
// pieces, 144.5 -> 142.0 us; b = 1, 128 rows of 43 pieces, 27.8 -> 38 us with a warp per row).
constexpr long long kWarpPerRowFrom = 2048;

// Where request `req`'s row (token of its tile, head) goes in out and lse.
struct OutputRow {
  int64_t out;
  int64_t lse;
};
__device__ __forceinline__ OutputRow output_row(const CombineParams& p, int req, int token, int head) {
  const int64_t b = req / p.tokens_per_batch;
  const int64_t t = req % p.tokens_per_batch + token;
  return OutputRow{b * p.out_batch_stride + t * p.out_token_stride + head * p.out_head_stride,
                   b * p.lse_batch_stride + head * p.lse_head_stride + t};
}

// The attention sink's factor on a merged row; a row with no key (lse +inf) is 0 already.
__device__ __forceinline__ float sink_factor(const float* attn_sink, int head, float lse) {
  if (attn_sink == nullptr || lse == INFINITY) return 1.f;
  return 1.f / (1.f + __expf(attn_sink[head] - lse));
}

// A CTA with nothing to merge. The spare CTAs retire at once, but the grid must not complete before
// the attention kernel it follows: a kernel launched after the combine with programmatic dependent
// launch (an engine's next kernel, or the next decode call) waits for this grid alone, and with no
// split request every CTA would retire without waiting for the attention, letting that kernel read
// out and lse while the attention still writes them (measured: the next call's waits returned
// ~110 us before the attention ended). So the grid's first CTA waits for it before retiring.
__device__ __forceinline__ void retire_spare_cta() {
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) dev::pdl_wait_for_prerequisites();
}

// Grid: (split request, kv head, query row of that head: token-major). The number of split
// requests is known only on the device; only real query rows get a CTA (tiles padded to 64 rows
// would launch 4x more CTAs for h_q = 16, and those idle CTAs cost more than the merge itself).
// One warp turns the pieces' LSEs into weights, then each thread merges 4 columns of every
// kCombineGroups-th piece so the loads stay coalesced, and the groups' sums are added in a fixed
// order (deterministic).
//
// The split list comes from the plan, which finished before the attention kernel started (that
// launch does not overlap its predecessor), so it is read before waiting for the attention kernel:
// CTAs without a split request retire at once (retire_spare_cta), and the others know their row's
// request, pieces and slots before the wait.
template <typename Element>
__global__ void __launch_bounds__(kCombineWarps * 32 * kCombineGroups) combine_kernel(CombineParams p) {
  const int count = p.split_list[0];
  if (static_cast<int>(blockIdx.x) >= count) {
    retire_spare_cta();
    return;
  }
  // Which request, and its pieces, are plan data too: read before the wait, off the merge's chain.
  const int req = p.split_list[1 + blockIdx.x];
  const int n = p.req_num_splits[req];
  const int base = p.req_split_base[req];
  dev::pdl_wait_for_prerequisites();
  const int kv = blockIdx.y;
  const int token = blockIdx.z / p.tiling.heads_per_kv;
  const int head_in_kv = blockIdx.z % p.tiling.heads_per_kv;
  // The tile and tile row that hold (token, head_in_kv): the inverse of RowTiling::row.
  const int m = (token / p.tiling.tokens_per_tile) * p.tiling.head_tiles + head_in_kv / kTileRows;
  const int r = (token % p.tiling.tokens_per_tile) * p.tiling.heads_per_tile + head_in_kv % kTileRows;
  const int lane = threadIdx.x % 32;

  const size_t rows_per_slot = static_cast<size_t>(p.h_kv) * p.tiling.num_m_blocks * kTileRows;
  const size_t row = (static_cast<size_t>(kv) * p.tiling.num_m_blocks + m) * kTileRows + r;
  const float* lse_of = p.lse_accum + static_cast<size_t>(base) * rows_per_slot + row;

  // The pieces' weights exp(lse_s - lse) go to shared memory once (one warp), so the merge loop
  // below has no dependent global load between its o_accum loads, of which 8 per thread are in
  // flight. (Loading each thread's first piece beside the weights took 8 more registers: b = 8
  // then ran three CTAs per SM instead of four, and held at four, fewer loads stayed in flight for
  // rows of many pieces; docs/PERF.md.)
  __shared__ float weight[kMaxCombinePieces];
  __shared__ float row_lse;
  if (threadIdx.x < 32) {
    const float lane_lse = lane < n ? lse_of[lane * rows_per_slot] : -INFINITY;
    const auto piece_lse = [&](int s) { return lse_of[s * rows_per_slot]; };
    bool any;
    const float lse = merged_lse(lane_lse, piece_lse, n, lane, any);
    if (lane < n) weight[lane] = piece_weight(lane_lse, lse, any);
    for (int s = lane + 32; s < n; s += 32) weight[s] = piece_weight(piece_lse(s), lse, any);
    if (lane == 0) row_lse = lse;
  }
  __syncthreads();
  const float lse = row_lse;

  constexpr int kGroupThreads = kCombineWarps * 32;
  const int group = threadIdx.x / kGroupThreads;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int col = (threadIdx.x % kGroupThreads) * 4;
  if (lse != INFINITY && col < p.d_v) {
    const Element* src =
        static_cast<const Element*>(p.o_accum) + (static_cast<size_t>(base) * rows_per_slot + row) * p.d_v + col;
    const size_t slot_stride = rows_per_slot * p.d_v;
#pragma unroll 8
    for (int s = group; s < n; s += kCombineGroups) {
      const float w = weight[s];
      const float4 v = load4<Element>(src + s * slot_stride);
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
  }
  __shared__ float4 group_acc[kCombineGroups - 1][kGroupThreads];
  if (group > 0) group_acc[group - 1][threadIdx.x % kGroupThreads] = acc;
  __syncthreads();
  if (group > 0) return;
#pragma unroll
  for (int g = 0; g < kCombineGroups - 1; ++g) {
    const float4 v = group_acc[g][threadIdx.x];
    acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
  }
  const int head = kv * p.tiling.heads_per_kv + head_in_kv;
  const float sink = sink_factor(p.attn_sink, head, lse);
  acc.x *= sink; acc.y *= sink; acc.z *= sink; acc.w *= sink;
  const OutputRow o = output_row(p, req, token, head);
  if (col < p.d_v) store4<Element>(static_cast<Element*>(p.out) + o.out + col, acc.x, acc.y, acc.z, acc.w);
  if (threadIdx.x == 0) p.lse[o.lse] = lse;
}

// One warp per (split request, kv head, query row of that head), for batches with many rows to
// merge. The grid is sized for the most split requests there can be, like the kernel above, with a
// warp instead of a CTA per row, and covers them all (a grid-stride loop would cost the registers
// that let four CTAs share an SM). Lane l merges columns 8 l .. 8 l + 7 and 256 + 8 l .. 256 + 8 l + 7.
// After the wait for the attention kernel a row costs one round trip to L2: its slots (plan data)
// are located before the wait, and the first two pieces' partial rows load beside the LSEs.
// Four CTAs per SM (at most 64 registers): b = 32, h_q 128 launches 512 CTAs, one wave.
template <typename Element>
__global__ void __launch_bounds__(kRowWarpsPerCta * 32, 4) combine_warp_per_row_kernel(CombineParams p) {
  constexpr int kPrefetched = 2;  // pieces whose rows load beside the LSEs (most rows here have 2-3)
  const int rows_per_req = p.h_kv * p.tiling.s_q * p.tiling.heads_per_kv;
  const int warp = blockIdx.x * kRowWarpsPerCta + threadIdx.x / 32;
  if (warp >= p.split_list[0] * rows_per_req) {
    retire_spare_cta();
    return;
  }
  const int lane = threadIdx.x % 32;
  const size_t rows_per_slot = static_cast<size_t>(p.h_kv) * p.tiling.num_m_blocks * kTileRows;
  const size_t slot_stride = rows_per_slot * kDv;
  const int req = p.split_list[1 + warp / rows_per_req];
  const int in_req = warp % rows_per_req;
  const int kv = in_req / (p.tiling.s_q * p.tiling.heads_per_kv);
  const int token = (in_req / p.tiling.heads_per_kv) % p.tiling.s_q;
  const int head_in_kv = in_req % p.tiling.heads_per_kv;
  const int m = (token / p.tiling.tokens_per_tile) * p.tiling.head_tiles + head_in_kv / kTileRows;
  const int r = (token % p.tiling.tokens_per_tile) * p.tiling.heads_per_tile + head_in_kv % kTileRows;
  const int n = p.req_num_splits[req];
  const size_t row = static_cast<size_t>(p.req_split_base[req]) * rows_per_slot +
                     (static_cast<size_t>(kv) * p.tiling.num_m_blocks + m) * kTileRows + r;
  const float* lse_of = p.lse_accum + row;
  const Element* src = static_cast<const Element*>(p.o_accum) + row * kDv + lane * 8;
  dev::pdl_wait_for_prerequisites();

  const float lane_lse = lane < n ? lse_of[lane * rows_per_slot] : -INFINITY;
  uint4 first[kPrefetched][2];
#pragma unroll
  for (int q = 0; q < kPrefetched; ++q)
#pragma unroll
    for (int a = 0; a < 2; ++a)
      if (q < n) first[q][a] = *reinterpret_cast<const uint4*>(src + q * slot_stride + a * (kDv / 2));

  const auto piece_lse = [&](int s) { return lse_of[s * rows_per_slot]; };
  bool any;
  const float lse = merged_lse(lane_lse, piece_lse, n, lane, any);
  float acc[2][8];
  if (lse != INFINITY) {
    // Lane l holds the weight of piece s0 + l; shuffles broadcast it, so no dependent global load
    // sits between the partial-row loads. The first piece's product starts the sums (a split
    // request has n >= 2), which frees its registers before the second is unpacked.
    float my_weight = lane < n ? piece_weight(lane_lse, lse, /*any=*/true) : 0.f;  // lse finite: a key
#pragma unroll
    for (int q = 0; q < kPrefetched; ++q) {
      if (q >= n) break;
      const float w = __shfl_sync(0xffffffffu, my_weight, q);
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        float v[8];
        unpack8<Element>(first[q][a], v);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[a][j] = q == 0 ? w * v[j] : acc[a][j] + w * v[j];
      }
    }
    for (int s0 = 0; s0 < n; s0 += 32) {
      if (s0 > 0) my_weight = s0 + lane < n ? piece_weight(piece_lse(s0 + lane), lse, true) : 0.f;
      const int chunk = min(32, n - s0);
#pragma unroll 4
      for (int i = s0 == 0 ? kPrefetched : 0; i < chunk; ++i) {
        const float w = __shfl_sync(0xffffffffu, my_weight, i);
        const Element* piece = src + static_cast<size_t>(s0 + i) * slot_stride;
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          float v[8];
          unpack8<Element>(*reinterpret_cast<const uint4*>(piece + a * (kDv / 2)), v);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[a][j] += w * v[j];
        }
      }
    }
  } else {
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[a][j] = 0.f;
  }
  const int head = kv * p.tiling.heads_per_kv + head_in_kv;
  const float sink = sink_factor(p.attn_sink, head, lse);
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[a][j] *= sink;
  const OutputRow o = output_row(p, req, token, head);
  Element* dst = static_cast<Element*>(p.out) + o.out + lane * 8;
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    store4<Element>(dst + a * (kDv / 2), acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
    store4<Element>(dst + a * (kDv / 2) + 4, acc[a][4], acc[a][5], acc[a][6], acc[a][7]);
  }
  if (lane == 0) p.lse[o.lse] = lse;
}

}  // namespace

CombineParams combine_params(const DecodeSchedule& schedule, int requests, int tokens_per_batch, int h_kv,
                             const RowTiling& tiling, const OutputView& output, const float* attn_sink) {
  CombineParams cp{};
  cp.batch = requests;
  cp.tokens_per_batch = tokens_per_batch;
  cp.h_kv = h_kv;
  cp.d_v = kDv;
  cp.num_sm_parts = schedule.num_sm_parts;
  cp.tiling = tiling;
  cp.req_num_splits = schedule.num_splits;
  cp.req_split_base = schedule.split_base;
  cp.split_list = schedule.split_list;
  cp.lse_accum = schedule.lse_accum;
  cp.o_accum = schedule.o_accum;
  cp.out = output.out;
  cp.out_batch_stride = output.out_batch_stride;
  cp.out_token_stride = output.out_token_stride;
  cp.out_head_stride = output.out_head_stride;
  cp.lse = output.lse;
  cp.lse_batch_stride = output.lse_batch_stride;
  cp.lse_head_stride = output.lse_head_stride;
  cp.attn_sink = attn_sink;
  return cp;
}

template <typename Element>
void launch_combine(const CombineParams& params, cudaStream_t stream) {
  // A request has at most one piece per part; the merge keeps one weight per piece in shared memory.
  if (params.num_sm_parts > kMaxCombinePieces)
    throw CudaError("hmla: " + std::to_string(params.num_sm_parts) + " SM parts exceed the combine's " +
                    std::to_string(kMaxCombinePieces) + " pieces per request");
  if (params.d_v != kDv) throw CudaError("hmla: the combine supports d_v = 512, got " + std::to_string(params.d_v));
  const int rows_per_req = params.h_kv * params.tiling.s_q * params.tiling.heads_per_kv;
  // x: one slot per split request there can be, min(batch, parts): only the device knows how many
  // there are. The spare CTAs retire at once, but not while the attention kernel runs (its CTAs
  // hold a whole SM's registers), so each costs a CTA launch after it: with a slot per part, b = 1
  // launched 66 x 128 CTAs for 128 rows.
  const int max_split_requests = params.batch < params.num_sm_parts ? params.batch : params.num_sm_parts;
  const long long max_rows = static_cast<long long>(max_split_requests) * rows_per_req;  // the most to merge
  if (max_rows >= kWarpPerRowFrom) {
    const long long ctas = (max_rows + kRowWarpsPerCta - 1) / kRowWarpsPerCta;
    launch_after_prerequisites(combine_warp_per_row_kernel<Element>, dim3(static_cast<unsigned>(ctas)),
                               dim3(kRowWarpsPerCta * 32), 0, stream, params);
    return;
  }
  launch_after_prerequisites(combine_kernel<Element>,
                             dim3(max_split_requests, params.h_kv, params.tiling.s_q * params.tiling.heads_per_kv),
                             dim3(kCombineWarps * 32 * kCombineGroups), 0, stream, params);
}

template void launch_combine<__nv_bfloat16>(const CombineParams&, cudaStream_t);
template void launch_combine<__half>(const CombineParams&, cudaStream_t);

}  // namespace hmla::detail
