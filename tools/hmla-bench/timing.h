// hmla-bench: the one timing loop every measurement goes through.
//
//   warm-up calls (not timed): at least `warmup` calls and at least `warmup_ms` of them, so that the
//             GPU's clocks have left the idle state whatever ran before (a CPU --check of the previous
//             row leaves the GPU idle for seconds; short rows then ran up to 8 % slower)
//   [backlog] one spin kernel that keeps the GPU busy while the host enqueues every timed call,
//             so that host-side launch cost never lands between a start and a stop event
//   for each timed call: event record; call; event record   (no host synchronisation in between)
//   [clock probe] one thread counting SM cycles against the global timer for 200 us, right after
//             the last call: the clock the card had set for the calls (see SmClockProbe)
//   one synchronisation, then the elapsed time of every (start, stop) pair.
// The result is the GPU time of each call from its first to its last kernel, back to back with
// its predecessor, as a decode loop issues them. Without the backlog (--no-backlog) a call that
// is shorter than its host launch cost also counts the host's enqueue time.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "common.h"
#include "device_util.h"

namespace hmla_bench {

struct TimingConfig {
  int warmup = 5;
  double warmup_ms = 25.0;
  int iters = 50;
  bool backlog = true;
  double host_us_per_call = 40.0;  // generous host enqueue cost per call, sizes the spin kernel
};

// call(i) enqueues call number i (0-based, warm-up calls first) on `stream`; before(i), when given,
// enqueues untimed work ahead of it (outside its events).
// Returns the per-call times of the timed calls in microseconds; `sm_mhz`, when given, gets the SM
// clock measured right after them.
template <typename Call, typename Before>
std::vector<double> time_calls_after(const TimingConfig& cfg, cudaStream_t stream, Before&& before, Call&& call,
                                     double* sm_mhz = nullptr) {
  int calls = 0;
  // Allocated before any call is queued (an allocation may wait for the device).
  std::unique_ptr<SmClockProbe> probe = sm_mhz ? std::make_unique<SmClockProbe>() : nullptr;
  const auto warm_start = std::chrono::steady_clock::now();
  if (cfg.warmup > 0 || cfg.warmup_ms > 0) {
    do {
      for (int i = 0; i < std::max(1, cfg.warmup); ++i) {
        before(calls);
        call(calls++);
      }
      HB_CUDA(cudaStreamSynchronize(stream));
    } while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - warm_start).count() <
             cfg.warmup_ms);
  }
  EventPool events(2 * (size_t)cfg.iters);
  if (cfg.backlog) {
    double spin = std::min(200000.0, 500.0 + cfg.host_us_per_call * (double)cfg.iters);
    gpu_spin(spin, stream);
  }
  for (int i = 0; i < cfg.iters; ++i) {
    before(calls + i);
    HB_CUDA(cudaEventRecord(events[2 * (size_t)i], stream));
    call(calls + i);
    HB_CUDA(cudaEventRecord(events[2 * (size_t)i + 1], stream));
  }
  if (probe) {
    probe->launch(200.0, stream);
    *sm_mhz = probe->mhz(stream);
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

template <typename Call>
std::vector<double> time_calls(const TimingConfig& cfg, cudaStream_t stream, Call&& call, double* sm_mhz = nullptr) {
  return time_calls_after(cfg, stream, [](int) {}, std::forward<Call>(call), sm_mhz);
}

}  // namespace hmla_bench
