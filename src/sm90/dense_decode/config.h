// Tile shapes, warp roles and shared-memory plan of the sm90 dense decode kernel (docs/DENSE_DECODE.md).
//
// One CTA = one (work range, kv head, query tile of 64 rows), two warpgroups and no producer warp:
// K tiles of 64 tokens come in pairs, the even tile in buffer 0 and the odd one in buffer 1.
// Warpgroup 0 scores even tiles and owns output columns [0, 256); warpgroup 1 scores odd tiles and
// owns [256, 512). Each warpgroup multiplies its own P from registers and the other's P from shared
// memory ("seesaw"), so one warpgroup's softmax always runs beside the other's tensor-core work.
// Each 64-column chunk of a K buffer has its own TMA barrier, and each half of a buffer is reloaded
// by the one warpgroup that reads it last, as soon as it is done with it.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm90.hpp>

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
  static constexpr int kChunks = kHeadDim / kChunkCols;          // 9
  static constexpr int kChunkElems = kBlockN * kChunkCols;       // one 8 KB chunk
  static constexpr int kVHalfChunks = kHeadDimV / 2 / kChunkCols;  // 4 chunks per output half
  static constexpr int kRopeChunk = kChunks - 1;                 // 8: read by S only
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = 128 * kWarpgroups;

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  // [chunk of 64 columns][row][64 columns, swizzled]: exactly what a TMA box of 64 x rows writes.
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutChunk = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kChunkCols>>{}));
  // One output half of V^T as a view of 4 chunks of a K tile: (256 columns, token), token-contiguous
  // inside each chunk, which wgmma reads as an MN-major B operand.
  using SmemLayoutVtHalf = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDimV / 2>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));

  // S = Q K^T, one 64-column chunk at a time; chunks 0..7 with Q from shared memory, chunk 8 with Q
  // from registers (its shared memory holds the odd tile's P).
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kChunkCols>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  using MmaSRegQ = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kChunkCols>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  // O_half += P V_half: P from registers (own tile) or from shared memory (the other warpgroup's).
  using MmaORegP = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimV / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  using MmaOSmemP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimV / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));

  struct SharedStorage {
    alignas(1024) Element q[kBlockM * kHeadDim];  // chunk 8 doubles as P of the odd tile
    alignas(1024) Element k[2][kBlockN * kHeadDim];
    alignas(1024) Element p_even[kBlockM * kBlockN];
    float max_even[kBlockM];  // running max after the even tile (log2 domain), by warpgroup 0
    float max_odd[kBlockM];   // running max after the odd tile, by warpgroup 1
    float row_sum[2][kWarpgroups][kBlockM];  // [request parity][warpgroup][row]
    uint64_t q_full;
    uint64_t k_full[2][kChunks];
  };
  // The dynamic shared-memory base is only 16-byte aligned; the kernel rounds it up to 1024.
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB per CTA of sm_90");
};

}  // namespace hmla::sm90::dense_decode
