// hmla-bench: the one timing loop every measurement goes through.
//
//   warm-up calls (not timed)
//   [backlog] one spin kernel that keeps the GPU busy while the host enqueues every timed call,
//             so that host-side launch cost never lands between a start and a stop event
//   for each timed call: event record; call; event record   (no host synchronisation in between)
//   one synchronisation, then the elapsed time of every (start, stop) pair.
// The result is the GPU time of each call from its first to its last kernel, back to back with
// its predecessor, as a decode loop issues them. Without the backlog (--no-backlog) a call that
// is shorter than its host launch cost also counts the host's enqueue time.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "device_util.h"

namespace hmla_bench {

struct TimingConfig {
  int warmup = 5;
  int iters = 50;
  bool backlog = true;
  double host_us_per_call = 40.0;  // generous host enqueue cost per call, sizes the spin kernel
};

// call(i) enqueues call number i (0-based, warm-up calls first) on `stream`.
// Returns the per-call times of the timed calls in microseconds.
template <typename Call>
std::vector<double> time_calls(const TimingConfig& cfg, cudaStream_t stream, Call&& call) {
  for (int i = 0; i < cfg.warmup; ++i) call(i);
  HB_CUDA(cudaStreamSynchronize(stream));
  EventPool events(2 * (size_t)cfg.iters);
  if (cfg.backlog) {
    double spin = std::min(200000.0, 500.0 + cfg.host_us_per_call * (double)cfg.iters);
    gpu_spin(spin, stream);
  }
  for (int i = 0; i < cfg.iters; ++i) {
    HB_CUDA(cudaEventRecord(events[2 * (size_t)i], stream));
    call(cfg.warmup + i);
    HB_CUDA(cudaEventRecord(events[2 * (size_t)i + 1], stream));
  }
  HB_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> us(cfg.iters);
  for (int i = 0; i < cfg.iters; ++i) {
    float ms = 0.f;
    HB_CUDA(cudaEventElapsedTime(&ms, events[2 * (size_t)i], events[2 * (size_t)i + 1]));
    us[i] = (double)ms * 1000.0;
  }
  return us;
}

}  // namespace hmla_bench
