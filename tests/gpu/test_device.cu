// Sanity checks of the device itself: it is a Hopper (sm_90), code built for sm_90a runs on it and a
// tiny kernel writes what it should. If these fail, nothing else in the GPU suite means anything.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "gpu_test_util.h"

namespace {

// Writes a known pattern plus what the compiler saw: the architecture it compiled for and whether
// the sm_90a feature set (wgmma, setmaxnreg) was enabled.
__global__ void pattern_kernel(int* out, int n, int* arch_info) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 3 * i + 1;
  if (i == 0) {
#if defined(__CUDA_ARCH__)
    arch_info[0] = __CUDA_ARCH__;
#else
    arch_info[0] = -1;
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    arch_info[1] = 1;
#else
    arch_info[1] = 0;
#endif
  }
}

TEST(Device, IsHopperSm90) {
  int device = -1;
  HMLA_TEST_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  HMLA_TEST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  EXPECT_EQ(prop.major, 9) << prop.name;
  EXPECT_EQ(prop.minor, 0) << prop.name << ": sm_90a code only runs on compute capability 9.0";
  EXPECT_GT(prop.multiProcessorCount, 0);
  // Dense decode's tiles need the full 227 KB of opt-in shared memory per block of Hopper.
  EXPECT_GE(prop.sharedMemPerBlockOptin, size_t{227} * 1024) << prop.name;
}

TEST(Device, KernelWritesExpectedValues) {
  const int n = 1000;
  hmla_test::DeviceBuffer out(n * sizeof(int));
  hmla_test::DeviceBuffer info(2 * sizeof(int));
  HMLA_TEST_CUDA_CHECK(cudaMemset(out.get(), 0xff, n * sizeof(int)));
  HMLA_TEST_CUDA_CHECK(cudaMemset(info.get(), 0xff, 2 * sizeof(int)));
  pattern_kernel<<<(n + 127) / 128, 128>>>(out.as<int>(), n, info.as<int>());
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int> host(n);
  out.download(host.data(), n * sizeof(int));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host[i] != 3 * i + 1;
  EXPECT_EQ(wrong, 0) << "first value " << host[0] << ", last " << host[n - 1];
  int arch[2] = {0, 0};
  info.download(arch, sizeof(arch));
  EXPECT_EQ(arch[0], 900) << "the test binary was not compiled for sm_90";
  EXPECT_EQ(arch[1], 1) << "the test binary was not compiled for sm_90a (arch-specific features)";
}

TEST(Device, BinaryTargetsSm90a) {
  cudaFuncAttributes attr{};
  HMLA_TEST_CUDA_CHECK(cudaFuncGetAttributes(&attr, pattern_kernel));
  EXPECT_EQ(attr.binaryVersion, 90);
}

}  // namespace
