#include "common/device_attributes.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

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
  // One slot per kernel (hmla has a handful), each with the devices already set: on the hot path a
  // short scan of atomics, no lock. Devices past the bit mask are set on every call.
  struct Slot {
    std::atomic<const void*> kernel{nullptr};
    std::atomic<unsigned long long> devices{0};
  };
  constexpr int kSlots = 32;
  static Slot slots[kSlots];
  const unsigned long long bit = device < kMaxDevices ? 1ull << device : 0ull;
  Slot* slot = nullptr;
  for (Slot& s : slots) {
    const void* k = s.kernel.load(std::memory_order_acquire);
    if (k == nullptr) {
      const void* expected = nullptr;
      if (s.kernel.compare_exchange_strong(expected, kernel, std::memory_order_acq_rel) || expected == kernel) {
        slot = &s;
        break;
      }
      continue;
    }
    if (k == kernel) {
      slot = &s;
      break;
    }
  }
  if (slot != nullptr && bit != 0 && (slot->devices.load(std::memory_order_acquire) & bit)) return;
  // The dynamic limit may reach the device's opt-in limit less the kernel's static shared memory.
  int max_optin = 0;
  HMLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  HMLA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int limit = max_optin - static_cast<int>(attributes.sharedSizeBytes);
  if (bytes > limit)
    throw CudaError("hmla: a kernel needs " + std::to_string(bytes) + " bytes of dynamic shared memory, the device allows " +
                    std::to_string(limit));
  HMLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
  if (slot != nullptr) slot->devices.fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace hmla::detail
