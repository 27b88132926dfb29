// The sm90 dense decode kernel and its CUDA launch (launch_kernel). Included only by the
// instantiation files, one per element type, so the two element types compile in parallel; the host
// side (tensor maps, parameters, the combine) is launch.cu.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/device_attributes.h"
#include "common/device_primitives.cuh"
#include "common/launch.h"
#include "scheduler/decode_schedule.h"
#include "sm90/dense_decode/config.h"
#include "sm90/dense_decode/launch.h"
#include "sm90/dense_decode/trace.cuh"

namespace hmla::sm90::dense_decode {

// Work units of a request, as the plan counts them (a length <= 0 is one unit). Written without
// seqlen + 63, which overflows for lengths near INT_MAX.
__device__ __forceinline__ int units_of(int seqlen) {
  const int blocks = seqlen / detail::kBlockN + (seqlen % detail::kBlockN > 0);
  return blocks > 0 ? blocks : 1;
}

// Keys of a request that are attended: its length clamped to [0, max_keys]. The work units stay
// those of the unclamped length (the plan, which does not know the block table's size, partitioned
// them); tiles past the clamp load nothing and are masked whole.
__device__ __forceinline__ int attended_keys(int seqlen, int max_keys) {
  return seqlen < 0 ? 0 : (seqlen > max_keys ? max_keys : seqlen);
}

// Element i of a thread's wgmma accumulator fragment (64 x N tile of one warpgroup) sits at row
// 16 * warp + lane / 4 + 8 * ((i / 2) % 2) and column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
__device__ __forceinline__ int frag_row(int i, int warp_in_wg, int lane) {
  return 16 * warp_in_wg + lane / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int frag_col(int i, int lane) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

template <typename Cfg>
__device__ __forceinline__ void producer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p,
                                              const CUtensorMap* q_map, const CUtensorMap* k_map,
                                              const detail::PartMetadata& meta, int kv, int m) {
  constexpr int kChunkElems = Cfg::kBlockN * Cfg::kChunkCols;
  const int rows_per_box = p.page_size < Cfg::kBlockN ? p.page_size : Cfg::kBlockN;
  const uint32_t box_bytes = static_cast<uint32_t>(rows_per_box) * Cfg::kChunkCols * 2;
  const uint32_t q_bytes =
      static_cast<uint32_t>(p.tiling.heads_per_tile * p.tiling.tokens_per_tile) * Cfg::kChunkCols * 2 * Cfg::kChunks;
  const int t0 = p.tiling.first_token(m), hh0 = p.tiling.first_head(m);
  int stage = 0, tile = 0;
  uint32_t phase = 0, q_phase = 0;
  for (int req = meta.begin_req; req <= meta.end_req; ++req) {
    // The first request's length comes with the part's metadata: at kernel start, when every CTA
    // loads at once, Q is issued right away and the first page id is the only read before K's.
    const int seqlen = req == meta.begin_req ? meta.begin_seqlen : p.seqlens[req];
    if (seqlen <= 0) continue;
    const int u0 = req == meta.begin_req ? meta.begin_unit : 0;
    const int u1 = req == meta.end_req ? meta.end_unit : units_of(seqlen);
    const int keys = attended_keys(seqlen, p.max_keys);
    const int32_t* table = p.block_table + req * p.block_table_batch_stride;

    dev::mbar_wait(&smem.q_empty, q_phase ^ 1);
    dev::mbar_arrive_expect_tx(&smem.q_full, q_bytes);
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c)
      dev::tma_load_5d(smem.q + c * kChunkElems, q_map, &smem.q_full, c * Cfg::kChunkCols, hh0, kv, t0, req);
    q_phase ^= 1;
    for (int u = u0; u < u1; ++u, ++tile) {
      trace::event(2, tile, trace::kProducerWait);
      dev::mbar_wait(&smem.k_empty[stage], phase ^ 1);
      // At kernel start every CTA loads at once and HBM is the limit: the second tile waits for the
      // first to land, so Q and the first tile, which the first S needs, do not share the burst with
      // a tile that is needed only after the first softmax.
      if (tile == 1) dev::mbar_wait(&smem.k_full[0], 0);
      trace::event(2, tile, trace::kProducerIssue);
      const int token0 = u * Cfg::kBlockN;
      const int valid = min(Cfg::kBlockN, keys - token0);
      // Only pages that hold attended tokens of this request are read; block-table entries past
      // them (or past max_blocks_per_seq) are never looked at. A tile wholly past the clamp loads
      // nothing (its barrier completes on the arrival alone); the consumers mask it whole. A page
      // id outside [0, num_blocks) is a box outside the tensor map: TMA reads no memory and fills
      // the box with zeros, which still count as its bytes.
      const int boxes = valid > 0 ? (valid + rows_per_box - 1) / rows_per_box : 0;
      dev::mbar_arrive_expect_tx(&smem.k_full[stage], box_bytes * boxes * Cfg::kChunks);
      for (int b = 0; b < boxes; ++b) {
        const int token = token0 + b * rows_per_box;
        const int page = table[token / p.page_size];
        const int row = token % p.page_size;
        typename Cfg::Element* dst = smem.k[stage] + b * rows_per_box * Cfg::kChunkCols;
#pragma unroll
        for (int c = 0; c < Cfg::kChunks; ++c)
          dev::tma_load_4d(dst + c * kChunkElems, k_map, &smem.k_full[stage], c * Cfg::kChunkCols, kv, row, page);
      }
      if (++stage == Cfg::kStages) { stage = 0; phase ^= 1; }
    }
  }
}

#ifdef HMLA_DENSE_TRACE
// Trace builds: a spare producer warp records when each K tile lands (it only watches k_full).
template <typename Cfg>
__device__ void observer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p,
                              const detail::PartMetadata& meta) {
  int stage = 0, tile = 0;
  uint32_t phase = 0;
  for (int req = meta.begin_req; req <= meta.end_req; ++req) {
    const int seqlen = p.seqlens[req];
    if (seqlen <= 0) continue;
    const int u0 = req == meta.begin_req ? meta.begin_unit : 0;
    const int u1 = req == meta.end_req ? meta.end_unit : units_of(seqlen);
    for (int u = u0; u < u1; ++u, ++tile) {
      if (!trace::observe(&smem.k_full[stage], phase)) return;
      trace::event(2, tile, trace::kLanded);
      if (++stage == Cfg::kStages) { stage = 0; phase ^= 1; }
    }
  }
}
#endif

// Named barriers of the consumers (0 is __syncthreads).
// Both consumers, once part q of the scorer's P (and, with part 0, its statistics) is in smem:
// kBarrierP + stage * kPParts + q.
constexpr int kBarrierP = 1;
// + stage: the non-scorer has issued its last P V (it arrives, the scorer waits).
template <typename Cfg>
constexpr int kBarrierPvOrder = kBarrierP + Cfg::kStages * Cfg::kPParts;
template <typename Cfg>
constexpr int kBarrierWarpgroup = kBarrierPvOrder<Cfg> + Cfg::kStages;  // + warpgroup: one consumer's 128 threads
static_assert(kBarrierWarpgroup<Config<cute::half_t>> + 2 <= 16, "named barrier ids");

// A row's reference max (log2 domain) moves only when a score exceeds it by more than this: P is
// then at most 2^8, exact in bf16/fp16 and harmless in the fp32 sums.
constexpr float kLazyMaxMargin = 8.f;

// Zeroes the V rows [valid, 64) of a tail tile: those cache rows lie past the request's end and may
// hold anything (NaN in the tests); P is 0 there but 0 * NaN is NaN. The scorer zeroes all 512
// columns once its S has retired, and the tile's first P barrier publishes them to both consumers.
// (Each consumer zeroing its own V half after that barrier needed one more barrier of its own
// warpgroup on tail tiles only; with that one-sided barrier in a part holding several requests,
// racecheck reported hazards on the softmax statistics; docs/DENSE_DECODE.md, known limits.)
template <typename Cfg>
__device__ __forceinline__ void zero_tail_rows(typename Cfg::Element* tile, int valid, int wtid) {
  constexpr int kChunkElems = Cfg::kBlockN * Cfg::kChunkCols;
  constexpr int kVChunks = Cfg::kHeadDimV / Cfg::kChunkCols;
  const int bytes_per_chunk = (Cfg::kBlockN - valid) * Cfg::kChunkCols * 2;
#pragma unroll
  for (int c = 0; c < kVChunks; ++c) {
    char* start = reinterpret_cast<char*>(tile + c * kChunkElems + valid * Cfg::kChunkCols);
    for (int off = wtid * 16; off < bytes_per_chunk; off += 128 * 16)
      *reinterpret_cast<uint4*>(start + off) = make_uint4(0, 0, 0, 0);
  }
}

template <typename Cfg>
__device__ __forceinline__ void consumer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p,
                                              const detail::PartMetadata& meta, int kv, int m) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using Native = NativeOf<Element>;
  constexpr int kChunkElems = Cfg::kBlockN * Cfg::kChunkCols;
  const int ctid = threadIdx.x - 128;  // 0..255 over both consumer warpgroups
  const int wg = ctid / 128;  // consumer index: scores tiles g with g % 2 == wg
  const int wtid = ctid % 128;
  const int warp_in_wg = wtid / 32;
  const int lane = threadIdx.x % 32;
  const float kLn2 = 0.69314718055994530942f;

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemLayoutQ{});
  typename Cfg::MmaS mma_s;
  typename Cfg::MmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(wtid);
  auto thr_o = mma_o.get_thread_slice(ctid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);
  typename Cfg::MmaSr mma_sr;
  auto thr_sr = mma_sr.get_thread_slice(wtid);
  constexpr int kKStepsPerChunk = Cfg::kChunkCols / 16;
  constexpr int kSmemKSteps = Cfg::kQSmemChunks * kKStepsPerChunk;
  // Registers of the last Q chunks: the RS A fragment of a (64, 64 * kQRegChunks) slice.
  Tensor tSrQr = thr_sr.partition_fragment_A(make_tensor(
      make_smem_ptr(smem.q + Cfg::kQSmemChunks * kChunkElems),
      tile_to_shape(typename Cfg::SmemAtom{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kQRegChunks * Cfg::kChunkCols>>{})));
  static_assert(decltype(size<2>(tSrQr))::value == Cfg::kQRegChunks * kKStepsPerChunk, "Q register k-steps");
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<Cfg::kBlockM>, Int<Cfg::kBlockN>>{});
  Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDimV>>{});
  static_assert(decltype(size(tSrS))::value == 32, "S fragment: 64 x 64 per warpgroup");
  static_assert(decltype(size(tOrO))::value == 128, "O fragment: 64 x 256 per warpgroup");

  // The two rows this thread holds in every accumulator, and their query token.
  int rows[2], row_token[2], row_head[2];
  bool row_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows[h] = frag_row(2 * h, warp_in_wg, lane);
    row_valid[h] = p.tiling.row(m, rows[h], row_token[h], row_head[h]);
  }
  // Fragment element i of S holds key 8 (i / 4) + 2 (lane % 4) + i % 2, so P part q (keys
  // [q, q + 1) * kPartKeys) is elements [q, q + 1) * kPartKeys / 2, and P V k-step k covers keys
  // [16 k, 16 k + 16).
  constexpr int kPartKeys = Cfg::kBlockN / Cfg::kPParts;
  constexpr int kPartElems = kPartKeys / 2;
  constexpr int kPartKSteps = kPartKeys / 16;
  const int tile_first_token = p.tiling.first_token(m);
  const int col_base_o = wg * (Cfg::kHeadDimV / 2);

  int g = 0;  // tiles consumed so far by this CTA: stage g % 2, scorer g % 2, phase (g / 2) % 2
  uint32_t q_phase = 0;
  int sum_slot = 0;  // row-sum shares slot of the current request: alternates between requests
  for (int req = meta.begin_req; req <= meta.end_req; ++req) {
    const int seqlen = req == meta.begin_req ? meta.begin_seqlen : p.seqlens[req];
    const bool split = p.req_num_splits[req] > 1;
    const int split_base = p.req_split_base[req];  // loaded now, used by the epilogue
    const int split_idx = req == meta.begin_req ? meta.begin_split_idx : 0;
    const int u0 = req == meta.begin_req ? meta.begin_unit : 0;
    const int u1 = req == meta.end_req ? meta.end_unit : units_of(seqlen);

    // Keys visible to each of this thread's rows (causal: query i sees s_k - s_q + i + 1 keys), of
    // the request's attended keys (its length clamped to what the block table holds).
    const int keys = attended_keys(seqlen, p.max_keys);
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) limit[h] = p.causal ? keys - p.s_q + row_token[h] + 1 : keys;
    const int mask_from = p.causal ? keys - p.s_q + tile_first_token + 1 : keys;

    // Reference max (log2 domain of the scaled scores) and row sum, identical in both consumers.
    float row_m[2] = {-INFINITY, -INFINITY};
    float row_l[2] = {0.f, 0.f};
    // This lane's share of each row sum: the P sums of the tiles this warpgroup scored (its lane's
    // columns), carried through every tile's scale. The two warpgroups' shares meet once per
    // request, through the last tile's P barrier, instead of a store and a load on every tile.
    float sum_share[2] = {0.f, 0.f};
    clear(tOrO);

    if (seqlen > 0) {
      dev::mbar_wait(&smem.q_full, q_phase);
      q_phase ^= 1;
      // Fragment element v of k-step ks: row 16 * warp + lane / 4 + 8 * (v / 2 % 2), column
      // 16 * ks + 2 * (lane % 4) + v % 2 + 8 * (v / 4); pairs of columns are one 32-bit word of
      // the 128-byte-swizzled chunk (16-byte group j of row r at j ^ (r % 8)).
      CUTE_UNROLL
      for (int ks = 0; ks < size<2>(tSrQr); ++ks) {
        const int chunk = Cfg::kQSmemChunks + ks / kKStepsPerChunk;
        const int col = (ks % kKStepsPerChunk) * 16 + 2 * (lane % 4);
        CUTE_UNROLL
        for (int v = 0; v < 8; v += 2) {
          const int row = 16 * warp_in_wg + lane / 4 + 8 * ((v / 2) % 2);
          const int c = col + 8 * (v / 4);
          const uint32_t addr = dev::smem_addr(smem.q + chunk * kChunkElems) + row * 128 +
                                ((((c * 2) / 16) ^ (row % 8)) << 4) + (c * 2) % 16;
          const uint32_t word = dev::ld_shared_u32(addr);
          tSrQr(v, 0, ks) = Element::bitcast(static_cast<uint16_t>(word & 0xffffu));
          tSrQr(v + 1, 0, ks) = Element::bitcast(static_cast<uint16_t>(word >> 16));
        }
      }
      for (int u = u0; u < u1; ++u, ++g) {
        const int stage = g & 1;
        const uint32_t phase = (g >> 1) & 1;
        Element* tile = smem.k[stage];
        Element* p_tile = tile + Cfg::kPChunk * kChunkElems;
        const int token0 = u * Cfg::kBlockN;
        const int valid = max(0, min(Cfg::kBlockN, keys - token0));
        float scale[2];
        // The scorer's state between the parts of its softmax: the reference P is taken against,
        // where its rows of P go, and each part's row sums (chain q holds part q's keys when there
        // are four parts; the sum order is the same for any number of parts).
        float base[2], sum4[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        uint32_t p_row_addr[2];
        const bool scorer = stage == wg;
        // The scorer's exponentials of P part q (keys [q, q + 1) * kPartKeys), stored to shared memory.
        auto exponentiate_part = [&](auto part) {
          constexpr int q = decltype(part)::value;
          CUTE_UNROLL
          for (int i = q * kPartElems; i < (q + 1) * kPartElems; i += 2) {
            const int h = (i / 2) % 2;
            const float a = dev::exp2_ftz(tSrS(i) * p.scale_log2 - base[h]);
            const float b = dev::exp2_ftz(tSrS(i + 1) * p.scale_log2 - base[h]);
            sum4[h][(i / 8) % 4] += a + b;
            typename Native::pair packed = Native::make(a, b);
            dev::st_shared_u32(p_row_addr[h] ^ ((i / 4) << 4), *reinterpret_cast<uint32_t*>(&packed));
          }
        };

        if (scorer) {
          // This warpgroup scores the tile: S = Q K^T over d_qk = 576.
          Tensor sK = make_tensor(make_smem_ptr(tile), typename Cfg::SmemLayoutK{});
          Tensor tSrK = thr_s.partition_fragment_B(sK);
          Tensor tSrKr = thr_sr.partition_fragment_B(sK);
          // Retire this warpgroup's P V of tile g - 1 before issuing S and release its stage at
          // once: the load of tile g + 1 then overlaps S, the softmax and P V of this tile instead
          // of starting after S (with two stages, that load is the critical path). The tensor
          // pipe stays busy meanwhile with the other warpgroup's half of P V. The tile's own
          // barrier is checked first: the check costs ~130 clk even when the tile has landed,
          // and that now overlaps the P V still in flight.
          if (wtid == 0) trace::event(wg, g, trace::kTop);
          dev::mbar_wait(&smem.k_full[stage], phase);
          if (wtid == 0) trace::event(wg, g, trace::kReady);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          if (u > u0) dev::mbar_arrive(&smem.k_empty[stage ^ 1]);
          if (wtid == 0) trace::event(wg, g, trace::kDrained);
          warpgroup_fence_operand(tSrS);
          warpgroup_fence_operand(tSrQr);
          warpgroup_arrive();
          mma_s.accumulate_ = GMMA::ScaleOut::Zero;
          CUTE_UNROLL
          for (int k = 0; k < kSmemKSteps; ++k) {
            gemm(mma_s, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
            mma_s.accumulate_ = GMMA::ScaleOut::One;
          }
          mma_sr.accumulate_ = GMMA::ScaleOut::One;
          CUTE_UNROLL
          for (int k = 0; k < size<2>(tSrQr); ++k) gemm(mma_sr, tSrQr(_, _, k), tSrKr(_, _, kSmemKSteps + k), tSrS);
          warpgroup_commit_batch();
          warpgroup_fence_operand(tSrQr);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
          if (wtid == 0) trace::event(wg, g, trace::kScored);
          // Q is read by S only: after the request's last S the producer may load the next Q
          // while the last P V and the epilogue run.
          if (u + 1 == u1) dev::mbar_arrive(&smem.q_empty);

          if (token0 > mask_from - Cfg::kBlockN) {  // token0 + 64 could overflow near INT_MAX
            CUTE_UNROLL
            for (int i = 0; i < size(tSrS); ++i) {
              const int key = token0 + frag_col(i, lane);
              if (key >= limit[(i / 2) % 2]) tSrS(i) = -INFINITY;
            }
          }
          // Row max and sum as four independent chains per row: the softmax is the longest
          // dependent chain of the tile, with one warp per scheduler to hide its latency.
          // Elements 4 j + 2 h and 4 j + 2 h + 1 are row h, column group j; chain c takes j = 2c, 2c+1.
          float max4[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              max4[h][c] = fmaxf(fmaxf(tSrS(8 * c + 2 * h), tSrS(8 * c + 2 * h + 1)),
                                 fmaxf(tSrS(8 * c + 4 + 2 * h), tSrS(8 * c + 4 + 2 * h + 1)));
          // Lazy reference max: while no score of the warp's rows exceeds its row's reference by more
          // than kLazyMaxMargin, P is taken against the old reference and nothing is rescaled, with
          // one warp vote instead of the row-max shuffles and the exp2 of the scale on this tile's
          // critical path. The first tile of a request always moves it (the reference is -inf).
          float thread_max[2], base_of[2], new_m[2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
            thread_max[h] = fmaxf(fmaxf(max4[h][0], max4[h][1]), fmaxf(max4[h][2], max4[h][3])) * p.scale_log2;
          const bool move = __any_sync(0xffffffffu, thread_max[0] > row_m[0] + kLazyMaxMargin ||
                                                        thread_max[1] > row_m[1] + kLazyMaxMargin);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            new_m[h] = row_m[h];
            if (move) {
              float row_max = fmaxf(thread_max[h], __shfl_xor_sync(0xffffffffu, thread_max[h], 1));
              row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
              new_m[h] = fmaxf(row_m[h], row_max);
            }
            base_of[h] = new_m[h] == -INFINITY ? 0.f : new_m[h];  // no key yet: P stays 0
            scale[h] = move ? dev::exp2_ftz(row_m[h] - base_of[h]) : 1.f;
          }
          // P goes to smem in SmemLayoutP (128-byte swizzle: the 16-byte column group j of row r
          // sits at group j ^ (r % 8)). Each thread's two rows share r % 8 = lane / 4, so the
          // address of group j is one XOR away from a per-row base, computed here in 32 bits
          // (CuTe's swizzled pointer would turn these into generic 64-bit stores).
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // (A copy, not base computed in place: that compiles to a different register
            // allocation, not timed; this is the measured form.)
            base[h] = base_of[h];
            p_row_addr[h] = dev::smem_addr(p_tile) + rows[h] * (Cfg::kBlockN * 2) + (lane % 4) * 4 + ((lane / 4) << 4);
          }
          // P part 0 first: both consumers start their P V on it while this warpgroup
          // exponentiates the next part.
          exponentiate_part(Int<0>{});
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (lane % 4 == 0) {
              smem.row_scale[stage][rows[h]] = scale[h];
              smem.row_max[stage][rows[h]] = new_m[h];
            }
            row_m[h] = new_m[h];
          }
          if (valid < Cfg::kBlockN) zero_tail_rows<Cfg>(tile, valid, wtid);
          dev::fence_proxy_async_smem();
          // One barrier of both consumers publishes P part 0 and the statistics to the other
          // warpgroup and to this one's own P V (the other is normally waiting here).
          dev::named_barrier_sync(kBarrierP + stage * Cfg::kPParts, Cfg::kConsumerThreads);
        } else {
          // The other warpgroup scores this tile; take its P and statistics.
          if (wtid == 0) trace::event(wg, g, trace::kTop);
          warpgroup_wait<0>();  // retires this warpgroup's P V of tile g - 1
          warpgroup_fence_operand(tOrO);
          if (u > u0) dev::mbar_arrive(&smem.k_empty[stage ^ 1]);
          if (u + 1 == u1) dev::mbar_arrive(&smem.q_empty);  // this warpgroup's last S is done
          if (wtid == 0) trace::event(wg, g, trace::kDrained);
          // The request's last tile: this share still lacks this tile's scale, which the scorer
          // is computing; both warpgroups apply it below.
          if (u + 1 == u1) {
#pragma unroll
            for (int h = 0; h < 2; ++h) smem.row_sum_share[sum_slot][wg][rows[h]][lane % 4] = sum_share[h];
          }
          dev::named_barrier_sync(kBarrierP + stage * Cfg::kPParts, Cfg::kConsumerThreads);
          if (wtid == 0) trace::event(wg, g, trace::kReady);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            scale[h] = smem.row_scale[stage][rows[h]];
            row_m[h] = smem.row_max[stage][rows[h]];
            sum_share[h] *= scale[h];
          }
        }

        // O = O * scale + P V over the tile's 64 tokens, left in flight. Once the running max
        // settles, the scale is exactly 1 for every row of a warp on most tiles: skip the 128
        // multiplies then (they sit on the path between the softmax and the next P V).
        if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) {
          CUTE_UNROLL
          for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= scale[(i / 2) % 2];
        }
        Tensor sP = make_tensor(make_smem_ptr(p_tile), typename Cfg::SmemLayoutP{});
        Tensor sVt = make_tensor(make_smem_ptr(tile), typename Cfg::SmemLayoutVt{});
        Tensor tOrP = thr_o.partition_fragment_A(sP);
        Tensor tOrV = thr_o.partition_fragment_B(sVt);
        mma_o.accumulate_ = GMMA::ScaleOut::One;
        // P V on the keys of part q, left in flight behind the earlier parts'.
        auto multiply_part = [&](auto part) {
          constexpr int q = decltype(part)::value;
          warpgroup_fence_operand(tOrO);
          warpgroup_arrive();
          CUTE_UNROLL
          for (int k = q * kPartKSteps; k < (q + 1) * kPartKSteps; ++k) gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), tOrO);
          warpgroup_commit_batch();
        };
        multiply_part(Int<0>{});
        // The other parts: the scorer exponentiates part q while the P V of part q - 1 runs.
        cute::for_each(make_int_range<1, Cfg::kPParts>{}, [&](auto part) {
          constexpr int q = decltype(part)::value;
          if (scorer) {
            exponentiate_part(part);
            if constexpr (q + 1 == Cfg::kPParts) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                sum_share[h] = sum_share[h] * scale[h] + ((sum4[h][0] + sum4[h][1]) + (sum4[h][2] + sum4[h][3]));
                // The request's last tile: this share is complete (this tile's scale included).
                if (u + 1 == u1) smem.row_sum_share[sum_slot][wg][rows[h]][lane % 4] = sum_share[h];
              }
            }
            dev::fence_proxy_async_smem();
            if (q + 1 == Cfg::kPParts && wtid == 0) trace::event(wg, g, trace::kSoftmaxed);
            dev::named_barrier_sync(kBarrierP + stage * Cfg::kPParts + q, Cfg::kConsumerThreads);
            if (q + 1 == Cfg::kPParts && wtid == 0) trace::event(wg, g, trace::kPublished);
            // The last part's P V goes behind the other warpgroup's: that one scores the next tile
            // and can issue its S only once its own P V has retired, which with the two issued
            // together came only when both had; issued behind, this one runs while the other drains
            // and issues S (b = 32 ~1 % faster; docs/PERF.md). The other warpgroup reaches this
            // barrier again (tile g + 2) only past the next tile's P barrier, where this one arrives
            // after waiting here, so arrivals of two tiles never mix.
            if constexpr (q + 1 == Cfg::kPParts) dev::named_barrier_sync(kBarrierPvOrder<Cfg> + stage, Cfg::kConsumerThreads);
          } else {
            dev::named_barrier_sync(kBarrierP + stage * Cfg::kPParts + q, Cfg::kConsumerThreads);
          }
          multiply_part(part);
          if constexpr (q + 1 == Cfg::kPParts)
            if (!scorer) dev::named_barrier_arrive(kBarrierPvOrder<Cfg> + stage, Cfg::kConsumerThreads);
        });
        if (wtid == 0) trace::event(wg, g, trace::kIssued);
        // After the request's last P barrier both warpgroups add the same eight parts in the same
        // order (the scorer's complete share, the other's times this tile's scale), while P V runs.
        if (u + 1 == u1) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4 scored = *reinterpret_cast<const float4*>(smem.row_sum_share[sum_slot][stage][rows[h]]);
            const float4 other = *reinterpret_cast<const float4*>(smem.row_sum_share[sum_slot][stage ^ 1][rows[h]]);
            row_l[h] = ((scored.x + scored.y) + (scored.z + scored.w)) +
                       ((other.x + other.y) + (other.z + other.w)) * scale[h];
          }
        }
      }
      // The next request's shares go to the other slot: a warpgroup may write them (a request of
      // one tile) before the other has read this request's, with no barrier in between.
      sum_slot ^= 1;
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
    }

    // NaN: a NaN in q or in an attended key makes its scores NaN, and exp2 of a NaN is NaN, so the
    // row sum is NaN. fmaxf drops NaN, so the reference max stays finite or -inf and the scales
    // never become NaN (nor hide one); a masked score is assigned -inf, which replaces a NaN of a
    // key the row does not see. A row with a key has a sum >= 1 (the key that set the reference
    // max contributed exp2(0)) and a row without one exactly 0, so the test is "!= 0", not "> 0":
    // a NaN sum makes inv and lse NaN, hence out NaN, and a split piece's NaN lse makes the
    // combine's row NaN. No per-element work is added.
    float inv[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool any = row_l[h] != 0.f;
      inv[h] = any ? 1.f / row_l[h] : 0.f;
      // Natural-log LSE of the scaled scores; a piece with no key is -inf for the combine,
      // a whole request with no key is +inf by the contract.
      lse[h] = any ? row_m[h] * kLn2 + logf(row_l[h]) : (split ? -INFINITY : INFINITY);
    }

    // A split piece's rows go to its partial-result slot (element type, rows of 512 contiguous
    // columns); the combine merges them. Its LSE goes beside them.
    const size_t accum_row0 =
        split ? static_cast<size_t>(split_base + split_idx) * p.h_kv * p.tiling.num_m_blocks * detail::kTileRows +
                    (static_cast<size_t>(kv) * p.tiling.num_m_blocks + m) * detail::kTileRows
              : 0;
    if (split && wg == 0 && lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (row_valid[h]) p.lse_accum[accum_row0 + rows[h]] = lse[h];
    }
    if (seqlen > 0) {
      // The output rows, or a split piece's partial rows (the same element type: half the bytes of
      // fp32 to write here and to read in the combine). Stored straight from the accumulator
      // fragment, the output leaves in 4-byte pieces spread over 8 rows per warp instruction,
      // which cost 8-14 us of the short memory-bound rows (measured; 16-bit partials stored that
      // way made b = 8 and b = 1 7-20 % slower; docs/PERF.md). Instead each warpgroup stages its 64 x 256 half in shared memory and every
      // warp stores whole 512-byte row halves. The staging area is this warpgroup's own V half of
      // the last K stage (chunks 4 wg .. 4 wg + 3): no other reader is left once its own P V has
      // retired, so a warpgroup barrier is the only synchronisation needed. Row r, 16-byte group
      // j sits at j ^ (r % 8): the fragment writes and the row reads are both conflict-free.
      constexpr int kHalfRowBytes = Cfg::kHeadDimV;  // 256 columns x 2 bytes
      constexpr int kChunksPerHalf = (Cfg::kHeadDimV / 2) / Cfg::kChunkCols;
      const uint32_t staging = dev::smem_addr(smem.k[(g - 1) & 1] + wg * kChunksPerHalf * kChunkElems);
      uint32_t row_addr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        row_addr[h] = staging + rows[h] * kHalfRowBytes + (lane % 4) * 4 + ((lane / 4) << 4);  // rows[h] % 8 == lane / 4
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 2) {
        typename Native::pair packed = Native::make(tOrO(i) * inv[(i / 2) % 2], tOrO(i + 1) * inv[(i / 2) % 2]);
        dev::st_shared_u32(row_addr[(i / 2) % 2] ^ ((i / 4) << 4), *reinterpret_cast<uint32_t*>(&packed));
      }
      dev::named_barrier_sync(kBarrierWarpgroup<Cfg> + wg, 128);
      // Each warp stores 16 row halves. All 16 are read from shared memory first, so the stage is
      // released before the global stores are issued: the next request's tiles load into it.
      constexpr int kRowsPerWarp = Cfg::kBlockM / 4;
      uint4 staged[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp_in_wg + 4 * i;
        staged[i] = dev::ld_shared_u128(staging + r * kHalfRowBytes + ((lane ^ (r % 8)) << 4));
      }
      dev::fence_proxy_async_smem();  // these generic accesses come before the stage's next TMA write
      dev::mbar_arrive(&smem.k_empty[(g - 1) & 1]);
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp_in_wg + 4 * i;
        int token, head_in_kv;
        if (!p.tiling.row(m, r, token, head_in_kv)) continue;
        typename Native::type* dst =
            split ? static_cast<typename Native::type*>(p.o_accum) + (accum_row0 + r) * Cfg::kHeadDimV + col_base_o +
                        lane * 8
                  : static_cast<typename Native::type*>(p.out) + req * p.out_batch_stride + token * p.out_token_stride +
                        (kv * p.tiling.heads_per_kv + head_in_kv) * p.out_head_stride + col_base_o + lane * 8;
        *reinterpret_cast<uint4*>(dst) = staged[i];
      }
    } else {
      // A request with no key loaded no stage to stage through: its output (zeros) is stored
      // directly. It is one work unit, so it is never split.
      typename Native::type* out_rows[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int head = kv * p.tiling.heads_per_kv + row_head[h];
        out_rows[h] = static_cast<typename Native::type*>(p.out) + req * p.out_batch_stride +
                      row_token[h] * p.out_token_stride + head * p.out_head_stride + col_base_o;
      }
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 2) {
        const int h = (i / 2) % 2;
        if (!row_valid[h]) continue;
        *reinterpret_cast<typename Native::pair*>(out_rows[h] + frag_col(i, lane)) =
            Native::make(tOrO(i) * inv[h], tOrO(i + 1) * inv[h]);
      }
    }
    if (!split && wg == 0 && lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!row_valid[h]) continue;
        const int head = kv * p.tiling.heads_per_kv + row_head[h];
        p.lse[req * p.lse_batch_stride + head * p.lse_head_stride + row_token[h]] = lse[h];
      }
    }
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dense_decode_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                        const KernelParams p) {
  HMLA_ALIGNED_SHARED_STORAGE(typename Cfg::SharedStorage, smem);
  // Grid (query tile, kv head, part): the query tiles of one part are neighbours in launch order and
  // stream the same K tiles at the same time, so all but the first find them in L2.
  const int part = blockIdx.z, kv = blockIdx.y, m = blockIdx.x;
  const int warpgroup = threadIdx.x / 128;

  // The combine kernel may start its launch now; it waits for this grid's completion itself.
  dev::pdl_launch_dependents();
  if (threadIdx.x == 0) trace::span(0);

  if (threadIdx.x == 0) {
    dev::tma_prefetch_descriptor(&q_map);
    dev::tma_prefetch_descriptor(&k_map);
    dev::mbar_init(&smem.q_full, 1);
    dev::mbar_init(&smem.q_empty, Cfg::kConsumerThreads);
    for (int s = 0; s < Cfg::kStages; ++s) {
      dev::mbar_init(&smem.k_full[s], 1);
      dev::mbar_init(&smem.k_empty[s], Cfg::kConsumerThreads);
    }
    dev::fence_barrier_init();
  }
  // Query rows that no TMA box covers stay zero, so padding rows compute on zeros, not on
  // whatever the shared memory held before.
  const int box_rows = p.tiling.heads_per_tile * p.tiling.tokens_per_tile;
  if (box_rows < Cfg::kBlockM) {
    for (int c = 0; c < Cfg::kChunks; ++c) {
      char* start = reinterpret_cast<char*>(smem.q + c * Cfg::kBlockM * Cfg::kChunkCols + box_rows * Cfg::kChunkCols);
      const int bytes = (Cfg::kBlockM - box_rows) * Cfg::kChunkCols * 2;
      for (int off = threadIdx.x * 16; off < bytes; off += Cfg::kThreads * 16)
        *reinterpret_cast<uint4*>(start + off) = make_uint4(0, 0, 0, 0);
    }
    dev::fence_proxy_async_smem();
  }
  // Launched with programmatic stream serialisation: the prologue above may overlap the previous
  // kernel's tail; nothing it wrote (the plan, q, the cache) is read before it has completed.
  dev::pdl_wait_for_prerequisites();
  __syncthreads();

  const detail::PartMetadata meta = p.parts[part];
  if (meta.begin_req >= p.batch) return;

  if (warpgroup == 0) {
    dev::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) producer_loop<Cfg>(smem, p, &q_map, &k_map, meta, kv, m);
#ifdef HMLA_DENSE_TRACE
    if (threadIdx.x == 32 && trace::cta_slot() >= 0) observer_loop<Cfg>(smem, p, meta);
#endif
  } else {
    dev::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    consumer_loop<Cfg>(smem, p, meta, kv, m);
    if (threadIdx.x == 128) trace::span(1);
  }
}

template <typename Element>
void launch_kernel(const CUtensorMap& q_map, const CUtensorMap& k_map, const KernelParams& kp, dim3 grid,
                   cudaStream_t stream) {
  using Cfg = Config<Element>;
  auto kernel = dense_decode_kernel<Cfg>;
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  detail::launch_after_prerequisites(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, q_map, k_map, kp);
#ifdef HMLA_DENSE_TRACE
  // Trace builds only (never in a release build): every call overwrites the file with its timeline.
  // Here, not in launch.cu: the trace buffer is a device symbol of this translation unit.
  dev::timeline::write_trace_file(trace::g_buffer, stream);
#endif
}

}  // namespace hmla::sm90::dense_decode
