// Host side of sparse prefill: validation, then the kernel (no plan; a workspace only for the last
// round's pieces, sm90/sparse_prefill/launch.h).
#include "common/device_attributes.h"
#include "hmla/sparse_prefill.h"
#include "sm90/sparse_prefill/launch.h"

namespace hmla {

void sparse_prefill_run(const SparsePrefillParams& params, cudaStream_t stream) {
  validate(params);
  sm90::sparse_prefill::launch(params, stream);
}

size_t sparse_prefill_workspace_bytes(const SparsePrefillParams& params) {
  if (params.s_q < 1 || params.h_q < 1 || params.topk < 1) return 0;
  return sm90::sparse_prefill::ItemRounds::plan(params.s_q, params.h_q, params.topk, detail::current_device_sm_count(),
                                                true)
      .bytes;
}

}  // namespace hmla
