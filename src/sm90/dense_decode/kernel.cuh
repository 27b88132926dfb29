// The sm90 dense decode kernel and its launcher. Included only by the instantiation files, one
// per element type, so the two element types compile in parallel.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/cuda_check.h"
#include "common/device_primitives.cuh"
#include "common/tensor_map.h"
#include "scheduler/decode_schedule.h"
#include "scheduler/decode_scheduler.h"
#include "sm90/dense_decode/config.h"
#include "sm90/dense_decode/launch.h"

namespace hmla::sm90::dense_decode {

struct KernelParams {
  int batch;
  int s_q;
  int h_kv;
  int page_size;
  bool causal;
  float scale_log2;  // softmax_scale * log2(e): scores are exponentiated with exp2
  uint64_t k_l2_policy;  // L2 eviction priority of K tile loads (a createpolicy value)
  detail::RowTiling tiling;
  const int32_t* seqlens;
  const int32_t* block_table;
  int64_t block_table_batch_stride;
  const detail::PartMetadata* parts;
  const int32_t* req_num_splits;
  const int32_t* req_split_base;
  float* lse_accum;
  float* o_accum;
  void* out;
  int64_t out_batch_stride, out_token_stride, out_head_stride;
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
};

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

__device__ __forceinline__ int units_of(int seqlen) {
  const int blocks = (seqlen + detail::kBlockN - 1) / detail::kBlockN;
  return blocks > 0 ? blocks : 1;
}

// Element i of a thread's wgmma accumulator fragment (64 x N tile of one warpgroup) sits at row
// 16 * warp + lane / 4 + 8 * ((i / 2) % 2) and column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
__device__ __forceinline__ int frag_row(int i, int warp_in_wg, int lane) {
  return 16 * warp_in_wg + lane / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int frag_col(int i, int lane) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

// Named barriers (0 is __syncthreads). Each pair is one arrive by the producing warpgroup and one
// sync by the consuming warpgroup, so a generation never completes without both.
constexpr int kBarEvenMax = 1;     // warpgroup 0 wrote max_even
constexpr int kBarOddMax = 2;      // warpgroup 1 wrote max_odd
constexpr int kBarEvenP = 3;       // warpgroup 0 stored the even tile's P
constexpr int kBarOddP = 4;        // warpgroup 1 stored the odd tile's P (and issued its P_even V)
constexpr int kBarWarpgroup = 5;   // + warpgroup: its own 128 threads

// What one thread carries through the kernel.
template <typename Cfg>
struct ThreadState {
  using Element = typename Cfg::Element;
  using FragS = decltype(partition_fragment_C(typename Cfg::MmaS{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kBlockN>>{}));
  using FragO =
      decltype(partition_fragment_C(typename Cfg::MmaORegP{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDimV / 2>>{}));
  // A operand of a 64 x 64 product held in registers (wgmma's A fragment: 4 k-steps of 16).
  using FragA = decltype(make_tensor<Element>(Shape<Shape<_2, _2, _2>, _1, Int<Cfg::kChunkCols / 16>>{}));

  FragS s;       // S of this warpgroup's tile, then its P in fp32
  FragO o;       // this warpgroup's 256 output columns
  FragA p;       // P in the input type, as the A operand of P V
  FragA q_rope;  // Q's RoPE chunk (its shared memory holds the odd tile's P)
  float m[2];    // running max of the thread's two rows, log2 domain of the scaled scores
  float l[2];    // this warpgroup's part of the row sums, over the thread's own columns
  uint32_t k_phase = 0;  // parity of this warpgroup's K buffer barriers
  uint32_t q_phase = 0;
};

// The request a CTA is working on, as the loops need it.
struct RequestView {
  const int32_t* table;  // block-table row
  int seqlen;
  int unit_begin, unit_end;  // this CTA's 64-token units of the request
  int limit[2];              // keys visible to the thread's two rows
  int mask_from;             // first key that some row of the tile cannot see
};

template <typename Cfg>
struct Kernel {
  using Element = typename Cfg::Element;
  using Native = NativeOf<Element>;
  using Smem = typename Cfg::SharedStorage;
  using State = ThreadState<Cfg>;
  static constexpr int kChunkElems = Cfg::kChunkElems;

  Smem& smem;
  const KernelParams& p;
  const CUtensorMap* q_map;
  const CUtensorMap* k_map;
  int kv, m_tile;
  int wg, wtid, warp_in_wg, lane;
  int rows[2];

  __device__ __forceinline__ int page_of(const RequestView& r, int unit) const {
    return r.table[unit * Cfg::kBlockN / p.page_size];
  }

  // One thread: TMA of chunks [kBegin, kEnd) of `unit` into K buffer `buf`, one barrier per chunk.
  // Only pages that hold tokens of the request are read; block-table entries past its length are
  // never looked at. `first_page` is the unit's first page id, read ahead by the caller.
  template <int kBegin, int kEnd>
  __device__ __forceinline__ void load_k(const RequestView& r, int buf, int unit, int first_page) const {
    const int rows_per_box = p.page_size < Cfg::kBlockN ? p.page_size : Cfg::kBlockN;
    const int token0 = unit * Cfg::kBlockN;
    const int valid = min(Cfg::kBlockN, r.seqlen - token0);
    const int boxes = (valid + rows_per_box - 1) / rows_per_box;
    const uint32_t bytes = static_cast<uint32_t>(boxes * rows_per_box * Cfg::kChunkCols * sizeof(Element));
#pragma unroll
    for (int c = kBegin; c < kEnd; ++c) dev::mbar_arrive_expect_tx(&smem.k_full[buf][c], bytes);
    for (int b = 0; b < boxes; ++b) {
      const int token = token0 + b * rows_per_box;
      const int page = b == 0 ? first_page : r.table[token / p.page_size];
      const int row = token % p.page_size;
      Element* dst = smem.k[buf] + b * rows_per_box * Cfg::kChunkCols;
#pragma unroll
      for (int c = kBegin; c < kEnd; ++c) {
        dev::tma_load_4d_hint(dst + c * kChunkElems, k_map, &smem.k_full[buf][c], c * Cfg::kChunkCols, kv, row, page,
                              p.k_l2_policy);
      }
    }
  }

  // One thread: Q of request `req` and the first two K tiles of its range, issued when the previous
  // request has released all shared memory.
  __device__ __forceinline__ void load_request(int req, const RequestView& r) const {
    const uint32_t q_bytes = static_cast<uint32_t>(p.tiling.heads_per_tile * p.tiling.tokens_per_tile) *
                             Cfg::kChunkCols * sizeof(Element) * Cfg::kChunks;
    const int t0 = p.tiling.first_token(m_tile), hh0 = p.tiling.first_head(m_tile);
    dev::mbar_arrive_expect_tx(&smem.q_full, q_bytes);
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c)
      dev::tma_load_5d(smem.q + c * kChunkElems, q_map, &smem.q_full, c * Cfg::kChunkCols, hh0, kv, t0, req);
    load_k<0, Cfg::kChunks>(r, 0, r.unit_begin, page_of(r, r.unit_begin));
    if (r.unit_begin + 1 < r.unit_end) load_k<0, Cfg::kChunks>(r, 1, r.unit_begin + 1, page_of(r, r.unit_begin + 1));
  }

  __device__ __forceinline__ RequestView view(int req, const detail::PartMetadata& meta) const {
    RequestView r;
    r.seqlen = p.seqlens[req];
    r.table = p.block_table + req * p.block_table_batch_stride;
    r.unit_begin = req == meta.begin_req ? meta.begin_unit : 0;
    r.unit_end = req == meta.end_req ? meta.end_unit : units_of(r.seqlen);
    // Causal: query token t sees s_k - s_q + t + 1 keys; the tile's first token sees the fewest.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int token, head;
      p.tiling.row(m_tile, rows[h], token, head);
      r.limit[h] = p.causal ? r.seqlen - p.s_q + token + 1 : r.seqlen;
    }
    r.mask_from = p.causal ? r.seqlen - p.s_q + p.tiling.first_token(m_tile) + 1 : r.seqlen;
    return r;
  }

  // S (+)= Q K^T over chunks kFirst, kFirst + 1, ... (mod 9) of K buffer `buf`: each chunk waits for
  // its own TMA barrier and is one commit group, so the product starts on the first chunk to land.
  template <int kFirst, int kCount, bool kZeroInit>
  __device__ __forceinline__ void issue_s(State& st, int buf) const {
    Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k[buf]), typename Cfg::SmemLayoutK{});
    typename Cfg::MmaS mma;
    typename Cfg::MmaSRegQ mma_rq;
    auto thr = mma.get_thread_slice(wtid);
    auto thr_rq = mma_rq.get_thread_slice(wtid);
    Tensor tQ = thr.partition_fragment_A(sQ);   // (MMA, 1, 36)
    Tensor tK = thr.partition_fragment_B(sK);   // (MMA, 1, 36)
    Tensor tKr = thr_rq.partition_fragment_B(sK);
    constexpr int kSteps = Cfg::kChunkCols / 16;
    mma_rq.accumulate_ = GMMA::ScaleOut::One;  // the RoPE chunk is never the first one
    static_assert((kFirst + 0) % Cfg::kChunks != Cfg::kRopeChunk || !kZeroInit, "first chunk must be from smem");
    CUTE_UNROLL
    for (int j = 0; j < kCount; ++j) {
      const int c = (kFirst + j) % Cfg::kChunks;
      dev::mbar_wait(&smem.k_full[buf][c], st.k_phase);
      warpgroup_fence_operand(st.s);
      warpgroup_arrive();
      if (c == Cfg::kRopeChunk) {
        CUTE_UNROLL
        for (int k = 0; k < kSteps; ++k) gemm(mma_rq, st.q_rope(_, _, k), tKr(_, _, c * kSteps + k), st.s);
      } else {
        CUTE_UNROLL
        for (int k = 0; k < kSteps; ++k) {
          mma.accumulate_ = (kZeroInit && j == 0 && k == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
          gemm(mma, tQ(_, _, c * kSteps + k), tK(_, _, c * kSteps + k), st.s);
        }
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(st.s);
    }
  }

  // O_half += P V_half with P from this thread's registers (own tile).
  __device__ __forceinline__ void issue_pv_own(State& st, int buf) const {
    Tensor sVt = make_tensor(make_smem_ptr(smem.k[buf] + wg * Cfg::kVHalfChunks * kChunkElems),
                             typename Cfg::SmemLayoutVtHalf{});
    typename Cfg::MmaORegP mma;
    mma.accumulate_ = GMMA::ScaleOut::One;
    Tensor tV = mma.get_thread_slice(wtid).partition_fragment_B(sVt);  // (MMA, 1, 4)
    warpgroup_fence_operand(st.o);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tV); ++k) gemm(mma, st.p(_, _, k), tV(_, _, k), st.o);
    warpgroup_commit_batch();
    warpgroup_fence_operand(st.o);
  }

  // O_half += P V_half with the other warpgroup's P from shared memory.
  __device__ __forceinline__ void issue_pv_other(State& st, int buf, Element* p_smem) const {
    Tensor sVt = make_tensor(make_smem_ptr(smem.k[buf] + wg * Cfg::kVHalfChunks * kChunkElems),
                             typename Cfg::SmemLayoutVtHalf{});
    Tensor sP = make_tensor(make_smem_ptr(p_smem), typename Cfg::SmemLayoutChunk{});
    typename Cfg::MmaOSmemP mma;
    mma.accumulate_ = GMMA::ScaleOut::One;
    auto thr = mma.get_thread_slice(wtid);
    Tensor tP = thr.partition_fragment_A(sP);
    Tensor tV = thr.partition_fragment_B(sVt);
    warpgroup_fence_operand(st.o);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tV); ++k) gemm(mma, tP(_, _, k), tV(_, _, k), st.o);
    warpgroup_commit_batch();
    warpgroup_fence_operand(st.o);
  }

  // Masks S of `unit` (only tiles that reach the causal limit or the sequence end), and returns the
  // row maxima of the scaled scores in the log2 domain, reduced over the quad that shares a row.
  __device__ __forceinline__ void mask_and_max(State& st, const RequestView& r, int unit, float block_max[2]) const {
    const int token0 = unit * Cfg::kBlockN;
    if (token0 + Cfg::kBlockN > r.mask_from) {
      CUTE_UNROLL
      for (int i = 0; i < size(st.s); ++i)
        if (token0 + frag_col(i, lane) >= r.limit[(i / 2) % 2]) st.s(i) = -INFINITY;
    }
    block_max[0] = block_max[1] = -INFINITY;
    CUTE_UNROLL
    for (int i = 0; i < size(st.s); ++i) block_max[(i / 2) % 2] = fmaxf(block_max[(i / 2) % 2], st.s(i));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 1));
      block_max[h] = fmaxf(block_max[h], __shfl_xor_sync(0xffffffffu, block_max[h], 2));
      block_max[h] *= p.scale_log2;
    }
  }

  // exp2 reference for a running max: a row that has seen no key yet keeps P = 0, not NaN.
  static __device__ __forceinline__ float base_of(float m) { return m == -INFINITY ? 0.f : m; }

  // S -> P = exp2(S * scale - base) in place (fp32), its input-type copy in st.p, and the row sums.
  __device__ __forceinline__ void exponentiate(State& st, const float base[2], float sum[2]) const {
    sum[0] = sum[1] = 0.f;
    auto* pairs = reinterpret_cast<typename Native::pair*>(raw_pointer_cast(st.p.data()));
    CUTE_UNROLL
    for (int i = 0; i < size(st.s); i += 2) {
      const int h = (i / 2) % 2;
      st.s(i) = exp2f(st.s(i) * p.scale_log2 - base[h]);
      st.s(i + 1) = exp2f(st.s(i + 1) * p.scale_log2 - base[h]);
      sum[h] += st.s(i) + st.s(i + 1);
      pairs[i / 2] = Native::make(st.s(i), st.s(i + 1));
    }
  }

  __device__ __forceinline__ void scale_o(State& st, const float scale[2]) const {
    CUTE_UNROLL
    for (int i = 0; i < size(st.o); ++i) st.o(i) *= scale[(i / 2) % 2];
  }

  // st.p -> a 64 x 64 P buffer in shared memory (stmatrix), for the other warpgroup's wgmma.
  __device__ __forceinline__ void store_p(State& st, Element* dst) const {
    Tensor sP = make_tensor(make_smem_ptr(dst), typename Cfg::SmemLayoutChunk{});
    auto copy_p = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Cfg::MmaS{});
    auto thr = copy_p.get_slice(wtid);
    copy(copy_p, thr.retile_S(st.p), thr.partition_D(sP));
  }

  // Zeroes this warpgroup's V rows [valid, 64) of a tail tile: those cache rows lie past the
  // request's end and may hold anything (NaN in the tests); P is 0 there but 0 * NaN is NaN.
  __device__ __forceinline__ void zero_v_tail(int buf, int valid) const {
    const int bytes_per_chunk = (Cfg::kBlockN - valid) * Cfg::kChunkCols * static_cast<int>(sizeof(Element));
#pragma unroll
    for (int c = 0; c < Cfg::kVHalfChunks; ++c) {
      char* start = reinterpret_cast<char*>(smem.k[buf] + (wg * Cfg::kVHalfChunks + c) * kChunkElems +
                                            valid * Cfg::kChunkCols);
      for (int off = wtid * 16; off < bytes_per_chunk; off += 128 * 16)
        *reinterpret_cast<uint4*>(start + off) = make_uint4(0, 0, 0, 0);
    }
    dev::fence_proxy_async_smem();
    dev::named_barrier_sync(kBarWarpgroup + wg, 128);
  }

  __device__ __forceinline__ int valid_in(const RequestView& r, int unit) const {
    return min(Cfg::kBlockN, r.seqlen - unit * Cfg::kBlockN);
  }

  // Warpgroup 0, one pair of tiles (even tile `e` in buffer 0, odd tile e + 1 in buffer 1).
  // On entry st.s holds S of tile e; on exit S of tile e + 2 (if any), all products retired.
  template <bool kHasOdd, bool kNextEven, bool kNextOdd>
  __device__ __forceinline__ void even_pair(State& st, const RequestView& r, int e) const {
    const bool issuer = wtid == 0;
    int next_even_page = 0, next_odd_page = 0;  // read ahead: their latency hides behind the softmax
    if (issuer) {
      if (kNextEven) next_even_page = page_of(r, e + 2);
      if (kNextOdd) next_odd_page = page_of(r, e + 3);
    }

    // Softmax of the even tile against the running max.
    float block_max[2], base[2], scale[2], sum[2];
    mask_and_max(st, r, e, block_max);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float new_m = fmaxf(st.m[h], block_max[h]);
      base[h] = base_of(new_m);
      scale[h] = exp2f(st.m[h] - base[h]);
      st.m[h] = new_m;
      if (lane % 4 == 0) smem.max_even[rows[h]] = new_m;
    }
    dev::named_barrier_arrive(kBarEvenMax, Cfg::kThreads);
    exponentiate(st, base, sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * scale[h] + sum[h];
    scale_o(st, scale);

    // O_left += P_even V_even,left.
    if (valid_in(r, e) < Cfg::kBlockN) zero_v_tail(0, valid_in(r, e));
    issue_pv_own(st, 0);
    warpgroup_wait<0>();
    warpgroup_fence_operand(st.o);

    // Also when there is no odd tile: warpgroup 1 arrives only after retiring its products of the
    // previous pair, one of which reads p_even, which is overwritten below.
    dev::named_barrier_sync(kBarOddMax, Cfg::kThreads);
    float odd_scale[2] = {1.f, 1.f};
    if constexpr (kHasOdd) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float odd_m = smem.max_odd[rows[h]];
        odd_scale[h] = exp2f(st.m[h] - base_of(odd_m));
        st.m[h] = odd_m;
      }
    }
    // Buffer 0's left half is free: S of tile e and this product were its only readers.
    if (kNextEven && issuer) load_k<0, Cfg::kVHalfChunks>(r, 0, e + 2, next_even_page);

    // P_even, brought to the odd tile's max, for warpgroup 1.
    if constexpr (kHasOdd) {
      auto* pairs = reinterpret_cast<typename Native::pair*>(raw_pointer_cast(st.p.data()));
      CUTE_UNROLL
      for (int i = 0; i < size(st.s); i += 2) {
        const float f = odd_scale[(i / 2) % 2];
        pairs[i / 2] = Native::make(st.s(i) * f, st.s(i + 1) * f);
      }
    }
    store_p(st, smem.p_even);
    dev::fence_proxy_async_smem();
    dev::named_barrier_arrive(kBarEvenP, Cfg::kThreads);

    // O_left = O_left * odd_scale + P_odd V_odd,left.
    if constexpr (kHasOdd) {
      dev::named_barrier_sync(kBarOddP, Cfg::kThreads);
      if (valid_in(r, e + 1) < Cfg::kBlockN) zero_v_tail(1, valid_in(r, e + 1));
#pragma unroll
      for (int h = 0; h < 2; ++h) st.l[h] *= odd_scale[h];
      scale_o(st, odd_scale);
      issue_pv_other(st, 1, smem.q + Cfg::kRopeChunk * kChunkElems);
    }

    // S of tile e + 2; its left half was issued first, so start there.
    if constexpr (kNextEven) {
      issue_s<0, Cfg::kVHalfChunks, true>(st, 0);
      if constexpr (kNextOdd) {
        warpgroup_wait<Cfg::kVHalfChunks>();  // retires P_odd V_odd,left: buffer 1's left half is free
        if (issuer) load_k<0, Cfg::kVHalfChunks>(r, 1, e + 3, next_odd_page);
      }
      issue_s<Cfg::kVHalfChunks, Cfg::kChunks - Cfg::kVHalfChunks, false>(st, 0);
      st.k_phase ^= 1;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(st.s);
    warpgroup_fence_operand(st.o);
  }

  // Warpgroup 1, the same pair. On entry st.s holds S of tile e + 1 (if it exists).
  template <bool kHasOdd, bool kNextEven, bool kNextOdd>
  __device__ __forceinline__ void odd_pair(State& st, const RequestView& r, int e) const {
    const bool issuer = wtid == 0;
    int next_even_page = 0, next_odd_page = 0;
    if (issuer) {
      if (kNextEven) next_even_page = page_of(r, e + 2);
      if (kNextOdd) next_odd_page = page_of(r, e + 3);
    }

    float scale[2];
    dev::named_barrier_sync(kBarEvenMax, Cfg::kThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float even_m = smem.max_even[rows[h]];
      scale[h] = exp2f(st.m[h] - base_of(even_m));
      st.m[h] = even_m;
    }
    if constexpr (kHasOdd) {
      float block_max[2], base[2], sum[2];
      mask_and_max(st, r, e + 1, block_max);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float new_m = fmaxf(st.m[h], block_max[h]);
        base[h] = base_of(new_m);
        scale[h] *= exp2f(st.m[h] - base[h]);
        st.m[h] = new_m;
        if (lane % 4 == 0) smem.max_odd[rows[h]] = new_m;
      }
      dev::named_barrier_arrive(kBarOddMax, Cfg::kThreads);
      exponentiate(st, base, sum);
#pragma unroll
      for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * scale[h] + sum[h];
      scale_o(st, scale);
      // P_odd goes where Q's RoPE chunk was (this request's copy of it is in registers).
      store_p(st, smem.q + Cfg::kRopeChunk * kChunkElems);
      if (valid_in(r, e + 1) < Cfg::kBlockN) zero_v_tail(1, valid_in(r, e + 1));
      dev::fence_proxy_async_smem();
      issue_pv_own(st, 1);  // O_right += P_odd V_odd,right
    } else {
      dev::named_barrier_arrive(kBarOddMax, Cfg::kThreads);
#pragma unroll
      for (int h = 0; h < 2; ++h) st.l[h] *= scale[h];
      scale_o(st, scale);
    }

    // O_right += P_even V_even,right.
    dev::named_barrier_sync(kBarEvenP, Cfg::kThreads);
    if (valid_in(r, e) < Cfg::kBlockN) zero_v_tail(0, valid_in(r, e));
    issue_pv_other(st, 0, smem.p_even);
    if constexpr (kHasOdd) dev::named_barrier_arrive(kBarOddP, Cfg::kThreads);

    // The right halves are free once their last product retires.
    if constexpr (kNextOdd) {
      warpgroup_wait<1>();
      if (issuer) load_k<Cfg::kVHalfChunks, Cfg::kChunks>(r, 1, e + 3, next_odd_page);
    }
    if constexpr (kNextEven) {
      warpgroup_wait<0>();
      if (issuer) load_k<Cfg::kVHalfChunks, Cfg::kChunks>(r, 0, e + 2, next_even_page);
    }
    // S of tile e + 3: its right half was issued first.
    if constexpr (kNextOdd) {
      issue_s<Cfg::kVHalfChunks, Cfg::kChunks, true>(st, 1);
      st.k_phase ^= 1;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(st.s);
    warpgroup_fence_operand(st.o);
  }

  template <bool kHasOdd, bool kNextEven, bool kNextOdd>
  __device__ __forceinline__ void pair(State& st, const RequestView& r, int e) const {
    if (wg == 0)
      even_pair<kHasOdd, kNextEven, kNextOdd>(st, r, e);
    else
      odd_pair<kHasOdd, kNextEven, kNextOdd>(st, r, e);
  }

  __device__ __forceinline__ int next_nonempty(int req, int end_req) const {
    while (req <= end_req && p.seqlens[req] <= 0) ++req;
    return req;
  }

  __device__ __forceinline__ void run(const detail::PartMetadata& meta) {
    State st;
    int req_token[2], req_head[2];
    bool row_valid[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) row_valid[h] = p.tiling.row(m_tile, rows[h], req_token[h], req_head[h]);
    const float kLn2 = 0.69314718055994530942f;

    // The request whose Q and first K tiles were issued last (requests with no key load nothing).
    int loaded = next_nonempty(meta.begin_req, meta.end_req);
    if (threadIdx.x == 0 && loaded <= meta.end_req) load_request(loaded, view(loaded, meta));

    int parity = 0;  // row_sum is double-buffered by request
    for (int req = meta.begin_req; req <= meta.end_req; ++req, parity ^= 1) {
      const RequestView r = view(req, meta);
      const bool split = p.req_num_splits[req] > 1;
      const int split_idx = req == meta.begin_req ? meta.begin_split_idx : 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st.m[h] = -INFINITY;
        st.l[h] = 0.f;
      }
      clear(st.o);

      if (r.seqlen > 0) {
        dev::mbar_wait(&smem.q_full, st.q_phase);
        st.q_phase ^= 1;
        {
          Tensor sQrope = make_tensor(make_smem_ptr(smem.q + Cfg::kRopeChunk * kChunkElems),
                                      typename Cfg::SmemLayoutChunk{});
          auto copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, typename Cfg::MmaSRegQ{});
          auto thr = copy_q.get_slice(wtid);
          copy(copy_q, thr.partition_S(sQrope), thr.retile_D(st.q_rope));
        }
        // S of the first tile of each warpgroup (both were loaded by load_request).
        if (wg == 0 || r.unit_begin + 1 < r.unit_end) {
          issue_s<0, Cfg::kChunks, true>(st, wg);
          st.k_phase ^= 1;
          warpgroup_wait<0>();
          warpgroup_fence_operand(st.s);
        }

        for (int e = r.unit_begin; e < r.unit_end; e += 2) {
          if (e + 3 < r.unit_end)
            pair<true, true, true>(st, r, e);
          else if (e + 2 < r.unit_end)
            pair<true, true, false>(st, r, e);
          else if (e + 1 < r.unit_end)
            pair<true, false, false>(st, r, e);
          else
            pair<false, false, false>(st, r, e);
        }
      }

      // Row sums: over the quad, then over the two warpgroups.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
        st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
        if (lane % 4 == 0) smem.row_sum[parity][wg][rows[h]] = st.l[h];
      }
      __syncthreads();  // also: every product and read of this request's shared memory is done
      {
        const int next = next_nonempty(req + 1, meta.end_req);
        if (next <= meta.end_req && next != loaded) {
          if (threadIdx.x == 0) load_request(next, view(next, meta));
          loaded = next;
        }
      }
      float inv[2], lse[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float total = smem.row_sum[parity][0][rows[h]] + smem.row_sum[parity][1][rows[h]];
        const bool any = total > 0.f;
        inv[h] = any ? 1.f / total : 0.f;
        // Natural-log LSE of the scaled scores; a piece with no key is -inf for the combine, a
        // whole request with no key is +inf by the contract.
        lse[h] = any ? st.m[h] * kLn2 + logf(total) : (split ? -INFINITY : INFINITY);
      }
      const int col_base = wg * (Cfg::kHeadDimV / 2);

      if (split) {
        const int slot = p.req_split_base[req] + split_idx;
        const size_t rows_per_slot = static_cast<size_t>(p.h_kv) * p.tiling.num_m_blocks * detail::kTileRows;
        const size_t row0 = static_cast<size_t>(slot) * rows_per_slot +
                            (static_cast<size_t>(kv) * p.tiling.num_m_blocks + m_tile) * detail::kTileRows;
        CUTE_UNROLL
        for (int i = 0; i < size(st.o); i += 2) {
          const int h = (i / 2) % 2;
          if (!row_valid[h]) continue;
          float2 v = make_float2(st.o(i) * inv[h], st.o(i + 1) * inv[h]);
          *reinterpret_cast<float2*>(p.o_accum + (row0 + rows[h]) * Cfg::kHeadDimV + col_base + frag_col(i, lane)) = v;
        }
        if (wg == 0 && lane % 4 == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (row_valid[h]) p.lse_accum[row0 + rows[h]] = lse[h];
        }
      } else {
        typename Native::type* out_rows[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int head = kv * p.tiling.heads_per_kv + req_head[h];
          out_rows[h] = static_cast<typename Native::type*>(p.out) + req * p.out_batch_stride +
                        req_token[h] * p.out_token_stride + head * p.out_head_stride + col_base;
        }
        CUTE_UNROLL
        for (int i = 0; i < size(st.o); i += 2) {
          const int h = (i / 2) % 2;
          if (!row_valid[h]) continue;
          *reinterpret_cast<typename Native::pair*>(out_rows[h] + frag_col(i, lane)) =
              Native::make(st.o(i) * inv[h], st.o(i + 1) * inv[h]);
        }
        if (wg == 0 && lane % 4 == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (!row_valid[h]) continue;
            const int head = kv * p.tiling.heads_per_kv + req_head[h];
            p.lse[req * p.lse_batch_stride + head * p.lse_head_stride + req_token[h]] = lse[h];
          }
        }
      }
    }
  }
};

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dense_decode_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                        const KernelParams p) {
  extern __shared__ char smem_raw[];
  // Round up to 1024 bytes by offsetting the shared array itself: a pointer rebuilt from an integer
  // would lose its address space and turn every access into a generic load or store.
  const uint32_t misalign = dev::smem_addr(smem_raw) & 1023u;
  auto& smem = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw + ((1024u - misalign) & 1023u));

  // The combine kernel may start its launch now; it waits for this grid's completion itself.
  dev::pdl_launch_dependents();

  if (threadIdx.x == 0) {
    dev::tma_prefetch_descriptor(&q_map);
    dev::tma_prefetch_descriptor(&k_map);
    dev::mbar_init(&smem.q_full, 1);
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < Cfg::kChunks; ++c) dev::mbar_init(&smem.k_full[b][c], 1);
    dev::fence_barrier_init();
  }
  // Query rows that no TMA box covers stay zero, so padding rows compute on zeros, not on
  // whatever the shared memory held before (later requests leave P values, never NaN, in the
  // RoPE chunk's padding rows).
  const int box_rows = p.tiling.heads_per_tile * p.tiling.tokens_per_tile;
  if (box_rows < Cfg::kBlockM) {
    for (int c = 0; c < Cfg::kChunks; ++c) {
      char* start = reinterpret_cast<char*>(smem.q + c * Cfg::kChunkElems + box_rows * Cfg::kChunkCols);
      const int bytes = (Cfg::kBlockM - box_rows) * Cfg::kChunkCols * 2;
      for (int off = threadIdx.x * 16; off < bytes; off += Cfg::kThreads * 16)
        *reinterpret_cast<uint4*>(start + off) = make_uint4(0, 0, 0, 0);
    }
    dev::fence_proxy_async_smem();
  }
  __syncthreads();

  // Grid (query tile, kv head, part): the query tiles of one part are neighbours in launch order and
  // stream the same K tiles at the same time, so all but the first find them in L2.
  const detail::PartMetadata meta = p.parts[blockIdx.z];
  if (meta.begin_req >= p.batch) return;

  Kernel<Cfg> k{smem, p, &q_map, &k_map, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x)};
  k.wg = threadIdx.x / 128;
  k.wtid = threadIdx.x % 128;
  k.warp_in_wg = k.wtid / 32;
  k.lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) k.rows[h] = frag_row(2 * h, k.warp_in_wg, k.lane);
  k.run(meta);
}

// K is read once per query tile: with one tile per kv head nothing reuses it, so it goes first out
// of L2; with several, the other tiles' CTAs want it soon after the first one fetched it.
// HMLA_K_L2_POLICY=first|last|normal overrides the choice (for measurements).
inline uint64_t k_l2_policy(int num_m_blocks) {
  static const char* forced = std::getenv("HMLA_K_L2_POLICY");
  if (forced != nullptr) {
    if (std::strcmp(forced, "first") == 0) return dev::kL2EvictFirst;
    if (std::strcmp(forced, "last") == 0) return dev::kL2EvictLast;
    if (std::strcmp(forced, "normal") == 0) return dev::kL2EvictNormal;
  }
  return num_m_blocks > 1 ? dev::kL2EvictNormal : dev::kL2EvictFirst;
}

template <typename Element>
void launch(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  using Cfg = Config<Element>;
  using Native = typename NativeOf<Element>::type;
  const int heads_per_kv = params.h_q / params.h_kv;
  const detail::RowTiling tiling = detail::RowTiling::make(params.s_q, heads_per_kv);

  // Q as [batch][s_q][h_kv][heads_per_kv][576] so that one box is a tile of query rows.
  const uint64_t q_dims[5] = {static_cast<uint64_t>(Cfg::kHeadDim), static_cast<uint64_t>(heads_per_kv),
                              static_cast<uint64_t>(params.h_kv), static_cast<uint64_t>(params.s_q),
                              static_cast<uint64_t>(params.batch)};
  const uint64_t q_strides[4] = {static_cast<uint64_t>(params.q_head_stride) * 2,
                                 static_cast<uint64_t>(params.q_head_stride) * heads_per_kv * 2,
                                 static_cast<uint64_t>(params.q_token_stride) * 2,
                                 static_cast<uint64_t>(params.q_batch_stride) * 2};
  const uint32_t q_box[5] = {static_cast<uint32_t>(Cfg::kChunkCols), static_cast<uint32_t>(tiling.heads_per_tile), 1,
                             static_cast<uint32_t>(tiling.tokens_per_tile), 1};
  const CUtensorMap q_map = detail::make_tensor_map_16bit_sw128(params.q, 5, q_dims, q_strides, q_box, "q");

  // K cache as [num_blocks][page_size][h_kv][576].
  const uint64_t k_dims[4] = {static_cast<uint64_t>(Cfg::kHeadDim), static_cast<uint64_t>(params.h_kv),
                              static_cast<uint64_t>(params.page_size), static_cast<uint64_t>(params.num_blocks)};
  const uint64_t k_strides[3] = {static_cast<uint64_t>(params.k_head_stride) * 2,
                                 static_cast<uint64_t>(params.k_token_stride) * 2,
                                 static_cast<uint64_t>(params.k_block_stride) * 2};
  const uint32_t k_box[4] = {static_cast<uint32_t>(Cfg::kChunkCols), 1,
                             static_cast<uint32_t>(params.page_size < Cfg::kBlockN ? params.page_size : Cfg::kBlockN), 1};
  const CUtensorMap k_map = detail::make_tensor_map_16bit_sw128(params.k_cache, 4, k_dims, k_strides, k_box, "k_cache");

  KernelParams kp{};
  kp.batch = params.batch;
  kp.s_q = params.s_q;
  kp.h_kv = params.h_kv;
  kp.page_size = params.page_size;
  kp.causal = params.causal && params.s_q > 1;
  const float scale = params.softmax_scale > 0.f ? params.softmax_scale : 1.f / std::sqrt(static_cast<float>(params.d_qk));
  kp.scale_log2 = scale * 1.4426950408889634f;
  kp.k_l2_policy = k_l2_policy(tiling.num_m_blocks);
  kp.tiling = tiling;
  kp.seqlens = params.cache_seqlens;
  kp.block_table = params.block_table;
  kp.block_table_batch_stride = params.block_table_batch_stride;
  kp.parts = reinterpret_cast<const detail::PartMetadata*>(schedule.tile_metadata);
  kp.req_num_splits = schedule.num_splits;
  kp.req_split_base = schedule.split_base;
  kp.lse_accum = schedule.lse_accum;
  kp.o_accum = schedule.o_accum;
  kp.out = params.out;
  kp.out_batch_stride = params.out_batch_stride;
  kp.out_token_stride = params.out_token_stride;
  kp.out_head_stride = params.out_head_stride;
  kp.lse = params.lse;
  kp.lse_batch_stride = params.lse_batch_stride;
  kp.lse_head_stride = params.lse_head_stride;

  auto kernel = dense_decode_kernel<Cfg>;
  // The shared-memory opt-in is per device; remember which devices have it (racing threads at
  // worst both set it, which is harmless).
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> configured[kMaxDevices] = {};
  int device = 0;
  HMLA_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices || !configured[device].load(std::memory_order_acquire)) {
    HMLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    if (device < kMaxDevices) configured[device].store(true, std::memory_order_release);
  }
  dim3 grid(tiling.num_m_blocks, params.h_kv, schedule.num_sm_parts);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(q_map, k_map, kp);
  HMLA_CUDA_CHECK(cudaGetLastError());

  detail::CombineParams cp{};
  cp.batch = params.batch;
  cp.h_kv = params.h_kv;
  cp.d_v = Cfg::kHeadDimV;
  cp.num_sm_parts = schedule.num_sm_parts;
  cp.tiling = tiling;
  cp.req_num_splits = schedule.num_splits;
  cp.req_split_base = schedule.split_base;
  cp.split_list = schedule.split_list;
  cp.lse_accum = schedule.lse_accum;
  cp.o_accum = schedule.o_accum;
  cp.out = params.out;
  cp.out_batch_stride = params.out_batch_stride;
  cp.out_token_stride = params.out_token_stride;
  cp.out_head_stride = params.out_head_stride;
  cp.lse = params.lse;
  cp.lse_batch_stride = params.lse_batch_stride;
  cp.lse_head_stride = params.lse_head_stride;
  detail::launch_combine<Native>(cp, stream);
}

}  // namespace hmla::sm90::dense_decode
