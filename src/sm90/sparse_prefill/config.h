// Tile shapes, warp roles and shared-memory plan of the sm90 sparse prefill kernel (docs/SPARSE_PREFILL.md).
//
// A work item is one (query token, tile of 64 heads); the grid is persistent (one CTA per SM, items
// round-robin). The item's top-k list is walked in pairs of 64-token K tiles: tile 2j into K
// buffer 0, tile 2j + 1 into buffer 1.
//   warpgroup 0: the producer. cp.async copies the bf16 rows named by the indices straight into the
//     128-byte-swizzled K buffers (an invalid index's row is zero-filled, never read). Each buffer is
//     filled and released in two halves: columns [0, 256) (the left V half) and the rest (the right
//     V half and, at d_qk 576, the RoPE chunk).
//   warpgroups 1 and 2: the consumers "A" and "B". A scores tile 2j, B tile 2j + 1, so one's softmax
//     runs while the other's S is on the tensor cores. A keeps O's columns [0, 256), B [256, 512).
//     Each multiplies its own tile's P from registers (RS wgmma) and the other's P from shared
//     memory (SS wgmma) into its half of O. Both use one running max per row: A publishes its
//     tile's, B folds its own into it, and A rescales its P to that max before B reads it.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90.hpp>

#include <cstdint>

namespace hmla::sm90::sparse_prefill {

using namespace cute;

template <int kHeadDimT>
struct SeesawConfig {
  using Element = cute::bfloat16_t;
  static constexpr bool kPrefill = true;  // for the decode kernel's shared output writer
  // Its stores in fours of blocks, 16 bytes per thread: pairs spilled 8 bytes here and were level
  // to 2 % slower than fours (H100, docs/PERF.md "The epilogue's stores").
  static constexpr int kStoreLanes = 4;
  static constexpr int kBlockM = 64;      // heads per item (one wgmma M)
  static constexpr int kQRows = kBlockM;
  static constexpr int kBlockN = 64;      // tokens per K tile
  static constexpr int kHeadDim = kHeadDimT;
  static constexpr int kHeadDimV = 512;
  static constexpr int kChunkCols = 64;   // 128-byte swizzle span
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kChunkElems = kBlockN * kChunkCols;
  static constexpr int kLeftChunks = kHeadDimV / 2 / kChunkCols;  // the left V half: 4 chunks
  static constexpr int kThreads = 384;
  static constexpr int kProducerThreads = 128;
  // 384 threads launch at 168 registers each; setmaxnreg moves them between warpgroups. The producer
  // keeps eight row addresses and its loop; a consumer keeps its half of O (128), S in float32 (32),
  // P in bf16 (16) and the statistics.
  static constexpr int kLaunchRegs = 168;
  static constexpr int kProducerRegs = 72;
  static constexpr int kConsumerRegs = 216;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kLaunchRegs, "setmaxnreg: more registers than the CTA has");
  // At d_qk 576 A's P lives in its K buffer's RoPE chunk, which only A's S reads: once that S has
  // retired the chunk is free, and buffer 0's right half is released after B's product with that P.
  // Shared memory then holds Q, two K buffers and one P tile (224 KB of the 227). At d_qk 512 there is
  // no such chunk, and a P buffer of its own fits.
  static constexpr bool kPInRope = kHeadDim > kHeadDimV;

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // V^T over one V half (256 columns = 4 chunks) of a K buffer: (d, token), an MN-major B operand.
  using SmemLayoutKHalf = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimV / 2>>{}));
  using SmemLayoutVtHalf = decltype(composition(
      SmemLayoutKHalf{}, make_layout(Shape<Int<kHeadDimV / 2>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));

  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  // O_half += P V_half: the own tile's P from registers, the other's from shared memory.
  using MmaPvRegs = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimV / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  using MmaPvSmem = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimV / 2>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));

  struct SharedStorage {
    alignas(1024) Element q[kBlockM * kHeadDim];
    alignas(1024) Element k[2][kBlockN * kHeadDim];
    // p[1]: B's P, read by A; p[0]: A's P at d_qk 512 (at 576 it is k[0]'s RoPE chunk).
    alignas(1024) Element p[kPInRope ? 1 : 2][kBlockM * kBlockN];
    float row_max[kBlockM];        // the pair's running max: A's, then B's (log2 domain)
    float row_sum[2][2][kBlockM];  // [item parity][consumer]: each consumer's share of the denominators
    uint64_t valid[2][4];          // [buffer][producer warp]: bit t = token t of the tile is a key
    uint64_t q_full;
    uint64_t k_ready[2][2];  // [buffer][half]
    uint64_t k_free[2][2];
    uint64_t a_max;    // A's tile max published (A's 128 threads)
    uint64_t b_max;    // the pair's max published (B's)
    uint64_t p_ready[2];  // [consumer]: its P is in shared memory
    int merger;           // this CTA's piece was its item's last: it merges (kernel.cuh, merge_pieces)
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB per CTA of sm_90");
};

}  // namespace hmla::sm90::sparse_prefill
