// Kernel launches with programmatic stream serialisation (programmatic dependent launch): the
// attention kernels and the combine.
// Why: a run entry point launches two kernels every decoding step, and its host time is mostly
// theirs. On the H200's host a cudaLaunchKernelEx with this attribute costs ~2.8 us against ~3.3 us
// for a plain launch of the same kernel (hmla-host-overhead, docs/PYTHON.md "Measured overhead"), and
// on the GPU the kernel's prologue may overlap the tail of the kernel before it. The launch goes to
// the driver's cuLaunchKernelEx with the kernel's context-free handle (cudaGetKernel, looked up once
// per kernel), which skips the runtime's per-launch lookup of the host stub (0.06-0.1 us per launch
// there); with no CUDA context current on the calling thread (a thread that never used the runtime)
// it goes through the runtime, which sets one up. The kernel must call
// dev::pdl_wait_for_prerequisites() before it reads anything an earlier kernel of the stream wrote.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/cuda_check.h"

namespace hmla::detail {

// The kernel's context-free handle (a CUkernel, which cuLaunchKernelEx takes as a CUfunction), or
// null when there is no CUDA context current on this thread (the launch then uses the runtime).
CUfunction driver_kernel_handle(const void* kernel);

// The CUDA context current on this thread, or null (none, or no driver entry points).
CUcontext current_context();

// cuLaunchKernelEx with programmatic stream serialisation; throws hmla::CudaError on failure.
void driver_launch_after_prerequisites(CUfunction function, dim3 grid, dim3 block, size_t smem_bytes,
                                       cudaStream_t stream, void** params);

// The runtime's form of the same launch (cudaLaunchKernelEx): the fallback below, and the baseline
// hmla-host-overhead times the driver's form against.
template <typename... Params, typename... Args>
void runtime_launch_after_prerequisites(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                        cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  HMLA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The launches of one run entry point, held back while a LaunchReplay records them (the scope of
// ReplayedRun, common/launch_replay.h): each launch's function, shape and a copy of its arguments, so
// that they can be set into a graph's nodes or launched directly afterwards, in order.
class RecordedLaunches {
 public:
  static constexpr int kMaxLaunches = 2;
  static constexpr int kMaxParams = 4;
  static constexpr size_t kArgumentBytes = 2048;

  struct Launch {
    CUfunction function;
    dim3 grid, block;
    size_t smem_bytes;
    void* params[kMaxParams];
  };

  explicit RecordedLaunches(cudaStream_t stream) : stream_(stream) {}

  // Holds the launch back; false when it does not fit (more launches or argument bytes than a run
  // makes), after launching everything held so far: the caller then launches it directly.
  template <typename... Values>
  bool hold(CUfunction function, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
            const std::tuple<Values...>& values) {
    static_assert(sizeof...(Values) <= kMaxParams, "a kernel with more parameters than a recorded launch holds");
    size_t end = used_;
    ((end = aligned(end, alignof(Values)) + sizeof(Values)), ...);
    if (stream != stream_ || count_ == kMaxLaunches || end > kArgumentBytes) {
      launch_held_directly();
      return false;
    }
    Launch& launch = launches_[count_++];
    launch.function = function;
    launch.grid = grid;
    launch.block = block;
    launch.smem_bytes = smem_bytes;
    int i = 0;
    std::apply([&](const auto&... value) { ((launch.params[i++] = copy_in(value)), ...); }, values);
    return true;
  }

  // Launches what is held, in order, with driver_launch_after_prerequisites.
  void launch_held_directly();

  int count() const { return count_; }
  const Launch& launch(int i) const { return launches_[i]; }
  cudaStream_t stream() const { return stream_; }
  void forget() { count_ = 0, used_ = 0; }

 private:
  static size_t aligned(size_t offset, size_t alignment) { return (offset + alignment - 1) / alignment * alignment; }
  template <typename T>
  void* copy_in(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "kernel arguments are copied as bytes");
    used_ = aligned(used_, alignof(T));
    void* at = arguments_ + used_;
    std::memcpy(at, &value, sizeof(T));
    used_ += sizeof(T);
    return at;
  }

  cudaStream_t stream_;
  int count_ = 0;
  size_t used_ = 0;
  Launch launches_[kMaxLaunches];
  alignas(128) unsigned char arguments_[kArgumentBytes];
};

// The recorder of the run entry point in progress on this thread, or null (launches go directly);
// set_recording_launches installs one (null: none) and returns the one it replaces.
RecordedLaunches* recording_launches();
RecordedLaunches* set_recording_launches(RecordedLaunches* launches);

template <typename... Params, typename... Args>
void launch_after_prerequisites(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  RecordedLaunches* recording = recording_launches();
  if (CUfunction function = driver_kernel_handle(reinterpret_cast<const void*>(kernel))) {
    // The driver takes a pointer to each parameter, of the kernel's exact type.
    std::tuple<std::remove_cv_t<std::remove_reference_t<Params>>...> values(std::forward<Args>(args)...);
    if (recording != nullptr && recording->hold(function, grid, block, smem_bytes, stream, values)) return;
    std::apply(
        [&](auto&... value) {
          void* params[] = {static_cast<void*>(&value)...};
          driver_launch_after_prerequisites(function, grid, block, smem_bytes, stream, params);
        },
        values);
    return;
  }
  if (recording != nullptr) recording->launch_held_directly();  // keep the stream's order
  runtime_launch_after_prerequisites(kernel, grid, block, smem_bytes, stream, std::forward<Args>(args)...);
}

}  // namespace hmla::detail
