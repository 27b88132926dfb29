#include "common/device_attributes.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "common/cuda_check.h"

namespace hmla::detail {
namespace {
constexpr int kMaxDevices = 64;
}  // namespace

int current_device_sm_count() {
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  HMLA_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  HMLA_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (device < kMaxDevices) cached[device].store(count, std::memory_order_relaxed);
  return count;
}

void set_max_dynamic_smem_once(const void* kernel, int bytes) {
  int device = 0;
  HMLA_CUDA_CHECK(cudaGetDevice(&device));
  // A handful of kernels: a small map under a lock, taken only on the first call per kernel and
  // device (the fast path reads a thread-local copy of the last answer).
  static std::mutex lock;
  static std::unordered_map<const void*, unsigned long long> done;  // kernel -> bitmask of devices
  thread_local const void* last_kernel = nullptr;
  thread_local int last_device = -1;
  thread_local int last_bytes = 0;
  if (kernel == last_kernel && device == last_device && bytes <= last_bytes) return;
  {
    std::lock_guard<std::mutex> guard(lock);
    unsigned long long& devices = done[kernel];
    const unsigned long long bit = device < kMaxDevices ? 1ull << device : 0ull;
    if (bit == 0 || !(devices & bit)) {
      int max_optin = 0;
      HMLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      HMLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin));
      devices |= bit;
    }
  }
  last_kernel = kernel;
  last_device = device;
  last_bytes = bytes;
}

}  // namespace hmla::detail
