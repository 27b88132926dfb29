// Kernel launches with programmatic stream serialisation (programmatic dependent launch): the
// attention kernels and the combine.
// Why: on the H200's host such a cudaLaunchKernelEx costs ~2.8 us against ~3.3 us for a plain launch
// of the same kernel (hmla-host-overhead, docs/PYTHON.md "Measured overhead"), and a run entry point
// launches two kernels every decoding step; on the GPU, the kernel's prologue may overlap the tail of
// the kernel before it. The kernel must call dev::pdl_wait_for_prerequisites() before it reads
// anything an earlier kernel of the stream wrote.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.h"

namespace hmla::detail {

template <typename... Params, typename... Args>
void launch_after_prerequisites(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
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

}  // namespace hmla::detail
