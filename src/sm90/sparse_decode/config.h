// Tile shapes, warp roles and shared-memory plan of the sm90 token-sparse decode kernel
// (docs/SPARSE_DECODE.md).
//
// One CTA = one (work range, query tile of 64 heads). A request is one query token; its keys are
// the tokens its index lists name, gathered 64 at a time into an fp16 K tile.
//   warpgroup 0: producers. Each tile is gathered by all four warps, 16 tokens each: a thread
//     loads 16-byte pieces of FP8 rows into registers, dequantises them on the CUDA cores and
//     stores fp16 into the 128-byte-swizzled layout wgmma reads. Every register a store frees is
//     refilled at once with the next tile's piece, so the next tile's loads are in flight during
//     this tile's stores (and the wait for its stage); the indices of the tile after are loaded
//     at the same time and located when the stores are done.
//   warpgroup 1: the scorer. S = Q K^T over d_qk, the online softmax, P to shared memory, then
//     P V for output columns [0, 256). It also loads each request's Q with TMA and converts it to fp16
//     (docs/SPARSE_DECODE.md, "Number formats").
//   warpgroup 2: P V for output columns [256, 512).
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90.hpp>

#include <cstdint>
#include <type_traits>

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
  static constexpr int kScaleWords = 4;      // 4-byte words of a token's scales: 4 float32
  static constexpr bool kScalesApart = false;
  // Byte offset of token `offset`'s scales from its page: inside the token, after the NoPE values.
  __host__ __device__ static int64_t scale_offset(int /*page_size*/, int offset) {
    return static_cast<int64_t>(offset) * kTokenStride + kNope;
  }
  // The scale of NoPE piece `piece` (values [16 piece, 16 piece + 16)): one float per 128 values.
  __device__ static int scale_word_of_piece(int piece) { return piece / 8; }
  // A loaded scale word as what the dequantisation multiplies by (fp8_dequant.cuh): the float's two
  // f16 factors, made once per word by the lane that loaded it, before it is shuffled.
  static constexpr bool kTwoFactors = true;
  __device__ static uint32_t prepare_scale_word(uint32_t word) { return dev::v32_scale_factors(word); }
  __device__ static uint32_t factors_of_piece(uint32_t prepared, int /*piece*/) { return prepared; }
};

template <>
struct CacheFormat<SparseCacheLayout::kModel1> {
  static constexpr int kHeadDim = 512;
  static constexpr int kNope = 448;
  static constexpr int kTokenStride = 576;   // token t's data at page + t * 576
  static constexpr int kRopeOffset = 448;
  static constexpr int kScaleWords = 2;      // 7 UE8M0 bytes, padded to 8
  static constexpr bool kScalesApart = true;
  // The scales of every token follow the page's token data, 8 bytes per token.
  __host__ __device__ static int64_t scale_offset(int page_size, int offset) {
    return static_cast<int64_t>(page_size) * kTokenStride + static_cast<int64_t>(offset) * 8;
  }
  // One UE8M0 byte per 64 values: byte (piece / 4) % 4 of word piece / 16.
  __device__ static int scale_word_of_piece(int piece) { return piece / 16; }
  static constexpr bool kTwoFactors = false;
  __device__ static uint32_t prepare_scale_word(uint32_t word) { return word; }
  __device__ static uint32_t factors_of_piece(uint32_t word, int piece) {
    return dev::ue8m0_factor(word >> (8 * ((piece / 4) % 4)));
  }
};

// Tiles, warp roles and shared memory of the kernel for one FP8 layout.
template <typename FormatT>
struct ConfigT {
  using Format = FormatT;
  static constexpr bool kPrefill = false;  // the shared output writer also serves sparse prefill
  // The output writer's stores of 2 x kStoreLanes columns per thread (store_output): pairs here,
  // 8-byte stores. Fours (16 bytes) spilled 16 bytes in the helper warpgroup and ran 1-3 % slower
  // than pairs on every wide row (H100, docs/PERF.md "The epilogue's stores").
  static constexpr int kStoreLanes = 2;
  // The 16-bit type of Q, K, V and P in shared memory and in the wgmma: the FP8 caches dequantise to
  // fp16 (fp8_dequant.cuh says why) and each request's bf16 Q is converted to fp16 with a power-of-two
  // prescale (docs/SPARSE_DECODE.md, "Number formats").
  using Element = cute::half_t;
  static constexpr int kBlockM = 64;     // heads per tile (one wgmma M)
  static constexpr int kQRows = kBlockM;  // head rows of the Q tile in shared memory
  static constexpr int kBlockN = 64;     // gathered tokens per K tile
  static constexpr int kHeadDim = Format::kHeadDim;
  static constexpr int kHeadDimV = 512;  // V: the first 512 columns of K
  static constexpr int kChunkCols = 64;  // 128-byte swizzle span
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kStages = 2;
  static constexpr int kProducerWarps = 4;
  // A warp's share of a tile, in its registers from its loads to its stores: 16 NoPE pieces,
  // 4 RoPE pieces and 1-2 scale words per lane (~84 registers).
  static constexpr int kTokensPerProducerWarp = kBlockN / kProducerWarps;
  static constexpr int kProducerThreads = 32 * kProducerWarps;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  // setmaxnreg moves registers between warpgroups inside the CTA's launch allocation: 384 threads
  // at the compiled 168 each (65536 / 384 rounded down to a multiple of 8). An increase that the
  // others' decreases do not cover blocks forever.
  static constexpr int kLaunchRegs = 168;
  // The producers hold a tile's loads (~84 registers) and more: at 144, MODEL1's producer spilled a
  // register; the helper keeps 64 x 256 of O (128) and little else, so it gives 8 to them.
  static constexpr int kProducerRegs = 152;
  // S is issued as batches of 4 k-steps (9 for V3.2, 8 for MODEL1), each retired before the next is
  // issued: 5-8 % faster on the wide rows than one batch of all 36 or 32 (H100, docs/PERF.md "S in
  // batches"), although the scorer's S takes longer. S with its Q operand from registers (half
  // the shared-memory reads, the same tensor time) was 2-6 % slower, so what the gaps give the
  // producers is not shared-memory bandwidth; nor is it the tensor pipe's queue (S issued only after
  // the helper's release of the previous stage, in one batch, is as slow as one batch). Batches of 3
  // or 6 are within 0.5 % of 4, of 2 or 8 2-8 % slower.
  static constexpr int kScoreKStepsPerBatch = 4;
  static constexpr int kScorerRegs = 192;
  static constexpr int kHelperRegs = 160;
  static_assert(kProducerRegs + kScorerRegs + kHelperRegs <= 3 * kLaunchRegs, "setmaxnreg: more registers than the CTA has");
  static_assert(kTokensPerProducerWarp <= 32, "one token's addresses per lane");

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
    alignas(16) uint32_t valid[kStages][kProducerWarps];  // bit t of word w: token 16 w + t is a key
    uint32_t q_absmax[8];  // per consumer warp: the largest |q| bits of the request's Q tile
    uint64_t q_full;
    uint64_t q_converted;  // both consumer warpgroups' 256 threads, twice per request
    uint64_t k_full[kStages];
    uint64_t k_empty[kStages];
  };
  // The dynamic shared-memory base is only 16-byte aligned; the kernel rounds it up to 1024.
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB per CTA of sm_90");
};

// The narrow form, for h_q <= 32 (docs/SPARSE_DECODE.md, "Narrow form"): the heads are wgmma's N
// (16 or 32) instead of a 64-row M, so the tensor work is what the heads need, and the whole of O^T
// (512 x kHeads in float32: 64 or 128 registers) fits one warpgroup. That frees a warpgroup for a
// second set of producers: at h_q 16 the kernel is bound by the gather and dequantisation, which the
// wide form runs on one warp per scheduler, latency-bound.
//   warpgroups 0-1: producers, eight warps of 8 tokens each per tile (the wide form's producer loop).
//   warpgroup 2: the consumer. S^T = K Q^T (M = 64 tokens, N = heads), the online softmax per column
//     (a head's max over the tile's tokens meets across the four warps in shared memory), P^T to
//     shared memory, O^T += V^T P^T (M = 512 output columns in eight wgmma rows, N = heads).
template <typename FormatT, int kHeadsT>
struct NarrowConfigT {
  static_assert(kHeadsT == 16 || kHeadsT == 32, "16 or 32 heads per CTA");
  using Format = FormatT;
  static constexpr bool kPrefill = false;
  using Element = cute::half_t;
  static constexpr int kHeads = kHeadsT;  // wgmma N
  static constexpr int kQRows = kHeads;
  static constexpr int kBlockN = 64;      // gathered tokens per K tile: wgmma M of S^T
  static constexpr int kHeadDim = Format::kHeadDim;
  static constexpr int kHeadDimV = 512;
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kStages = 2;
  static constexpr int kProducerWarps = 8;
  static constexpr int kTokensPerProducerWarp = kBlockN / kProducerWarps;
  static constexpr int kProducerThreads = 32 * kProducerWarps;
  static constexpr int kConsumerThreads = 128;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  static constexpr int kLaunchRegs = 168;
  // A producer warp holds 8 tokens of a tile in ~44 registers of loads; the consumer O^T (64 or
  // 128 registers), S^T (8 or 16) and the softmax state. At N 16 the consumer needs few enough that
  // the producers hold two tiles (producer_loop_two_tiles; 160 / 184 registers, no spill); at N 32
  // no split of the registers holds two tiles without spilling (ptxas: 76-108 bytes at 144-152 for
  // the producers), so they hold one.
  static constexpr int kTilesInRegisters = kHeads == 16 ? 2 : 1;
  static constexpr int kScoreKStepsPerBatch = 0;  // S^T as one batch (see ConfigT)
  static constexpr int kProducerRegs = kTilesInRegisters == 2 ? 160 : 128;
  static constexpr int kConsumerRegs = 3 * kLaunchRegs - 2 * kProducerRegs;
  static_assert(kConsumerRegs % 8 == 0 && kConsumerRegs <= 256, "setmaxnreg: a multiple of 8, at most 256");

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kHeads>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // P^T as (head, token), K-major: the B operand of O^T = V^T P^T.
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kHeads>, Int<kBlockN>>{}));
  // V^T as a view of the K tile: (d_v, token), M-major, the A operand of O^T = V^T P^T.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));

  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockN>, Int<kHeads>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  using MmaO = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeads>, Int<kBlockN>>, GMMA::Major::MN,
                           GMMA::Major::K>(),
      Layout<Shape<_1, _1, _1>>{}));

  struct SharedStorage {
    alignas(1024) Element q[kQRows * kHeadDim];
    alignas(1024) Element k[kStages][kBlockN * kHeadDim];
    alignas(1024) Element p[kHeads * kBlockN];
    float warp_max[2][4][kHeads];  // per consumer warp, a head's max over its 16 tokens; by tile parity
    float warp_sum[4][kHeads];     // per consumer warp, a head's softmax denominator share
    alignas(16) uint32_t valid[kStages][kProducerWarps];  // bit t of word w: token 8 w + t is a key
    uint32_t q_absmax[4];
    uint64_t q_full;
    uint64_t q_converted;
    uint64_t k_full[kStages];
    uint64_t k_empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB per CTA of sm_90");
};

template <SparseCacheLayout kLayout, int kHeads>
using NarrowConfig = NarrowConfigT<CacheFormat<kLayout>, kHeads>;

template <SparseCacheLayout kLayout>
using Config = ConfigT<CacheFormat<kLayout>>;

}  // namespace hmla::sm90::sparse_decode
