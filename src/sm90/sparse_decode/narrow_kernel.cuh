// The narrow form of the sm90 token-sparse decode kernel, for h_q <= 32 (NarrowConfigT in config.h,
// docs/SPARSE_DECODE.md "Narrow form"): the heads are wgmma's N, so one consumer warpgroup holds all
// of O^T and two warpgroups gather. The producers and the Q handling are kernel.cuh's; the consumer
// is here. Included by the narrow instantiation files, one per FP8 layout.
#pragma once

#include "sm90/sparse_decode/kernel.cuh"

namespace hmla::sm90::sparse_decode {

// Named barriers of the consumer's four warps (0 is __syncthreads).
constexpr int kBarrierNarrowMax = 1;  // every warp's maxima of the tile are in shared memory
constexpr int kBarrierNarrowP = 2;    // P^T is in shared memory; at a request's end, the sums

__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

// The consumer warpgroup: S^T = K Q^T, the softmax down each head's column, P^T, O^T += V^T P^T, the
// epilogue. A thread's S^T fragment (64 x kHeads) holds 2 tokens of kHeads / 4 heads; its O^T
// fragment the same kHeads / 4 heads at 16 output columns (two rows in each of the eight wgmma rows of
// 64). Column slot c of a thread is head 8 (c / 2) + 2 (lane % 4) + c % 2, the same in both.
template <typename Cfg>
__device__ void narrow_consumer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p, const CUtensorMap* q_map,
                                     const detail::PartMetadata& meta) {
  constexpr int kHeads = Cfg::kHeads;
  constexpr int kSlots = kHeads / 4;
  constexpr int kFragS = kHeads / 2;  // values of one 64-row wgmma fragment
  const int ctid = threadIdx.x - Cfg::kProducerThreads;
  const int warp = ctid / 32;
  const int lane = ctid % 32;
  const float kLn2 = 0.69314718055994530942f;

  typename Cfg::MmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(ctid);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemLayoutQ{});
  Tensor tSrQ = thr_s.partition_fragment_B(sQ);
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<Cfg::kBlockN>, Int<kHeads>>{});
  static_assert(decltype(size(tSrS))::value == kFragS, "S^T fragment: 64 x kHeads per warpgroup");

  typename Cfg::MmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(ctid);
  Tensor sP = make_tensor(make_smem_ptr(smem.p), typename Cfg::SmemLayoutP{});
  Tensor tOrP = thr_o.partition_fragment_B(sP);
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<Cfg::kHeadDimV>, Int<kHeads>>{});
  static_assert(decltype(size(tOrO))::value == kFragS * (Cfg::kHeadDimV / 64), "O^T fragment: 512 x kHeads");

  const auto slot_of = [](int j) { return 2 * (j / 4) + j % 2; };
  int head_of[kSlots];
#pragma unroll
  for (int c = 0; c < kSlots; ++c) head_of[c] = 8 * (c / 2) + 2 * (lane % 4) + c % 2;
  // Where P^T(head, token) of each S^T value goes, computed once: SmemLayoutP is 8-row atoms of
  // 128-byte rows (one row per head, 64 tokens) whose 16-byte groups are swizzled by row % 8. (The
  // layout's own index function leaves the swizzle to the pointer it is made with, so it is spelled
  // out here.)
  static_assert(Cfg::kBlockN * 2 == 128, "one 128-byte swizzle row per head");
  uint32_t p_addr[kFragS];
#pragma unroll
  for (int j = 0; j < kFragS; ++j) {
    const int head = head_of[slot_of(j)], token = frag_row(j, warp, lane);
    p_addr[j] = dev::smem_addr(smem.p) + (head / 8) * 1024 + (head % 8) * 128 + (((token / 8) ^ (head % 8)) << 4) +
                (token % 8) * 2;
  }

  int g = 0;  // tiles consumed by this CTA: stage g % 2, phase (g / 2) % 2
  uint32_t q_phase = 0;
  uint32_t conv_phase = 0;
  int q_loaded = -1;
  for (int r = meta.begin_req; r <= meta.end_req; ++r) {
    const Request q = request_of(p, meta, r);
    const bool split = p.req_num_splits[r] > 1;
    const int slot = split ? p.req_split_base[r] + (r == meta.begin_req ? meta.begin_split_idx : 0) : 0;
    float row_m[kSlots], row_l[kSlots];
#pragma unroll
    for (int c = 0; c < kSlots; ++c) row_m[c] = -INFINITY, row_l[c] = 0.f;
    clear(tOrO);
    if (q.tiles > 0) {
      if (q_loaded != r && ctid == 0) issue_q<Cfg>(smem, q_map, p, q, 0);
      q_loaded = r;
      dev::mbar_wait(&smem.q_full, q_phase);
      q_phase ^= 1;
      const float score_scale = p.scale_log2 * convert_q_to_half<Cfg, Cfg::kConsumerThreads>(smem, ctid, conv_phase);
      for (int u = q.u0; u < q.u1; ++u, ++g) {
        const int stage = g % Cfg::kStages;
        const uint32_t phase = (g / Cfg::kStages) & 1;
        const bool last = u + 1 == q.u1;
        Tensor sK = make_tensor(make_smem_ptr(smem.k[stage]), typename Cfg::SmemLayoutK{});
        Tensor tSrK = thr_s.partition_fragment_A(sK);
        // Every warp retires the previous P V here, before the max barrier below: P^T is rewritten
        // only once no warp's part of that P V still reads it.
        release_previous_stage<Cfg>(smem, stage, u > q.u0);
        dev::mbar_wait(&smem.k_full[stage], phase);
        dev::fence_proxy_async_smem();  // the producers' st.shared, read by wgmma (kernel.cuh says why here)
        issue_scores<Cfg::kScoreKStepsPerBatch>(mma_s, tSrK, tSrQ, tSrS);
        wait_scores(tSrS, tOrO);
        if (last && r < meta.end_req) {
          if (ctid == 0) {
            const Request next = request_of(p, meta, r + 1);
            if (next.tiles > 0) issue_q<Cfg>(smem, q_map, p, next, 0);
          }
          q_loaded = r + 1;
        }

        // Scores of invalid tokens are -inf (their K rows are zero, which would score 0).
        static_assert(Cfg::kProducerWarps == 8 && Cfg::kTokensPerProducerWarp == 8, "valid words of 8 bits");
        const uint4 w0 = *reinterpret_cast<const uint4*>(&smem.valid[stage][0]);
        const uint4 w1 = *reinterpret_cast<const uint4*>(&smem.valid[stage][4]);
        const uint32_t valid_lo = w0.x | (w0.y << 8) | (w0.z << 16) | (w0.w << 24);
        const uint32_t valid_hi = w1.x | (w1.y << 8) | (w1.z << 16) | (w1.w << 24);
        const uint64_t valid = static_cast<uint64_t>(valid_lo) | (static_cast<uint64_t>(valid_hi) << 32);
        float tile_max[kSlots];
#pragma unroll
        for (int c = 0; c < kSlots; ++c) tile_max[c] = -INFINITY;
        CUTE_UNROLL
        for (int j = 0; j < kFragS; ++j) {
          const float s = ((valid >> frag_row(j, warp, lane)) & 1u) ? tSrS(j) * score_scale : -INFINITY;
          tSrS(j) = s;
          tile_max[slot_of(j)] = fmaxf(tile_max[slot_of(j)], s);
        }
#pragma unroll
        for (int c = 0; c < kSlots; ++c) {
          tile_max[c] = fmaxf(tile_max[c], __shfl_xor_sync(0xffffffffu, tile_max[c], 4));
          tile_max[c] = fmaxf(tile_max[c], __shfl_xor_sync(0xffffffffu, tile_max[c], 8));
          tile_max[c] = fmaxf(tile_max[c], __shfl_xor_sync(0xffffffffu, tile_max[c], 16));
        }
        // The maxima are double-buffered by tile parity: a warp writes the next tile's only after
        // every warp has passed this tile's barrier, i.e. read this tile's.
        float(&maxima)[4][kHeads] = smem.warp_max[g & 1];
        if (lane < 4) {
#pragma unroll
          for (int c = 0; c < kSlots; ++c) maxima[warp][head_of[c]] = tile_max[c];
        }
        dev::named_barrier_sync(kBarrierNarrowMax, Cfg::kConsumerThreads);
        float base[kSlots], scale[kSlots];
#pragma unroll
        for (int c = 0; c < kSlots; ++c) {
          const float m = fmaxf(fmaxf(maxima[0][head_of[c]], maxima[1][head_of[c]]),
                                fmaxf(maxima[2][head_of[c]], maxima[3][head_of[c]]));
          const float new_m = fmaxf(row_m[c], m);
          base[c] = new_m == -INFINITY ? 0.f : new_m;  // no key yet: P stays 0
          scale[c] = dev::exp2_ftz(row_m[c] - base[c]);
          row_m[c] = new_m;
          row_l[c] *= scale[c];
        }
        CUTE_UNROLL
        for (int j = 0; j < kFragS; ++j) {
          const float e = dev::exp2_ftz(tSrS(j) - base[slot_of(j)]);
          row_l[slot_of(j)] += e;
          const __half h = __float2half_rn(e);
          st_shared_u16(p_addr[j], *reinterpret_cast<const uint16_t*>(&h));
        }
        // Once the running max settles the scales are exactly 1 on most tiles: skip the multiplies.
        bool rescale = false;
#pragma unroll
        for (int c = 0; c < kSlots; ++c) rescale |= scale[c] != 1.f;
        if (__any_sync(0xffffffffu, rescale)) {
          CUTE_UNROLL
          for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= scale[slot_of(i % kFragS)];
        }
        dev::fence_proxy_async_smem();  // P^T is read by wgmma
        dev::named_barrier_sync(kBarrierNarrowP, Cfg::kConsumerThreads);
        Tensor sVt = make_tensor(make_smem_ptr(smem.k[stage]), typename Cfg::SmemLayoutVt{});
        Tensor tOrV = thr_o.partition_fragment_A(sVt);
        issue_mma_batch<false>(mma_o, tOrV, tOrP, tOrO);
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      dev::mbar_arrive(&smem.k_empty[(g - 1) % Cfg::kStages]);
      // A head's denominator: this thread's two tokens per tile, then the warp's, then the four warps'.
#pragma unroll
      for (int c = 0; c < kSlots; ++c) {
        row_l[c] += __shfl_xor_sync(0xffffffffu, row_l[c], 4);
        row_l[c] += __shfl_xor_sync(0xffffffffu, row_l[c], 8);
        row_l[c] += __shfl_xor_sync(0xffffffffu, row_l[c], 16);
      }
      if (lane < 4) {
#pragma unroll
        for (int c = 0; c < kSlots; ++c) smem.warp_sum[warp][head_of[c]] = row_l[c];
      }
      dev::named_barrier_sync(kBarrierNarrowP, Cfg::kConsumerThreads);
#pragma unroll
      for (int c = 0; c < kSlots; ++c)
        row_l[c] = (smem.warp_sum[0][head_of[c]] + smem.warp_sum[1][head_of[c]]) +
                   (smem.warp_sum[2][head_of[c]] + smem.warp_sum[3][head_of[c]]);
    }

    // Epilogue: out (times the sink's factor) or, for a piece of a split request, its slot.
    __nv_bfloat16* dst[kSlots];
    float factor[kSlots];
#pragma unroll
    for (int c = 0; c < kSlots; ++c) {
      const int head = head_of[c];
      // No key: the sum is exactly 0. A NaN sum (a NaN the query attended to) stays NaN.
      const bool any = row_l[c] != 0.f;
      factor[c] = any ? 1.f / row_l[c] : 0.f;
      const float lse = any ? row_m[c] * kLn2 + logf(row_l[c]) : (split ? -INFINITY : INFINITY);
      const bool head_valid = head < p.h_q;
      if (split) {
        const size_t row = static_cast<size_t>(slot) * p.rows_per_slot + head;
        dst[c] = static_cast<__nv_bfloat16*>(p.o_accum) + row * Cfg::kHeadDimV;
        if (ctid < 4 && head_valid) p.lse_accum[row] = lse;
      } else {
        if (p.attn_sink != nullptr && any && head_valid) factor[c] /= 1.f + __expf(p.attn_sink[head] - lse);
        dst[c] = reinterpret_cast<__nv_bfloat16*>(p.out) + q.batch * p.out_batch_stride + q.token * p.out_token_stride +
                 head * p.out_head_stride;
        if (ctid < 4 && head_valid) p.lse[q.batch * p.lse_batch_stride + head * p.lse_head_stride + q.token] = lse;
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); ++i) {
      const int j = i % kFragS, c = slot_of(j);
      const int d = 64 * (i / kFragS) + frag_row(j, warp, lane);
      if (head_of[c] < p.h_q) dst[c][d] = __float2bfloat16_rn(tOrO(i) * factor[c]);
    }
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sparse_decode_narrow_kernel(const __grid_constant__ CUtensorMap q_map, const KernelParams p) {
  HMLA_ALIGNED_SHARED_STORAGE(typename Cfg::SharedStorage, smem);
  const int part = static_cast<int>(blockIdx.z);

  kernel_prologue<Cfg>(smem, &q_map, p);

  const detail::PartMetadata meta = p.parts[part];
  if (meta.begin_req >= p.requests) return;
  if (threadIdx.x < Cfg::kProducerThreads) {
    dev::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if constexpr (Cfg::kTilesInRegisters == 2)
      producer_loop_two_tiles<Cfg>(smem, p, meta);
    else
      producer_loop<Cfg>(smem, p, meta);
  } else {
    dev::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    narrow_consumer_loop<Cfg>(smem, p, &q_map, meta);
  }
}

template <SparseCacheLayout kLayout, int kHeads>
void launch_narrow_kernel(const CUtensorMap& q_map, const KernelParams& params, int num_sm_parts, cudaStream_t stream) {
  using Cfg = NarrowConfig<kLayout, kHeads>;
  auto kernel = sparse_decode_narrow_kernel<Cfg>;
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  detail::launch_after_prerequisites(kernel, dim3(1, 1, num_sm_parts), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream,
                                     q_map, params);
}

}  // namespace hmla::sm90::sparse_decode
