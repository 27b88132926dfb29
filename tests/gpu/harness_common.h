// What the decode test harnesses (dense_decode_harness, sparse_decode_harness) share: tensor
// layouts with padding and guards, the output poison and sentinels, random inputs, the comparison
// of an output row with the reference under a stated tolerance, the collection of failures into one
// readable message, the guarded plan + run, the row sampler that bounds the reference's cost, the
// accuracy summary and the gtest names of parameterised cases. Host code only.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "hmla/types.h"

namespace hmla_test {

constexpr int kDv = 512;  // value width of every MLA contract

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// gtest names of value-parameterised cases: the case's own (unique, readable) name.
template <class Case>
std::string case_param_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name;
}

// ------------------------------------------------------------------------------ tolerances
// out (compared with the reference's unrounded float output):
//   over a group of rows  ||out - ref||_2 / ||ref||_2  <= out_rel_l2
//   per element           |out - ref| <= out_elem_rel * |ref| + out_elem_row_rel * max|ref row| +
//   1e-7
//                         (the row is the 512 values of one (request, token, head))
// lse: |lse - ref| <= lse_rel * max(1, |ref|).
// Each harness states its values and why next to its constants.
struct Tolerance {
  double out_rel_l2;
  double out_elem_rel;
  double out_elem_row_rel;
  double lse_rel;
};

// ------------------------------------------------------------------------------ tensor layouts
// How a 4-D [batch, tokens, heads, dim] (or 3-D lse) tensor is laid out in its allocation.
enum class Layout {
  kDense,       // [b][s][h][d]
  kPadded,      // [b][s][h][d] with gaps (multiples of 8 elements) between heads/tokens/batches
  kHeadMajor,   // [h][b][s][d + 8]: head stride largest, batch stride smaller than head stride
  kTokenMajor,  // [s][b][h][d]: token stride largest
};
const char* layout_name(Layout l);

struct Strided {
  int64_t dims[4] = {1, 1, 1, 1};  // logical extents, last one contiguous
  int64_t strides[4] = {0, 0, 0, 1};
  int64_t guard = 0;  // elements before the logical origin
  int64_t total = 0;  // elements in the allocation
  int rank = 4;
  int64_t offset(int64_t i0, int64_t i1, int64_t i2) const {
    return guard + i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
  }
  int64_t logical_count() const { return dims[0] * dims[1] * dims[2] * dims[3]; }
};

// [b][s][h][d], d contiguous, 64 guard elements (128 bytes) on each side; `seed` draws the gaps of
// kPadded.
Strided make_layout4(Layout layout, int64_t b, int64_t s, int64_t h, int64_t d, uint64_t seed);
// lse [b][h][s], s contiguous, 32 guard floats on each side; padded: gaps between heads and
// batches.
Strided make_layout_lse(bool padded, int64_t b, int64_t h, int64_t s);

// Fills the rows of a [b][s][h][d] 16-bit tensor with amplitude * normalish(value_seed, row * d +
// i) (row = (b * s + s) * h + h, independent of the layout) and every other element of the
// allocation with the input NaN; row_norm gets the L2 norm of every row as stored.
void fill_half_rows(const Strided& layout, hmla::DType dtype, float amplitude, uint64_t value_seed,
                    std::vector<uint16_t>* host, std::vector<float>* row_norm);

// ------------------------------------------------------------------------------ outputs
struct Outputs {
  std::vector<uint16_t> out;  // the whole out allocation (guards and padding included)
  std::vector<float> lse;     // the whole lse allocation
};
// Bitwise comparison of two downloads (every element of the allocations).
bool outputs_bitwise_equal(const Outputs& a, const Outputs& b, std::string* where);

// What is uploaded before every run: the finite sentinel everywhere in the allocations and the NaN
// poison on every logical element, so that unwritten elements and stray writes both show.
Outputs make_poison_images(const Strided& out_layout, const Strided& lse_layout, uint16_t poison);

// ------------------------------------------------------------------------------ findings
// Failures found while checking, grouped by kind with a few examples each; merged across threads.
struct Findings {
  std::map<std::string, int64_t> counts;
  std::map<std::string, std::vector<std::string>> examples;
  void add(const std::string& what, const std::string& example);
  void merge(const Findings& o);
  bool empty() const { return counts.empty(); }
  // "<header>\n  - <kind>: <n> occurrence(s), e.g.\n      <example>\n ... <footer>"
  std::string report(const std::string& header, const std::string& footer) const;
};

// Padding and guards of out and lse must still hold the sentinel.
void check_padding_unchanged(const Outputs& got, const Strided& out_layout,
                             const Strided& lse_layout, Findings& f);

// Structural checks of one out row (d elements at `row`) of a query that attends n_keys keys:
// every element written (not the poison), no NaN/inf, all exactly 0 without keys, |v| <= hull with.
void check_out_row(hmla::DType dt, const uint16_t* row, int d, uint16_t poison, int n_keys,
                   double hull, const std::string& pos, Findings& f);
// lse of such a query: written, +inf without keys, finite with, and within log(n_keys) +-
// max_abs_score (a bound of every |score|; catches dropped or doubled keys).
void check_lse_value(float l, int n_keys, double max_abs_score, const std::string& pos,
                     Findings& f);

// One out row against the reference's float row, under tol's elementwise bound.
struct RowComparison {
  double diff2 = 0, ref2 = 0;  // sums of squares over the row (diff2 infinite if out is not)
  double worst_ratio = 0;      // max |out - ref| / bound
  int worst_d = 0;
  int64_t bad = 0;  // elements over the bound
  float ref_row_max = 0;
};
RowComparison compare_out_row(hmla::DType dt, const uint16_t* got, const float* ref, int d,
                              const Tolerance& tol);
// Adds "out elements outside the elementwise bound" for a row with bad elements.
void report_out_row(hmla::DType dt, const uint16_t* got, const float* ref, int d,
                    const RowComparison& rc, const std::string& pos, Findings& f);
// |lse - ref| / (lse_rel * max(1, |ref|)); adds "lse outside tolerance" above 1. Returns the ratio.
double compare_lse(float got, float ref, double lse_rel, const std::string& pos, Findings& f);
// sqrt(diff2 / ref2); a group whose reference is all zero must be exactly zero.
inline double relative_l2(double diff2, double ref2) {
  return ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0);
}

// ------------------------------------------------------------------------------ running
// Fills the workspace with 0xff (NaN / -1: nothing may rely on its contents), calls plan_and_run
// (which enqueues on `stream`), synchronises and checks that nothing threw and CUDA reported no
// error; a broken context stops the binary. Adds a failure naming `label` and returns false if not.
bool run_guarded(const std::string& label, DeviceBuffer& workspace, size_t workspace_bytes,
                 cudaStream_t stream, const std::function<void()>& plan_and_run);

// ------------------------------------------------------------------------------ sampling
// Chooses which reference units (rows or row blocks) a check compares when comparing all of them
// would cost more than `budget` (multiply-adds): the `priority` units in order while they fit (the
// first always), then the others in an order shuffled by `rng`, each while it still fits. Returns
// the chosen ids in the order taken; *taken_cost gets their total cost.
std::vector<int64_t> sample_units(int64_t num_units, const std::function<double(int64_t)>& cost,
                                  const std::vector<int64_t>& priority, double budget, Rng& rng,
                                  double* taken_cost);

// ------------------------------------------------------------------------------ statistics
// Statistics of one check, for messages and the end-of-run summary.
struct CheckStats {
  int64_t rows_total = 0, rows_compared = 0;
  double ref_macs = 0, ref_seconds = 0;
  double rel_l2 = 0;      // over the compared rows (the sparse harness: worst (b, s) group)
  double worst_elem = 0;  // max |out - ref| / bound
  double worst_lse = 0;   // max |lse - ref| / (lse_rel * max(1, |ref|))
  bool sampled = false;
};

// Worst error ratios and reference time per group (a dtype, a cache layout), printed at the end.
class AccuracySummary {
 public:
  void record(const std::string& group, const std::string& case_name, const CheckStats& s);
  void print(const char* title, const std::function<const Tolerance&(const std::string&)>& tol);

 private:
  struct Worst {
    double value = 0;
    std::string where;
    void update(double v, const std::string& w);
  };
  struct Group {
    int64_t cases = 0, sampled_cases = 0, rows_total = 0, rows_compared = 0;
    double ref_macs = 0, ref_seconds = 0;
    Worst rel_l2, elem, lse;
  };
  std::mutex mutex_;
  std::map<std::string, Group> groups_;
};

}  // namespace hmla_test
