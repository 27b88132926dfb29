#include "common/tensor_map.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "common/cuda_check.h"

namespace hmla::detail {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult query{};
    HMLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000,
                                                     cudaEnableDefault, &query));
    if (query == cudaDriverEntryPointSuccess) fn = reinterpret_cast<EncodeTiledFn>(entry);
  });
  if (fn == nullptr) throw CudaError("hmla: the CUDA driver has no cuTensorMapEncodeTiled (needs >= 12.0)");
  return fn;
}

}  // namespace

CUtensorMap make_tensor_map_16bit_sw128(const void* base, int rank, const uint64_t* dims,
                                        const uint64_t* strides_bytes, const uint32_t* box,
                                        const char* what) {
  CUtensorMap map{};
  cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  CUresult status = encode_tiled_fn()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, static_cast<cuuint32_t>(rank), const_cast<void*>(base),
      reinterpret_cast<const cuuint64_t*>(dims), reinterpret_cast<const cuuint64_t*>(strides_bytes),
      reinterpret_cast<const cuuint32_t*>(box), element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw CudaError(std::string("hmla: cuTensorMapEncodeTiled failed for ") + what + " (CUresult " +
                    std::to_string(static_cast<int>(status)) + ")");
  }
  return map;
}

}  // namespace hmla::detail
