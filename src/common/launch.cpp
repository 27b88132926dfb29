#include "common/launch.h"

#include <atomic>
#include <mutex>
#include <string>

namespace hmla::detail {
namespace {

using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using CtxGetCurrentFn = CUresult (*)(CUcontext*);
using GetErrorNameFn = CUresult (*)(CUresult, const char**);

struct DriverEntries {
  LaunchKernelExFn launch = nullptr;
  CtxGetCurrentFn current_context = nullptr;
  GetErrorNameFn error_name = nullptr;
};

template <typename Fn>
Fn driver_entry(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult query{};
  if (cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &query) != cudaSuccess ||
      query != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // not sticky; leave no error behind for the caller's next check
    return nullptr;
  }
  return reinterpret_cast<Fn>(entry);
}

// Resolved once; all null when the driver lacks one of them (every launch then uses the runtime).
const DriverEntries& driver_entries() {
  static const DriverEntries entries = [] {
    DriverEntries e;
    e.launch = driver_entry<LaunchKernelExFn>("cuLaunchKernelEx");
    e.current_context = driver_entry<CtxGetCurrentFn>("cuCtxGetCurrent");
    e.error_name = driver_entry<GetErrorNameFn>("cuGetErrorName");
    if (e.launch == nullptr || e.current_context == nullptr) e = DriverEntries{};
    return e;
  }();
  return entries;
}

}  // namespace

CUcontext current_context() {
  const DriverEntries& driver = driver_entries();
  CUcontext context = nullptr;
  if (driver.current_context == nullptr || driver.current_context(&context) != CUDA_SUCCESS) return nullptr;
  return context;
}

CUfunction driver_kernel_handle(const void* kernel) {
  if (driver_entries().launch == nullptr || current_context() == nullptr) return nullptr;
  // One slot per kernel (hmla has a handful): on the hot path a short scan of atomics, no lock.
  struct Slot {
    std::atomic<const void*> kernel{nullptr};
    std::atomic<CUfunction> handle{nullptr};
  };
  constexpr int kSlots = 32;
  static Slot slots[kSlots];
  for (Slot& slot : slots) {
    const void* k = slot.kernel.load(std::memory_order_acquire);
    if (k == kernel) {
      if (CUfunction h = slot.handle.load(std::memory_order_acquire)) return h;
      break;  // another thread is filling it: look it up without the cache
    }
    if (k != nullptr) continue;
    cudaKernel_t handle = nullptr;
    HMLA_CUDA_CHECK(cudaGetKernel(&handle, kernel));
    const void* expected = nullptr;
    if (slot.kernel.compare_exchange_strong(expected, kernel, std::memory_order_acq_rel))
      slot.handle.store(reinterpret_cast<CUfunction>(handle), std::memory_order_release);
    return reinterpret_cast<CUfunction>(handle);
  }
  cudaKernel_t handle = nullptr;
  HMLA_CUDA_CHECK(cudaGetKernel(&handle, kernel));
  return reinterpret_cast<CUfunction>(handle);
}

void driver_launch_after_prerequisites(CUfunction function, dim3 grid, dim3 block, size_t smem_bytes,
                                       cudaStream_t stream, void** params) {
  CUlaunchConfig config{};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = block.x;
  config.blockDimY = block.y;
  config.blockDimZ = block.z;
  config.sharedMemBytes = static_cast<unsigned>(smem_bytes);
  config.hStream = reinterpret_cast<CUstream>(stream);
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const DriverEntries& driver = driver_entries();
  const CUresult status = driver.launch(&config, function, params, nullptr);
  if (status != CUDA_SUCCESS) {
    const char* name = nullptr;
    if (driver.error_name == nullptr || driver.error_name(status, &name) != CUDA_SUCCESS || name == nullptr)
      throw CudaError("hmla: cuLaunchKernelEx failed: CUresult " + std::to_string(static_cast<int>(status)));
    throw CudaError(std::string("hmla: cuLaunchKernelEx failed: ") + name);
  }
}

namespace {
thread_local RecordedLaunches* recording = nullptr;
}  // namespace

RecordedLaunches* recording_launches() { return recording; }

RecordedLaunches* set_recording_launches(RecordedLaunches* launches) {
  RecordedLaunches* previous = recording;
  recording = launches;
  return previous;
}

void RecordedLaunches::launch_held_directly() {
  const int held = count_;
  forget();
  for (int i = 0; i < held; ++i) {
    const Launch& l = launches_[i];
    driver_launch_after_prerequisites(l.function, l.grid, l.block, l.smem_bytes, stream_,
                                      const_cast<void**>(l.params));
  }
}

}  // namespace hmla::detail
