// Tile shapes, warp roles and shared-memory plan of the sm90 dense decode kernel (docs/DENSE_DECODE.md).
//
// One CTA = one (work range, kv head, query tile of 64 rows). Warpgroup 0 is the producer: one
// thread issues TMA loads of Q (once per request) and of 64-token K tiles (two stages). Warpgroups
// 1 and 2 are consumers that take turns on S: K tile g is scored by consumer g % 2 (S = Q K^T, the
// online softmax, P written into the tile's RoPE columns, which no later step reads), while both
// consumers accumulate their half (256 columns) of O = P V for every tile. The scoring warpgroup of
// tile g + 1 works while the other one's P V of tile g keeps the tensor cores busy.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90.hpp>

#include <cstdint>

namespace hmla::sm90::dense_decode {

using namespace cute;

template <typename Element_>
struct Config {
  using Element = Element_;  // cute::bfloat16_t or cute::half_t
  static constexpr int kBlockM = 64;     // query rows per tile (one wgmma M)
  static constexpr int kBlockN = 64;     // cached tokens per K tile
  static constexpr int kHeadDim = 576;   // d_qk
  static constexpr int kHeadDimV = 512;  // d_v: the first 512 columns of K
  static constexpr int kChunkCols = 64;  // 128-byte swizzle span = one TMA box width
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kStages = 2;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  // [chunk of 64 columns][row][64 columns, swizzled]: exactly what a TMA box of 64 x rows writes.
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // V^T as a view of the K tile: (d_v, token), token-contiguous inside each 64-column chunk,
  // which wgmma reads as an MN-major B operand.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));

  // S = Q K^T for a whole 64-token tile, by one consumer warpgroup.
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  // The last kQRegChunks 64-column chunks of Q are held in registers (the A operand of an RS
  // wgmma): S is bound by shared-memory reads (64 x 16 of Q and 64 x 16 of K per wgmma), and each
  // chunk in registers removes 8 KB of the 144 KB S reads per tile for 16 registers per thread
  // (two chunks spill at 232 registers).
  static constexpr int kQRegChunks = 1;
  static constexpr int kQSmemChunks = kChunks - kQRegChunks;
  using MmaSr = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  // O += P V: each consumer warpgroup owns 256 of the 512 output columns.
  using MmaO = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockM>, Int<kHeadDimV / kConsumerWarpgroups>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kConsumerWarpgroups>, _1>>{}));

  // The scorer publishes P in kPParts parts of consecutive keys, each behind its own barrier, and
  // both consumers issue P V on a part as soon as it is published: the tensor pipe then works
  // through the softmax (part q is exponentiated while P V of part q - 1 runs) instead of idling
  // from S to the end of the softmax, which with S and P V is the tile's critical path.
  // Two parts of 32 keys: b = 32 h_q 128 measured 133.3 -> 129.5 us. A first part of 16 or
  // 48 keys, or four parts of 16, measured slower (docs/PERF.md, history).
  static constexpr int kPParts = 2;
  static_assert(kBlockN % (16 * kPParts) == 0 && kPParts <= 4, "P parts are whole wgmma k-steps");

  // P of tile g lives in the tile's last 64 columns (RoPE: read by S only, never by P V).
  static constexpr int kPChunk = kChunks - 1;
  static_assert(kPChunk * kChunkCols >= kHeadDimV, "P must not overlap V");

  struct SharedStorage {
    alignas(1024) Element q[kBlockM * kHeadDim];
    alignas(1024) Element k[kStages][kBlockN * kHeadDim];
    // Softmax statistics of tile g, from its scoring warpgroup to the other (double buffered).
    float row_scale[kStages][kBlockM];  // exp2(old max - new max)
    float row_max[kStages][kBlockM];    // new running max (log2 domain)
    // Each lane's share of the row sums at a request's end, per writing warpgroup; two slots
    // alternating between requests.
    alignas(16) float row_sum_share[2][kConsumerWarpgroups][kBlockM][4];
    uint64_t q_full;
    uint64_t q_empty;
    uint64_t k_full[kStages];
    uint64_t k_empty[kStages];
  };
  // The dynamic shared-memory base is only 16-byte aligned; the kernel rounds it up to 1024.
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB per CTA of sm_90");
};

// The CUDA type of an element type, for the kernel's stores and the combine's instantiation.
template <typename Element>
struct NativeOf;
template <>
struct NativeOf<cute::bfloat16_t> {
  using type = __nv_bfloat16;
  using pair = __nv_bfloat162;
  static __device__ __forceinline__ pair make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <>
struct NativeOf<cute::half_t> {
  using type = __half;
  using pair = __half2;
  static __device__ __forceinline__ pair make(float a, float b) { return __floats2half2_rn(a, b); }
};

}  // namespace hmla::sm90::dense_decode
