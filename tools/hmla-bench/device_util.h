// hmla-bench: device helpers: random fills, a spin kernel that lets the host run ahead, and an
// output scan. All asynchronous on the given stream unless stated.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common.h"
#include "hmla/types.h"

namespace hmla_bench {

// dst[i] = half(clamp(N(0,1) * stddev, -clamp_abs, clamp_abs)), N from a counter-based hash of
// (seed, i), so the same seed gives the same tensor on every run and every device.
void fill_randn_half(void* dst, size_t count, hmla::DType dtype, uint64_t seed, float stddev,
                     float clamp_abs, cudaStream_t stream);

// The hash behind fill_randn_half, on the host: inputs built on the host (the FP8 caches, which
// only the host quantiser packs) get the same kind of reproducible stream.
uint64_t counter_hash(uint64_t seed, uint64_t i);

// Fills `bytes` (a multiple of 4) with hashed 32-bit words.
void fill_random_words(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream);

// One thread spins for about `microseconds` (global timer), keeping the stream busy while the host
// enqueues the work to be timed behind it.
void gpu_spin(double microseconds, cudaStream_t stream);

// The SM clock the card's power management has set: the H200 holds its 700 W cap by lowering it
// (measured in sustained runs: b = 32, h_q 128 at ~1720-1755 MHz, a memory-bound row at 1315-1440 MHz;
// max 1980), so a time means little without it, and NVML's clock and power readings lag by tens of
// ms. One thread on the stream counts SM cycles against the global timer for a while; launched right
// after the timed calls, it sees the clock they were given. Inside a tensor-heavy kernel the
// effective clock can be lower still (a trace build measured 1.69-1.72 GHz inside b = 32's kernel
// while this probe read ~1.97 GHz after short runs).
class SmClockProbe {
 public:
  SmClockProbe();
  void launch(double microseconds, cudaStream_t stream);
  // Cycles per microsecond of the last launch; synchronises the stream.
  double mhz(cudaStream_t stream);

 private:
  DeviceBuffer result_;
};

// Number of non-finite values (NaN or +-inf) among `count` bf16/fp16 values. Synchronous.
uint64_t count_nonfinite_half(const void* data, size_t count, hmla::DType dtype,
                              cudaStream_t stream);

}  // namespace hmla_bench
