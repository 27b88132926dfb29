// The sm90 sparse prefill kernel: the "seesaw" schedule of config.h and docs/SPARSE_PREFILL.md.
// Included by the instantiation files (one per d_qk); the host side is launch.cu. It shares with the
// sparse decode kernel its parameters (KernelParams), the Q load, the batched form's row view and the
// output writer.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cmath>

#include "common/device_attributes.h"
#include "common/device_primitives.cuh"
#include "common/launch.h"
#include "scheduler/merge_math.cuh"
#include "sm90/sparse_decode/kernel.cuh"
#include "sm90/sparse_prefill/config.h"
#include "sm90/sparse_prefill/trace.cuh"

namespace hmla::sm90::sparse_prefill {

using sparse_decode::KernelParams;
using sparse_decode::SparseCacheView;

// One work unit: a query token's tile of 64 heads (an item), whole or, in the last round, one piece
// of its pairs of 64-token tiles (launch.h, ItemRounds). Four fields, live in every role's loop: a
// piece's slot and first pair are computed from the unit where they are needed (two more fields
// spilled the consumers' loop state).
struct Item {
  int token, m;
  int keys;   // the item's list length (topk_length or topk)
  int pairs;  // the unit's pairs; the second tile of the list's last pair may hold no key
};

// A piece's partial-result slot (its index among the pieces), or -1 for a whole item.
__device__ __forceinline__ int slot_of(const KernelParams& p, int unit) {
  return p.tail_pieces > 1 && unit >= p.tail_first ? unit - p.tail_first : -1;
}

// The unit's first pair of its item's list: piece j of k takes pairs [pairs j / k, pairs (j + 1) / k).
__device__ __forceinline__ int first_pair_of(const KernelParams& p, int unit, int keys) {
  const int slot = slot_of(p, unit);
  return slot < 0 ? 0 : (keys + 127) / 128 * (slot % p.tail_pieces) / p.tail_pieces;
}

__device__ __forceinline__ Item item_of(const KernelParams& p, int unit) {
  Item it;
  const int slot = slot_of(p, unit);
  const int w = slot < 0 ? unit : p.tail_first + slot / p.tail_pieces;
  it.token = w / p.num_m_blocks;
  it.m = w - it.token * p.num_m_blocks;
  it.keys = p.work.main_keys(it.token);
  const int pairs = (it.keys + 127) / 128;
  it.pairs = slot < 0 ? pairs : pairs * (slot % p.tail_pieces + 1) / p.tail_pieces - first_pair_of(p, unit, it.keys);
  return it;
}

__device__ __forceinline__ int units_of(const KernelParams& p) { return p.units; }

// The unit after w in this CTA's order (one with no key past the last). Every role reads it at the
// top of w's loop body, so that its length's load overlaps w's work.
__device__ __forceinline__ Item next_item_of(const KernelParams& p, int w) {
  const int next = w + static_cast<int>(gridDim.x);
  return next < units_of(p) ? item_of(p, next) : Item{};
}

// The first unit at or after w (stepping by the grid) that has a key, or -1: only those load Q.
__device__ __forceinline__ int next_item_with_keys(const KernelParams& p, int w) {
  for (; w < units_of(p); w += gridDim.x)
    if (item_of(p, w).pairs > 0) return w;
  return -1;
}

// A pointer whose value the compiler cannot see through. The consumers take their wgmma descriptors
// from fixed shared-memory buffers; from a plain pointer the compiler may compute all of them once
// (two per k-step) and keep them live across the loop, which spills.
template <typename T>
__device__ __forceinline__ T* opaque(T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// ------------------------------------------------------------------------------------ producer

// The kv rows that sparse prefill's query token `token` indexes: all of kv in the flat form; in the
// batched form those of its sequence, the i with cu_seqlens_q[i] <= token < cu_seqlens_q[i + 1],
// found by binary search (exact when cu_seqlens_q is non-decreasing). The arrays are device data
// that the host never saw: a token in no sequence gets no row (every index invalid: out 0, lse
// +inf), and the offset and length are clamped into kv, so no value reads outside the arrays or kv.
__device__ __forceinline__ SparseCacheView sequence_rows(const KernelParams& p, int token) {
  SparseCacheView rows = p.cache;
  if (p.num_seqs == 0) return rows;
  int lo = 0, hi = p.num_seqs;  // the last i in [0, num_seqs) with cu_seqlens_q[i] <= token is lo - 1
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (__ldg(p.cu_seqlens_q + mid) <= token)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int seq = lo - 1;
  int64_t offset = 0, len = 0;
  if (seq >= 0 && token < __ldg(p.cu_seqlens_q + seq + 1)) {
    const int64_t o = __ldg(p.seq_kv_offset + seq), l = __ldg(p.seq_kv_len + seq);
    offset = o < 0 ? 0 : (o > rows.num_slots ? rows.num_slots : o);
    len = l < 0 ? 0 : (l > rows.num_slots - offset ? rows.num_slots - offset : l);
  }
  // Invalid tokens zero-fill from rows.data, which must stay an address inside kv: with no row, the
  // first row of kv rather than one past its end.
  if (len == 0) offset = 0;
  rows.data += offset * rows.block_stride_bytes;
  rows.num_slots = len;
  return rows;
}


// A 64-bit L2 policy that keeps kv rows (re-read by other query tokens and the other head tile)
// ahead of the streaming Q and output traffic.
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// 16 bytes global -> shared without registers, with that policy and a 256-byte L2 prefetch (the rest
// of the row's chunk pieces follow); src_bytes 0 zero-fills and reads nothing.
__device__ __forceinline__ void cp_async_16_keep(uint32_t dst, const uint8_t* src, uint32_t src_bytes,
                                                 uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

// Producer thread t copies, of both tiles of a pair, the 16-byte piece t % 8 of every 64-column
// chunk of rows t / 8 + 16 q (q = 0..3): eight threads cover a row's chunk (128 bytes, coalesced), and
// a thread's swizzled column is the same in all of its rows. All 128 threads copy every half-buffer:
// a half's load time is on the path from its release to its next S.
template <typename Cfg>
struct PairCopier {
  static constexpr int kRows = 4;
  const uint8_t* src[2][kRows];  // [tile of the pair][q]: the row's piece (a valid address for a non-key too)
  uint32_t valid;                // bit 4 b + q: row q of tile b is a key

  // Loads the pair's indices. An index is a key when it lies in the list's length and in [0, rows).
  __device__ __forceinline__ void locate(const int32_t* list, int keys, int pair, const SparseCacheView& rows,
                                         int group, int piece) {
    valid = 0;
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        const int pos = (2 * pair + b) * Cfg::kBlockN + group + 16 * q;
        const int index = pos < keys ? __ldg(list + pos) : -1;
        const bool key = index >= 0 && static_cast<int64_t>(index) < rows.num_slots;
        src[b][q] = rows.data + static_cast<int64_t>(key ? index : 0) * rows.block_stride_bytes + 16 * piece;
        valid |= static_cast<uint32_t>(key) << (4 * b + q);
      }
    }
  }

  // Copies chunks [c0, c1) of tile b into its buffer.
  template <int c0, int c1>
  __device__ __forceinline__ void copy(uint32_t buffer, int b, uint32_t dst_in_chunk, uint64_t policy) const {
#pragma unroll
    for (int c = c0; c < c1; ++c) {
#pragma unroll
      for (int q = 0; q < kRows; ++q) {
        const uint32_t dst = buffer + c * (Cfg::kChunkElems * 2) + dst_in_chunk + q * 16 * 128;
        cp_async_16_keep(dst, src[b][q] + c * 128, ((valid >> (4 * b + q)) & 1u) ? 16u : 0u, policy);
      }
    }
  }

  // Tile b's key bits as the consumers read them: producer warp w covers rows 4 w + i + 16 q
  // (i = lane / 8), one word per warp, ORed by the readers. Lane 0 writes it and arrives on the
  // barrier of the half that is filled first (the readers wait there before they read it).
  __device__ __forceinline__ void publish_valid(uint64_t* word, uint64_t* ready, int b, int warp, int lane) const {
    uint64_t bits = 0;
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      const uint32_t ballot = __ballot_sync(0xffffffffu, (valid >> (4 * b + q)) & 1u);
#pragma unroll
      for (int i = 0; i < 4; ++i) bits |= static_cast<uint64_t>((ballot >> (8 * i)) & 1u) << (4 * warp + i + 16 * q);
    }
    if (lane == 0) {
      *word = bits;
      dev::mbar_arrive(ready);
    }
  }
};

// Halves are filled in the order the consumers release them: buffer 0's left half (after A's own
// P V), buffer 1's right half (after B's own P V), buffer 0's right half (after B's product with A's
// P), buffer 1's left half (after A's product with B's P). A's S reads buffer 0 left then right, B's
// S buffer 1 right then left.
template <typename Cfg>
__device__ void producer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p) {
  constexpr int kL = Cfg::kLeftChunks, kAll = Cfg::kChunks;
  const int t = threadIdx.x;
  const int warp = t / 32, lane = t % 32;
  const int group = t / 8, piece = t % 8;
  const uint32_t dst_in_chunk = group * 128 + ((piece ^ (group & 7)) << 4);
  const uint64_t policy = l2_evict_last_policy();
  const uint32_t buf0 = dev::smem_addr(smem.k[0]), buf1 = dev::smem_addr(smem.k[1]);
  uint32_t n = 0;  // pairs so far: the parity of every K barrier
  Item it = item_of(p, blockIdx.x);
  for (int w = blockIdx.x; w < units_of(p); w += gridDim.x) {
    const Item next = next_item_of(p, w);
    const SparseCacheView rows = it.pairs > 0 ? sequence_rows(p, it.token) : SparseCacheView{};
    const int32_t* list = p.indices + static_cast<int64_t>(it.token) * p.indices_batch_stride;
    const int first_pair = first_pair_of(p, w, it.keys);
    for (int j = 0; j < it.pairs; ++j, ++n) {
      PairCopier<Cfg> c;
      c.locate(list, it.keys, first_pair + j, rows, group, piece);
      trace::event(trace::kProducer, n, trace::kProducerTop);
      const uint32_t free_parity = (n & 1) ^ 1;
      // Halves in the order the consumers free them: B's own product (buffer 1's right half) retires
      // first, A's (buffer 0's left half) next, then the two products with the other's P.
      dev::mbar_wait(&smem.k_free[1][1], free_parity);
      trace::event(trace::kProducer, n, trace::kFree1Right);
      c.publish_valid(&smem.valid[1][warp], &smem.k_ready[1][1], 1, warp, lane);
      c.template copy<kL, kAll>(buf1, 1, dst_in_chunk, policy);
      dev::cp_async_mbar_arrive(&smem.k_ready[1][1]);
      dev::mbar_wait(&smem.k_free[0][0], free_parity);
      trace::event(trace::kProducer, n, trace::kFree0Left);
      c.publish_valid(&smem.valid[0][warp], &smem.k_ready[0][0], 0, warp, lane);
      c.template copy<0, kL>(buf0, 0, dst_in_chunk, policy);
      dev::cp_async_mbar_arrive(&smem.k_ready[0][0]);
      dev::mbar_wait(&smem.k_free[0][1], free_parity);
      trace::event(trace::kProducer, n, trace::kFree0Right);
      c.template copy<kL, kAll>(buf0, 0, dst_in_chunk, policy);
      dev::cp_async_mbar_arrive(&smem.k_ready[0][1]);
      dev::mbar_wait(&smem.k_free[1][0], free_parity);
      trace::event(trace::kProducer, n, trace::kFree1Left);
      c.template copy<0, kL>(buf1, 1, dst_in_chunk, policy);
      dev::cp_async_mbar_arrive(&smem.k_ready[1][0]);
      trace::event(trace::kProducer, n, trace::kProducerIssued);
    }
    it = next;
  }
}

// ------------------------------------------------------------------------------------ consumers

// S (+)= Q K^T over chunks [c0, c1) of K buffer `k_tile`, issued and committed as one wgmma batch.
// The buffer was filled by cp.async, whose completion the barrier wait before this observed: no
// proxy fence (as CUTLASS's cp.async wgmma mainloops; in the consumers it would compile to a
// MEMBAR that also waits for the previous item's output stores).
template <typename Cfg, int c0, int c1, bool kClear, typename TS>
__device__ __forceinline__ void issue_scores(typename Cfg::SharedStorage& smem, const typename Cfg::Element* k_tile,
                                             TS& tSrS) {
  typename Cfg::MmaS mma;
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor sQ = make_tensor(make_smem_ptr(opaque(smem.q)), typename Cfg::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(opaque(k_tile)), typename Cfg::SmemLayoutK{});
  Tensor tSrQ = thr.partition_fragment_A(sQ);
  Tensor tSrK = thr.partition_fragment_B(sK);
  constexpr int kSteps = Cfg::kChunkCols / 16;  // k-steps per chunk
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int k = c0 * kSteps; k < c1 * kSteps; ++k) {
    mma.accumulate_ = (kClear && k == c0 * kSteps) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    gemm(mma, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
  }
  warpgroup_commit_batch();
}

// O_half += P V_half, P from registers (the consumer's own tile), V_half the consumer's 256 columns
// of a K buffer.
template <typename Cfg, typename TP, typename TO>
__device__ __forceinline__ void issue_pv_from_registers(const typename Cfg::Element* v_half, TP& tOrP, TO& tOrO) {
  typename Cfg::MmaPvRegs mma;
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor sVt = make_tensor(make_smem_ptr(opaque(v_half)), typename Cfg::SmemLayoutVtHalf{});
  Tensor tOrV = thr.partition_fragment_B(sVt);
  warpgroup_fence_operand(tOrP);  // P's registers are written before the wgmma reads them
  sparse_decode::issue_mma_batch<false>(mma, tOrP, tOrV, tOrO);
}

// O_half += P V_half with the other consumer's P from shared memory.
template <typename Cfg, typename TO>
__device__ __forceinline__ void issue_pv_from_smem(const typename Cfg::Element* p_tile,
                                                   const typename Cfg::Element* v_half, TO& tOrO) {
  typename Cfg::MmaPvSmem mma;
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor sP = make_tensor(make_smem_ptr(opaque(p_tile)), typename Cfg::SmemLayoutP{});
  Tensor sVt = make_tensor(make_smem_ptr(opaque(v_half)), typename Cfg::SmemLayoutVtHalf{});
  sparse_decode::issue_mma_batch<false>(mma, thr.partition_fragment_A(sP), thr.partition_fragment_B(sVt), tOrO);
}

// A consumer's state. Thread rows: this thread holds rows rows[0] and rows[1] = rows[0] + 8 of the
// 64 x 64 S fragment and of its 64 x 256 O half (elements i with (i / 2) % 2 == h are row h).
template <typename Cfg>
struct Consumer {
  using Element = typename Cfg::Element;
  decltype(partition_fragment_C(typename Cfg::MmaS{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kBlockN>>{})) tSrS;
  decltype(make_tensor<Element>(partition_shape_A(typename Cfg::MmaPvRegs{},
                                                  Shape<Int<Cfg::kBlockM>, Int<Cfg::kBlockN>>{}))) tOrP;
  decltype(partition_fragment_C(typename Cfg::MmaPvRegs{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDimV / 2>>{})) tOrO;
  float row_m[2];  // the running max after the last pair (-inf: no key yet)
  float row_l[2];  // this thread's share of its rows' denominators, at row_m
  int rows[2];
  int lane;
  uint32_t p_row_addr;  // this lane's row address in a P tile at offset 0 (see store_p)
  int p_group_xor;      // and the bits of its 16-byte group index that depend on the lane

  __device__ explicit Consumer(int ctid) {
    static_assert(decltype(size(tSrS))::value == 32 && decltype(size(tOrP))::value == 32, "S and P: 64 x 64");
    static_assert(decltype(size(tOrO))::value == 128, "O half: 64 x 256");
    lane = ctid % 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[h] = sparse_decode::frag_row(2 * h, ctid / 32, lane);
    // store_p's stmatrix: lane L gives the address of row L % 8 of matrix L / 8, which is (row half
    // (L / 8) % 2, column group 2 t + L / 16) of the warp's 16 x 64 rows of P; in SmemLayoutP, row r's
    // 16-byte group g sits at r * 128 + ((g ^ (r % 8)) << 4).
    const int r = lane % 8, matrix = lane / 8;
    p_row_addr = (16 * (ctid / 32) + 8 * (matrix % 2) + r) * 128;
    p_group_xor = (matrix / 2) ^ r;
  }

  __device__ void start_item() {
    clear(tOrO);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_m[h] = -INFINITY;
      row_l[h] = 0.f;
    }
  }

  // Scales the scores (log2 domain) and sets those of non-keys to -inf; returns the tile's row
  // maxima (over the four lanes that share a row).
  __device__ void mask_and_max(uint64_t valid, float scale, float (&tile_max)[2]) {
    // Element i is column 8 (i / 4) + 2 (lane % 4) + i % 2: one shift by the lane's part, then
    // constant bit positions.
    const uint64_t mine = valid >> (2 * (lane % 4));
    tile_max[0] = tile_max[1] = -INFINITY;
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) {
      const float s = ((mine >> (8 * (i / 4) + i % 2)) & 1u) ? tSrS(i) * scale : -INFINITY;
      tSrS(i) = s;
      tile_max[(i / 2) % 2] = fmaxf(tile_max[(i / 2) % 2], s);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    }
  }

  // Writes the running max `m` of this thread's rows for the other consumer and signals `bar` (one
  // arrival per thread: warp_arrive says why). The __syncwarp: every lane has read the max that
  // this overwrites (the last pair's, or A's).
  __device__ void publish_max(typename Cfg::SharedStorage& smem, const float (&m)[2], uint64_t* bar) const {
    __syncwarp();
    if (lane % 4 == 0) {
      smem.row_max[rows[0]] = m[0];
      smem.row_max[rows[1]] = m[1];
    }
    dev::mbar_arrive(bar);
  }

  // Moves O and the denominators to the max `m` (>= row_m), then P = exp2(S - m) in tSrS (float32)
  // and in tOrP (bf16), its row sums added to the denominators.
  __device__ void exponentiate(const float (&m)[2]) {
    float base[2], scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      base[h] = m[h] == -INFINITY ? 0.f : m[h];  // no key yet: P stays 0
      scale[h] = dev::exp2_ftz(row_m[h] - base[h]);
      row_m[h] = m[h];
      row_l[h] *= scale[h];
    }
    rescale_o(scale);
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); i += 2) {
      const int h = (i / 2) % 2;
      const float a = dev::exp2_ftz(tSrS(i) - base[h]);
      const float b = dev::exp2_ftz(tSrS(i + 1) - base[h]);
      tSrS(i) = a;
      tSrS(i + 1) = b;
      row_l[h] += a + b;
      tOrP(i) = static_cast<Element>(a);
      tOrP(i + 1) = static_cast<Element>(b);
    }
  }

  // O *= scale per row; skipped when the running max did not move for any row of the warp.
  __device__ void rescale_o(const float (&scale)[2]) {
    if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= scale[(i / 2) % 2];
    }
  }

  // P as bf16 into the P tile at shared-memory address `tile` with four stmatrix (each 8 x 8 matrix
  // of the fragment is a thread's pair in row lane / 4); fenced for wgmma.
  __device__ void store_p(uint32_t tile) const {
    uint32_t pairs[16];  // pair 2 k + h: columns 8 k + 2 (lane % 4) + {0, 1} of row half h
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); i += 2) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(tSrS(i), tSrS(i + 1));
      pairs[i / 2] = *reinterpret_cast<const uint32_t*>(&v);
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t addr = tile + p_row_addr + (((2 * t) ^ p_group_xor) << 4);
      dev::stmatrix_x4(addr, pairs[4 * t], pairs[4 * t + 1], pairs[4 * t + 2], pairs[4 * t + 3]);
    }
    dev::fence_proxy_async_smem();
  }
};

// One arrival per warp on a consumer barrier (the K releases and P's hand-over count the four warps
// of the warpgroup that signals them), after the warp's earlier shared-memory writes: the warp's
// barrier orders them before lane 0's release. Each thread's mbarrier arrival is a shared-memory
// atomic; 128 of them per signal, eight signals per pair, queue beside the wgmma operand reads. The
// running max's hand-over (a_max, b_max) keeps one arrival per thread: compute-sanitizer's racecheck
// does not follow a __syncwarp into lane 0's release and reports the max's plain stores as races.
__device__ __forceinline__ void warp_arrive(uint64_t* bar) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) dev::mbar_arrive(bar);
}

// The tile's key bits, read by lane 0 of each warp and handed to the others by shuffle: the lane that
// reads them is the one whose release (warp_arrive) lets the producer overwrite them, an order
// racecheck can follow.
template <typename Cfg>
__device__ __forceinline__ uint64_t read_valid(const typename Cfg::SharedStorage& smem, int buffer) {
  uint64_t bits = 0;
  if (threadIdx.x % 32 == 0)
    bits = smem.valid[buffer][0] | smem.valid[buffer][1] | smem.valid[buffer][2] | smem.valid[buffer][3];
  return __shfl_sync(0xffffffffu, static_cast<unsigned long long>(bits), 0);
}

// The end of a piece, both consumers (256 threads): once every thread's partial rows are visible
// device-wide, the piece counts itself on its item's counter, and the CTA that counts last merges the
// item's pieces into out, lse and max_logits with the decode combine's math
// (scheduler/merge_math.cuh: the same LSE reduction, weights, NaN and no-key rules), the sink applied
// once to the merged row. No CTA waits for another: the pieces that finish earlier leave. A warp
// merges a head row at a time, lane l columns 16 l .. 16 l + 15 and piece l's weight (pieces <= 32).
// Called by both consumers after their loops: a piece is always a CTA's last unit, and merging there
// leaves the loops' registers alone (inside them, the merger's made ptxas spill the loop state).
template <typename Cfg>
__device__ void merge_last_piece(typename Cfg::SharedStorage& smem, const KernelParams& p) {
  const int units = units_of(p), grid = static_cast<int>(gridDim.x), first = static_cast<int>(blockIdx.x);
  if (first >= units) return;
  const int last_unit = first + (units - 1 - first) / grid * grid;
  const int slot = slot_of(p, last_unit);
  if (slot < 0) return;
  const Item it = item_of(p, last_unit);
  const int ctid = threadIdx.x - 128;
  constexpr int kBarrierMerge = 1;  // finish_item's named barrier of both consumers
  constexpr int kWarps = 8;
  const int n = p.tail_pieces;
  const int cut_item = slot / n;
  __threadfence();
  dev::named_barrier_sync(kBarrierMerge, 256);
  if (ctid == 0) smem.merger = atomicAdd(p.tail_counters + cut_item, 1) == n - 1;
  dev::named_barrier_sync(kBarrierMerge, 256);
  if (!smem.merger) return;
  __threadfence();  // the other pieces' rows, published before their counts, are read after ours
  const int warp = ctid / 32, lane = ctid % 32;
  const size_t slot_rows = p.rows_per_slot;
  for (int r = warp; r < Cfg::kBlockM; r += kWarps) {
    const int head = it.m * Cfg::kBlockM + r;
    if (head >= p.h_q) break;
    const size_t row0 = static_cast<size_t>(cut_item) * n * slot_rows + r;  // piece s: row0 + s slot_rows
    const auto piece_lse = [&](int s) { return __ldcg(p.lse_accum + row0 + s * slot_rows); };
    const float lane_lse = lane < n ? piece_lse(lane) : -INFINITY;
    bool any;
    const float lse = dev::merged_lse(lane_lse, piece_lse, n, lane, any);
    float max_logit = lane < n ? __ldcg(p.max_accum + row0 + lane * slot_rows) : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, o));
    const float my_weight = lane < n ? dev::piece_weight(lane_lse, lse, any) : 0.f;
    float acc[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j] = 0.f;
    const auto* src = static_cast<const __nv_bfloat16*>(p.o_accum) + row0 * Cfg::kHeadDimV + 16 * lane;
#pragma unroll 4
    for (int s = 0; s < n; ++s) {
      const float w = __shfl_sync(0xffffffffu, my_weight, s);
      const uint4* at = reinterpret_cast<const uint4*>(src + s * slot_rows * Cfg::kHeadDimV);
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        float v[8];
        dev::unpack8<__nv_bfloat16>(__ldcg(at + a), v);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[8 * a + j] += w * v[j];
      }
    }
    float factor = 1.f;
    if (p.attn_sink != nullptr && any) factor = 1.f / (1.f + __expf(p.attn_sink[head] - lse));
    auto* dst = reinterpret_cast<__nv_bfloat16*>(p.out) + it.token * p.out_batch_stride + head * p.out_head_stride +
                16 * lane;
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      uint32_t words[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(acc[8 * a + 2 * j] * factor, acc[8 * a + 2 * j + 1] * factor);
        words[j] = *reinterpret_cast<const uint32_t*>(&v);
      }
      reinterpret_cast<uint4*>(dst)[a] = make_uint4(words[0], words[1], words[2], words[3]);
    }
    if (lane == 0) {
      const int64_t at = it.token * p.lse_batch_stride + head * p.lse_head_stride;
      p.lse[at] = lse;
      p.max_logits[at] = max_logit;
    }
  }
}

// The end of an item, both consumers: the denominators of a row are the sum of both consumers'
// shares (exchanged through shared memory, double-buffered by item parity), then each writes its
// O half; A also writes lse and max_logits. A piece writes them to its slot (merge_last_piece).
template <typename Cfg>
__device__ void finish_item(typename Cfg::SharedStorage& smem, const KernelParams& p, Consumer<Cfg>& c,
                            const Item& it, int unit, int parity, int consumer) {
  constexpr int kBarrierSums = 1;  // named barrier of both consumers (0 is __syncthreads)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    c.row_l[h] += __shfl_xor_sync(0xffffffffu, c.row_l[h], 1);
    c.row_l[h] += __shfl_xor_sync(0xffffffffu, c.row_l[h], 2);
    if (c.lane % 4 == 0) smem.row_sum[parity][consumer][c.rows[h]] = c.row_l[h];
  }
  dev::named_barrier_sync(kBarrierSums, 256);
  float sum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) sum[h] = smem.row_sum[parity][0][c.rows[h]] + smem.row_sum[parity][1][c.rows[h]];
  sparse_decode::Request q{};
  q.batch = it.token;
  q.token = 0;
  const int slot = slot_of(p, unit);
  sparse_decode::store_output<Cfg>(p, q, it.m, c.tOrO, c.rows, sum, c.row_m, slot >= 0, slot,
                                   consumer * (Cfg::kHeadDimV / 2), consumer == 0, c.lane);
}

template <typename Cfg>
__device__ __forceinline__ typename Cfg::Element* p_tile_of(typename Cfg::SharedStorage& smem, int consumer) {
  if constexpr (Cfg::kPInRope) {
    return consumer == 0 ? smem.k[0] + Cfg::kHeadDimV * Cfg::kBlockN : smem.p[0];
  } else {
    return smem.p[consumer];
  }
}

// Consumer A: tiles 2j (buffer 0), O columns [0, 256). It also issues the Q loads.
template <typename Cfg>
__device__ void consumer_a_loop(typename Cfg::SharedStorage& smem, const KernelParams& p, const CUtensorMap* q_map) {
  constexpr int kL = Cfg::kLeftChunks, kAll = Cfg::kChunks;
  const int ctid = threadIdx.x % 128;
  Consumer<Cfg> c(ctid);
  typename Cfg::Element* const v0 = smem.k[0];                        // V left half of buffer 0
  typename Cfg::Element* const v1 = smem.k[1];                        // of buffer 1
  const uint32_t p_own = dev::smem_addr(p_tile_of<Cfg>(smem, 0));
  const typename Cfg::Element* p_other = p_tile_of<Cfg>(smem, 1);
  // Thread 0 loads Q: that of the first item with a key, then, once an item's last S is done, the
  // next such item's (found while the item runs, off the path to its P).
  auto load_q = [&](int w) {
    if (w < 0) return;
    const Item it = item_of(p, w);
    sparse_decode::Request q{};
    q.batch = it.token;
    sparse_decode::issue_q<Cfg>(smem, q_map, p, q, it.m);
  };
  if (ctid == 0) load_q(next_item_with_keys(p, blockIdx.x));
  uint32_t n = 0, q_parity = 0;
  int items = 0;
  Item it = item_of(p, blockIdx.x);
  for (int w = blockIdx.x; w < units_of(p); w += gridDim.x, ++items) {
    // The next item's length loads while this one runs.
    const Item next = next_item_of(p, w);
    const int next_q = ctid == 0 && it.pairs > 0 ? next_item_with_keys(p, w + gridDim.x) : -1;
    c.start_item();
    if (it.pairs > 0) {
      dev::mbar_wait(&smem.q_full, q_parity);
      q_parity ^= 1;
      trace::event(trace::kConsumerA, n, trace::kAQLanded);
      // The first pair's S; later ones are issued at the end of the pair before.
      dev::mbar_wait(&smem.k_ready[0][0], n & 1);
      issue_scores<Cfg, 0, kL, true>(smem, smem.k[0], c.tSrS);
      dev::mbar_wait(&smem.k_ready[0][1], n & 1);
      issue_scores<Cfg, kL, kAll, false>(smem, smem.k[0], c.tSrS);
      warpgroup_wait<0>();
      warpgroup_fence_operand(c.tSrS);
      for (int j = 0; j < it.pairs; ++j, ++n) {
        const uint32_t parity = n & 1;
        trace::event(trace::kConsumerA, n, trace::kAScored);
        float m[2];
        c.mask_and_max(read_valid<Cfg>(smem, 0), p.scale_log2, m);
#pragma unroll
        for (int h = 0; h < 2; ++h) m[h] = fmaxf(c.row_m[h], m[h]);
        c.publish_max(smem, m, &smem.a_max);
        trace::event(trace::kConsumerA, n, trace::kAMaxSent);
        // B folds its tile into the max; P_A and O move to that pair max at once, and P_A goes to B
        // before A issues its own product: the warp stalls in a register-sourced wgmma's issue while
        // the tensor pipe is busy, so a store behind it (the P that B waits for) would start late.
        dev::mbar_wait(&smem.b_max, parity);
        trace::event(trace::kConsumerA, n, trace::kAMaxBack);
#pragma unroll
        for (int h = 0; h < 2; ++h) m[h] = smem.row_max[c.rows[h]];
        c.exponentiate(m);
        // Q is read by S alone: both S of the item's last pair are done (B's before b_max).
        if (j + 1 == it.pairs && ctid == 0) load_q(next_q);
        c.store_p(p_own);
        warp_arrive(&smem.p_ready[0]);
        issue_pv_from_registers<Cfg>(v0, c.tOrP, c.tOrO);
        warpgroup_wait<0>();
        warpgroup_fence_operand(c.tOrO);
        warp_arrive(&smem.k_free[0][0]);
        trace::event(trace::kConsumerA, n, trace::kAOwnDone);
        dev::mbar_wait(&smem.p_ready[1], parity);
        issue_pv_from_smem<Cfg>(p_other, v1, c.tOrO);
        trace::event(trace::kConsumerA, n, trace::kAOtherP);
        // Buffer 1's left half is released as soon as this product retires: B's next S waits for its
        // reload, which must not wait for this warpgroup's next tile as well.
        warpgroup_wait<0>();
        warpgroup_fence_operand(c.tOrO);
        warp_arrive(&smem.k_free[1][0]);
        trace::event(trace::kConsumerA, n, trace::kAOtherDone);
        if (j + 1 < it.pairs) {
          dev::mbar_wait(&smem.k_ready[0][0], parity ^ 1);
          trace::event(trace::kConsumerA, n, trace::kANextLeft);
          issue_scores<Cfg, 0, kL, true>(smem, smem.k[0], c.tSrS);
          dev::mbar_wait(&smem.k_ready[0][1], parity ^ 1);
          trace::event(trace::kConsumerA, n, trace::kANextRight);
          issue_scores<Cfg, kL, kAll, false>(smem, smem.k[0], c.tSrS);
          warpgroup_wait<0>();
          warpgroup_fence_operand(c.tSrS);
        }
      }
    }
    finish_item<Cfg>(smem, p, c, it, w, items & 1, 0);
    if (it.pairs > 0) trace::event(trace::kConsumerA, n - 1, trace::kAEpilogueDone);
    it = next;
  }
  merge_last_piece<Cfg>(smem, p);
}

// Consumer B: tiles 2j + 1 (buffer 1), O columns [256, 512).
template <typename Cfg>
__device__ void consumer_b_loop(typename Cfg::SharedStorage& smem, const KernelParams& p) {
  constexpr int kL = Cfg::kLeftChunks, kAll = Cfg::kChunks;
  constexpr int kHalfElems = Cfg::kLeftChunks * Cfg::kChunkElems;
  const int ctid = threadIdx.x % 128;
  Consumer<Cfg> c(ctid);
  typename Cfg::Element* const v0 = smem.k[0] + kHalfElems;  // V right half of buffer 0
  typename Cfg::Element* const v1 = smem.k[1] + kHalfElems;
  const uint32_t p_own = dev::smem_addr(p_tile_of<Cfg>(smem, 1));
  const typename Cfg::Element* p_other = p_tile_of<Cfg>(smem, 0);
  uint32_t n = 0, q_parity = 0;
  int items = 0;
  Item it = item_of(p, blockIdx.x);
  for (int w = blockIdx.x; w < units_of(p); w += gridDim.x, ++items) {
    const Item next = next_item_of(p, w);
    c.start_item();
    if (it.pairs > 0) {
      dev::mbar_wait(&smem.q_full, q_parity);
      q_parity ^= 1;
      trace::event(trace::kConsumerB, n, trace::kBQLanded);
      for (int j = 0; j < it.pairs; ++j, ++n) {
        const uint32_t parity = n & 1;
        trace::event(trace::kConsumerB, n, trace::kBTop);
        dev::mbar_wait(&smem.k_ready[1][1], parity);
        trace::event(trace::kConsumerB, n, trace::kBRight);
        issue_scores<Cfg, kL, kAll, true>(smem, smem.k[1], c.tSrS);
        dev::mbar_wait(&smem.k_ready[1][0], parity);
        trace::event(trace::kConsumerB, n, trace::kBLeft);
        issue_scores<Cfg, 0, kL, false>(smem, smem.k[1], c.tSrS);
        warpgroup_wait<0>();
        warpgroup_fence_operand(c.tSrS);
        trace::event(trace::kConsumerB, n, trace::kBScored);
        float m[2];
        c.mask_and_max(read_valid<Cfg>(smem, 1), p.scale_log2, m);
        dev::mbar_wait(&smem.a_max, parity);
        trace::event(trace::kConsumerB, n, trace::kBMaxIn);
#pragma unroll
        for (int h = 0; h < 2; ++h) m[h] = fmaxf(smem.row_max[c.rows[h]], m[h]);
        c.publish_max(smem, m, &smem.b_max);
        c.exponentiate(m);
        issue_pv_from_registers<Cfg>(v1, c.tOrP, c.tOrO);
        c.store_p(p_own);
        warp_arrive(&smem.p_ready[1]);
        // Buffer 1's right half is released as soon as the own product retires (its reload is what
        // this warpgroup's next S waits for), not once A's P has come and its product was issued.
        warpgroup_wait<0>();
        warpgroup_fence_operand(c.tOrO);
        warp_arrive(&smem.k_free[1][1]);
        trace::event(trace::kConsumerB, n, trace::kBOwnDone);
        dev::mbar_wait(&smem.p_ready[0], parity);
        issue_pv_from_smem<Cfg>(p_other, v0, c.tOrO);
        trace::event(trace::kConsumerB, n, trace::kBOtherP);
        warpgroup_wait<0>();
        warpgroup_fence_operand(c.tOrO);
        warp_arrive(&smem.k_free[0][1]);
        trace::event(trace::kConsumerB, n, trace::kBOtherDone);
      }
    }
    finish_item<Cfg>(smem, p, c, it, w, items & 1, 1);
    if (it.pairs > 0) trace::event(trace::kConsumerB, n - 1, trace::kBEpilogueDone);
    it = next;
  }
  merge_last_piece<Cfg>(smem, p);
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sparse_prefill_kernel(const __grid_constant__ CUtensorMap q_map, const KernelParams p) {
  HMLA_ALIGNED_SHARED_STORAGE(typename Cfg::SharedStorage, smem);
  const int warpgroup = threadIdx.x / 128;

  dev::pdl_launch_dependents();
  if (threadIdx.x == 0) trace::span(0);
  if (threadIdx.x == 0) {
    dev::tma_prefetch_descriptor(&q_map);
    dev::mbar_init(&smem.q_full, 1);
    for (int b = 0; b < 2; ++b) {
      for (int h = 0; h < 2; ++h) {
        // The producer threads' copies; the half filled first also counts the four warps' key words.
        // The consumers release a half once per warp.
        const bool first_half = h == (b == 0 ? 0 : 1);
        dev::mbar_init(&smem.k_ready[b][h], Cfg::kProducerThreads + (first_half ? 4 : 0));
        dev::mbar_init(&smem.k_free[b][h], 4);
      }
    }
    // The statistics' hand-over counts every thread of the warpgroup (see warp_arrive); P's once per warp.
    dev::mbar_init(&smem.a_max, 128);
    dev::mbar_init(&smem.b_max, 128);
    dev::mbar_init(&smem.p_ready[0], 4);
    dev::mbar_init(&smem.p_ready[1], 4);
    dev::fence_barrier_init();
  }
  sparse_decode::zero_uncovered_q_rows<Cfg>(smem, p);
  // Launched with programmatic stream serialisation: nothing a previous kernel wrote is read before
  // it has completed.
  dev::pdl_wait_for_prerequisites();
  __syncthreads();

  if (warpgroup == 0) {
    dev::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    producer_loop<Cfg>(smem, p);
  } else if (warpgroup == 1) {
    dev::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    consumer_a_loop<Cfg>(smem, p, &q_map);
  } else {
    dev::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    consumer_b_loop<Cfg>(smem, p);
    if (threadIdx.x == 256) trace::span(1);
  }
}

// One CTA per SM at most (the plan takes all of shared memory), units round-robin (ItemRounds).
template <int kHeadDim>
void launch_kernel(const CUtensorMap& q_map, const KernelParams& params, int grid, cudaStream_t stream) {
  using Cfg = SeesawConfig<kHeadDim>;
  auto kernel = sparse_prefill_kernel<Cfg>;
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  detail::launch_after_prerequisites(kernel, dim3(grid), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, q_map, params);
#ifdef HMLA_PREFILL_TRACE_BUFFER
  // Trace builds only (never in a release build): every call overwrites the file with its timeline.
  // Here, not in launch.cu: the trace buffer is a device symbol of this translation unit.
  dev::timeline::write_trace_file(trace::g_buffer, stream);
#endif
}

}  // namespace hmla::sm90::sparse_prefill
