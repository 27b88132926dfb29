// hmla-bench: one dense-decode row: inputs, plan, timing, metrics and the optional check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cases.h"
#include "common.h"

namespace hmla_bench {

// Pass thresholds of --check (stated in the output and the JSON).
constexpr double kCheckOutRelL2 = 1e-2;  // ||out - ref||_2 / ||ref||_2 over the checked requests
constexpr double kCheckLseAbs = 1e-3;    // max |lse - ref_lse| (natural log)

struct RowOptions {
  int warmup = 5;
  double warmup_ms = 25.0;  // and at least this long (see timing.h)
  int iters = 50;
  bool backlog = true;
  uint64_t seed = 20261129;
  size_t rotate_min_bytes = 512 * kMiB;  // rotate input sets until the calls touch this much
  int max_input_sets = 1024;
  size_t max_rotation_bytes = 4 * kGiB;  // bound on all sets' allocations when rotating (not on one set)
  bool check = false;
  int check_requests = 0;  // 0: automatic (up to 8, fewer when the reference would be slow)
  bool verbose = false;    // check progress on stderr
};

struct DenseResult {
  DenseCase c;
  // lengths actually used
  long long total_tokens = 0;
  double s_k_mean = 0;
  int s_k_min = 0, s_k_max = 0;
  // plan
  size_t workspace_bytes = 0;
  int num_sm_parts = 0;
  int num_m_blocks = 0;
  // rotation
  int input_sets = 1;
  double bytes_per_set = 0;  // device bytes one call touches (inputs, outputs, table)
  // timing and metrics
  TimeStats time;  // microseconds
  double flops = 0, bytes = 0, tflops = 0, gbps = 0;
  double sm_mhz = 0;  // SM clock right after the timed calls (SmClockProbe)
  // check
  bool checked = false;
  std::vector<int> check_request_ids;
  double out_rel_l2 = 0, out_max_abs = 0, lse_max_abs = 0;
  unsigned long long nonfinite_out = 0;  // over the whole batch's out after the poisoned run
  unsigned long long bad_lse = 0;        // NaN anywhere, or inf where the query has keys (or vice versa)
  bool check_pass = true;
  double check_seconds = 0;
  std::string check_note;
};

// Throws hmla::InvalidArgument for shapes the library rejects, BenchError / hmla::CudaError for
// CUDA failures.
DenseResult run_dense_case(const DenseCase& c, const RowOptions& opt, cudaStream_t stream);

// FlashMLA's formulas with s_k the mean length (total_tokens / b).
inline double dense_flops(const DenseCase& c, long long total_tokens) {
  return (double)c.s_q * c.h_q * (2.0 * 576 + 2.0 * 512) * (double)total_tokens;
}
inline double dense_bytes(const DenseCase& c, long long total_tokens) {
  const double elem = 2.0;
  return (double)c.b * c.s_q * c.h_q * 576 * elem + (double)total_tokens * c.h_kv * 576 * elem +
         (double)c.b * c.s_q * c.h_q * 512 * elem;
}

}  // namespace hmla_bench
