#include "scheduler/decode_scheduler.h"

#include <algorithm>
#include <cstdlib>

#include "common/cuda_check.h"

namespace hmla::detail {
namespace {

__device__ __forceinline__ int units_of(int seqlen) {
  // An empty request is one unit of work: somebody has to write its "no key" output.
  int blocks = (max(seqlen, 0) + kBlockN - 1) / kBlockN;
  return blocks > 0 ? blocks : 1;
}

// One CTA: the threads sum the units, then one thread walks the requests greedily, giving each
// part about the same number of units plus a fixed cost per piece it starts. overhead <= 0: the
// cost is chosen from the tiles per part (kSplitOverheadUnits or kSplitOverheadUnitsLongParts).
__global__ void __launch_bounds__(1024) decode_scheduler_kernel(const int32_t* __restrict__ seqlens,
                                                               int batch, int num_sm_parts, int overhead,
                                                               PartMetadata* __restrict__ parts,
                                                               int32_t* __restrict__ req_num_splits,
                                                               int32_t* __restrict__ req_split_base,
                                                               int32_t* __restrict__ split_list) {
  __shared__ long long block_total;
  if (threadIdx.x == 0) block_total = 0;
  __syncthreads();
  long long local = 0;
  for (int r = threadIdx.x; r < batch; r += blockDim.x) {
    local += units_of(seqlens[r]);
    req_num_splits[r] = 0;
  }
  atomicAdd(reinterpret_cast<unsigned long long*>(&block_total), static_cast<unsigned long long>(local));
  __syncthreads();
  if (threadIdx.x != 0) return;

  if (overhead <= 0)
    overhead = block_total >= static_cast<long long>(kLongPartTiles) * num_sm_parts ? kSplitOverheadUnitsLongParts
                                                                                  : kSplitOverheadUnits;
  const long long with_overhead = block_total + static_cast<long long>(batch) * overhead;
  const long long payload = (with_overhead + num_sm_parts - 1) / num_sm_parts + overhead;
  int req = 0, unit = 0;
  for (int p = 0; p < num_sm_parts; ++p) {
    PartMetadata meta{};
    meta.begin_req = req < batch ? req : batch;
    meta.begin_unit = unit;
    meta.begin_split_idx = req < batch ? req_num_splits[req] : 0;
    meta.begin_seqlen = req < batch ? seqlens[req] : 0;
    meta.end_req = -1;
    meta.end_unit = 0;
    long long remaining = payload;
    while (req < batch) {
      const int units = units_of(seqlens[req]);
      const int left = units - unit;
      if (remaining >= left + overhead) {
        remaining -= left + overhead;
        req_num_splits[req] += 1;
        meta.end_req = req;
        meta.end_unit = units;
        ++req;
        unit = 0;
      } else {
        const long long take = remaining - overhead;
        if (take > 0) {
          req_num_splits[req] += 1;
          unit += static_cast<int>(take);
          meta.end_req = req;
          meta.end_unit = unit;
        }
        break;
      }
    }
    if (meta.end_req < 0) meta.begin_req = batch;  // took nothing
    parts[p] = meta;
  }
  // Accumulator slots for split requests only: at most one split request starts per part
  // boundary, and each part holds at most two pieces of split requests.
  int slots = 0, count = 0;
  for (int r = 0; r < batch; ++r) {
    if (req_num_splits[r] > 1) {
      req_split_base[r] = slots;
      slots += req_num_splits[r];
      split_list[1 + count++] = r;
    } else {
      req_split_base[r] = -1;
    }
  }
  split_list[0] = count;
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

void launch_decode_scheduler(const int32_t* cache_seqlens, int batch, int num_sm_parts,
                             void* workspace, const WorkspaceLayout& layout, cudaStream_t stream) {
  auto* base = static_cast<char*>(workspace);
  decode_scheduler_kernel<<<1, 1024, 0, stream>>>(
      cache_seqlens, batch, num_sm_parts, split_overhead_units(), reinterpret_cast<PartMetadata*>(base + layout.part_metadata),
      reinterpret_cast<int32_t*>(base + layout.req_num_splits),
      reinterpret_cast<int32_t*>(base + layout.req_split_base),
      reinterpret_cast<int32_t*>(base + layout.split_list));
  HMLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmla::detail
