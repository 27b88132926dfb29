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
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/cuda_check.h"

namespace hmla::detail {

// The kernel's context-free handle (a CUkernel, which cuLaunchKernelEx takes as a CUfunction), or
// null when there is no CUDA context current on this thread (the launch then uses the runtime).
CUfunction driver_kernel_handle(const void* kernel);

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

template <typename... Params, typename... Args>
void launch_after_prerequisites(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  if (CUfunction function = driver_kernel_handle(reinterpret_cast<const void*>(kernel))) {
    // The driver takes a pointer to each parameter, of the kernel's exact type.
    std::tuple<std::remove_cv_t<std::remove_reference_t<Params>>...> values(std::forward<Args>(args)...);
    std::apply(
        [&](auto&... value) {
          void* params[] = {static_cast<void*>(&value)...};
          driver_launch_after_prerequisites(function, grid, block, smem_bytes, stream, params);
        },
        values);
    return;
  }
  runtime_launch_after_prerequisites(kernel, grid, block, smem_bytes, stream, std::forward<Args>(args)...);
}

}  // namespace hmla::detail
