// hmla-bench: the sparse-prefill family: a bf16 kv tensor, top-k index lists per query token, the
// timed call and the check of one row. No plan; the workspace that cuts the last round of items
// (hmla::sparse_prefill_workspace_bytes; HMLA_BENCH_PREFILL_WHOLE_ITEMS=1 in the environment runs
// without it, whole items only, for A/B).
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "bench_case.h"
#include "cases.h"
#include "hmla/params.h"

namespace hmla_bench {

class SparsePrefillBench : public BenchCase {
 public:
  explicit SparsePrefillBench(const SparsePrefillCase& c) : c_(c) {}

  const char* kind() const override { return "sparse_prefill"; }
  std::string describe() const override { return hmla_bench::describe(c_); }
  const AnchorRow* find_anchor(const Anchors& anchors) const override { return anchors.find_sparse_prefill(c_); }

  void setup(const RowOptions& opt, cudaStream_t stream) override;
  int input_sets() const override { return sets_; }
  double bytes_per_set() const override { return bytes_per_set_; }
  size_t workspace_bytes() const override { return workspace_bytes_; }
  void run(int set, cudaStream_t stream) override;
  double flops() const override;
  double bytes() const override;
  void check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& out) override;
  double check_out_rel_l2_limit() const override { return kCheckSparsePrefillOutRelL2; }
  void release() override;

  std::string shape_header() const override;
  std::string shape_cells() const override;
  void json_shape(Json& row) const override;
  void json_schedule(Json& row) const override { (void)row; }

 private:
  SparsePrefillCase c_;
  float softmax_scale_ = 0.f;
  int sets_ = 1;
  double bytes_per_set_ = 0;
  double attended_ = 0;           // counted entries over all query tokens (s_q * topk without random lengths)
  std::vector<int32_t> lengths_;  // [s_q], the same in every set
  std::vector<float> sink_;
  // one slot per input set
  Slab q_, kv_, indices_, lengths_dev_, out_, max_logits_, lse_;
  DeviceBuffer sink_dev_;
  DeviceBuffer workspace_;  // one for every set: the calls are serialised on the stream
  size_t workspace_bytes_ = 0;
  std::vector<hmla::SparsePrefillParams> params_;
};

}  // namespace hmla_bench
