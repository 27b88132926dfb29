// hmla-bench: the dense-decode family: inputs, plan, the timed call and the check of one row.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "bench_case.h"
#include "cases.h"
#include "hmla/decode_schedule.h"
#include "hmla/dense_decode.h"

namespace hmla_bench {

// FlashMLA's formulas with s_k the mean length (total_tokens / b).
inline double dense_flops(const DenseCase& c, long long total_tokens) {
  return (double)c.s_q * c.h_q * (2.0 * 576 + 2.0 * 512) * (double)total_tokens;
}
inline double dense_bytes(const DenseCase& c, long long total_tokens) {
  const double elem = 2.0;
  return (double)c.b * c.s_q * c.h_q * 576 * elem + (double)total_tokens * c.h_kv * 576 * elem +
         (double)c.b * c.s_q * c.h_q * 512 * elem;
}

class DenseBench : public BenchCase {
 public:
  explicit DenseBench(const DenseCase& c) : c_(c) {}

  const char* kind() const override { return "dense_decode"; }
  std::string describe() const override { return hmla_bench::describe(c_); }
  const AnchorRow* find_anchor(const Anchors& anchors) const override { return anchors.find_dense(c_); }

  void setup(const RowOptions& opt, cudaStream_t stream) override;
  int input_sets() const override { return sets_; }
  double bytes_per_set() const override { return bytes_per_set_; }
  size_t workspace_bytes() const override { return ws_bytes_; }
  void run(int set, cudaStream_t stream) override;
  double flops() const override { return dense_flops(c_, total_tokens_); }
  double bytes() const override { return dense_bytes(c_, total_tokens_); }
  void check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& out) override;
  void release() override;

  std::string shape_header() const override;
  std::string shape_cells() const override;
  void json_shape(Json& row) const override;
  void json_schedule(Json& row) const override;

 private:
  DenseCase c_;
  // lengths actually used
  std::vector<int> lens_;
  long long total_tokens_ = 0;
  int s_k_min_ = 0, s_k_max_ = 0;
  int mbps_ = 1, num_blocks_ = 0;
  // plan
  size_t ws_bytes_ = 0;
  int num_sm_parts_ = 0, num_m_blocks_ = 0;
  // rotation
  int sets_ = 1;
  double bytes_per_set_ = 0;
  // device state, one slot per input set
  Slab q_, cache_, out_, lse_, table_, seqlens_, ws_;
  std::vector<hmla::DenseDecodeParams> params_;
  std::vector<hmla::DecodeSchedule> sched_;
};

}  // namespace hmla_bench
