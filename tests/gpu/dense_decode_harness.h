// Test harness for hmla's dense decode: builds one problem (paged cache, block table, q, poisoned
// outputs) on host and device, runs plan + run, and checks the outputs against
// hmla::reference::dense_decode. See test_dense_decode.cu for the suite, its coverage and the
// tolerances (also listed below next to the constants that implement them).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "harness_common.h"
#include "hmla/dense_decode.h"
#include "hmla/params.h"

namespace hmla_test {

constexpr int kDqk = 576;

// ------------------------------------------------------------------------------ tolerances
// (the meaning of each field: Tolerance in harness_common.h; rel L2 is over every compared element
// of a case; lse is float32 from fp32 accumulation for both dtypes; rows without any key: out
// exactly 0 and lse exactly +inf, as in the reference)
// bf16: 8-bit significand; output rounding alone is up to 2^-8 relative and P is fed to the PV
// product in bf16 (2^-9), so the measured relative L2 error is ~2e-3: 1e-2 leaves 4-5x margin.
constexpr Tolerance kBf16Tolerance{1e-2, 1.0 / 128, 1e-2, 1e-5};
// fp16: 11-bit significand, four times finer than bf16 on both roundings: 5e-3 and a 4x tighter
// elementwise bound (fp16's expected error ~5e-4 relative L2).
constexpr Tolerance kFp16Tolerance{5e-3, 1.0 / 512, 2.5e-3, 1e-5};
inline const Tolerance& tolerance_for(hmla::DType t) {
  return t == hmla::DType::kBF16 ? kBf16Tolerance : kFp16Tolerance;
}

// ------------------------------------------------------------------------------ case spec
struct DecodeCase {
  std::string name;  // unique, used for the q seed and in messages
  hmla::DType dtype = hmla::DType::kBF16;
  int batch = 1;
  int s_q = 1;
  int h_q = 16;
  int h_kv = 1;
  int page_size = 64;
  bool causal = false;
  float softmax_scale = 0.f;
  std::vector<int> lengths;   // cache_seqlens, size batch
  std::vector<int> capacity;  // optional: tokens of cache each request owns (>= lengths), so
                              // set_lengths can grow a request later; empty means lengths
  Layout q_layout = Layout::kDense;
  Layout out_layout = Layout::kDense;
  bool pad_lse = false;          // lse head/batch strides with gaps
  bool pad_block_table = false;  // block-table batch stride > max_blocks_per_seq
  bool pad_cache = false;        // cache head/token/block strides with gaps (filled with NaN)
  uint64_t cache_seed = 0;       // 0: derived from the name. Cases with equal cache inputs share
                                 // one generated cache (the grid relies on it to stay fast).
  // Reference cost budget in multiply-adds: rows are sampled when a full check would cost more.
  // 0: the suite default (HMLA_TEST_REF_BUDGET for grid cases, HMLA_TEST_SPECIAL_REF_BUDGET
  // otherwise); < 0: unlimited (every row). HMLA_TEST_FULL=1 makes every budget unlimited.
  double ref_budget = 0;
  bool grid_case = false;
  int num_sms = 0;  // the SM count the plan schedules for (0: the device's); small counts split
                    // small problems the way large ones split on the whole GPU
};

// Number of keys query `t` of a request of length `len` attends to.
inline int keys_for(int len, int s_q, int t, bool causal) {
  if (!causal) return len;
  const int n = len - s_q + t + 1;
  return n < 0 ? 0 : (n > len ? len : n);
}

// ------------------------------------------------------------------------------ paged cache
// The cache, its block table and lengths-capacity; shared between cases with the same inputs.
struct PagedCache {
  std::string key;
  hmla::DType dtype = hmla::DType::kBF16;
  int batch = 0, h_kv = 1, page_size = 64;
  int num_blocks = 0, max_blocks_per_seq = 0;
  int64_t block_stride = 0, token_stride = 0, head_stride = 0, bt_stride = 0;
  std::vector<int> capacity;         // tokens with real data, per request
  std::vector<int> pages;            // pages assigned per request
  std::vector<uint16_t> host;        // num_blocks * block_stride
  std::vector<int32_t> block_table;  // batch * bt_stride
  DeviceBuffer dev, dev_block_table;
  float max_abs_value = 0.f;  // over the first 512 columns of every real row
  double max_key_norm = 0.0;  // L2 over 576 columns, max over every real row
};

std::shared_ptr<const PagedCache> get_paged_cache(const DecodeCase& c);
void release_cached_caches();

// ------------------------------------------------------------------------------ problem
class DecodeProblem {
 public:
  explicit DecodeProblem(DecodeCase c);
  ~DecodeProblem();
  DecodeProblem(const DecodeProblem&) = delete;
  DecodeProblem& operator=(const DecodeProblem&) = delete;

  const DecodeCase& spec() const { return c_; }
  const std::vector<int>& lengths() const { return lengths_; }
  hmla::DenseDecodeParams device_params() const;
  int32_t* device_seqlens() const { return dev_seqlens_.as<int32_t>(); }

  // Change cache_seqlens (each <= the case's capacity); uploads, forgets the reference.
  void set_lengths(const std::vector<int>& lengths);
  // New q values (same layout); uploads, forgets the reference.
  void refill_q(uint64_t seed);
  // Writes the NaN poison into every logical out/lse element and the sentinel everywhere else.
  void poison_outputs();

  // ---- planted NaNs: the rows expected NaN (every out element and lse) follow from them and the
  // current lengths; every other row is still compared with the reference.
  // A NaN in q element d of (request b, token t, head h): that row is NaN. Cleared by refill_q.
  void plant_nan_in_q(int b, int t, int h, int d);
  // A NaN in column d of cache row `key` of request b, kv head `kv` (key < the request's
  // capacity; the problem takes a private copy of the cache first). The rows of the queries that
  // attend the key are NaN; a key at or past the length changes nothing. Throws for a key in a
  // V column (d < 512) that some causal query of the request does not see: a NaN there may reach
  // those queries too (docs/API.md).
  void plant_nan_in_cache(int b, int key, int kv, int d);
  bool expects_nan(int b, int t, int h) const {
    return nan_row_[(static_cast<size_t>(b) * c_.s_q + t) * c_.h_q + h] != 0;
  }

  // ---- device-side values the host cannot check (docs/API.md, contract 1, defined behaviour)
  // Uploads these cache_seqlens as they are; the reference uses each clamped to
  // [0, max_blocks_per_seq * page_size], the kernel's rule.
  void set_device_lengths_unchecked(const std::vector<int32_t>& raw);
  // Writes `value` into block_table[b][page_index] on the device. Where the reference needs an
  // entry outside [0, num_blocks) it reads a page of zeros instead, the kernel's rule.
  void set_block_table_entry(int b, int page_index, int32_t value);
  int max_blocks_per_seq() const { return cache_->max_blocks_per_seq; }
  int num_blocks() const { return cache_->num_blocks; }

  size_t workspace_bytes() const;
  // The usual sequence: poison, fresh workspace filled with 0xff, plan, run, synchronise, check
  // that nothing failed. Returns false (after adding a failure) if anything threw or CUDA failed.
  // after_run (optional): enqueued right after the run, before the synchronisation.
  bool plan_and_run(cudaStream_t stream, const std::function<void(cudaStream_t)>& after_run = {});
  Outputs download() const;
  // The whole out and lse allocations (what download() copies) and the workspace of the last plan.
  const DeviceBuffer& out_buffer() const { return dev_out_; }
  const DeviceBuffer& lse_buffer() const { return dev_lse_; }
  void* device_workspace() const { return dev_ws_.get(); }

  // Every structural check (no poison left, no NaN/inf, no write outside the logical elements,
  // exact zeros/+inf for rows without keys, out within the convex hull of V, lse within
  // log(n) +- max|score|) on every row, plus the reference comparison on all rows or a
  // deterministic sample of (request, head) rows within the case's reference budget.
  // Adds gtest failures labelled with `what`; returns true if everything passed.
  bool check(const Outputs& got, const std::string& what, CheckStats* stats = nullptr);

  // Bitwise comparison of the logical elements of two runs.
  static bool bitwise_equal(const Outputs& a, const Outputs& b, std::string* where);

 private:
  void build_q(uint64_t seed);
  void upload_lengths();
  void make_cache_private();
  void refresh_nan_rows();
  void refresh_reference_block_table();
  void compute_reference();
  double budget() const;

  DecodeCase c_;
  std::shared_ptr<const PagedCache> cache_;
  std::shared_ptr<PagedCache> private_cache_;  // cache_ once a test changes the cache
  std::vector<int> lengths_;                   // what the reference attends to
  std::vector<int32_t> device_block_table_;    // what the device holds, when a test changed it
  std::vector<int32_t> ref_block_table_;       // what the reference reads (empty: the cache's)
  int zero_page_ = -1;                         // a spare page of zeros, for out-of-range ids
  std::vector<std::array<int, 4>> q_nans_, cache_nans_;
  std::vector<uint8_t> nan_row_;  // [b][s_q][h_q]
  Strided q_layout_, out_layout_, lse_layout_;
  std::vector<uint16_t> q_host_;
  Outputs poison_image_;
  std::vector<float> q_row_norm_;  // [b][s_q][h_q]
  DeviceBuffer dev_q_, dev_out_, dev_lse_, dev_seqlens_, dev_ws_;

  // reference results for the compared (request, head) pairs
  bool ref_valid_ = false;
  bool ref_sampled_ = false;
  double ref_macs_ = 0, ref_seconds_ = 0;
  std::vector<int32_t> ref_slot_;  // [b * h_q] -> slot or -1
  std::vector<float> ref_out_;     // [slot][s_q][512]
  std::vector<float> ref_lse_;     // [slot][s_q]
};

// Accumulated over the run and printed at the end (worst errors, time spent).
void record_stats(const DecodeCase& c, const CheckStats& s);
void print_summary();

// Convenience for the value-parameterised tests: build, run, check.
void run_and_check_case(const DecodeCase& c);

}  // namespace hmla_test
