#include "sm90/sparse_prefill/kernel.cuh"

namespace hmla::sm90::sparse_prefill {

template void launch_kernel<512>(const CUtensorMap&, const KernelParams&, int, cudaStream_t);

}  // namespace hmla::sm90::sparse_prefill
