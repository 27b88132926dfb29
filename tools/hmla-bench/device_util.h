// hmla-bench: device helpers: random fills, a spin kernel that lets the host run ahead, and an
// output scan. All asynchronous on the given stream unless stated.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hmla/types.h"

namespace hmla_bench {

// dst[i] = half(clamp(N(0,1) * stddev, -clamp_abs, clamp_abs)), N from a counter-based hash of
// (seed, i), so the same seed gives the same tensor on every run and every device.
void fill_randn_half(void* dst, size_t count, hmla::DType dtype, uint64_t seed, float stddev,
                     float clamp_abs, cudaStream_t stream);

// Fills `bytes` (a multiple of 4) with hashed 32-bit words.
void fill_random_words(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream);

// One thread spins for about `microseconds` (global timer), keeping the stream busy while the host
// enqueues the work to be timed behind it.
void gpu_spin(double microseconds, cudaStream_t stream);

// Number of non-finite values (NaN or +-inf) among `count` bf16/fp16 values. Synchronous.
uint64_t count_nonfinite_half(const void* data, size_t count, hmla::DType dtype,
                              cudaStream_t stream);

}  // namespace hmla_bench
