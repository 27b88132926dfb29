// hmla-bench: device helpers (see device_util.h).
#include "device_util.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common.h"

namespace hmla_bench {
namespace {

__host__ __device__ inline uint64_t mix64(uint64_t x) {
  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

__host__ __device__ inline uint64_t hash_index(uint64_t seed, uint64_t i) {
  return mix64(mix64(seed) ^ (i * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
}

// Grid size for a grid-stride loop over `count` items: enough CTAs to fill the GPU a few times.
int grid_for(size_t count, int threads) {
  static int num_sms = 0;
  if (num_sms == 0) {
    int dev = 0;
    HB_CUDA(cudaGetDevice(&dev));
    HB_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  }
  size_t want = ceil_div(std::max<size_t>(count, 1), (size_t)threads);
  return (int)std::min<size_t>(want, (size_t)num_sms * 16);
}

template <bool kBF16>
__global__ void fill_randn_kernel(uint16_t* __restrict__ dst, size_t count, uint64_t seed,
                                  float stddev, float clamp_abs) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    uint64_t h = hash_index(seed, i);
    // Box-Muller from two 24-bit uniforms; u1 in (0, 1] so the log is finite.
    float u1 = (float)((h >> 40) + 1) * (1.0f / 16777216.0f);
    float u2 = (float)(h & 0xffffffull) * (1.0f / 16777216.0f);
    float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    float v = fminf(fmaxf(z * stddev, -clamp_abs), clamp_abs);
    if constexpr (kBF16) {
      dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    } else {
      dst[i] = __half_as_ushort(__float2half_rn(v));
    }
  }
}

__global__ void fill_words_kernel(uint32_t* __restrict__ dst, size_t count, uint64_t seed) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = (uint32_t)hash_index(seed, i);
  }
}

__device__ inline uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t nanoseconds) {
  uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
    __nanosleep(2000);
  }
}

// One thread reads the SM cycle counter and the global timer, busy-waits (no sleep, so the SM
// stays awake at the chip's clock) for `nanoseconds`, and reads both again.
__global__ void clock_probe_kernel(uint64_t nanoseconds, unsigned long long* out) {
  const uint64_t t0 = global_timer_ns();
  const long long c0 = clock64();
  uint64_t t1 = t0;
  while (t1 - t0 < nanoseconds) t1 = global_timer_ns();
  const long long c1 = clock64();
  out[0] = (unsigned long long)(c1 - c0);
  out[1] = t1 - t0;
}

template <bool kBF16>
__global__ void count_nonfinite_kernel(const uint16_t* __restrict__ data, size_t count,
                                       unsigned long long* __restrict__ result) {
  const uint16_t mask = kBF16 ? 0x7f80 : 0x7c00;  // all-ones exponent: inf or NaN
  unsigned long long local = 0;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    local += ((data[i] & mask) == mask) ? 1ull : 0ull;
  }
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(result, local);
}

}  // namespace

uint64_t counter_hash(uint64_t seed, uint64_t i) { return hash_index(seed, i); }

void fill_randn_half(void* dst, size_t count, hmla::DType dtype, uint64_t seed, float stddev,
                     float clamp_abs, cudaStream_t stream) {
  if (count == 0) return;
  const int threads = 256;
  int grid = grid_for(count, threads);
  if (dtype == hmla::DType::kBF16) {
    fill_randn_kernel<true><<<grid, threads, 0, stream>>>(static_cast<uint16_t*>(dst), count, seed,
                                                          stddev, clamp_abs);
  } else {
    fill_randn_kernel<false><<<grid, threads, 0, stream>>>(static_cast<uint16_t*>(dst), count, seed,
                                                           stddev, clamp_abs);
  }
  HB_CUDA_LAUNCH();
}

void fill_random_words(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream) {
  size_t count = bytes / 4;
  if (count == 0) return;
  const int threads = 256;
  fill_words_kernel<<<grid_for(count, threads), threads, 0, stream>>>(static_cast<uint32_t*>(dst),
                                                                       count, seed);
  HB_CUDA_LAUNCH();
}

void gpu_spin(double microseconds, cudaStream_t stream) {
  if (microseconds <= 0) return;
  spin_kernel<<<1, 1, 0, stream>>>((uint64_t)(microseconds * 1000.0));
  HB_CUDA_LAUNCH();
}

SmClockProbe::SmClockProbe() : result_(2 * sizeof(unsigned long long)) {}

void SmClockProbe::launch(double microseconds, cudaStream_t stream) {
  clock_probe_kernel<<<1, 1, 0, stream>>>((uint64_t)(microseconds * 1000.0), result_.get<unsigned long long>());
  HB_CUDA_LAUNCH();
}

double SmClockProbe::mhz(cudaStream_t stream) {
  unsigned long long host[2] = {0, 0};
  HB_CUDA(cudaMemcpyAsync(host, result_.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  HB_CUDA(cudaStreamSynchronize(stream));
  return host[1] > 0 ? 1000.0 * (double)host[0] / (double)host[1] : 0.0;
}

uint64_t count_nonfinite_half(const void* data, size_t count, hmla::DType dtype,
                              cudaStream_t stream) {
  if (count == 0) return 0;
  DeviceBuffer result(sizeof(unsigned long long));
  HB_CUDA(cudaMemsetAsync(result.get(), 0, sizeof(unsigned long long), stream));
  const int threads = 256;
  int grid = grid_for(count, threads);
  if (dtype == hmla::DType::kBF16) {
    count_nonfinite_kernel<true><<<grid, threads, 0, stream>>>(
        static_cast<const uint16_t*>(data), count, result.get<unsigned long long>());
  } else {
    count_nonfinite_kernel<false><<<grid, threads, 0, stream>>>(
        static_cast<const uint16_t*>(data), count, result.get<unsigned long long>());
  }
  HB_CUDA_LAUNCH();
  unsigned long long host = 0;
  HB_CUDA(cudaMemcpyAsync(&host, result.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  HB_CUDA(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace hmla_bench
