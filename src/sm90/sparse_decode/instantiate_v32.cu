#include "sm90/sparse_decode/kernel.cuh"

namespace hmla::sm90::sparse_decode {

template void launch_kernel<SparseCacheLayout::kV32>(const CUtensorMap&, const KernelParams&, int, int, cudaStream_t);

}  // namespace hmla::sm90::sparse_decode
