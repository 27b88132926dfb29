// Host side of merge_attention_states: validation, then the launch (scheduler/merge_states.cu).
#include "hmla/merge.h"

#include "api/validate.h"
#include "scheduler/merge_states.h"

namespace hmla {

void merge_attention_states(const MergeAttentionParams& params, cudaStream_t stream) {
  validate(params);
  detail::launch_merge_states(params, stream);
}

void merge_attention_states(DType dtype, int batch, int s_q, int h, int d_v, const AttentionState& a,
                            const AttentionState& b, const AttentionOutput& output, cudaStream_t stream) {
  const AttentionState states[2] = {a, b};
  MergeAttentionParams params;
  params.dtype = dtype;
  params.batch = batch;
  params.s_q = s_q;
  params.h = h;
  params.d_v = d_v;
  params.num_states = 2;
  params.states = states;
  params.output = output;
  merge_attention_states(params, stream);
}

}  // namespace hmla
