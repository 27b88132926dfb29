#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <cstdlib>

#include <cub/block/block_scan.cuh>

#include "common/cuda_check.h"
#include "common/device_attributes.h"
#include "scheduler/greedy_walk.h"

namespace hmla::detail {
namespace {

// 512 threads: the chains and the lifting levels are loops over the requests, and at 1024 the
// warp walk (past kChainedPlanRequests) spilled its serial chain to local memory.
constexpr int kPlanThreads = 512;
// Up to this many requests the parts come from chains ranked by binary lifting (shared memory:
// 4 bytes per request and lifting level, 8 levels for 132 parts: 128 KB at 4096); past it warp 0
// walks the parts one after another (~0.2 us each on an H200).
constexpr int kChainedPlanRequests = 4096;

// The plan in one CTA. Every request costs its units plus a fixed cost per piece it is cut into;
// parts are filled greedily in request order, each with the same budget (the greedy of
// docs/DENSE_DECODE.md "Work partition", src/scheduler/greedy_walk.h):
//   1. all threads: units of every request into shared memory, one block scan: their exclusive
//      prefix and sum -> the per-piece cost -> C, the prefix of units + cost, in place;
//   2. up to kChainedPlanRequests requests: threads over requests compute each request's chain (the
//      parts from its start up to one that stops at a later request's start), then
//      log2(min(requests, parts)) rounds of binary lifting over the chains, then threads over parts
//      find each part's chain by one descent and compute the part from it; no step is serial over
//      the parts. Past it, warp 0
//      walks the parts one after another, each finding where its budget ends by a 32-wide search
//      forward in C;
//   3. threads over parts: each part's lengths read and its metadata written; the split requests
//      numbered by one scan over the parts (at most one closes per part).
// overhead <= 0: the cost is chosen from the tiles per part (kSplitOverheadUnits or
// kSplitOverheadUnitsLongParts).
__global__ void __launch_bounds__(kPlanThreads) decode_scheduler_kernel(DecodeWork work, int requests,
                                                                        int num_sm_parts, int overhead,
                                                                        PartMetadata* __restrict__ parts,
                                                                        int32_t* __restrict__ req_num_splits,
                                                                        int32_t* __restrict__ req_split_base,
                                                                        int32_t* __restrict__ split_list) {
  // Dynamic shared memory: C [requests + 1], PartMetadata [num_sm_parts], and for the chained form
  // the lifting levels [levels][requests + 1] (sized by launch_decode_scheduler).
  extern __shared__ long long cost_prefix[];
  PartMetadata* walked = reinterpret_cast<PartMetadata*>(cost_prefix + requests + 1);
  uint32_t* lifting_levels_smem = reinterpret_cast<uint32_t*>(walked + num_sm_parts);
  using Scan = cub::BlockScan<long long, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;  // reused: barriers separate the two scans

  // Each thread owns a contiguous chunk of requests, so the units scan is a local pass and one block scan.
  const int per_thread = (requests + kPlanThreads - 1) / kPlanThreads;
  const int r0 = min(requests, static_cast<int>(threadIdx.x) * per_thread);
  const int r1 = min(requests, r0 + per_thread);

  long long local_units = 0;
  for (int r = r0; r < r1; ++r) {
    const int u = work.units(r);
    cost_prefix[r] = u;
    local_units += u;
    req_num_splits[r] = 1;
    req_split_base[r] = -1;
  }
  long long units_before, total_units;
  Scan(scan_storage).ExclusiveSum(local_units, units_before, total_units);
  if (overhead <= 0)
    overhead = total_units >= static_cast<long long>(kLongPartTiles) * num_sm_parts ? kSplitOverheadUnitsLongParts
                                                                                  : kSplitOverheadUnits;
  for (int r = r0; r < r1; ++r) {
    const long long units = cost_prefix[r];
    cost_prefix[r] = units_before + static_cast<long long>(r) * overhead;
    units_before += units;
  }
  if (threadIdx.x == 0) cost_prefix[requests] = total_units + static_cast<long long>(requests) * overhead;
  __syncthreads();

  const GreedyWalk walk{cost_prefix, requests, (cost_prefix[requests] + num_sm_parts - 1) / num_sm_parts + overhead,
                        overhead};
  if (requests <= kChainedPlanRequests) {
    const int levels = lifting_levels(requests, num_sm_parts);
    const int row = requests + 1;
    for (int r = threadIdx.x; r <= requests; r += kPlanThreads)
      lifting_levels_smem[r] = r < requests ? walk.chain_from(r, num_sm_parts) : ChainLink::pack(requests, 0);
    for (int l = 1; l < levels; ++l) {
      __syncthreads();
      const uint32_t* below = lifting_levels_smem + (l - 1) * row;
      for (int r = threadIdx.x; r <= requests; r += kPlanThreads)
        lifting_levels_smem[l * row + r] = ChainLink::then(below[r], below[ChainLink::next(below[r])]);
    }
    __syncthreads();
    const ChainLifting lifting{lifting_levels_smem, requests, levels};
    for (int p = threadIdx.x; p < num_sm_parts; p += kPlanThreads) {
      int head, first;
      lifting.chain_of_part(p, head, first);
      PartMetadata meta{};
      meta.begin_req = requests;
      meta.end_req = -1;
      if (head < requests) meta = walk.chain_part(head, p - first, lifting_levels_smem[head]);
      walked[p] = meta;
    }
  } else if (threadIdx.x < 32) {
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

  // Each part's metadata written; split requests numbered in request order from the parts that close
  // them (pieces_closed_by): one scan over the parts, no pass over the requests (step 1 marked every
  // request unsplit). Each thread owns a contiguous chunk of parts; the scan carries the slots in
  // the high 32 bits and the split requests in the low.
  const int parts_per_thread = (num_sm_parts + kPlanThreads - 1) / kPlanThreads;
  const int p0 = min(num_sm_parts, static_cast<int>(threadIdx.x) * parts_per_thread);
  const int p1 = min(num_sm_parts, p0 + parts_per_thread);
  long long local_splits = 0;
  for (int p = p0; p < p1; ++p) {
    PartMetadata meta = walked[p];
    if (meta.begin_req < requests) {
      meta.begin_seqlen = work.main_keys(meta.begin_req);
      meta.begin_extra_keys = work.extra_keys(meta.begin_req);
    }
    parts[p] = meta;
    const int pieces = pieces_closed_by(walked, p, num_sm_parts, requests);
    if (pieces > 0) local_splits += (static_cast<long long>(pieces) << 32) | 1;
  }
  long long splits_before, all_splits;
  Scan(scan_storage).ExclusiveSum(local_splits, splits_before, all_splits);
  int slot = static_cast<int>(splits_before >> 32), index = static_cast<int>(splits_before & 0xffffffff);
  for (int p = p0; p < p1; ++p) {
    const int pieces = pieces_closed_by(walked, p, num_sm_parts, requests);
    if (pieces == 0) continue;
    const int r = walked[p].begin_req;
    req_num_splits[r] = pieces;
    req_split_base[r] = slot;
    split_list[1 + index] = r;
    slot += pieces;
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
  const size_t lifting_bytes = requests <= kChainedPlanRequests
                                   ? sizeof(uint32_t) * lifting_levels(requests, num_sm_parts) * (requests + 1)
                                   : 0;
  const int smem_bytes = static_cast<int>(sizeof(long long) * (requests + 1) + sizeof(PartMetadata) * num_sm_parts +
                                          lifting_bytes);
  // Raised once per device whatever the size: 48 KB is the limit of static and dynamic together
  // (the block scans' static storage is 5.4 KB).
  set_max_dynamic_smem_once(reinterpret_cast<const void*>(decode_scheduler_kernel), smem_bytes);
  auto* base = static_cast<char*>(workspace);
  decode_scheduler_kernel<<<1, kPlanThreads, smem_bytes, stream>>>(
      work, requests, num_sm_parts, split_overhead_units(), reinterpret_cast<PartMetadata*>(base + layout.part_metadata),
      reinterpret_cast<int32_t*>(base + layout.req_num_splits),
      reinterpret_cast<int32_t*>(base + layout.req_split_base),
      reinterpret_cast<int32_t*>(base + layout.split_list));
  HMLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmla::detail
