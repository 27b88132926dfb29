#include "sm90/dense_decode/kernel.cuh"

namespace hmla::sm90::dense_decode {

template void launch_kernel<cute::half_t>(const CUtensorMap&, const CUtensorMap&, const KernelParams&, dim3, cudaStream_t);

}  // namespace hmla::sm90::dense_decode
