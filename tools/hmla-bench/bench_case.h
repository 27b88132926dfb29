// hmla-bench: what one benchmark family (dense decode, sparse decode, sparse prefill, merge)
// implements for a row of the table, and what every family shares: the timed loop over rotated input
// sets, the metrics, the random index lists, and the --check bookkeeping (which requests are
// checked, how outputs compare, when a row passes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "anchors.h"
#include "bench_json.h"
#include "cases.h"
#include "common.h"
#include "hmla/types.h"
#include "timing.h"

namespace hmla_bench {

// Pass thresholds of --check (stated in the output and the JSON).
constexpr double kCheckOutRelL2 = 1e-2;  // ||out - ref||_2 / ||ref||_2 over the checked requests
constexpr double kCheckLseAbs = 1e-3;    // max |lse - ref_lse| (natural log)
// Sparse prefill's out against its bf16 kv: no FP8 quantisation error to allow for, so a tighter bound.
constexpr double kCheckSparsePrefillOutRelL2 = 4e-3;

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
};

struct CheckOutcome {
  bool checked = false;
  std::vector<int> request_ids;  // batch entries (prefill: query tokens) compared with the reference
  double out_rel_l2 = 0, out_max_abs = 0, lse_max_abs = 0;
  double lse_rel_l2 = 0;  // ||lse - ref||_2 / ||ref||_2 over the finite reference values
  double out_rel_l2_limit = kCheckOutRelL2;  // the row's family's bound (BenchCase::check_out_rel_l2_limit)
  unsigned long long nonfinite_out = 0;  // over the whole batch's out after the poisoned run
  unsigned long long bad_lse = 0;        // NaN anywhere, or inf where the query has keys (or vice versa)
  bool pass = true;
  double seconds = 0;
  std::string note;
};

// What the shared driver measured for a row.
struct RowResult {
  int input_sets = 1;
  double bytes_per_set = 0;  // device bytes one call touches
  TimeStats time;            // microseconds, of the family's steady-state call
  double flops = 0, bytes = 0, tflops = 0, gbps = 0;
  double sm_mhz = 0;  // SM clock right after the timed calls (SmClockProbe)
  CheckOutcome check;
};

// One row of one family. The driver calls setup, then run(set) for every warm-up and timed call
// (set = call number modulo input_sets()), then time_extras, then check when asked; release frees
// the device and host buffers while the row's figures stay for the table and the JSON.
class BenchCase {
 public:
  virtual ~BenchCase() = default;

  virtual const char* kind() const = 0;           // the JSON "kind" and the --only name
  virtual std::string describe() const = 0;       // one line for progress messages
  virtual const AnchorRow* find_anchor(const Anchors& anchors) const = 0;

  // Allocates and fills every input set and plans each. Throws hmla::InvalidArgument for shapes the
  // library rejects, BenchError / hmla::CudaError for CUDA failures.
  virtual void setup(const RowOptions& opt, cudaStream_t stream) = 0;
  virtual int input_sets() const = 0;
  virtual double bytes_per_set() const = 0;
  virtual size_t workspace_bytes() const = 0;
  virtual void run(int set, cudaStream_t stream) = 0;
  // FlashMLA's formulas for this family; valid after setup.
  virtual double flops() const = 0;
  virtual double bytes() const = 0;
  // Timings beyond the steady-state call (the sparse plan, which engines run once per step).
  virtual void time_extras(const TimingConfig& cfg, cudaStream_t stream) { (void)cfg; (void)stream; }
  // Runs set 0 once more into NaN-poisoned outputs and fills everything in `out` but checked,
  // pass, note and seconds (judge_check and the driver set those).
  virtual void check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& out) = 0;
  virtual double check_out_rel_l2_limit() const { return kCheckOutRelL2; }
  virtual void release() = 0;

  // The table: the family's columns left of time_us, and its columns after the ceiling fractions
  // (each extra string starts with its own separator; empty: none).
  virtual std::string shape_header() const = 0;
  virtual std::string shape_cells() const = 0;
  virtual std::string extra_header() const { return ""; }
  virtual std::string extra_cells() const { return ""; }

  // JSON: each adds its fields to the row object. The shape fields open the row; the schedule
  // fields follow the metrics; the extras follow workspace_bytes.
  virtual void json_shape(Json& row) const = 0;
  virtual void json_schedule(Json& row) const = 0;
  virtual void json_extras(Json& row) const { (void)row; }
};

TimingConfig timing_config(const RowOptions& opt);

// How many input sets to rotate: enough that a pass over them touches opt.rotate_min_bytes (one
// call touches `touched` bytes), bounded by opt.max_input_sets and by opt.max_rotation_bytes of
// allocations (`alloc_per_set` each: a workspace or an index list can dwarf what a call reads).
int rotation_sets(const RowOptions& opt, double touched, double alloc_per_set);

// setup, the timed calls, time_extras, and the check when opt.check; metrics from the median.
RowResult run_row(BenchCase& row, const RowOptions& opt, cudaStream_t stream);

// fn(0) .. fn(n - 1) on every core; the first exception is rethrown after all have finished.
void parallel_for(int n, const std::function<void(int)>& fn);

// ---- inputs shared by the sparse families

// The topk_length array of `entries` lists (requests or query tokens) for `mode`; all topk for
// kNone (then the array is not passed, but the metrics still count each list in full).
std::vector<int32_t> topk_lengths(TopkLength mode, int entries, int topk, uint64_t seed);

// [lists, topk]: each list topk distinct positions of [0, n) in random order (a partial Fisher-Yates
// shuffle per list, from counter_hash(seed, list), so the result does not depend on the thread
// count), each stored as map(list, position) when map is given.
std::vector<int32_t> random_distinct_lists(int lists, int n, int topk, uint64_t seed,
                                           const std::function<int32_t(int, int32_t)>& map = nullptr);

// attn_sink: one randn float per head.
std::vector<float> random_sink(int h_q, uint64_t seed);

// ---- pieces of --check shared by the families

// Batch entries to check: `requested` (or, when <= 0, up to `automatic`) spread evenly over
// [0, batch), first and last included; in the automatic case fewer while the float64 reference's
// multiply-adds (reference_macs of each entry, summed) would take more than seconds.
std::vector<int> pick_check_requests(int batch, int requested, const std::function<double(int)>& reference_macs,
                                     int automatic = 8);

// Fills out_* from `count` device outputs (bf16/fp16 bits, copied back) against the reference's
// unrounded floats, and lse_max_abs and lse_rel_l2 from `lse_count` values (a matching pair of
// infinities is exact).
void compare_outputs(const uint16_t* out_got, hmla::DType dtype, const float* out_want, size_t count,
                     const float* lse_got, const float* lse_want, size_t lse_count, CheckOutcome& out);

// Sets pass and note from the figures and the thresholds (out against out_rel_l2_limit).
void judge_check(CheckOutcome& out);

// Fills out (bf16/fp16) and lse (float32) with NaN bytes.
void poison_outputs(void* out, size_t out_bytes, float* lse, size_t lse_bytes, cudaStream_t stream);

// Copies through the row's (non-blocking) stream and waits for the copy.
void copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);

// A device buffer of `sets` equal slots, each aligned for any tensor.
struct Slab {
  DeviceBuffer buf;
  size_t set_stride = 0;  // bytes between sets
  void allocate(size_t bytes_per_set, int sets);
  template <typename T = void>
  T* at(int set) const {
    return reinterpret_cast<T*>(buf.get<char>() + set_stride * (size_t)set);
  }
};
constexpr size_t kSlabAlign = 256;

// Throws BenchError naming the row when `need` bytes do not fit the device's free memory.
void require_device_memory(double need, const std::string& row);

}  // namespace hmla_bench
