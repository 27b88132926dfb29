// hmla-bench: the merge family: hmla::merge_attention_states over n partial results of one shape.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "bench_case.h"
#include "cases.h"
#include "hmla/merge.h"
#include "hmla/types.h"

namespace hmla_bench {

// Every state's out and lse read once, the merged out and lse written once.
inline double merge_bytes(const MergeCase& c) {
  const double rows = (double)c.b * c.s_q * c.h;
  return (c.states + 1.0) * rows * ((double)c.d_v * 2 + 4);
}
inline double merge_flops(const MergeCase& c) { return 2.0 * c.states * c.b * c.s_q * c.h * (double)c.d_v; }

class MergeBench : public BenchCase {
 public:
  explicit MergeBench(const MergeCase& c) : c_(c) {}

  const char* kind() const override { return "merge"; }
  std::string describe() const override { return hmla_bench::describe(c_); }
  const AnchorRow* find_anchor(const Anchors&) const override { return nullptr; }

  void setup(const RowOptions& opt, cudaStream_t stream) override;
  int input_sets() const override { return sets_; }
  double bytes_per_set() const override { return merge_bytes(c_); }
  size_t workspace_bytes() const override { return 0; }
  void run(int set, cudaStream_t stream) override;
  double flops() const override { return merge_flops(c_); }
  double bytes() const override { return merge_bytes(c_); }
  void check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& out) override;
  void release() override;

  std::string shape_header() const override;
  std::string shape_cells() const override;
  void json_shape(Json& row) const override;
  void json_schedule(Json& row) const override { (void)row; }

 private:
  hmla::MergeAttentionParams params(int set) const;

  MergeCase c_;
  int sets_ = 1;
  // one slot per input set: the states stacked ([states][b][s_q][h][d_v], [states][b][h][s_q]),
  // then the output
  Slab states_out_, states_lse_, out_, lse_;
  std::vector<std::vector<hmla::AttentionState>> views_;
};

}  // namespace hmla_bench
