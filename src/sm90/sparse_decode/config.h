// Tile shapes, warp roles and shared-memory plan of the sm90 token-sparse decode kernel
// (docs/SPARSE_DECODE.md).
//
// One CTA = one (work range, query tile of 64 heads). A request is one query token; its keys are
// the tokens its index lists name, gathered 64 at a time into a bf16 K tile.
//   warpgroup 0: producers. Two groups of two warps fill the two K stages in turn (group g always
//     fills stage g): each thread gathers 16-byte pieces of FP8 rows, dequantises them on the CUDA
//     cores and stores bf16 into the 128-byte-swizzled layout wgmma reads. Two independent groups
//     keep two tiles' gathers in flight, so a tile's index load and row loads (two dependent trips
//     to memory) overlap the other stage's math.
//   warpgroup 1: the scorer. S = Q K^T over d_qk, the online softmax, P to shared memory, then
//     P V for output columns [0, 256). It also loads each request's Q with TMA.
//   warpgroup 2: P V for output columns [256, 512).
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90.hpp>

#include <cstdint>

#include "common/fp8_dequant.cuh"
#include "hmla/params.h"

namespace hmla::sm90::sparse_decode {

using namespace cute;

// Where one token's bytes sit in its page, per FP8 layout (docs/API.md, "FP8 layout").
template <SparseCacheLayout kLayout>
struct CacheFormat;

template <>
struct CacheFormat<SparseCacheLayout::kV32> {
  static constexpr int kHeadDim = 576;
  static constexpr int kNope = 512;          // e4m3 values
  static constexpr int kTokenStride = 656;   // token t at page + t * 656
  static constexpr int kRopeOffset = 528;    // after the NoPE values and 4 float32 scales
  static constexpr int kScalePieces = 8;     // 16-value pieces per scale (128 values)
  static constexpr int kDataBytes = 656;     // a token's bytes from its start, scales included
  static constexpr bool kScalesApart = false;
  // Byte offset of token `offset`'s scales from its page: inside the token, after the NoPE values.
  __host__ __device__ static int64_t scale_offset(int /*page_size*/, int offset) {
    return static_cast<int64_t>(offset) * kTokenStride + kNope;
  }
  // The scale of NoPE piece `piece` (values [16 piece, 16 piece + 16)).
  __device__ static float load_scale(const uint8_t* scales, int piece) {
    return __ldg(reinterpret_cast<const float*>(scales) + piece / kScalePieces);
  }
};

template <>
struct CacheFormat<SparseCacheLayout::kModel1> {
  static constexpr int kHeadDim = 512;
  static constexpr int kNope = 448;
  static constexpr int kTokenStride = 576;   // token t's data at page + t * 576
  static constexpr int kRopeOffset = 448;
  static constexpr int kScalePieces = 4;     // 64 values per UE8M0 scale
  static constexpr int kDataBytes = 576;     // NoPE and RoPE; the scales sit apart
  static constexpr bool kScalesApart = true;
  // The scales of every token follow the page's token data, 8 bytes per token.
  __host__ __device__ static int64_t scale_offset(int page_size, int offset) {
    return static_cast<int64_t>(page_size) * kTokenStride + static_cast<int64_t>(offset) * 8;
  }
  __device__ static float load_scale(const uint8_t* scales, int piece) {
    return dev::ue8m0_to_float(__ldg(scales + piece / kScalePieces));
  }
};

template <SparseCacheLayout kLayout>
struct Config {
  using Format = CacheFormat<kLayout>;
  using Element = cute::bfloat16_t;
  static constexpr int kBlockM = 64;     // heads per tile (one wgmma M)
  static constexpr int kBlockN = 64;     // gathered tokens per K tile
  static constexpr int kHeadDim = Format::kHeadDim;
  static constexpr int kHeadDimV = 512;  // V: the first 512 columns of K
  static constexpr int kChunkCols = 64;  // 128-byte swizzle span
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kStages = 2;
  static constexpr int kProducerGroups = kStages;  // group g fills stage g
  static constexpr int kProducerWarpsPerGroup = 2;
  static constexpr int kTokensPerProducerWarp = kBlockN / kProducerWarpsPerGroup;  // one per lane
  static constexpr int kTokensPerRound = 4;  // tokens per round of loads (two rounds in flight)
  static constexpr int kProducerGroupThreads = 32 * kProducerWarpsPerGroup;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  // setmaxnreg moves registers between warpgroups inside the CTA's launch allocation: 384 threads
  // at the compiled 168 each (65536 / 384 rounded down to a multiple of 8). An increase that the
  // others' decreases do not cover blocks forever.
  static constexpr int kLaunchRegs = 168;
  static constexpr int kProducerRegs = 128;
  static constexpr int kScorerRegs = 208;
  static constexpr int kHelperRegs = kLaunchRegs;
  static_assert(kProducerRegs + kScorerRegs + kHelperRegs <= 3 * kLaunchRegs, "setmaxnreg: more registers than the CTA has");
  static constexpr int kNopePieces = Format::kNope / 16;  // 16-byte e4m3 pieces per token
  static constexpr int kRopePieces = 8;                    // 16-byte bf16 pieces per token
  static_assert(kTokensPerRound * kRopePieces % 32 == 0, "whole RoPE pieces per lane");
  static_assert(kNopePieces <= 32, "one NoPE piece per lane");
  static_assert(Format::kNope + 64 == kHeadDim && Format::kNope % kChunkCols == 0, "RoPE is the last chunk");

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // V^T as a view of the K tile: (d_v, token), which wgmma reads as an MN-major B operand.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));

  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  // O += P V: each of the two consumer warpgroups owns 256 of the 512 output columns.
  using MmaO = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimV / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  struct SharedStorage {
    alignas(1024) Element q[kBlockM * kHeadDim];
    alignas(1024) Element k[kStages][kBlockN * kHeadDim];
    alignas(1024) Element p[kBlockM * kBlockN];
    float row_scale[kBlockM];  // exp2(old max - new max) of the tile P belongs to
    float row_sum[kBlockM];    // a request's softmax denominator, at its last tile
    float row_max[kBlockM];    // and its running max (log2 domain)
    uint32_t valid[kStages][kProducerWarpsPerGroup];  // bit t of word w: token 32 w + t is a key
    uint64_t q_full;
    uint64_t k_full[kStages];
    uint64_t k_empty[kStages];
  };
  // The dynamic shared-memory base is only 16-byte aligned; the kernel rounds it up to 1024.
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB per CTA of sm_90");
};

}  // namespace hmla::sm90::sparse_decode
