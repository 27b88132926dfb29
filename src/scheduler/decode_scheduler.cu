#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <cstdlib>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cuda_check.h"
#include "common/device_attributes.h"

namespace hmla::detail {
namespace {

// 512, not 1024: at 1024 threads (64 registers each) the walk below spilled 160 bytes to local
// memory, each spill a load in its serial chain; at 512 it needs 52 registers.
constexpr int kPlanThreads = 512;

// The plan in one CTA. Every request costs its units plus a fixed cost per piece it is cut into;
// parts are filled greedily in request order, each with the same budget (the greedy of
// docs/DENSE_DECODE.md "Scheduler"). Written so that only the walk over the parts is serial:
//   1. all threads: units of every request into shared memory, their sum -> the per-piece cost;
//   2. all threads: the exclusive prefix sum C of (units + cost) in place;
//   3. warp 0: the parts one after another, each finding where its budget ends by a 32-wide search
//      forward in C (a part usually holds fewer than 32 requests, so one step). The walk touches
//      shared memory only: a global load in it would cost its latency once per part (~0.3 us);
//   4. one thread per part: the part's lengths read and its metadata and split count written;
//   5. all threads: split requests numbered by a second scan.
// Part p of the greedy covers the stretch [V, E) of the stream of costs, where V is where part p - 1
// stopped and E = V + budget (less one piece cost when V is inside a request: that piece pays the
// cost again); a stop inside a request's own fixed cost rounds down to the request's start.
// overhead <= 0: the cost is chosen from the tiles per part (kSplitOverheadUnits or
// kSplitOverheadUnitsLongParts).
__global__ void __launch_bounds__(kPlanThreads) decode_scheduler_kernel(DecodeWork work, int requests,
                                                                        int num_sm_parts, int overhead,
                                                                        PartMetadata* __restrict__ parts,
                                                                        int32_t* __restrict__ req_num_splits,
                                                                        int32_t* __restrict__ req_split_base,
                                                                        int32_t* __restrict__ split_list) {
  extern __shared__ long long cost_prefix[];  // [requests + 1], then PartMetadata[num_sm_parts]
  PartMetadata* walked = reinterpret_cast<PartMetadata*>(cost_prefix + requests + 1);
  using Reduce = cub::BlockReduce<long long, kPlanThreads>;
  using Scan = cub::BlockScan<long long, kPlanThreads>;
  using ScanInt = cub::BlockScan<int, kPlanThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
    typename ScanInt::TempStorage scan_int;
  } temp;
  __shared__ long long total_units;

  // Each thread owns a contiguous chunk of requests, so both scans are a local pass and one block scan.
  const int per_thread = (requests + kPlanThreads - 1) / kPlanThreads;
  const int r0 = min(requests, static_cast<int>(threadIdx.x) * per_thread);
  const int r1 = min(requests, r0 + per_thread);

  long long local_units = 0;
  for (int r = r0; r < r1; ++r) {
    const int u = work.units(r);
    cost_prefix[r] = u;
    local_units += u;
    req_num_splits[r] = 1;
  }
  const long long block_units = Reduce(temp.reduce).Sum(local_units);
  if (threadIdx.x == 0) total_units = block_units;
  __syncthreads();
  if (overhead <= 0)
    overhead = total_units >= static_cast<long long>(kLongPartTiles) * num_sm_parts ? kSplitOverheadUnitsLongParts
                                                                                  : kSplitOverheadUnits;
  long long local_cost = local_units + static_cast<long long>(r1 - r0) * overhead;
  long long running;
  Scan(temp.scan).ExclusiveSum(local_cost, running);
  for (int r = r0; r < r1; ++r) {
    const long long cost = cost_prefix[r] + overhead;
    cost_prefix[r] = running;
    running += cost;
  }
  if (r1 == requests && r0 < r1) cost_prefix[requests] = running;
  if (requests == 0 && threadIdx.x == 0) cost_prefix[0] = 0;
  __syncthreads();

  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const long long with_overhead = cost_prefix[requests];
    const long long budget = (with_overhead + num_sm_parts - 1) / num_sm_parts + overhead;
    auto units_of = [&](int r) { return static_cast<int>(cost_prefix[r + 1] - cost_prefix[r] - overhead); };
    long long at = 0;  // where the previous part stopped, in the stream of costs
    int req = 0;       // the request holding `at`: cost_prefix[req] <= at < cost_prefix[req + 1]
    int mid_starts = 0;  // consecutive earlier parts that started inside `req`
    for (int p = 0; p < num_sm_parts; ++p) {
      PartMetadata meta{};
      meta.begin_req = requests;
      meta.end_req = -1;
      if (req < requests) {
        const long long start = cost_prefix[req];
        const bool mid = at > start;
        const long long end = at + budget - (mid ? overhead : 0);
        // The last request boundary at or before `end`: the prefix is strictly increasing, so the
        // lanes that pass form a prefix of the warp.
        int last = req;
        for (;;) {
          const int cand = last + 1 + lane;
          const unsigned pass = __ballot_sync(0xffffffffu, cand <= requests && cost_prefix[cand] <= end);
          const int count = __popc(pass);
          last += count;
          if (count < 32) break;
        }
        meta.begin_req = req;
        meta.begin_unit = mid ? static_cast<int>(at - start - overhead) : 0;
        mid_starts = mid ? mid_starts + 1 : 0;
        meta.begin_split_idx = mid_starts;
        if (last >= requests) {
          meta.end_req = requests - 1;
          meta.end_unit = units_of(requests - 1);
          at = cost_prefix[requests];
          req = requests;
        } else if (end - cost_prefix[last] > overhead) {
          meta.end_req = last;
          meta.end_unit = static_cast<int>(end - cost_prefix[last] - overhead);
          at = end;
          req = last;
        } else {
          meta.end_req = last - 1;
          meta.end_unit = units_of(last - 1);
          at = cost_prefix[last];
          req = last;
        }
        if (req != meta.begin_req) mid_starts = 0;
      }
      if (lane == 0) walked[p] = meta;
    }
  }
  __syncthreads();

  // A request cut n times is begun mid-way by n parts, numbered 1 .. n by begin_split_idx; the last
  // part that begins in it knows its count.
  for (int p = threadIdx.x; p < num_sm_parts; p += kPlanThreads) {
    PartMetadata meta = walked[p];
    if (meta.begin_req < requests) {
      meta.begin_seqlen = work.main_keys(meta.begin_req);
      meta.begin_extra_keys = work.extra_keys(meta.begin_req);
      const bool last_in_request = p + 1 == num_sm_parts || walked[p + 1].begin_req != meta.begin_req;
      if (meta.begin_split_idx > 0 && last_in_request) req_num_splits[meta.begin_req] = 1 + meta.begin_split_idx;
    }
    parts[p] = meta;
  }
  __syncthreads();

  // Accumulator slots for split requests only, numbered in request order.
  int local_slots = 0, local_split = 0;
  for (int r = r0; r < r1; ++r) {
    const int n = req_num_splits[r];
    if (n > 1) { local_slots += n; ++local_split; }
  }
  int slot, index;
  ScanInt(temp.scan_int).ExclusiveSum(local_slots, slot);
  __syncthreads();
  ScanInt(temp.scan_int).ExclusiveSum(local_split, index);
  for (int r = r0; r < r1; ++r) {
    const int n = req_num_splits[r];
    if (n > 1) {
      req_split_base[r] = slot;
      slot += n;
      split_list[1 + index++] = r;
    } else {
      req_split_base[r] = -1;
    }
  }
  if (r1 == requests && r0 < r1) split_list[0] = index;
  if (requests == 0 && threadIdx.x == 0) split_list[0] = 0;
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
  const int smem_bytes =
      static_cast<int>(sizeof(long long) * (requests + 1) + sizeof(PartMetadata) * num_sm_parts);
  if (smem_bytes > 48 * 1024)
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
