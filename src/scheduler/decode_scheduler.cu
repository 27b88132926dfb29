#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <cstdlib>

#include <cub/block/block_scan.cuh>

#include "common/cuda_check.h"
#include "common/device_attributes.h"
#include "scheduler/greedy_walk.h"

namespace hmla::detail {
namespace {

// Threads of the plan's CTA, chosen per launch (plan_threads): every warp runs the kernel's fixed
// steps (its scans, barriers, the budget), which cost ~0.15 us of the plan per warp (H100: 16 more
// warps, +2.35 us at b 1), while the requests a thread handles one after another cost ~1.6 us each
// at b 1024-4096. So a small plan takes one thread per part (132 parts: five warps) and a large one
// more threads.
constexpr int kPlanThreadsSmall = 160;
constexpr int kPlanThreadsMedium = 512;
constexpr int kPlanThreadsLarge = 1024;
constexpr int kPlanLargeFrom = 2048;  // requests past which the large CTA is used
// Up to this many requests the parts come from chains ranked by binary lifting (shared memory:
// 4 bytes per request and lifting level, 8 levels for 132 parts: 128 KB at 4096), where their
// shared memory fits kChainedPlanSmemBytes (more parts than SMs make more levels); past it warp 0
// walks the parts one after another (~0.2 us each on an H200).
constexpr int kChainedPlanRequests = 4096;
constexpr size_t kChainedPlanSmemBytes = 220 * 1024;
// Up to this many requests (at most 32) warp 0 alone loads the lengths, scans them and ranks the
// chains, by shuffles: no block barrier until the parts. 0: the block form for every size.
#ifndef HMLA_PLAN_WARP_REQUESTS
#define HMLA_PLAN_WARP_REQUESTS 32
#endif
static_assert(HMLA_PLAN_WARP_REQUESTS <= 32, "the warp form holds one request per lane");
// Lengths loaded per thread before any is used: a thread's requests cost one memory round trip per
// batch, not one each.
constexpr int kLengthLoadBatch = 8;

// Shared memory of the plan kernel for `requests` and `num_sm_parts` (dynamic; 8-byte aligned
// pieces first): the prefix C, each part's closing record, and either the chained form's lengths and
// lifting levels or the warp walk's parts.
struct PlanSmem {
  size_t closing, keys, levels, walked, bytes;
  __host__ __device__ static PlanSmem make(int requests, int num_sm_parts, bool chained) {
    PlanSmem m{};
    size_t at = sizeof(long long) * (requests + 1);
    m.closing = at;
    at += sizeof(int2) * num_sm_parts;
    if (chained) {
      m.keys = at;
      at += sizeof(int2) * requests;
      m.levels = at;
      at += sizeof(uint32_t) * lifting_levels(requests, num_sm_parts) * (requests + 1);
    } else {
      m.walked = at;
      at += sizeof(PartMetadata) * num_sm_parts;
    }
    m.bytes = at;
    return m;
  }
  static bool chained_form(int requests, int num_sm_parts) {
    return requests <= kChainedPlanRequests && make(requests, num_sm_parts, true).bytes <= kChainedPlanSmemBytes;
  }
};

// The plan in one CTA. Every request costs its units plus a fixed cost per piece it is cut into;
// parts are filled greedily in request order, each with the same budget (the greedy of
// docs/DENSE_DECODE.md "Work partition", src/scheduler/greedy_walk.h):
//   1. each thread loads the lengths of a contiguous chunk of requests (kLengthLoadBatch in flight),
//      keeps them for step 3 and sums its units; one block scan -> the per-piece cost -> C, the
//      prefix of units + cost, in place;
//   2. up to kChainedPlanRequests requests (`chained`): each thread computes the chains of its chunk (the parts
//      from a request's start up to one that stops at a later request's start; each search starts
//      at the previous request's stop), then log2(min(requests, parts)) rounds of binary lifting
//      over the chains. Past it, warp 0 walks the parts one after another, each finding where its
//      budget ends by a 32-wide search forward in C;
//   3. each thread takes a contiguous chunk of parts: finds each part's chain by one descent,
//      computes it and writes its metadata, and knows from the part's end whether it closes a split
//      request; one block scan over the parts numbers the split requests (at most one closes per part).
// So the barriers are the two scans', one after C, one per lifting level: no step is serial over
// the parts, and every global load is in step 1.
// overhead <= 0: the cost is chosen from the tiles per part (kSplitOverheadUnits or
// kSplitOverheadUnitsLongParts).
template <int kPlanThreads>
__global__ void __launch_bounds__(kPlanThreads) decode_scheduler_kernel(DecodeWork work, int requests,
                                                                        int num_sm_parts, int overhead, bool chained,
                                                                        PartMetadata* __restrict__ parts,
                                                                        int32_t* __restrict__ req_num_splits,
                                                                        int32_t* __restrict__ req_split_base,
                                                                        int32_t* __restrict__ split_list) {
  extern __shared__ long long cost_prefix[];
  const PlanSmem layout = PlanSmem::make(requests, num_sm_parts, chained);
  char* smem = reinterpret_cast<char*>(cost_prefix);
  int2* closing = reinterpret_cast<int2*>(smem + layout.closing);  // per part: (request, pieces) it closes
  int2* keys = reinterpret_cast<int2*>(smem + layout.keys);  // chained: (main, extra) keys per request
  using Scan = cub::BlockScan<long long, kPlanThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename Scan::TempStorage scan_storage;  // reused: barriers separate the two scans

  // The per-piece cost: forced, or chosen from the tiles per part.
  auto choose_overhead = [&](long long total_units) {
    if (overhead > 0) return overhead;
    return total_units >= static_cast<long long>(kLongPartTiles) * num_sm_parts ? kSplitOverheadUnitsLongParts
                                                                               : kSplitOverheadUnits;
  };
  // Each part's budget, computed by one thread (a 64-bit division) and read by all after the barrier.
  auto budget_of = [&](int piece_cost) {
    return (cost_prefix[requests] + num_sm_parts - 1) / num_sm_parts + piece_cost;
  };
  __shared__ long long part_budget;
  const bool warp_form = HMLA_PLAN_WARP_REQUESTS > 0 && chained && requests <= HMLA_PLAN_WARP_REQUESTS;
  __shared__ int warp_form_overhead;
  uint32_t* lifting_levels_smem = reinterpret_cast<uint32_t*>(smem + layout.levels);
  const int levels = chained ? lifting_levels(requests, num_sm_parts) : 0;
  const int row = requests + 1;
  if (warp_form) {
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      const DecodeWork::EntryLengths lengths = work.entry_lengths();
      int main_keys = 0, extra_keys = 0;
      if (lane < requests) {
        const int entry = lane / work.tokens_per_batch;
        main_keys = lengths.main_keys(entry);
        extra_keys = lengths.extra_keys(entry);
        keys[lane] = make_int2(main_keys, extra_keys);
        req_num_splits[lane] = 1;
        req_split_base[lane] = -1;
      }
      const long long units = lane < requests ? DecodeWork::units_of_keys(main_keys, extra_keys) : 0;
      long long through = units;  // inclusive prefix of the units
      for (int offset = 1; offset < 32; offset *= 2) {
        const long long below = __shfl_up_sync(0xffffffffu, through, offset);
        if (lane >= offset) through += below;
      }
      const long long total_units = __shfl_sync(0xffffffffu, through, 31);
      const int piece_cost = choose_overhead(total_units);
      if (lane < requests) cost_prefix[lane] = through - units + static_cast<long long>(lane) * piece_cost;
      if (lane == 0) {
        cost_prefix[requests] = total_units + static_cast<long long>(requests) * piece_cost;
        warp_form_overhead = piece_cost;
        part_budget = budget_of(piece_cost);
      }
      __syncwarp();
      const GreedyWalk lane_walk{cost_prefix, requests, part_budget, piece_cost};
      // Lane r holds request r's link at each level; lanes past the requests hold the end.
      uint32_t link = lane < requests ? lane_walk.chain_from(lane, num_sm_parts) : ChainLink::pack(requests, 0);
      for (int l = 0; l < levels; ++l) {
        if (l > 0) {
          const int next = ChainLink::next(link);
          const uint32_t successor = __shfl_sync(0xffffffffu, link, next & 31);
          link = ChainLink::then(link, next < requests ? successor : ChainLink::pack(requests, 0));
        }
        if (lane < requests) lifting_levels_smem[l * row + lane] = link;
        if (lane == 0) lifting_levels_smem[l * row + requests] = ChainLink::pack(requests, 0);
      }
    }
    __syncthreads();
    overhead = warp_form_overhead;
  } else {
    // Each thread owns a contiguous chunk of requests, so the units scan is a local pass and one block scan.
    const int per_thread = (requests + kPlanThreads - 1) / kPlanThreads;
    const int r0 = min(requests, static_cast<int>(threadIdx.x) * per_thread);
    const int r1 = min(requests, r0 + per_thread);

    long long local_units = 0;
    const DecodeWork::EntryLengths lengths = work.entry_lengths();
    // Request r is token r % tokens_per_batch of batch entry r / tokens_per_batch (dense: 1 token).
    int entry = r0 / work.tokens_per_batch, token = r0 - entry * work.tokens_per_batch;
    for (int base = r0; base < r1; base += kLengthLoadBatch) {
      int main_keys[kLengthLoadBatch], extra_keys[kLengthLoadBatch];
#pragma unroll
      for (int i = 0; i < kLengthLoadBatch; ++i) {
        const bool in = base + i < r1;
        main_keys[i] = in ? lengths.main_keys(entry) : 0;
        extra_keys[i] = in ? lengths.extra_keys(entry) : 0;
        if (++token == work.tokens_per_batch) {
          token = 0;
          ++entry;
        }
      }
#pragma unroll
      for (int i = 0; i < kLengthLoadBatch; ++i) {
        if (base + i >= r1) break;
        const int units = DecodeWork::units_of_keys(main_keys[i], extra_keys[i]);
        cost_prefix[base + i] = units;
        local_units += units;
        if (chained) keys[base + i] = make_int2(main_keys[i], extra_keys[i]);
      }
    }
    // Every request unsplit until a part that closes it says otherwise (step 3, after barriers).
    for (int r = threadIdx.x; r < requests; r += kPlanThreads) {
      req_num_splits[r] = 1;
      req_split_base[r] = -1;
    }
    long long units_before, total_units;
    Scan(scan_storage).ExclusiveSum(local_units, units_before, total_units);
    overhead = choose_overhead(total_units);
    for (int r = r0; r < r1; ++r) {
      const long long units = cost_prefix[r];
      cost_prefix[r] = units_before + static_cast<long long>(r) * overhead;
      units_before += units;
    }
    if (threadIdx.x == 0) {
      cost_prefix[requests] = total_units + static_cast<long long>(requests) * overhead;
      part_budget = budget_of(overhead);
    }
    __syncthreads();
  }

  const GreedyWalk walk{cost_prefix, requests, part_budget, overhead};
  const int parts_per_thread = (num_sm_parts + kPlanThreads - 1) / kPlanThreads;
  const int p0 = min(num_sm_parts, static_cast<int>(threadIdx.x) * parts_per_thread);
  const int p1 = min(num_sm_parts, p0 + parts_per_thread);
  long long local_splits = 0;  // split slots in the high 32 bits, split requests in the low
  auto record = [&](int p, const PartMetadata& meta, int pieces, int main_keys, int extra_keys) {
    PartMetadata out = meta;
    if (meta.begin_req < requests) {
      out.begin_seqlen = main_keys;
      out.begin_extra_keys = extra_keys;
    }
    parts[p] = out;
    closing[p] = make_int2(meta.begin_req, pieces);
    if (pieces > 0) local_splits += (static_cast<long long>(pieces) << 32) | 1;
  };

  if (chained) {
    if (!warp_form) {
      // This thread's requests, as in the first step.
      const int per_thread = (requests + kPlanThreads - 1) / kPlanThreads;
      const int r0 = min(requests, static_cast<int>(threadIdx.x) * per_thread);
      const int r1 = min(requests, r0 + per_thread);
      int first_stop = r0;
      for (int r = r0; r < r1; ++r) lifting_levels_smem[r] = walk.chain_from(r, num_sm_parts, first_stop);
      if (threadIdx.x == 0) lifting_levels_smem[requests] = ChainLink::pack(requests, 0);
      for (int l = 1; l < levels; ++l) {
        __syncthreads();
        const uint32_t* below = lifting_levels_smem + (l - 1) * row;
#pragma unroll 4
        for (int r = threadIdx.x; r <= requests; r += kPlanThreads)
          lifting_levels_smem[l * row + r] = ChainLink::then(below[r], below[ChainLink::next(below[r])]);
      }
      __syncthreads();
    }
    const ChainLifting lifting{lifting_levels_smem, requests, levels};
    for (int p = p0; p < p1; ++p) {
      int head, first;
      lifting.chain_of_part(p, head, first);
      PartMetadata meta{};
      meta.begin_req = requests;
      meta.end_req = -1;
      int next_begin_req = requests;
      if (head < requests) meta = walk.chain_part(head, p - first, lifting_levels_smem[head], next_begin_req);
      const int2 k = meta.begin_req < requests ? keys[meta.begin_req] : make_int2(0, 0);
      record(p, meta, pieces_closed_by(meta, next_begin_req, p, num_sm_parts, requests), k.x, k.y);
    }
  } else {
    PartMetadata* walked = reinterpret_cast<PartMetadata*>(smem + layout.walked);
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      // The last request boundary at or before `end`: the prefix is strictly increasing, so the lanes
      // that pass form a prefix of the warp. The walk touches shared memory only: a global load in
      // it would cost its latency once per part (~0.3 us).
      auto warp_search = [&](long long end, int from) {
        int last = from;
        for (;;) {
          const int cand = last + 1 + lane;
          const unsigned pass = __ballot_sync(0xffffffffu, cand <= requests && cost_prefix[cand] <= end);
          const int count = __popc(pass);
          last += count;
          if (count < 32) return last;
        }
      };
      GreedyWalk::State state = walk.start_of(0);
      for (int p = 0; p < num_sm_parts; ++p) {
        const PartMetadata meta = walk.step(state, warp_search);
        if (lane == 0) walked[p] = meta;
      }
    }
    __syncthreads();
    for (int p = p0; p < p1; ++p) {
      const PartMetadata& meta = walked[p];
      const bool work_part = meta.begin_req < requests;
      record(p, meta, pieces_closed_by(walked, p, num_sm_parts, requests),
             work_part ? work.main_keys(meta.begin_req) : 0, work_part ? work.extra_keys(meta.begin_req) : 0);
    }
  }

  // Split requests numbered in request order from the parts that close them: each thread's parts
  // are contiguous, so one scan.
  long long splits_before, all_splits;
  Scan(scan_storage).ExclusiveSum(local_splits, splits_before, all_splits);
  int slot = static_cast<int>(splits_before >> 32), index = static_cast<int>(splits_before & 0xffffffff);
  for (int p = p0; p < p1; ++p) {
    const int2 c = closing[p];
    if (c.y == 0) continue;
    req_num_splits[c.x] = c.y;
    req_split_base[c.x] = slot;
    split_list[1 + index] = c.x;
    slot += c.y;
    ++index;
  }
  if (threadIdx.x == 0) split_list[0] = static_cast<int>(all_splits & 0xffffffff);
}

// HMLA_SPLIT_OVERHEAD_UNITS fixes the modelled cost of one more piece, in 64-token units (read once
// per process): a tuning knob for measurements, not an interface. 0: the kernel chooses.
int split_overhead_units() {
  static const int units = [] {
    const char* text = std::getenv("HMLA_SPLIT_OVERHEAD_UNITS");
    const int value = text ? std::atoi(text) : 0;
    return std::max(value, 0);
  }();
  return units;
}

}  // namespace

DecodeSchedule schedule_in_workspace(int batch, int s_q, int h_q, int h_kv, int num_sm_parts, int num_m_blocks,
                                     void* workspace, size_t workspace_bytes, const WorkspaceLayout& layout) {
  DecodeSchedule s{};
  s.batch = batch;
  s.s_q = s_q;
  s.h_q = h_q;
  s.h_kv = h_kv;
  s.num_sm_parts = num_sm_parts;
  s.num_m_blocks = num_m_blocks;
  s.workspace = workspace;
  s.workspace_bytes = workspace_bytes;
  char* base = static_cast<char*>(workspace);
  s.tile_metadata = reinterpret_cast<int32_t*>(base + layout.part_metadata);
  s.num_splits = reinterpret_cast<int32_t*>(base + layout.req_num_splits);
  s.split_base = reinterpret_cast<int32_t*>(base + layout.req_split_base);
  s.split_list = reinterpret_cast<int32_t*>(base + layout.split_list);
  s.lse_accum = reinterpret_cast<float*>(base + layout.lse_accum);
  s.o_accum = base + layout.o_accum;
  return s;
}

void launch_decode_scheduler(const DecodeWork& work, int requests, int num_sm_parts, void* workspace,
                             const WorkspaceLayout& layout, cudaStream_t stream) {
  if (requests > kMaxPlanRequests)
    throw CudaError("hmla: a plan holds at most " + std::to_string(kMaxPlanRequests) + " requests, got " +
                    std::to_string(requests));
  if (num_sm_parts > 0xffff)
    throw CudaError("hmla: a plan holds at most 65535 parts, got " + std::to_string(num_sm_parts));
  const bool chained = PlanSmem::chained_form(requests, num_sm_parts);
  const int smem_bytes = static_cast<int>(PlanSmem::make(requests, num_sm_parts, chained).bytes);
  // Raised once per device whatever the size: 48 KB is the limit of static and dynamic together
  // (the block scans' static storage is 5.4 KB).
  auto* base = static_cast<char*>(workspace);
  auto launch = [&](auto kernel, int threads) {
    set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), smem_bytes);
    kernel<<<1, threads, smem_bytes, stream>>>(work, requests, num_sm_parts, split_overhead_units(), chained,
                                               reinterpret_cast<PartMetadata*>(base + layout.part_metadata),
                                               reinterpret_cast<int32_t*>(base + layout.req_num_splits),
                                               reinterpret_cast<int32_t*>(base + layout.req_split_base),
                                               reinterpret_cast<int32_t*>(base + layout.split_list));
  };
  if (requests <= kPlanThreadsSmall && num_sm_parts <= kPlanThreadsSmall)
    launch(decode_scheduler_kernel<kPlanThreadsSmall>, kPlanThreadsSmall);
  else if (requests <= kPlanLargeFrom)
    launch(decode_scheduler_kernel<kPlanThreadsMedium>, kPlanThreadsMedium);
  else
    launch(decode_scheduler_kernel<kPlanThreadsLarge>, kPlanThreadsLarge);
  HMLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmla::detail
