#include "sm90/dense_decode/kernel.cuh"

namespace hmla::sm90::dense_decode {

void launch_fp16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  launch<cute::half_t>(params, schedule, stream);
}

}  // namespace hmla::sm90::dense_decode
