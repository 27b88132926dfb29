#include "sm90/sparse_decode/kernel.cuh"

namespace hmla::sm90::sparse_decode {

template void launch_prefill_kernel<512>(const CUtensorMap&, const KernelParams&, cudaStream_t);

}  // namespace hmla::sm90::sparse_decode
