#include "sm90/sparse_decode/narrow_kernel.cuh"

namespace hmla::sm90::sparse_decode {

template void launch_narrow_kernel<SparseCacheLayout::kV32, 16>(const CUtensorMap&, const KernelParams&, int, cudaStream_t);
template void launch_narrow_kernel<SparseCacheLayout::kV32, 32>(const CUtensorMap&, const KernelParams&, int, cudaStream_t);

}  // namespace hmla::sm90::sparse_decode
