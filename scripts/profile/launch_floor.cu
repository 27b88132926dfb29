// The floor under a one-CTA kernel as hmla-bench times it (the plan's plan_us), through hmla-bench's
// own timing loop (tools/hmla-bench/timing.h: a spin kernel under the enqueue, "event; call; event"
// pairs, each pair's elapsed GPU time). Kernels of the plan kernel's shapes that do (almost) nothing,
// so that the share of plan_us a plan body could ever remove is measured, not assumed: CTA size,
// dynamic shared memory, the opt-in limit raised to the device's maximum (hmla raises it for every
// kernel), a preferred carve-out, and one dependent global load and store (the least any plan does).
//   nvcc -O2 -std=c++17 -arch=sm_90a -Iinclude -Itools/hmla-bench -o launch_floor \
//     scripts/profile/launch_floor.cu tools/hmla-bench/device_util.cu -lcublas && ./launch_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "timing.h"

#define CHECK HB_CUDA

__global__ void empty_kernel() {}

__global__ void empty_kernel_raised() {}  // a separate function, so its attributes are its own

__global__ void empty_kernel_carveout() {}

__global__ void load_store(const int* in, int* out) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0) {
    smem[0] = in[0];
    out[0] = smem[0] + 1;
  }
}

template <typename Launch>
double median_us(Launch&& launch, cudaStream_t stream) {
  hmla_bench::TimingConfig cfg;
  cfg.iters = 200;
  std::vector<double> us = hmla_bench::time_calls(cfg, stream, [&](int) { launch(); });
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int main() {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, opt-in smem %zu\n", prop.name, prop.multiProcessorCount,
              prop.sharedMemPerBlockOptin);
  const int max_dyn = static_cast<int>(prop.sharedMemPerBlockOptin);
  CHECK(cudaFuncSetAttribute(empty_kernel_raised, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dyn));
  CHECK(cudaFuncSetAttribute(empty_kernel_carveout, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dyn));
  CHECK(cudaFuncSetAttribute(empty_kernel_carveout, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared));
  CHECK(cudaFuncSetAttribute(load_store, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dyn));
  int *in, *out;
  CHECK(cudaMalloc(&in, 4));
  CHECK(cudaMalloc(&out, 4));
  CHECK(cudaMemset(in, 0, 4));

  // Nothing between the events: the events' own floor.
  std::printf("%-52s %7.2f us\n", "events only", median_us([&] {}, stream));
  for (int threads : {32, 160, 512, 1024}) {
    for (int smem : {0, 1024, 8 * 1024, 47 * 1024}) {
      char name[96];
      std::snprintf(name, sizeof(name), "empty, %4d threads, %5d B dynamic", threads, smem);
      std::printf("%-52s %7.2f us\n", name,
                  median_us([&] { empty_kernel<<<1, threads, smem, stream>>>(); }, stream));
    }
  }
  for (int smem : {1024, 47 * 1024, 100 * 1024}) {
    char name[96];
    std::snprintf(name, sizeof(name), "empty, 160 threads, %6d B, opt-in raised", smem);
    std::printf("%-52s %7.2f us\n", name,
                median_us([&] { empty_kernel_raised<<<1, 160, smem, stream>>>(); }, stream));
    std::snprintf(name, sizeof(name), "empty, 160 threads, %6d B, raised + max carve-out", smem);
    std::printf("%-52s %7.2f us\n", name,
                median_us([&] { empty_kernel_carveout<<<1, 160, smem, stream>>>(); }, stream));
  }
  std::printf("%-52s %7.2f us\n", "one load + store, 160 threads, 1 KB",
              median_us([&] { load_store<<<1, 160, 1024, stream>>>(in, out); }, stream));
  std::printf("%-52s %7.2f us\n", "two kernels back to back (empty, 160, 1 KB)", median_us([&] {
                empty_kernel<<<1, 160, 1024, stream>>>();
                empty_kernel<<<1, 160, 1024, stream>>>();
              }, stream));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  return 0;
}
