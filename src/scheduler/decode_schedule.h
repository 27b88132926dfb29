// The work partition shared by every decode kernel: how much work each request is, how the plan
// kernel lays out the workspace, how a persistent CTA reads its range of (request, block) work, and
// how query rows map to tiles.
//
// Work unit: one block of kBlockN = 64 keys of one request (an empty request counts as one unit, so
// exactly one CTA writes its "no key" output). Each of num_sm_parts CTAs per (kv head, query tile)
// takes a contiguous range of units in request order; a request cut by a range boundary is "split"
// and its pieces are merged by the combine kernel.
//
// A request is a batch entry for dense decode (its s_q query tokens share the keys, so they share
// the tile rows), and one query token (batch entry, s_q position) for sparse decode (each token has
// its own index lists).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hmla/decode_schedule.h"

#if defined(__CUDACC__)
#define HMLA_HOST_DEVICE __host__ __device__
#else
#define HMLA_HOST_DEVICE
#endif

namespace hmla::detail {

constexpr int kBlockN = 64;          // cached tokens per work unit (one K tile)
constexpr int kTileRows = 64;        // query rows per CTA tile (one wgmma M)
// Modelled cost of starting one more piece, in units of kBlockN tokens (Q load, pipeline fill,
// partial write and its share of the combine). Parts of few tiles are latency-bound and want few,
// long pieces (FlashMLA's 5 units); parts of many tiles want the tiles spread evenly, and there 5
// units rounds whole parts away (b = 8, h_q 128, s_k 8192: 17 tiles on 60 of 66 parts instead of
// 16 on 64; measured 54.3 -> 52.6 us with 3 units, b = 1 unchanged; docs/PERF.md).
constexpr int kSplitOverheadUnits = 5;
constexpr int kSplitOverheadUnitsLongParts = 3;
constexpr int kLongPartTiles = 8;  // tiles per part from which the long-part cost applies

// Most requests one plan partitions: the plan keeps one 64-bit prefix sum per request in shared
// memory (128 KB).
constexpr int kMaxPlanRequests = 16384;

// Keys of one list after clamping a device-side length to [0, capacity] (lengths the host cannot
// check are defined behaviour, never an out-of-bounds read).
HMLA_HOST_DEVICE inline int clamp_length(int length, int capacity) {
  return length < 0 ? 0 : (length > capacity ? capacity : length);
}
// (keys / kBlockN rounded up, without keys + kBlockN - 1, which overflows for keys near INT_MAX.)
HMLA_HOST_DEVICE inline int blocks_of(int keys) { return keys / kBlockN + (keys % kBlockN > 0); }

// How much work each request of a plan is, read on the device by the plan kernel and the attention
// kernels alike (so both see the same lengths).
struct DecodeWork {
  // Dense: request r attends to cache_seqlens[r] keys.
  const int32_t* seqlens = nullptr;
  // Sparse (seqlens == nullptr): request r is query token r % tokens_per_batch of batch entry
  // r / tokens_per_batch; its keys are the first topk_length[b] (or topk) entries of its main list,
  // then, with an extra cache (extra_topk > 0), the first extra_topk_length[b] (or extra_topk) of its
  // extra list. Each list is cut into its own blocks of kBlockN entries.
  int tokens_per_batch = 1;
  int topk = 0;
  const int32_t* topk_length = nullptr;
  int extra_topk = 0;
  const int32_t* extra_topk_length = nullptr;

  HMLA_HOST_DEVICE int main_keys(int r) const {
    if (seqlens != nullptr) return seqlens[r] > 0 ? seqlens[r] : 0;
    return topk_length != nullptr ? clamp_length(topk_length[r / tokens_per_batch], topk) : topk;
  }
  HMLA_HOST_DEVICE int extra_keys(int r) const {
    if (seqlens != nullptr || extra_topk <= 0) return 0;
    return extra_topk_length != nullptr ? clamp_length(extra_topk_length[r / tokens_per_batch], extra_topk)
                                        : extra_topk;
  }
  // The same lengths by batch entry, with the kind of work resolved once (the plan kernel loads
  // thousands of them: no branch or division per request).
  struct EntryLengths {
    const int32_t* main;  // lengths of the main list, or nullptr: main_cap for every entry
    int main_cap;
    const int32_t* extra;
    int extra_cap;
    HMLA_HOST_DEVICE int main_keys(int b) const { return main != nullptr ? clamp_length(main[b], main_cap) : main_cap; }
    HMLA_HOST_DEVICE int extra_keys(int b) const {
      return extra != nullptr ? clamp_length(extra[b], extra_cap) : extra_cap;
    }
  };
  HMLA_HOST_DEVICE EntryLengths entry_lengths() const {
    if (seqlens != nullptr) return EntryLengths{seqlens, 0x7fffffff, nullptr, 0};
    if (extra_topk <= 0) return EntryLengths{topk_length, topk, nullptr, 0};
    return EntryLengths{topk_length, topk, extra_topk_length, extra_topk};
  }
  // Units of work: the blocks of both lists, at least one.
  HMLA_HOST_DEVICE static int units_of_keys(int main, int extra) {
    const int blocks = blocks_of(main) + blocks_of(extra);
    return blocks > 0 ? blocks : 1;
  }
  HMLA_HOST_DEVICE int units(int r) const { return units_of_keys(main_keys(r), extra_keys(r)); }
};

struct PartMetadata {
  int32_t begin_req;        // first request (== batch: no work)
  int32_t begin_unit;       // first unit inside begin_req
  int32_t end_req;          // last request (inclusive)
  int32_t end_unit;         // one past the last unit inside end_req
  int32_t begin_split_idx;  // which piece of begin_req this part computes
  int32_t begin_seqlen;     // main_keys(begin_req): the kernel's first loads need no other read
  int32_t begin_extra_keys; // extra_keys(begin_req)
  int32_t pad;
};
static_assert(sizeof(PartMetadata) == 32, "PartMetadata is 8 ints");

// Query rows of one kv head ([s_q][heads_per_kv]) cut into tiles of at most 64 rows, a tile being
// a box of `tokens_per_tile` consecutive query tokens x `heads_per_tile` consecutive heads, so that
// one TMA box loads it. Row r of tile m is token t0 + r / heads_per_tile, head hh0 + r % heads_per_tile.
struct RowTiling {
  int s_q;
  int heads_per_kv;
  int heads_per_tile;     // min(heads_per_kv, 64)
  int tokens_per_tile;    // 64 / heads_per_kv (capped by s_q) when heads_per_kv <= 64, else 1
  int head_tiles;         // ceil(heads_per_kv / 64): 1 or 2
  int num_m_blocks;       // head_tiles * ceil(s_q / tokens_per_tile)

  static RowTiling make(int s_q, int heads_per_kv) {
    RowTiling t{};
    t.s_q = s_q;
    t.heads_per_kv = heads_per_kv;
    t.heads_per_tile = heads_per_kv < kTileRows ? heads_per_kv : kTileRows;
    t.head_tiles = (heads_per_kv + kTileRows - 1) / kTileRows;
    int tokens = heads_per_kv <= kTileRows ? kTileRows / heads_per_kv : 1;
    t.tokens_per_tile = tokens < s_q ? tokens : s_q;
    t.num_m_blocks = t.head_tiles * ((s_q + t.tokens_per_tile - 1) / t.tokens_per_tile);
    return t;
  }
  HMLA_HOST_DEVICE int first_token(int m) const { return (m / head_tiles) * tokens_per_tile; }
  HMLA_HOST_DEVICE int first_head(int m) const { return (m % head_tiles) * kTileRows; }
  // Returns false for padding rows of the tile.
  HMLA_HOST_DEVICE bool row(int m, int r, int& token, int& head_in_kv) const {
    token = first_token(m) + r / heads_per_tile;
    head_in_kv = first_head(m) + r % heads_per_tile;
    return r < heads_per_tile * tokens_per_tile && token < s_q && head_in_kv < heads_per_kv;
  }
};

// Where the plan puts things inside the caller's workspace (all offsets 256-byte aligned).
struct WorkspaceLayout {
  size_t part_metadata;       // PartMetadata[num_sm_parts]
  size_t req_num_splits;      // int32[requests]: pieces of each request (1: not split)
  size_t req_split_base;      // int32[requests]: first accumulator slot of a split request
  size_t split_list;          // int32[1 + num_sm_parts]: count, then the split requests
  size_t lse_accum;           // float[2 * num_sm_parts][h_kv][num_m_blocks * 64]
  size_t o_accum;             // bf16/fp16[2 * num_sm_parts][h_kv][num_m_blocks * 64][d_v]
  size_t total;

  static size_t align(size_t x) { return (x + 255) / 256 * 256; }
  static WorkspaceLayout make(int requests, int num_sm_parts, int h_kv, int num_m_blocks, int d_v) {
    WorkspaceLayout w{};
    size_t at = 0;
    w.part_metadata = at;  at = align(at + sizeof(PartMetadata) * num_sm_parts);
    w.req_num_splits = at; at = align(at + sizeof(int32_t) * requests);
    w.req_split_base = at; at = align(at + sizeof(int32_t) * requests);
    w.split_list = at;     at = align(at + sizeof(int32_t) * (1 + num_sm_parts));
    const size_t slots = 2 * static_cast<size_t>(num_sm_parts);  // at most 2 pieces per part
    const size_t rows = static_cast<size_t>(h_kv) * num_m_blocks * kTileRows;
    w.lse_accum = at;      at = align(at + sizeof(float) * slots * rows);
    // Partial outputs are normalised rows of V values, so the output dtype holds them (half the
    // bytes of fp32 to write at the end of a piece and to read in the combine).
    w.o_accum = at;        at = align(at + sizeof(uint16_t) * slots * rows * d_v);
    w.total = at;
    return w;
  }
};

// Persistent CTAs per (kv head, query tile), so that all of them together fill the GPU once.
inline int num_sm_parts_for(int num_sms, int h_kv, int num_m_blocks) {
  int parts = num_sms / (h_kv * num_m_blocks);
  return parts > 0 ? parts : 1;
}

// The plan's views and the outputs in a decode kernel's parameters (every family's KernelParams
// names them alike).
template <class KernelParams, class Params>
void set_schedule_and_outputs(KernelParams& kp, const hmla::DecodeSchedule& s, const Params& params) {
  kp.parts = reinterpret_cast<const PartMetadata*>(s.tile_metadata);
  kp.req_num_splits = s.num_splits;
  kp.req_split_base = s.split_base;
  kp.lse_accum = s.lse_accum;
  kp.o_accum = s.o_accum;
  kp.out = params.out;
  kp.out_batch_stride = params.out_batch_stride;
  kp.out_token_stride = params.out_token_stride;
  kp.out_head_stride = params.out_head_stride;
  kp.lse = params.lse;
  kp.lse_batch_stride = params.lse_batch_stride;
  kp.lse_head_stride = params.lse_head_stride;
}

}  // namespace hmla::detail
