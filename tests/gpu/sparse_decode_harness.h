// Test harness for hmla's token-sparse FP8 decode: builds one problem (FP8 paged caches whose
// unattended slots are NaN, index lists with invalid entries and duplicates, optional lengths,
// sink and extra cache, poisoned outputs) on host and device, runs plan + run, and checks the
// outputs against hmla::reference::sparse_decode. See test_sparse_decode.cu for the suite and its
// coverage; the tolerances are stated below next to the constants that implement them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "harness_common.h"
#include "hmla/params.h"
#include "hmla/sparse_decode.h"

namespace hmla_test {

// ------------------------------------------------------------------------------ tolerances
// The reference is float64 on the dequantised cache (e4m3 code * scale in float32, exactly what
// the cache holds), so FP8 quantisation is no error here. What the kernel adds (its math is fp16:
// src/common/fp8_dequant.cuh, docs/SPARSE_DECODE.md "Number formats"):
//   K and V in fp16 after dequantisation: exact for kModel1's power-of-two UE8M0 scales, within
//   2^-10 relative for V3.2's float32 scales (two roundings of 2^-11); q converted to fp16 after a
//   power-of-two prescale (exact: bf16 has fewer significant bits); the RoPE part bf16 -> fp16
//   (exact in range);
//   P = exp(score - max) fed to the PV product in fp16 (2^-11),
//   out rounded to bf16 (2^-8);
// plus fp32 accumulation over up to 32768 keys and the split-K combine (~1e-6). The roundings of
// K, V and P are independent across keys and average out in the weighted sums; the output's own
// rounding does not, and alone gives a relative L2 error of 1.7e-3 to 2.5e-3 on these inputs (the
// bf16 math before measured at most 3.5e-3 in a float32 emulation; FlashMLA's own path is measured
// at <= 3e-3). 8e-3 per (b, s) group (h_q x 512 values) leaves over 2x margin, while one wrong,
// dropped or doubled key among a few, or a wrong scale or sink, costs far more.
// Per element: 2^-6 relative plus 2e-2 of the row's largest |ref| (the row is the 512 values of
// one head; cancellation makes a small element's relative error unbounded).
// lse is float32 from fp32 sums of exp of scores computed from fp16 K. On kModel1 that K is exact
// (e4m3 times a power of two); on kV32 each dequantised value is off by up to 2^-10 relative, so
// each score is off by about 2^-10 / sqrt(3) of the spread of its d_qk products, and lse as much as
// the scores that dominate it: within 1e-3 * max(1, |lse|) with the default scale. The bf16 math
// this bound was set for had 4x the per-value error (at softmax scale 1.0 a float32 emulation of it
// was 9x over), so the V3.2 cases keep scales near the default and the sharp-softmax case is
// kModel1.
// Queries without a valid key: out exactly 0 and lse exactly +inf (no tolerance).
constexpr Tolerance kSparseTolerance{8e-3, 1.0 / 64, 2e-2, 1e-3};

// ------------------------------------------------------------------------------ case spec
// topk_length / extra_topk_length.
enum class LengthMode {
  kOff,    // null pointer: every entry counts
  kMixed,  // request r: {random in [0, topk], 0, topk, 1}[r % 4]; batch 1: random in [1, topk]
  kZero,   // every request 0
  kFull,   // every request topk (the array is read, the answer is the null pointer's)
};
enum class SinkMode {
  kNone,
  kFinite,  // per head, near the typical lse (log of the key count) +- 3, so it matters
  kNegInf,  // changes nothing
  kPosInf,  // out 0, lse unchanged
  kMixed,   // head h: {finite, -inf, +inf, 1e30}[h % 4]
};
// Invalid entries among the counted ones (< length). Every kind is drawn: -1, INT_MIN, other
// negatives, exactly num_blocks * page_size, INT_MAX, far past the end, and (with an extra cache)
// values inside the other cache's range but outside this one's.
enum class InvalidMode {
  kNone,
  kSome,            // 5 %
  kThirtyPercent,   // 30 %
  kRowsAllInvalid,  // every third (b, s) query has no valid key in either list; the others 5 %
  kAll,             // no query has a valid key
};
inline const char* length_mode_name(LengthMode m) {
  switch (m) {
    case LengthMode::kOff:
      return "off";
    case LengthMode::kMixed:
      return "mixed";
    case LengthMode::kZero:
      return "zero";
    case LengthMode::kFull:
      return "full";
  }
  return "?";
}

inline const char* sink_mode_name(SinkMode m) {
  switch (m) {
    case SinkMode::kNone:
      return "none";
    case SinkMode::kFinite:
      return "finite";
    case SinkMode::kNegInf:
      return "neginf";
    case SinkMode::kPosInf:
      return "posinf";
    case SinkMode::kMixed:
      return "mixed";
  }
  return "?";
}

inline const char* invalid_mode_name(InvalidMode m) {
  switch (m) {
    case InvalidMode::kNone:
      return "none";
    case InvalidMode::kSome:
      return "some";
    case InvalidMode::kThirtyPercent:
      return "30pct";
    case InvalidMode::kRowsAllInvalid:
      return "rows";
    case InvalidMode::kAll:
      return "all";
  }
  return "?";
}

struct SparseCase {
  std::string name;  // unique, readable, used for the seeds and in messages
  hmla::SparseCacheLayout layout = hmla::SparseCacheLayout::kV32;
  int batch = 1;
  int s_q = 1;
  int h_q = 64;
  int topk = 128;
  int page_size = 64;
  int num_blocks = 0;  // 0: about 1.5 x topk attendable slots plus a spare page (never attended)
  bool extra = false;  // second cache and index list
  int extra_page_size = 64;
  int extra_num_blocks = 0;  // 0: as num_blocks, for extra_topk
  int extra_topk = 64;
  LengthMode topk_length = LengthMode::kOff;
  LengthMode extra_topk_length = LengthMode::kOff;
  SinkMode sink = SinkMode::kNone;
  InvalidMode invalid = InvalidMode::kNone;
  bool duplicates = false;  // 10 % of the counted valid entries repeat an earlier one of the list
  // Padding between heads/tokens/batches of q, out, lse and the index lists, and cache pages
  // further apart than the layout's page bytes (every padding byte NaN or a NaN-slot index).
  bool strided = false;
  float softmax_scale = 0.f;   // 0: 1/sqrt(d_qk)
  float q_amplitude = 0.25f;   // q ~ q_amplitude x N(0, 1)-like
  float kv_amplitude = 0.1f;   // cache tokens ~ kv_amplitude x N(0, 1)-like x the per-token and per-tile factors
  int num_sms = 0;             // the SM count the plan schedules for (0: the device's)
  size_t workspace_slack = 0;  // bytes given beyond sparse_decode_workspace_bytes
  // Reference cost budget in multiply-adds (see SuiteConfig): 0 the suite default (grid cases:
  // HMLA_TEST_REF_BUDGET, others HMLA_TEST_SPECIAL_REF_BUDGET), < 0 unlimited.
  double ref_budget = 0;
  bool grid_case = false;
};

std::string describe_case(const SparseCase& c);

// ------------------------------------------------------------------------------ problem
// Where plant_nan puts a NaN inside a token's data.
enum class NanSpot { kNopeCode, kScale, kRope };

class SparseProblem {
 public:
  explicit SparseProblem(SparseCase c);
  ~SparseProblem();
  SparseProblem(const SparseProblem&) = delete;
  SparseProblem& operator=(const SparseProblem&) = delete;

  const SparseCase& spec() const { return c_; }
  hmla::SparseDecodeParams device_params() const;
  size_t workspace_bytes() const;  // sparse_decode_workspace_bytes + the case's slack

  void poison_outputs();
  // Poison, fresh 0xff workspace, plan, run, synchronise; false (after a failure) if anything
  // failed.
  // after_run (optional): enqueued right after each run, before the synchronisation.
  bool plan_and_run(cudaStream_t stream, const std::function<void(cudaStream_t)>& after_run = {});
  // The same `calls` times on the stream with no host synchronisation until the last: outputs
  // poisoned and workspace set to 0xff on the stream, a fresh plan, the run. The plan, the attention kernel and the combine of
  // one call overlap by programmatic dependent launch, and the combine reads the plan's split list
  // before its own wait: a combine that read it before the plan completed would see -1 (no split
  // request), merge nothing and leave poisoned rows behind.
  bool plan_and_run_repeatedly(cudaStream_t stream, int calls,
                               const std::function<void(cudaStream_t)>& after_run = {});
  Outputs download() const;
  // The whole out and lse allocations (what download() copies) and the workspace of the last plan.
  const DeviceBuffer& out_buffer() const { return dev_out_; }
  const DeviceBuffer& lse_buffer() const { return dev_lse_; }
  void* device_workspace() const { return dev_ws_.get(); }

  // Structural checks on every query row (every element written, no NaN/inf except where a planted
  // NaN is attended, padding untouched, lonely queries exactly 0 / +inf, |out| <= max|V|, lse
  // consistent with the key count) and the comparison with the reference on all rows or a
  // deterministic sample within the case's budget. Adds gtest failures labelled with `what`.
  bool check(const Outputs& got, const std::string& what, CheckStats* stats = nullptr);

  // Valid keys of query (b, s): counted, in range, duplicates counted twice, both lists.
  int keys_of(int b, int s) const { return n_keys_[static_cast<size_t>(b) * c_.s_q + s]; }
  // A slot of the main (extra = false) or extra cache that query (b, s) attends and no other query
  // does; false if there is none.
  bool find_exclusive_slot(int b, int s, bool extra, int64_t* slot) const;
  // Writes a NaN into one byte/element of an attended slot's data (host and device); the queries
  // that attend it are then expected to give NaN, every other one to be unaffected.
  void plant_nan(bool extra, int64_t slot, NanSpot spot);
  // Queries expected to be NaN (attending a planted NaN).
  bool expects_nan(int b, int s) const { return nan_query_[static_cast<size_t>(b) * c_.s_q + s]; }

 private:
  struct Cache;
  struct IndexList;
  void build_lists();
  void build_caches();
  void build_sink();
  void refresh_nan_queries();
  void compute_reference();
  double budget() const;
  hmla::SparseDecodeParams host_params() const;

  SparseCase c_;
  int d_qk_ = 576;
  std::unique_ptr<Cache> main_, extra_;
  std::unique_ptr<IndexList> main_list_, extra_list_;
  std::vector<int> n_keys_;         // [b][s]
  std::vector<uint8_t> nan_query_;  // [b][s]
  std::vector<float> sink_;         // [h_q] or empty
  Strided q_layout_, out_layout_, lse_layout_;
  std::vector<uint16_t> q_host_;
  std::vector<float> q_row_norm_;  // [b][s][h]
  Outputs poison_image_;
  DeviceBuffer dev_q_, dev_out_, dev_lse_, dev_sink_, dev_ws_;

  bool ref_valid_ = false;
  bool ref_sampled_ = false;
  double ref_macs_ = 0, ref_seconds_ = 0;
  std::vector<int32_t> ref_slot_;  // [(b * s_q + s) * h_q + h] -> slot or -1
  std::vector<float> ref_out_;     // [slot][512]
  std::vector<float> ref_lse_;     // [slot]
};

// Accumulated over the run and printed at the end (worst errors, reference time) per layout.
void record_sparse_stats(const SparseCase& c, const CheckStats& s);
void print_sparse_summary();

// Build, run, check, record.
void run_and_check_sparse_case(const SparseCase& c);

}  // namespace hmla_test
