// Timeline of the wide sparse decode kernel, compiled in only with -DHMLA_SPARSE_TRACE (CMake option
// HMLA_SPARSE_TRACE; scripts/gpu_trace.sh sparse). The CTAs of head tile 0 and parts 0 and 1 record
// the SM clock at fixed points of every K tile, per role (common/timeline.cuh), so that a tile's time,
// and the time between two requests, split into their waits and their work (the schedule is
// docs/SPARSE_DECODE.md). scripts/profile/sparse_trace_summary.py reads the file.
#pragma once

#include <cstdint>

#include "common/timeline.cuh"

namespace hmla::sm90::sparse_decode::trace {

constexpr int kCtas = 2;
constexpr int kRoles = 3;
constexpr int kTiles = 2048;  // the CTA's tiles over all its requests, in order
constexpr int kEvents = 8;

enum Role { kProducer = 0, kScorer = 1, kHelper = 2 };

// Events of a tile (g: the CTA's tile count). Those of a request's first tile (Q) and last tile
// (retired, epilogue) are recorded there only.
enum ProducerEvent {
  kProducerWait = 0,    // before the wait for the tile's stage to be free
  kProducerFree = 1,    // the stage is free (its stores and the next tile's loads follow)
  kProducerFilled = 2,  // the stage announced full
  kProducerQLanded = 3,     // (where the producers convert Q: tile g, the request's first) its Q landed
  kProducerQConverted = 4,  // and converted
};
enum ScorerEvent {
  kScorerQLanded = 0,     // (a request's first tile) its Q landed
  kScorerConverted = 1,   // (first tile) Q converted to fp16
  kScorerFull = 2,        // the stage is full
  kScorerScored = 3,      // S retired
  kScorerPublished = 4,   // P and the statistics published (past the P-ready barrier)
  kScorerRetired = 5,     // (a request's last tile) its last P V retired
  kScorerEpilogue = 6,    // (last tile) the request's O half and LSE stored
};
enum HelperEvent {
  kHelperQLanded = 0,    // (first tile) Q landed
  kHelperConverted = 1,  // (first tile) Q converted
  kHelperP = 2,          // past the P-ready barrier
  kHelperRetired = 3,    // its P V retired, the stage released
  kHelperEpilogue = 4,   // (last tile) the request's O half stored
};

#ifdef HMLA_SPARSE_TRACE
using Buffer = dev::timeline::Clocks<kCtas, kRoles, kTiles, kEvents>;
__device__ Buffer g_buffer;

__device__ __forceinline__ int cta_slot() {
  return blockIdx.x == 0 && blockIdx.z < kCtas ? static_cast<int>(blockIdx.z) : -1;
}
// Called by every thread of a role; thread 0 of the warpgroup records.
__device__ __forceinline__ void event(int role, int tile, int ev) {
  if (threadIdx.x % 128 == 0) g_buffer.event(cta_slot(), role, static_cast<uint32_t>(tile), ev);
}
__device__ __forceinline__ void span(int which) { g_buffer.mark_span(cta_slot(), which); }  // 0: start, 1: end
#else
__device__ __forceinline__ void event(int, int, int) {}
__device__ __forceinline__ void span(int) {}
#endif

}  // namespace hmla::sm90::sparse_decode::trace
