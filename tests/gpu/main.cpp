// Entry point of hmla_gpu_tests. Without a CUDA device, or on a device other than a Hopper
// (compute capability 9.x; the kernels are built for sm_90a only), it prints
// "HMLA_GPU_TESTS_SKIPPED: <reason>" and exits 0 without running any test; ctest turns that line
// into a skipped test (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("HMLA_GPU_TESTS_SKIPPED: no CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return 0;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  cudaDeviceProp prop{};
  const cudaError_t perr = cudaGetDeviceProperties(&prop, device);
  if (perr != cudaSuccess) {
    std::printf("HMLA_GPU_TESTS_SKIPPED: no usable CUDA device (%s)\n", cudaGetErrorString(perr));
    return 0;
  }
  if (prop.major != 9) {
    std::printf("HMLA_GPU_TESTS_SKIPPED: device %d (%s) is sm_%d%d, kernels need sm_90a\n", device,
                prop.name, prop.major, prop.minor);
    return 0;
  }
  std::printf("hmla_gpu_tests: device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", device, prop.name,
              prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  std::fflush(stdout);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
