// Host-side CUDA error checking: every runtime call the library makes goes through HMLA_CUDA_CHECK,
// which turns a failure into hmla::CudaError naming the call and the source line.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "hmla/types.h"

namespace hmla::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  throw CudaError(std::string("hmla: ") + call + " failed at " + file + ":" + std::to_string(line) +
                  ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace hmla::detail

#define HMLA_CUDA_CHECK(call)                                                        \
  do {                                                                               \
    cudaError_t hmla_status_ = (call);                                               \
    if (hmla_status_ != cudaSuccess)                                                 \
      ::hmla::detail::throw_cuda_error(hmla_status_, #call, __FILE__, __LINE__);     \
  } while (0)
