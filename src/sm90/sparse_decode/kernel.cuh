// The sm90 token-sparse decode kernel (schedule in config.h and docs/SPARSE_DECODE.md). Included by
// the instantiation files, one per FP8 layout; the host side is launch.cu.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "common/device_attributes.h"
#include "common/device_primitives.cuh"
#include "common/fp8_dequant.cuh"
#include "common/launch.h"
#include "scheduler/decode_schedule.h"
#include "sm90/sparse_decode/config.h"
#include "sm90/sparse_decode/launch.h"
#include "sm90/sparse_decode/trace.cuh"

namespace hmla::sm90::sparse_decode {

// Element i of a thread's wgmma accumulator fragment (64 x N tile of one warpgroup) sits at row
// 16 * warp + lane / 4 + 8 * ((i / 2) % 2) and column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
__device__ __forceinline__ int frag_row(int i, int warp_in_wg, int lane) {
  return 16 * warp_in_wg + lane / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int frag_col(int i, int lane) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

// Named barriers of the two consumer warpgroups (0 is __syncthreads).
constexpr int kBarrierPReady = 1;  // the scorer published P and its statistics (both wait)
// The other warpgroup is done reading them (both wait: the other has nothing to do before the next
// tile's P anyway, and a one-sided arrive leaves racecheck unable to order the reads before the
// scorer's next writes). The scorer passes it before every tile but its first (before a request's
// first tile at the request's top, where the helper meets it after its epilogue to convert Q
// together), and once at the end.
constexpr int kBarrierPFree = 2;

// What a CTA needs to know of one request (one query token).
struct Request {
  int batch, token;         // where its q, index lists and outputs are
  int main_keys, extra_keys;
  int main_blocks;          // tiles of its main list; the extra list's tiles follow
  int tiles;                // main and extra tiles (0: no key, the output is 0 and lse +inf)
  int u0, u1;               // this CTA's tiles of it
};

__device__ __forceinline__ Request request_of(const KernelParams& p, const detail::PartMetadata& meta, int r) {
  Request q;
  q.batch = r / p.s_q;
  q.token = r % p.s_q;
  q.main_keys = r == meta.begin_req ? meta.begin_seqlen : p.work.main_keys(r);
  q.extra_keys = r == meta.begin_req ? meta.begin_extra_keys : p.work.extra_keys(r);
  q.main_blocks = detail::blocks_of(q.main_keys);
  q.tiles = q.main_blocks + detail::blocks_of(q.extra_keys);
  q.u0 = r == meta.begin_req ? meta.begin_unit : 0;
  q.u1 = r == meta.end_req ? meta.end_unit : (q.tiles > 0 ? q.tiles : 1);
  return q;
}

// ------------------------------------------------------------------------------------ producer

// One 16-byte shared-memory store into a 128-byte-swizzled tile: 16-byte group j of row r of a
// 64-column chunk sits at group j ^ (r % 8).
__device__ __forceinline__ void st_swizzled(uint32_t tile, int chunk, int row, int group, uint4 v) {
  const uint32_t addr = tile + chunk * (64 * 128) + row * 128 + ((group ^ (row & 7)) << 4);
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// The same, by the lanes for which `store` holds: a predicated instruction, not a branch (a branch
// around the lanes with no NoPE piece, MODEL1's last four, splits the warp every token).
__device__ __forceinline__ void st_swizzled_if(uint32_t tile, int chunk, int row, int group, uint4 v, bool store) {
  const uint32_t addr = tile + chunk * (64 * 128) + row * 128 + ((group ^ (row & 7)) << 4);
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n}" ::"r"(addr),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(static_cast<int>(store))
      : "memory");
}

// Predicated loads into the registers they fill (left as they are when `load` is false). The C++
// form `v = 0; if (load) v = ldg(p)` lets the compiler load into a temporary and move it into v,
// and the move waits for the load: the loads would then not overlap anything.
__device__ __forceinline__ void ldg_nc_u128_if(uint4& v, const uint8_t* p, bool load) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p), "r"(static_cast<int>(load)));
}
__device__ __forceinline__ void ldg_nc_u32_if(uint32_t& v, const uint8_t* p, bool load) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p ld.global.nc.u32 %0, [%1];\n}"
               : "+r"(v)
               : "l"(p), "r"(static_cast<int>(load)));
}

__device__ __forceinline__ const uint8_t* shfl_ptr(const uint8_t* p, int lane) {
  return reinterpret_cast<const uint8_t*>(
      __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), lane));
}

// A warp's share of one tile: tokens row0 .. row0 + 15 of one index list. Lane t < 16 holds token
// t's addresses. Tokens whose index is invalid have none and are never read: their rows are stored
// as zeros and their bit is clear.
struct TokenSlots {
  const uint8_t* data;    // lane t: token t's first byte (its NoPE values; RoPE at kRopeOffset)
  const uint8_t* scales;  // lane t: token t's scales
  uint32_t valid;         // bit t: token t is a key (the same in every lane)
};

// A tile whose indices are being loaded: lane t < 16 holds token t's index (-1: none), which
// becomes addresses (locate_tokens) only a tile's worth of stores later, so that its latency hides
// behind them.
struct PendingTile {
  int index;
  bool extra;  // an extra-cache tile
};

template <typename Cfg>
__device__ __forceinline__ TokenSlots locate_tokens(const SparseCacheView& cache, int index) {
  using Format = typename Cfg::Format;
  const bool valid = index >= 0 && static_cast<int64_t>(index) < cache.num_slots;
  TokenSlots t{nullptr, nullptr, __ballot_sync(0xffffffffu, valid)};
  if (valid) {
    // A shift for the power-of-two page sizes: a division by a runtime divisor costs ~25 instructions.
    const int page = cache.page_shift >= 0 ? index >> cache.page_shift : index / cache.page_size;
    const int offset = index - page * cache.page_size;
    const uint8_t* page_start = cache.data + static_cast<int64_t>(page) * cache.block_stride_bytes;
    t.data = page_start + static_cast<int64_t>(offset) * Format::kTokenStride;
    t.scales = page_start + Format::scale_offset(cache.page_size, offset);
  }
  return t;
}

// A warp's share of a tile in registers, from its loads until its stores. Lane L holds NoPE piece L
// (16 values) of every token, so a warp reads a token's NoPE bytes in one coalesced access; the
// RoPE pieces are spread 4 per lane, and the scale words 1-2 per lane, each handed by shuffle to
// the lanes whose pieces it scales. The registers of one token are refilled with the next tile's
// token as soon as they are stored (store_and_refill): the next tile's loads are in flight during
// this tile's stores, in the same registers.
template <typename Cfg>
struct TileRows {
  using Format = typename Cfg::Format;
  static constexpr int kNopePieces = Format::kNope / 16;  // 16-byte e4m3 pieces per token
  static constexpr int kRopePieces = 8;                    // 16-byte bf16 pieces per token
  static constexpr int kTokens = Cfg::kTokensPerProducerWarp;
  static_assert(kTokens * kRopePieces % 32 == 0, "whole RoPE pieces per lane");
  static_assert(kTokens * Format::kScaleWords % 32 == 0 || kTokens * Format::kScaleWords < 32,
                "whole scale words per lane, or one word per lane with lanes to spare");
  static_assert(kNopePieces <= 32, "one NoPE piece per lane");
  static_assert(Format::kNope + 64 == Cfg::kHeadDim && Format::kNope % Cfg::kChunkCols == 0, "RoPE is the last chunk");
  static constexpr int kRopePerLane = kTokens * kRopePieces / 32;
  static constexpr int kTokensPerScaleReg = 32 / Format::kScaleWords;
  // Lanes past the warp's tokens (8 MODEL1 tokens: 16 words) load nothing: their token's bit is clear.
  static constexpr int kScaleRegs = (kTokens + kTokensPerScaleReg - 1) / kTokensPerScaleReg;
  uint4 nope[kTokens];
  uint4 rope[kRopePerLane];
  uint32_t scale_words[kScaleRegs];  // word lane % kScaleWords of token lane / kScaleWords + kTokensPerScaleReg j
  uint32_t valid;

  // Register slot i of a lane holds token i, or token i ^ 1 for a lane whose piece lies in an odd
  // 64-column chunk: then one store instruction writes row r of the even chunks and row r ^ 1 of the
  // odd ones, whose swizzled 16-byte groups fall in the other half of the banks, so it covers all 32
  // banks without the lanes swapping the halves of their pieces (8 selects per token).
  // MODEL1 (7 NoPE chunks) keeps the swap of halves instead: paired rows there made ptxas spill 416
  // bytes.
  static constexpr bool kPairedRows = Format::kNope == 512;
  static __device__ __forceinline__ int token_of_slot(int i, int lane) {
    return kPairedRows ? i ^ ((lane / 4) & 1) : i;
  }
  static_assert(kTokens % 2 == 0 && kTokensPerScaleReg % 2 == 0, "slots i and i ^ 1 pair up");

  __device__ __forceinline__ void load_nope(const TokenSlots& slots, int i, int lane) {
    const int t = token_of_slot(i, lane);
    const uint8_t* d = shfl_ptr(slots.data, t);
    nope[i] = make_uint4(0, 0, 0, 0);
    ldg_nc_u128_if(nope[i], d + 16 * lane, ((slots.valid >> t) & 1u) && lane < kNopePieces);
  }
  __device__ __forceinline__ void load_rope(const TokenSlots& slots, int lane) {
#pragma unroll
    for (int j = 0; j < kRopePerLane; ++j) {
      const int t = lane / 8 + 4 * j;
      const uint8_t* d = shfl_ptr(slots.data, t);
      rope[j] = make_uint4(0, 0, 0, 0);
      ldg_nc_u128_if(rope[j], d + Format::kRopeOffset + 16 * (lane % 8), (slots.valid >> t) & 1u);
    }
  }
  __device__ static __forceinline__ void load_scales(const TokenSlots& slots, int lane, uint32_t (&words)[kScaleRegs]) {
#pragma unroll
    for (int j = 0; j < kScaleRegs; ++j) {
      const int t = lane / Format::kScaleWords + kTokensPerScaleReg * j;
      const uint8_t* s = shfl_ptr(slots.scales, t);
      words[j] = 0u;  // an invalid token's values are 0 and stay 0
      ldg_nc_u32_if(words[j], s + 4 * (lane % Format::kScaleWords), (slots.valid >> t) & 1u);
    }
  }

  __device__ __forceinline__ void load(const TokenSlots& slots, int lane) {
#pragma unroll
    for (int i = 0; i < kTokens; ++i) load_nope(slots, i, lane);
    load_rope(slots, lane);
    load_scales(slots, lane, scale_words);
    valid = slots.valid;
  }

  // Stores this tile into `tile` and, with kRefill, loads `next`'s valid tokens into the registers
  // each store frees.
  template <bool kRefill = true>
  __device__ __forceinline__ void store_and_refill(uint32_t tile, int row0, const TokenSlots& next, int lane) {
    uint32_t next_scale_words[kScaleRegs];
    if constexpr (kRefill) load_scales(next, lane, next_scale_words);
#pragma unroll
    for (int j = 0; j < kScaleRegs; ++j) scale_words[j] = Format::prepare_scale_word(scale_words[j]);
    const int group = 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
      const int t = token_of_slot(i, lane);  // i / kTokensPerScaleReg == t / kTokensPerScaleReg
      const int source = (t % kTokensPerScaleReg) * Format::kScaleWords + Format::scale_word_of_piece(lane);
      const uint32_t word = __shfl_sync(0xffffffffu, scale_words[i / kTokensPerScaleReg], source);
      // Lanes with no NoPE piece (MODEL1's last four) dequantise zeros and store nothing.
      const bool has_piece = lane < kNopePieces;
      uint4 lo, hi;
      dev::dequant16_e4m3_to_f16<Format::kTwoFactors>(nope[i], Format::factors_of_piece(word, lane), lo, hi);
      if constexpr (kPairedRows) {
        st_swizzled_if(tile, lane / 4, row0 + t, group, lo, has_piece);
        st_swizzled_if(tile, lane / 4, row0 + t, group + 1, hi, has_piece);
      } else {
        // Lanes whose piece lies in an odd chunk store their high half first, so that each store
        // instruction covers all eight 16-byte groups of a row segment.
        const bool odd_chunk = (lane / 4) & 1;
        st_swizzled_if(tile, lane / 4, row0 + t, group + (odd_chunk ? 1 : 0), odd_chunk ? hi : lo, has_piece);
        st_swizzled_if(tile, lane / 4, row0 + t, group + (odd_chunk ? 0 : 1), odd_chunk ? lo : hi, has_piece);
      }
      if constexpr (kRefill) load_nope(next, i, lane);
    }
#pragma unroll
    for (int j = 0; j < kRopePerLane; ++j) {
      const uint4 r = rope[j];  // bf16 in the cache
      const uint4 h = make_uint4(dev::bf16x2_to_f16x2(r.x), dev::bf16x2_to_f16x2(r.y), dev::bf16x2_to_f16x2(r.z),
                                 dev::bf16x2_to_f16x2(r.w));
      st_swizzled(tile, Format::kNope / Cfg::kChunkCols, row0 + lane / 8 + 4 * j, lane % 8, h);
    }
    if constexpr (kRefill) {
      load_rope(next, lane);
#pragma unroll
      for (int j = 0; j < kScaleRegs; ++j) scale_words[j] = next_scale_words[j];
      valid = next.valid;
    }
  }
  __device__ __forceinline__ void store(uint32_t tile, int row0, int lane) {
    store_and_refill<false>(tile, row0, TokenSlots{}, lane);
  }
};

// Walks a CTA's tiles in order, skipping requests with no key.
struct TileCursor {
  int r;      // request (> meta.end_req: no tile left)
  int u;      // tile of it
  Request q;

  __device__ __forceinline__ void start(const KernelParams& p, const detail::PartMetadata& meta) {
    r = meta.begin_req;
    q = request_of(p, meta, r);
    u = q.u0;
    settle(p, meta);
  }
  __device__ __forceinline__ void next(const KernelParams& p, const detail::PartMetadata& meta) {
    ++u;
    settle(p, meta);
  }
  __device__ __forceinline__ bool done(const detail::PartMetadata& meta) const { return r > meta.end_req; }

  // Issues the load of the tile's indices (this warp's 16 of its main or, past the main tiles, its
  // extra list).
  template <typename Cfg>
  __device__ __forceinline__ PendingTile pending(const KernelParams& p, int row0, int lane) const {
    PendingTile t;
    t.extra = u >= q.main_blocks;
    const int32_t* list = t.extra ? p.extra_indices + q.batch * p.extra_indices_batch_stride +
                                        q.token * p.extra_indices_token_stride
                                  : p.indices + q.batch * p.indices_batch_stride + q.token * p.indices_token_stride;
    const int pos = (t.extra ? u - q.main_blocks : u) * Cfg::kBlockN + row0 + lane;
    const int keys = t.extra ? q.extra_keys : q.main_keys;
    t.index = lane < Cfg::kTokensPerProducerWarp && pos < keys ? __ldg(list + pos) : -1;
    return t;
  }

 private:
  __device__ __forceinline__ void settle(const KernelParams& p, const detail::PartMetadata& meta) {
    while (r <= meta.end_req && (q.tiles == 0 || u >= q.u1)) {
      if (++r > meta.end_req) break;
      q = request_of(p, meta, r);
      u = q.u0;
    }
  }
};

// The producers gather the CTA's tiles in order, tile n into stage n % 2. During tile n's stores,
// tile n + 1's loads go out (into the registers each store frees) and tile n + 2's indices load;
// after them, tile n + 2 is located. No proxy fence here (the consumers issue it): its MEMBAR
// would wait for tile n + 1's loads before the stage is announced.
template <typename Cfg>
__device__ void producer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p,
                              const detail::PartMetadata& meta) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = warp * Cfg::kTokensPerProducerWarp;
  auto locate = [&](const PendingTile& t) {
    return locate_tokens<Cfg>(t.extra ? p.extra_cache : p.cache, t.index);
  };
  TileCursor cur;
  cur.start(p, meta);
  TileRows<Cfg> rows;  // tile n
  TokenSlots next{};   // tile n + 1, located
  bool have_rows = !cur.done(meta);
  if (have_rows) {
    rows.load(locate(cur.pending<Cfg>(p, row0, lane)), lane);
    cur.next(p, meta);
  }
  bool have_next = !cur.done(meta);
  if (have_next) {
    next = locate(cur.pending<Cfg>(p, row0, lane));
    cur.next(p, meta);
  }
  for (int n = 0; have_rows; ++n) {
    const int stage = n % Cfg::kStages;
    const bool have_after = !cur.done(meta);
    PendingTile after{-1, false};
    if (have_after) {
      after = cur.pending<Cfg>(p, row0, lane);
      cur.next(p, meta);
    }
    trace::event(trace::kProducer, n, trace::kProducerWait);
    dev::mbar_wait(&smem.k_empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
    trace::event(trace::kProducer, n, trace::kProducerFree);
    if (lane == 0) smem.valid[stage][warp] = rows.valid;
    const uint32_t tile = dev::smem_addr(smem.k[stage]);
    // One loop body for every tile, the last one included (its refill has no valid token, so it
    // loads nothing): a second body for the last tile doubled the loop's code, and the producers'
    // instruction fetch stalls with it.
    if (!have_next) next.valid = 0u;
    rows.store_and_refill(tile, row0, next, lane);
    dev::mbar_arrive(&smem.k_full[stage]);
    trace::event(trace::kProducer, n, trace::kProducerFilled);
    have_rows = have_next;
    have_next = have_after;
    if (have_after) next = locate(after);
  }
}

// The same order of tiles with two tiles in registers (the narrow form's 8 tokens per warp leave
// room for both): tile n + 1's loads go out at the start of tile n's body into the other set, before
// the stage wait and tile n's stores, and tile n + 3's indices load there too, so tile n + 2 is
// located from indices loaded a body earlier. In the one-set loop above, ptxas issues the refill
// loads after the stores (SASS: every LDG of the next tile follows the last STS), so each tile paid
// the latency of its index load and then of its rows' loads (Nsight Compute, h_q 16: 22 % of the
// stall samples on the index's first use).
template <typename Cfg>
__device__ void producer_loop_two_tiles(typename Cfg::SharedStorage& smem, const KernelParams& p,
                                        const detail::PartMetadata& meta) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row0 = warp * Cfg::kTokensPerProducerWarp;
  auto locate = [&](const PendingTile& t) {
    return locate_tokens<Cfg>(t.extra ? p.extra_cache : p.cache, t.index);
  };
  // Takes the cursor's tile and moves past it; no tile left: an index of -1 (nothing to locate).
  auto take = [&](TileCursor& cur, bool& have) {
    PendingTile t{-1, false};
    have = !cur.done(meta);
    if (have) {
      t = cur.pending<Cfg>(p, row0, lane);
      cur.next(p, meta);
    }
    return t;
  };
  TileCursor cur;
  cur.start(p, meta);
  TileRows<Cfg> even, odd;
  bool have_rows, have_next, have_after;
  {
    const PendingTile first = take(cur, have_rows);
    if (have_rows) even.load(locate(first), lane);
  }
  TokenSlots next = locate(take(cur, have_next));  // tile n + 1
  PendingTile after = take(cur, have_after);        // tile n + 2
  int n = 0;
  auto body = [&](TileRows<Cfg>& rows, TileRows<Cfg>& refill) {
    if (!have_next) next.valid = 0u;
    refill.load(next, lane);
    bool have_far;
    const PendingTile far = take(cur, have_far);  // tile n + 3
    const int stage = n % Cfg::kStages;
    dev::mbar_wait(&smem.k_empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
    if (lane == 0) smem.valid[stage][warp] = rows.valid;
    rows.store(dev::smem_addr(smem.k[stage]), row0, lane);
    dev::mbar_arrive(&smem.k_full[stage]);
    ++n;
    have_rows = have_next;
    have_next = have_after;
    have_after = have_far;
    if (have_next) next = locate(after);
    after = far;
  };
  // Unrolled by two so that the sets swap roles without register moves (a move would wait for the
  // loads it moves).
  while (have_rows) {
    body(even, odd);
    if (!have_rows) break;
    body(odd, even);
  }
}

// ------------------------------------------------------------------------------------ consumers

template <typename Cfg>
__device__ __forceinline__ void issue_q(typename Cfg::SharedStorage& smem, const CUtensorMap* q_map,
                                        const KernelParams& p, const Request& q, int m) {
  constexpr int kChunkElems = Cfg::kQRows * Cfg::kChunkCols;
  dev::mbar_arrive_expect_tx(&smem.q_full, p.q_tile_bytes);
#pragma unroll
  for (int c = 0; c < Cfg::kChunks; ++c)
    dev::tma_load_4d(smem.q + c * kChunkElems, q_map, &smem.q_full, c * Cfg::kChunkCols, m * Cfg::kQRows, q.token,
                     q.batch);
}

// Converts the request's Q tile in shared memory (bf16, as TMA loaded it) to fp16 in place, times
// 2^-k for the k that puts the tile's largest |q| in [2^14, 2^15): every finite q then fits fp16
// with its 8 significant bits, whatever its magnitude. Returns 2^k, which the scores take back.
// k = 0 when the tile holds an inf or NaN (they convert as they are and reach the output, as the
// contract wants) or only zeros. Run by kThreads threads (ctid 0 .. kThreads - 1: the wide form's
// two consumer warpgroups, the narrow form's one) once the request's Q has landed, before its
// first S. They meet twice on the q_converted mbarrier (phase `phase`, flipped twice): a named
// barrier drew racecheck reports on the P statistics. In the wide form the conversion sits between
// two requests on the scorer's path to the next S; shared with the helper, which waits there
// anyway, it costs half: MODEL1's b 128 s_q 2 h 128 topk 128 row 60.9 -> 59.1 us on an H200
// (docs/PERF.md, "A request's fixed costs").
template <typename Cfg, int kThreads>
__device__ float convert_q_to_half(typename Cfg::SharedStorage& smem, int ctid, uint32_t& phase) {
  constexpr int kVectors = Cfg::kQRows * Cfg::kHeadDim * 2 / 16;
  static_assert(kVectors % kThreads == 0, "whole 16-byte vectors per thread");
  uint4* q = reinterpret_cast<uint4*>(smem.q);
  // |q| as bf16 bits orders like |q| as an integer, inf and NaN above every finite value.
  uint32_t m = 0;
#pragma unroll 4
  for (int i = ctid; i < kVectors; i += kThreads) {
    const uint4 v = q[i];
    m = __vmaxu2(m, v.x & 0x7fff7fffu);
    m = __vmaxu2(m, v.y & 0x7fff7fffu);
    m = __vmaxu2(m, v.z & 0x7fff7fffu);
    m = __vmaxu2(m, v.w & 0x7fff7fffu);
  }
  m = __reduce_max_sync(0xffffffffu, max(m & 0xffffu, m >> 16));
  if (ctid % 32 == 0) smem.q_absmax[ctid / 32] = m;
  dev::mbar_arrive(&smem.q_converted);
  dev::mbar_wait(&smem.q_converted, phase);
  phase ^= 1;
  m = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, smem.q_absmax[w]);
  int k = 0;
  if (m != 0 && m < 0x7f80u) {
    const int e = static_cast<int>(m >> 7) - 127;  // the largest |q| is in [2^e, 2^(e + 1))
    k = min(max(e - 14, -64), 64);
  }
  const float down = __uint_as_float(static_cast<uint32_t>(127 - k) << 23);
#pragma unroll 4
  for (int i = ctid; i < kVectors; i += kThreads) {
    const uint4 v = q[i];
    q[i] = make_uint4(dev::bf16x2_to_f16x2_scaled(v.x, down), dev::bf16x2_to_f16x2_scaled(v.y, down),
                      dev::bf16x2_to_f16x2_scaled(v.z, down), dev::bf16x2_to_f16x2_scaled(v.w, down));
  }
  dev::fence_proxy_async_smem();  // read by wgmma
  dev::mbar_arrive(&smem.q_converted);
  dev::mbar_wait(&smem.q_converted, phase);
  phase ^= 1;
  return __uint_as_float(static_cast<uint32_t>(127 + k) << 23);
}

// Two P values as one word of the tile's 16-bit type.
template <typename Element>
__device__ __forceinline__ uint32_t pack_p(float a, float b) {
  if constexpr (std::is_same_v<Element, cute::half_t>) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The thread's words (one per 8-column block of a fragment row: its two columns of it) of kLanes
// consecutive blocks, exchanged across the kLanes neighbouring threads that hold the other columns
// of those blocks (two exchanges per bit): after it, thread q holds at t what thread
// (q & ~(kLanes - 1)) | t held at q % kLanes, i.e. 2 kLanes adjacent columns of block q % kLanes.
template <int kLanes>
__device__ __forceinline__ void exchange_block_words(uint32_t (&w)[kLanes], int lane) {
#pragma unroll
  for (int b = 1; b < kLanes; b <<= 1) {
    const bool upper = (lane & b) != 0;
#pragma unroll
    for (int t = 0; t < kLanes; ++t) {
      if (t & b) continue;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? w[t] : w[t | b], b);
      if (upper) w[t] = got;
      else w[t | b] = got;
    }
  }
}

// Normalises a warpgroup's half of O and writes it: to out (times the sink's factor) or, for a
// piece of a split request, to its partial-result slot; the scorer also writes the LSE.
// A quad's four threads hold two columns each of every 8-column block of their row. Exchanged in
// groups of Cfg::kStoreLanes blocks (exchange_block_words), each thread stores 2 kStoreLanes
// adjacent columns at once, and a warp's store covers 16 kStoreLanes contiguous bytes of each of
// its eight rows: whole sectors, 2-4x fewer store instructions. Stored as the fragment lies (4
// bytes per thread, 16 per row and instruction), a CTA's epilogue cost ~7 us per request on an H100
// (docs/PERF.md, "The epilogue's stores").
template <typename Cfg, typename Frag>
__device__ __forceinline__ void store_output(const KernelParams& p, const Request& q, int m,
                                             const Frag& tOrO, const int (&rows)[2], const float (&row_sum)[2],
                                             const float (&row_max)[2], bool split, int slot, int col_base,
                                             bool write_lse, int lane) {
  const float kLn2 = 0.69314718055994530942f;
  constexpr int kLanes = Cfg::kStoreLanes;
  static_assert(kLanes == 2 || kLanes == 4, "blocks exchanged in pairs or fours");
  using Words = std::conditional_t<kLanes == 2, uint2, uint4>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = m * Cfg::kBlockM + rows[h];
    const bool head_valid = head < p.h_q;  // the same for the quad: the exchanges run regardless
    // No key: the sum is exactly 0. A NaN sum (a NaN the query attended to) stays NaN in out and lse.
    const bool any = row_sum[h] != 0.f;
    const float inv = any ? 1.f / row_sum[h] : 0.f;
    // Natural-log LSE of the scaled scores; a piece with no key is -inf for the combine, a whole
    // request with no key is +inf by the contract.
    const float lse = any ? row_max[h] * kLn2 + logf(row_sum[h]) : (split ? -INFINITY : INFINITY);
    __nv_bfloat16* dst;
    float factor = inv;
    if (split) {
      // A prefill piece's slot holds its one head tile.
      const size_t row = static_cast<size_t>(slot) * p.rows_per_slot + (Cfg::kPrefill ? 0 : m * Cfg::kBlockM) + rows[h];
      dst = static_cast<__nv_bfloat16*>(p.o_accum) + row * Cfg::kHeadDimV + col_base;
      if (head_valid && write_lse && lane % 4 == 0) {
        p.lse_accum[row] = lse;
        if constexpr (Cfg::kPrefill) p.max_accum[row] = any ? row_max[h] * kLn2 : -INFINITY;
      }
    } else {
      if (head_valid && p.attn_sink != nullptr && any) factor /= 1.f + __expf(p.attn_sink[head] - lse);
      dst = reinterpret_cast<__nv_bfloat16*>(p.out) + q.batch * p.out_batch_stride + q.token * p.out_token_stride +
            head * p.out_head_stride + col_base;
      if (head_valid && write_lse && lane % 4 == 0)
        p.lse[q.batch * p.lse_batch_stride + head * p.lse_head_stride + q.token] = lse;
      // Sparse prefill also returns the max of the scaled scores (natural log; -inf with no key).
      if constexpr (Cfg::kPrefill)
        if (head_valid && write_lse && lane % 4 == 0)
          p.max_logits[q.batch * p.lse_batch_stride + head * p.lse_head_stride] = any ? row_max[h] * kLn2 : -INFINITY;
    }
    // This thread's columns after the exchange: block kLanes * group + lane % kLanes, from column
    // 2 kLanes * ((lane % 4) / kLanes) of it.
    __nv_bfloat16* at = dst + 8 * (lane % kLanes) + 2 * kLanes * ((lane % 4) / kLanes);
    constexpr int kBlocks = decltype(size(tOrO))::value / 4;  // 8-column blocks of the warpgroup's columns
    static_assert(kBlocks % kLanes == 0, "whole groups of blocks");
    CUTE_UNROLL
    for (int group = 0; group < kBlocks / kLanes; ++group) {
      uint32_t w[kLanes];
      CUTE_UNROLL
      for (int t = 0; t < kLanes; ++t) {
        const int i = 4 * (kLanes * group + t) + 2 * h;  // elements i, i + 1: row h, block kLanes group + t
        const __nv_bfloat162 v = __floats2bfloat162_rn(tOrO(i) * factor, tOrO(i + 1) * factor);
        w[t] = *reinterpret_cast<const uint32_t*>(&v);
      }
      exchange_block_words<kLanes>(w, lane);
      Words out;
      if constexpr (kLanes == 2) out = make_uint2(w[0], w[1]);
      else out = make_uint4(w[0], w[1], w[2], w[3]);
      if (head_valid) *reinterpret_cast<Words*>(at + 8 * kLanes * group) = out;
    }
  }
}

// acc (+)= A B^T over all k-steps of the fragments, kClear starting the accumulator from zero. Every
// product of the sparse kernels: the wide form's S = Q K^T and O += P V, the narrow form's
// S^T = K Q^T and O^T += V^T P^T, the prefill's. Committed as batches of kKStepsPerBatch k-steps,
// each retired before the next is issued (0: one batch of all k-steps); the last batch is left in
// flight. Why S is batched: config.h, kScoreKStepsPerBatch.
template <bool kClear, int kKStepsPerBatch = 0, typename Mma, typename TA, typename TB, typename TC>
__device__ __forceinline__ void issue_mma_batch(Mma& mma, const TA& a, const TB& b, TC& acc) {
  constexpr int kAll = decltype(size<2>(a))::value;
  constexpr int kBatch = kKStepsPerBatch > 0 && kKStepsPerBatch < kAll ? kKStepsPerBatch : kAll;
  warpgroup_fence_operand(acc);
  mma.accumulate_ = kClear ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k0 = 0; k0 < kAll; k0 += kBatch) {
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = k0; k < k0 + kBatch && k < kAll; ++k) {
      gemm(mma, a(_, _, k), b(_, _, k), acc);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    if (k0 + kBatch < kAll) warpgroup_wait<0>();
  }
}

// S = Q K^T (narrow form: S^T = K Q^T) from zero.
template <int kKStepsPerBatch, typename Mma, typename TA, typename TB, typename TC>
__device__ __forceinline__ void issue_scores(Mma& mma, const TA& a, const TB& b, TC& acc) {
  issue_mma_batch<true, kKStepsPerBatch>(mma, a, b, acc);
}

// The state both consumer warpgroups keep: the MMA of O and its fragment, this thread's rows.
template <typename Cfg>
struct Consumer {
  typename Cfg::MmaO mma_o;
  decltype(mma_o.get_thread_slice(0)) thr_o;
  decltype(partition_fragment_C(mma_o, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDimV>>{})) tOrO;
  int rows[2];
  int lane;

  __device__ explicit Consumer(int ctid)
      : thr_o(mma_o.get_thread_slice(ctid)),
        tOrO(partition_fragment_C(mma_o, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDimV>>{})) {
    static_assert(decltype(size(tOrO))::value == 128, "O fragment: 64 x 256 per warpgroup");
    lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[h] = frag_row(2 * h, (ctid % 128) / 32, lane);
  }

  // O = O * scale + P V over the tile's 64 tokens, left in flight. Once the running max settles,
  // the scale is exactly 1 for every row of a warp on most tiles: the multiplies are skipped then.
  __device__ void multiply(typename Cfg::SharedStorage& smem, int stage, const float (&scale)[2]) {
    if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= scale[(i / 2) % 2];
    }
    Tensor sP = make_tensor(make_smem_ptr(smem.p), typename Cfg::SmemLayoutP{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.k[stage]), typename Cfg::SmemLayoutVt{});
    Tensor tOrP = thr_o.partition_fragment_A(sP);
    Tensor tOrV = thr_o.partition_fragment_B(sVt);
    issue_mma_batch<false>(mma_o, tOrP, tOrV, tOrO);
  }

  __device__ void retire() {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
  }
};

// Before the wait for stage n to be full: the previous tile's P V retires and its stage goes back to
// the producers at once. Released only after S(n) was issued (behind stage n's fill), the producers,
// done with stage n, waited for the consumers to see it full and issue S before they could refill.
// O, which that P V wrote, is fenced with the scores, after their wait: its next reader (the rescale)
// comes after that.
template <typename Cfg>
__device__ __forceinline__ void release_previous_stage(typename Cfg::SharedStorage& smem, int stage,
                                                       bool has_previous) {
  if (!has_previous) return;
  warpgroup_wait<0>();
  dev::mbar_arrive(&smem.k_empty[stage ^ 1]);
}

template <typename TS, typename TO>
__device__ __forceinline__ void wait_scores(TS& scores, TO& o) {
  warpgroup_wait<0>();
  warpgroup_fence_operand(scores);
  warpgroup_fence_operand(o);
}

// Warpgroup 1: S, the softmax, P, and P V for output columns [0, 256).
template <typename Cfg>
__device__ void scorer_loop(typename Cfg::SharedStorage& smem, const KernelParams& p, const CUtensorMap* q_map,
                            const detail::PartMetadata& meta, int m) {
  using namespace cute;
  const int wtid = threadIdx.x - 128;
  Consumer<Cfg> c(wtid);
  const int lane = c.lane;
  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Cfg::SmemLayoutQ{});
  typename Cfg::MmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(wtid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<Cfg::kBlockM>, Int<Cfg::kBlockN>>{});
  static_assert(decltype(size(tSrS))::value == 32, "S fragment: 64 x 64 per warpgroup");
  // P in SmemLayoutP: element pair i of row h is the 4-byte word at p_row_addr[h] ^ ((i / 4) << 4)
  // (16-byte group i / 4 of the row, swizzled by row % 8 = lane / 4).
  uint32_t p_row_addr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    p_row_addr[h] = dev::smem_addr(smem.p) + c.rows[h] * (Cfg::kBlockN * 2) + (lane % 4) * 4 + ((lane / 4) << 4);

  int g = 0;  // tiles consumed by this CTA: stage g % 2, phase (g / 2) % 2
  uint32_t q_phase = 0;
  uint32_t conv_phase = 0;  // of q_converted
  int q_loaded = -1;  // the request whose Q was issued last
  for (int r = meta.begin_req; r <= meta.end_req; ++r) {
    const Request q = request_of(p, meta, r);
    const bool split = p.req_num_splits[r] > 1;
    const int slot = split ? p.req_split_base[r] + (r == meta.begin_req ? meta.begin_split_idx : 0) : 0;
    float row_m[2] = {-INFINITY, -INFINITY};
    float row_l[2] = {0.f, 0.f};  // this thread's columns' share until the piece's last tile
    clear(c.tOrO);
    if (q.tiles > 0) {
      if (q_loaded != r && wtid == 0) issue_q<Cfg>(smem, q_map, p, q, m);
      q_loaded = r;
      // The helper converts Q with this warpgroup once it is done with the previous tile's P and
      // its own epilogue: the P-free barrier of this request's first tile is passed here.
      if (g > 0) dev::named_barrier_sync(kBarrierPFree, Cfg::kConsumerThreads);
      dev::mbar_wait(&smem.q_full, q_phase);
      q_phase ^= 1;
      trace::event(trace::kScorer, g, trace::kScorerQLanded);
      float score_scale = p.scale_log2;
      score_scale *= convert_q_to_half<Cfg, Cfg::kConsumerThreads>(smem, wtid, conv_phase);
      trace::event(trace::kScorer, g, trace::kScorerConverted);
      for (int u = q.u0; u < q.u1; ++u, ++g) {
        const int stage = g % Cfg::kStages;
        const uint32_t phase = (g / Cfg::kStages) & 1;
        const bool last = u + 1 == q.u1;
        Tensor sK = make_tensor(make_smem_ptr(smem.k[stage]), typename Cfg::SmemLayoutK{});
        Tensor tSrK = thr_s.partition_fragment_B(sK);
        release_previous_stage<Cfg>(smem, stage, u > q.u0);
        dev::mbar_wait(&smem.k_full[stage], phase);
        trace::event(trace::kScorer, g, trace::kScorerFull);
        // The producers fill the stage through the generic proxy (st.shared, cp.async); wgmma reads
        // it through the async one. The proxy fence is the consumers', after the barrier: in the
        // producers its MEMBAR waited for the next tile's loads, issued during the stores.
        dev::fence_proxy_async_smem();
        issue_scores<Cfg::kScoreKStepsPerBatch>(mma_s, tSrQ, tSrK, tSrS);
        wait_scores(tSrS, c.tOrO);
        trace::event(trace::kScorer, g, trace::kScorerScored);
        // Q is read by S only: once the request's last S is done, the next request's Q loads while
        // this one's softmax, P V and epilogue run.
        if (last && r < meta.end_req) {
          if (wtid == 0) {
            const Request next = request_of(p, meta, r + 1);
            if (next.tiles > 0) issue_q<Cfg>(smem, q_map, p, next, m);
          }
          q_loaded = r + 1;
        }

        // Scores of invalid tokens are -inf: those rows of K are zero, which would score 0.
        static_assert(Cfg::kProducerWarps == 4 && Cfg::kTokensPerProducerWarp == 16, "valid words of 16 bits");
        const uint4 words = *reinterpret_cast<const uint4*>(smem.valid[stage]);
        const uint64_t valid = static_cast<uint64_t>(words.x) | (static_cast<uint64_t>(words.y) << 16) |
                               (static_cast<uint64_t>(words.z) << 32) | (static_cast<uint64_t>(words.w) << 48);
        float tile_max[2] = {-INFINITY, -INFINITY};
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) {
          const float s = ((valid >> frag_col(i, lane)) & 1u) ? tSrS(i) * score_scale : -INFINITY;
          tSrS(i) = s;
          tile_max[(i / 2) % 2] = fmaxf(tile_max[(i / 2) % 2], s);
        }
        float base[2], scale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
          tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
          const float new_m = fmaxf(row_m[h], tile_max[h]);
          base[h] = new_m == -INFINITY ? 0.f : new_m;  // no key yet: P stays 0
          scale[h] = dev::exp2_ftz(row_m[h] - base[h]);
          row_m[h] = new_m;
          row_l[h] *= scale[h];
        }
        // P and the statistics are single-buffered: the other warpgroup must be done with the
        // previous tile's.
        if (u > q.u0) dev::named_barrier_sync(kBarrierPFree, Cfg::kConsumerThreads);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); i += 2) {
          const int h = (i / 2) % 2;
          const float a = dev::exp2_ftz(tSrS(i) - base[h]);
          const float b = dev::exp2_ftz(tSrS(i + 1) - base[h]);
          row_l[h] += a + b;
          dev::st_shared_u32(p_row_addr[h] ^ ((i / 4) << 4), pack_p<typename Cfg::Element>(a, b));
        }
        if (last) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            row_l[h] += __shfl_xor_sync(0xffffffffu, row_l[h], 1);
            row_l[h] += __shfl_xor_sync(0xffffffffu, row_l[h], 2);
          }
        }
        if (lane % 4 == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            smem.row_scale[c.rows[h]] = scale[h];
            if (last) {
              smem.row_sum[c.rows[h]] = row_l[h];
              smem.row_max[c.rows[h]] = row_m[h];
            }
          }
        }
        dev::fence_proxy_async_smem();  // P is read by wgmma
        // Both warpgroups: every row of P (this warpgroup's own P V reads all of them) and the
        // statistics are in shared memory.
        dev::named_barrier_sync(kBarrierPReady, Cfg::kConsumerThreads);
        trace::event(trace::kScorer, g, trace::kScorerPublished);
        c.multiply(smem, stage, scale);
      }
      c.retire();
      dev::mbar_arrive(&smem.k_empty[(g - 1) % Cfg::kStages]);
      trace::event(trace::kScorer, g - 1, trace::kScorerRetired);
    }
    store_output<Cfg>(p, q, m, c.tOrO, c.rows, row_l, row_m, split, slot, 0, true, lane);
    if (q.tiles > 0) trace::event(trace::kScorer, g - 1, trace::kScorerEpilogue);
  }
  if (wtid == 0) trace::span(1);
  if (g > 0) dev::named_barrier_sync(kBarrierPFree, Cfg::kConsumerThreads);  // the other's last tile
}

// Warpgroup 2: P V for output columns [256, 512), with the scorer's P and statistics.
template <typename Cfg>
__device__ void helper_loop(typename Cfg::SharedStorage& smem, const KernelParams& p,
                            const detail::PartMetadata& meta, int m) {
  const int wtid = threadIdx.x - 128;
  Consumer<Cfg> c(wtid);
  int g = 0;
  uint32_t q_phase = 0;
  uint32_t conv_phase = 0;
  for (int r = meta.begin_req; r <= meta.end_req; ++r) {
    const Request q = request_of(p, meta, r);
    const bool split = p.req_num_splits[r] > 1;
    const int slot = split ? p.req_split_base[r] + (r == meta.begin_req ? meta.begin_split_idx : 0) : 0;
    float row_m[2] = {-INFINITY, -INFINITY};
    float row_l[2] = {0.f, 0.f};
    if (q.tiles > 0) {
      dev::mbar_wait(&smem.q_full, q_phase);
      q_phase ^= 1;
      trace::event(trace::kHelper, g, trace::kHelperQLanded);
      convert_q_to_half<Cfg, Cfg::kConsumerThreads>(smem, wtid, conv_phase);
      trace::event(trace::kHelper, g, trace::kHelperConverted);
    }
    // After the conversion: O's registers are free while it runs (the helper has only 32 others).
    clear(c.tOrO);
    if (q.tiles > 0) {
      for (int u = q.u0; u < q.u1; ++u, ++g) {
        const int stage = g % Cfg::kStages;
        const bool last = u + 1 == q.u1;
        dev::named_barrier_sync(kBarrierPReady, Cfg::kConsumerThreads);
        trace::event(trace::kHelper, g, trace::kHelperP);
        dev::fence_proxy_async_smem();  // as the scorer
        float scale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          scale[h] = smem.row_scale[c.rows[h]];
          if (last) {
            row_l[h] = smem.row_sum[c.rows[h]];
            row_m[h] = smem.row_max[c.rows[h]];
          }
        }
        c.multiply(smem, stage, scale);
        // This warpgroup's P V must be done before the scorer overwrites P.
        c.retire();
        dev::mbar_arrive(&smem.k_empty[stage]);
        trace::event(trace::kHelper, g, trace::kHelperRetired);
        // After a request's last tile, the barrier waits for this warpgroup's epilogue (below), so
        // that both epilogues run at once and the scorer then meets this warpgroup in Q's conversion.
        if (!last) dev::named_barrier_sync(kBarrierPFree, Cfg::kConsumerThreads);
      }
    }
    store_output<Cfg>(p, q, m, c.tOrO, c.rows, row_l, row_m, split, slot, Cfg::kHeadDimV / 2, false, c.lane);
    if (q.tiles > 0) {
      trace::event(trace::kHelper, g - 1, trace::kHelperEpilogue);
      dev::named_barrier_sync(kBarrierPFree, Cfg::kConsumerThreads);
    }
  }
}

// Head rows of the Q tile that no TMA box covers (h_q below the tile's rows) stay zero. Before the
// first Q load, by every thread.
template <typename Cfg>
__device__ __forceinline__ void zero_uncovered_q_rows(typename Cfg::SharedStorage& smem, const KernelParams& p) {
  if (p.q_box_rows >= Cfg::kQRows) return;
  for (int c = 0; c < Cfg::kChunks; ++c) {
    char* start = reinterpret_cast<char*>(smem.q + c * Cfg::kQRows * Cfg::kChunkCols + p.q_box_rows * Cfg::kChunkCols);
    const int bytes = (Cfg::kQRows - p.q_box_rows) * Cfg::kChunkCols * 2;
    for (int off = threadIdx.x * 16; off < bytes; off += Cfg::kThreads * 16)
      *reinterpret_cast<uint4*>(start + off) = make_uint4(0, 0, 0, 0);
  }
  dev::fence_proxy_async_smem();
}

// The prologue both forms share, by every thread: the combine behind this kernel may launch (it
// waits for this grid itself), then the barriers, Q's descriptor and the uncovered Q rows. Launched
// with programmatic stream serialisation (as dense decode), so this overlaps the kernel before it;
// nothing a previous kernel wrote is read before the wait.
template <typename Cfg>
__device__ __forceinline__ void kernel_prologue(typename Cfg::SharedStorage& smem, const CUtensorMap* q_map,
                                                const KernelParams& p) {
  dev::pdl_launch_dependents();
  if (threadIdx.x == 0) {
    dev::tma_prefetch_descriptor(q_map);
    dev::mbar_init(&smem.q_full, 1);
    dev::mbar_init(&smem.q_converted, Cfg::kConsumerThreads);
    for (int s = 0; s < Cfg::kStages; ++s) {
      dev::mbar_init(&smem.k_full[s], Cfg::kProducerThreads);
      dev::mbar_init(&smem.k_empty[s], Cfg::kConsumerThreads);
    }
    dev::fence_barrier_init();
  }
  zero_uncovered_q_rows<Cfg>(smem, p);
  dev::pdl_wait_for_prerequisites();
  __syncthreads();
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sparse_decode_kernel(const __grid_constant__ CUtensorMap q_map, const KernelParams p) {
  HMLA_ALIGNED_SHARED_STORAGE(typename Cfg::SharedStorage, smem);
  // blockIdx.x is the head tile, z the plan's part.
  const int part = static_cast<int>(blockIdx.z);
  const int m = static_cast<int>(blockIdx.x);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) trace::span(0);
  kernel_prologue<Cfg>(smem, &q_map, p);

  const detail::PartMetadata meta = p.parts[part];
  if (meta.begin_req >= p.requests) return;

  if (warpgroup == 0) {
    dev::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    producer_loop<Cfg>(smem, p, meta);
  } else if (warpgroup == 1) {
    dev::warpgroup_reg_alloc<Cfg::kScorerRegs>();
    scorer_loop<Cfg>(smem, p, &q_map, meta, m);
  } else {
    if constexpr (Cfg::kHelperRegs < Cfg::kLaunchRegs) dev::warpgroup_reg_dealloc<Cfg::kHelperRegs>();
    helper_loop<Cfg>(smem, p, meta, m);
  }
}

template <SparseCacheLayout kLayout>
void launch_kernel(const CUtensorMap& q_map, const KernelParams& params, int num_m_blocks, int num_sm_parts,
                   cudaStream_t stream) {
  using Cfg = Config<kLayout>;
  auto kernel = sparse_decode_kernel<Cfg>;
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  detail::launch_after_prerequisites(kernel, dim3(num_m_blocks, 1, num_sm_parts), dim3(Cfg::kThreads),
                                     Cfg::kSmemBytes, stream, q_map, params);
#ifdef HMLA_SPARSE_TRACE
  // Trace builds only: the buffer is a device symbol of this translation unit.
  dev::timeline::write_trace_file(trace::g_buffer, stream);
#endif
}

}  // namespace hmla::sm90::sparse_decode
