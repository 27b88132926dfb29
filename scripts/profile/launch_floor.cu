// The floor under a one-CTA kernel as hmla-bench times it (the plan's plan_us): a spin kernel keeps
// the GPU busy while the host enqueues "event; kernel; event" pairs, and each pair's elapsed time is
// the GPU's. Kernels of the plan kernel's shapes that do (almost) nothing, so that the share of
// plan_us a plan body could ever remove is measured, not assumed: CTA size, dynamic shared memory,
// the opt-in limit raised to the device's maximum (hmla raises it for every kernel), a preferred
// carve-out, and one dependent global load and store (the least any plan does).
//   nvcc -O2 -arch=sm_90a -o launch_floor scripts/profile/launch_floor.cu && ./launch_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                                \
  do {                                                                                          \
    cudaError_t err_ = (x);                                                                     \
    if (err_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

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
double median_us(Launch&& launch, cudaStream_t stream, int iters = 200) {
  for (int i = 0; i < 20; ++i) launch();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  spin<<<1, 1, 0, stream>>>(2000LL * 1000 * 20);  // ~10 ms at 2 GHz: the host enqueues under it
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(ev[2 * i], stream));
    launch();
    CHECK(cudaEventRecord(ev[2 * i + 1], stream));
  }
  CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = ms * 1000.0;
  }
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  return us[iters / 2];
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
