// Timelines of the kernels' trace builds (src/sm90/*/trace.cuh; compiled in only with a kernel's
// trace macro, never in a release build). A few CTAs record the SM clock at fixed points (events)
// of every step (a K tile, a pair of them) per role, so that a step's time splits into its waits and
// its work and the roles line up against each other: Nsight Compute's stall samples say where warps
// wait, not in which order; this says both, at the cost of one store per event by one thread of the
// role. The launcher writes the buffer to $HMLA_TRACE_FILE after every call; the summary scripts
// under scripts/profile read it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/cuda_check.h"

namespace hmla::dev::timeline {

__device__ __forceinline__ uint32_t sm_clock() {
  uint32_t c;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
  return c;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The clocks of kCtas traced CTAs (slot 0 .. kCtas - 1; the kernel maps its CTAs to slots), and per
// slot clock64 and globaltimer (ns) at its start and end, from which the scripts get the SM clock rate.
template <int kCtas, int kRoles, int kSteps, int kEvents>
struct Clocks {
  uint32_t clock[kCtas][kRoles][kSteps][kEvents];
  unsigned long long span[kCtas][4];

  __device__ __forceinline__ void event(int slot, int role, uint32_t step, int ev) {
    if (slot >= 0 && slot < kCtas && step < static_cast<uint32_t>(kSteps)) clock[slot][role][step][ev] = sm_clock();
  }
  __device__ __forceinline__ void mark_span(int slot, int which) {  // which: 0 start, 1 end
    if (slot < 0 || slot >= kCtas) return;
    span[slot][2 * which] = clock64();
    span[slot][2 * which + 1] = global_ns();
  }
};

// Host, after a launch on `stream` in the translation unit that defines `symbol` (a __device__
// buffer): its bytes to $HMLA_TRACE_FILE, overwritten by every call.
template <typename Buffer>
void write_trace_file(const Buffer& symbol, cudaStream_t stream) {
  const char* path = std::getenv("HMLA_TRACE_FILE");
  if (path == nullptr) return;
  static Buffer host;  // hundreds of KB: not on the stack
  HMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
  HMLA_CUDA_CHECK(cudaMemcpyFromSymbol(&host, symbol, sizeof(host)));
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(&host, sizeof(host), 1, f);
    std::fclose(f);
  }
}

}  // namespace hmla::dev::timeline
