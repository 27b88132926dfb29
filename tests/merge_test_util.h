// The shape and parameter block shared by the merge op's CPU tests (tests/cpu/test_merge.cpp) and GPU
// tests (tests/gpu/test_merge.cu).
#pragma once

#include <vector>

#include "hmla/merge.h"
#include "hmla/types.h"

namespace hmla::test {

struct MergeShape {
  DType dtype;
  int batch, s_q, h, d_v;
};

inline MergeAttentionParams merge_params(const MergeShape& s, const std::vector<AttentionState>& views,
                                         const AttentionOutput& out) {
  MergeAttentionParams p;
  p.dtype = s.dtype;
  p.batch = s.batch;
  p.s_q = s.s_q;
  p.h = s.h;
  p.d_v = s.d_v;
  p.num_states = static_cast<int>(views.size());
  p.states = views.data();
  p.output = out;
  return p;
}

}  // namespace hmla::test
