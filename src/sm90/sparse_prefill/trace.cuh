// Timeline of the sparse prefill kernel, compiled in only with -DHMLA_PREFILL_TRACE (CMake option
// HMLA_PREFILL_TRACE; scripts/gpu_trace.sh prefill). CTAs 0 and 1 record the SM clock at fixed points
// of every pair of K tiles, per role, so that a pair's time splits into its waits and its work and
// the roles line up against each other (the schedule is docs/SPARSE_PREFILL.md; common/timeline.cuh).
// The launcher writes the buffer to $HMLA_TRACE_FILE after every call;
// scripts/profile/prefill_trace_summary.py reads it. -DHMLA_PREFILL_TRACE_GRID records only every
// CTA's start and end (no per-pair events, whose code changes the consumers' compilation): how
// evenly the persistent grid's CTAs finish.
#pragma once

#include <cstdint>

#include "common/timeline.cuh"

namespace hmla::sm90::sparse_prefill::trace {

constexpr int kCtas = 2;
constexpr int kRoles = 3;
constexpr int kPairs = 1024;  // the CTA's pairs over all its items, in order
constexpr int kEvents = 10;

enum Role { kProducer = 0, kConsumerA = 1, kConsumerB = 2 };

// Producer events of a pair.
enum ProducerEvent {
  kProducerTop = 0,     // indices located, before the wait for buffer 0's left half
  kFree0Left = 1,       // buffer 0's left half free (its copies follow)
  kFree1Right = 2,      // buffer 1's right half free
  kFree0Right = 3,      // buffer 0's right half free
  kFree1Left = 4,       // buffer 1's left half free
  kProducerIssued = 5,  // the pair's last copy issued
};
// Consumer A events of a pair.
enum ConsumerAEvent {
  kAScored = 0,      // S of tile 2j retired (the pair's body starts)
  kAMaxSent = 1,     // its running max published
  kAOwnDone = 2,     // P_A V_0 retired, buffer 0's left half released
  kAMaxBack = 3,     // B's pair max received
  kAOtherP = 4,      // B's P received, P_B V_1 issued
  kAOtherDone = 5,   // P_B V_1 retired, buffer 1's left half released
  kANextLeft = 6,    // the next pair's buffer 0 left half landed
  kANextRight = 7,   // its right half landed (the next S issued whole)
  kAQLanded = 8,     // (an item's first pair) its Q landed
  kAEpilogueDone = 9,  // (an item's last pair) its O half, lse and max_logits stored
};
// Consumer B events of a pair.
enum ConsumerBEvent {
  kBTop = 0,         // loop top, before the wait for buffer 1's right half
  kBRight = 1,       // buffer 1's right half landed
  kBLeft = 2,        // its left half landed (S issued whole)
  kBScored = 3,      // S of tile 2j + 1 retired
  kBMaxIn = 4,       // A's max received
  kBOwnDone = 5,     // P_B V_1 retired, buffer 1's right half released
  kBOtherP = 6,      // A's P received, P_A V_0 issued
  kBOtherDone = 7,   // P_A V_0 retired, buffer 0's right half released
  kBQLanded = 8,     // (an item's first pair) its Q landed
  kBEpilogueDone = 9,  // (an item's last pair) its O half stored
};

constexpr int kMaxGrid = 1024;

#if defined(HMLA_PREFILL_TRACE) || defined(HMLA_PREFILL_TRACE_GRID)
#define HMLA_PREFILL_TRACE_BUFFER 1
struct Buffer {
  dev::timeline::Clocks<kCtas, kRoles, kPairs, kEvents> clocks;
  // Every CTA: globaltimer (ns) at its start and its end, and its SM: how evenly the persistent grid's
  // CTAs finish (the kernel ends with the last).
  unsigned long long grid_span[kMaxGrid][3];
};
__device__ Buffer g_buffer;

// Called by every thread of a role; thread 0 of the warpgroup records.
__device__ __forceinline__ void event(int role, uint32_t pair, int ev) {
#ifdef HMLA_PREFILL_TRACE
  if (threadIdx.x % 128 == 0) g_buffer.clocks.event(static_cast<int>(blockIdx.x), role, pair, ev);
#else
  (void)role, (void)pair, (void)ev;
#endif
}
__device__ __forceinline__ void span(int which) {  // 0: start, 1: end; one thread
  const unsigned long long ns = dev::timeline::global_ns();
  if (blockIdx.x < kMaxGrid) {
    g_buffer.grid_span[blockIdx.x][which] = ns;
    if (which == 0) {
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_buffer.grid_span[blockIdx.x][2] = sm;
    }
  }
  g_buffer.clocks.mark_span(static_cast<int>(blockIdx.x), which);
}
#else
__device__ __forceinline__ void event(int, uint32_t, int) {}
__device__ __forceinline__ void span(int) {}
#endif

}  // namespace hmla::sm90::sparse_prefill::trace
