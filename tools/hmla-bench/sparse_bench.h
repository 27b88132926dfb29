// hmla-bench: the sparse-decode family: FP8 paged caches, top-k index lists, the plan, the timed
// call and the check of one row.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "bench_case.h"
#include "cases.h"
#include "hmla/decode_schedule.h"
#include "hmla/params.h"

namespace hmla_bench {

struct HostCache;  // a host image of one FP8 paged cache (sparse_bench.cu)

class SparseBench : public BenchCase {
 public:
  explicit SparseBench(const SparseCase& c);
  ~SparseBench() override;

  const char* kind() const override { return "sparse_decode"; }
  std::string describe() const override { return hmla_bench::describe(c_); }
  const AnchorRow* find_anchor(const Anchors& anchors) const override { return anchors.find_sparse(c_); }

  void setup(const RowOptions& opt, cudaStream_t stream) override;
  int input_sets() const override { return sets_; }
  double bytes_per_set() const override { return bytes_per_set_; }
  size_t workspace_bytes() const override { return ws_bytes_; }
  void run(int set, cudaStream_t stream) override;
  double flops() const override;
  double bytes() const override;
  void time_extras(const TimingConfig& cfg, cudaStream_t stream) override;
  void check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& out) override;
  void release() override;

  std::string shape_header() const override;
  std::string shape_cells() const override;
  std::string extra_header() const override;
  std::string extra_cells() const override;
  void json_shape(Json& row) const override;
  void json_schedule(Json& row) const override;
  void json_extras(Json& row) const override;

  // One cache (the main one or the extra one): its geometry, host image, block table, per-set index
  // lists and their device copies.
  struct Scope {
    bool present = false;
    int s_k = 0, page = 0, topk = 0;
    int pages_per_request = 0, num_blocks = 0;
    int64_t page_bytes = 0;
    std::shared_ptr<const HostCache> image;
    std::vector<int32_t> lengths;                // [b], the entries of each list that count
    std::vector<std::vector<int32_t>> indices;   // per set, [b, s_q, topk]
    std::vector<double> unique_tokens;           // per set: distinct tokens the counted entries name
    Slab cache_dev;                              // cache_copies copies of the image
    Slab indices_dev, lengths_dev;               // per set
  };

 private:
  SparseCase c_;
  int d_qk_ = 576;
  float softmax_scale_ = 0.f;
  Scope main_, extra_;
  int sets_ = 1, cache_copies_ = 1;
  double bytes_per_set_ = 0;
  double attended_ = 0;       // b * s_q * (counted main + extra entries), over the batch
  double unique_tokens_ = 0;  // mean over the sets, main + extra
  size_t ws_bytes_ = 0;
  int num_sm_parts_ = 0, num_m_blocks_ = 0;
  TimeStats plan_time_, plan_cold_time_;  // the plan alone, and right after the L2 was swept
  // A decoding step's attention with the plan reused, and with a fresh plan before it (time_extras).
  TimeStats step_alone_, step_planned_;
  double plan_step_us() const { return step_planned_.median - step_alone_.median; }
  std::vector<float> sink_;
  Slab q_, out_, lse_, ws_;
  DeviceBuffer sink_dev_;
  std::vector<hmla::SparseDecodeParams> params_;
  std::vector<hmla::DecodeSchedule> sched_;
};

}  // namespace hmla_bench
