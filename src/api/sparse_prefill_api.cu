// Host side of sparse prefill: validation, then the kernel (no plan, no workspace).
#include "hmla/sparse_prefill.h"
#include "sm90/sparse_prefill/launch.h"

namespace hmla {

void sparse_prefill_run(const SparsePrefillParams& params, cudaStream_t stream) {
  validate(params);
  sm90::sparse_prefill::launch(params, stream);
}

}  // namespace hmla
