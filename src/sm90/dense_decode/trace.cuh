// Timeline of the dense decode kernel, compiled in only with -DHMLA_DENSE_TRACE (CMake option
// HMLA_DENSE_TRACE; scripts/gpu_profile.sh trace). The first two parts' CTAs of query tile 0 and kv
// head 0 record the SM clock at fixed points of every K tile, per role (consumer warpgroup 0, 1,
// producer), so that the time of one tile splits into its waits and its work (common/timeline.cuh).
// The launcher copies the buffer to $HMLA_TRACE_FILE after every call.
#pragma once

#include <cstdint>

#include "common/timeline.cuh"

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
using Buffer = dev::timeline::Clocks<kCtas, kRoles, kTiles, kEvents>;
__device__ Buffer g_buffer;

__device__ __forceinline__ int cta_slot() {
  return blockIdx.x == HMLA_TRACE_MBLOCK && blockIdx.y == 0 && blockIdx.z < kCtas ? static_cast<int>(blockIdx.z) : -1;
}
// Called by one thread per role.
__device__ __forceinline__ void event(int role, int tile, int ev) {
  g_buffer.event(cta_slot(), role, static_cast<uint32_t>(tile), ev);
}
__device__ __forceinline__ void span(int which) { g_buffer.mark_span(cta_slot(), which); }  // 0: start, 1: end
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
