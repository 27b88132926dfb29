#include "sm90/dense_decode/kernel.cuh"

namespace hmla::sm90::dense_decode {

void launch_bf16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  launch<cute::bfloat16_t>(params, schedule, stream);
}

}  // namespace hmla::sm90::dense_decode
