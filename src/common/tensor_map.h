// Host-side creation of TMA tensor maps (CUtensorMap) without linking libcuda: the driver entry
// point is looked up once through the runtime, so binaries that never touch a GPU (CPU tests, CI)
// load on machines without the driver.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace hmla::detail {

// A bf16/fp16 tensor of `rank` dims (dim 0 contiguous), strides in bytes for dims 1..rank-1, tiled
// into boxes of `box` elements with 128-byte swizzle (box[0] * 2 bytes must be 128).
// Out-of-bounds box elements are filled with zeros by the hardware.
CUtensorMap make_tensor_map_16bit_sw128(const void* base, int rank, const uint64_t* dims,
                                        const uint64_t* strides_bytes, const uint32_t* box,
                                        const char* what);

}  // namespace hmla::detail
