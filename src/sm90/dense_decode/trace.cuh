// Timeline of the dense decode kernel, compiled in only with -DHMLA_DENSE_TRACE (CMake option
// HMLA_DENSE_TRACE; scripts/gpu_profile.sh trace). The first two parts' CTAs of query tile 0 and kv
// head 0 record the SM clock at fixed points of every K tile, per role (consumer warpgroup 0, 1,
// producer), so that the time of one tile splits into its waits and its work. Nsight Compute's
// stall samples say where warps wait, not in which order; this says both, at the cost of one
// store per event. The launcher copies the buffer to $HMLA_TRACE_FILE after every call.
#pragma once

#include <cstdint>

// Query tile whose CTAs are traced (compile with -DHMLA_TRACE_MBLOCK=1 for the second one: with two
// query tiles per K tile, one of them usually finds the tile in L2 and the other waits for HBM).
#ifndef HMLA_TRACE_MBLOCK
#define HMLA_TRACE_MBLOCK 0
#endif

namespace hmla::sm90::dense_decode::trace {

constexpr int kCtas = 2;
constexpr int kRoles = 3;  // consumer warpgroup 0, consumer warpgroup 1, producer
constexpr int kTiles = 2048;
constexpr int kEvents = 8;

// Events of a consumer tile.
constexpr int kTop = 0;         // loop top, before retiring this warpgroup's previous P V
constexpr int kDrained = 1;     // previous P V retired, stage released
constexpr int kReady = 2;       // scorer: K tile landed; other: P published
constexpr int kScored = 3;      // scorer: S retired
constexpr int kSoftmaxed = 4;   // scorer: the last part of P written, before its barrier
constexpr int kPublished = 5;   // scorer: past the last part's P barrier
constexpr int kIssued = 6;      // this warpgroup's last P V part issued
// Events of a producer tile.
constexpr int kProducerWait = 0;  // before waiting for a free stage
constexpr int kProducerIssue = 1; // stage free, loads about to be issued
constexpr int kLanded = 2;        // seen complete by an observer warp (trace builds only)

#ifdef HMLA_DENSE_TRACE
struct Buffer {
  uint32_t clock[kCtas][kRoles][kTiles][kEvents];
  // Per traced CTA: clock64 and globaltimer (ns) at the start and the end, for the SM clock rate.
  unsigned long long span[kCtas][4];
};
__device__ Buffer g_buffer;

__device__ __forceinline__ int cta_slot() {
  return blockIdx.x == HMLA_TRACE_MBLOCK && blockIdx.y == 0 && blockIdx.z < kCtas ? static_cast<int>(blockIdx.z) : -1;
}
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
// Called by one thread per role.
__device__ __forceinline__ void event(int role, int tile, int ev) {
  const int s = cta_slot();
  if (s >= 0 && tile < kTiles) g_buffer.clock[s][role][tile][ev] = sm_clock();
}
__device__ __forceinline__ void span(int which) {  // 0: start, 1: end
  const int s = cta_slot();
  if (s < 0) return;
  g_buffer.span[s][2 * which] = clock64();
  g_buffer.span[s][2 * which + 1] = global_ns();
}
// The observer warp's wait: bounded, so that a trace build can never hang on a missed phase.
__device__ __forceinline__ bool observe(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  for (int i = 0; i < (1 << 22); ++i) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
    if (done) return true;
  }
  return false;
}
#else
__device__ __forceinline__ void event(int, int, int) {}
__device__ __forceinline__ void span(int) {}
#endif

}  // namespace hmla::sm90::dense_decode::trace
