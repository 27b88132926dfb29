// Token-sparse FP8 MLA decode (hmla::sparse_decode_plan / sparse_decode_run) against the float64
// CPU reference hmla::reference::sparse_decode, on the H200.
//
// ================================================================================ what runs
// Suites (gtest --gtest_filter patterns in brackets; all of them: [Sparse*]):
//  * SparsePairwise/SparseDecodeGrid [*SparseDecodeGrid*]: a pairwise covering list (every value of
//      every axis, every pair of values of two axes in at least one case; sparse_decode_cases.h):
//      layout {V32, MODEL1} x h_q {1, 8, 16, 32, 64, 100, 128} x s_q {1, 2, 4} x
//      topk {1, 63, 128, 2048, 5000} x batch {1, 3, 128} x extra cache {off, page 2, 64, 128} x
//      topk_length {off, mixed 0/1/topk/random, full} x sink {none, finite, -inf, +inf, mixed} x
//      main page {64, 256, 53} x invalid {none, 5 %, 30 %, every third query all invalid} x
//      duplicates x padded strides x softmax_scale {0, 0.03} x num_sms {device, 1, 3, 8} x
//      workspace {exact, 1 MB larger}, and with an extra cache extra_topk {1, 64, 200} x
//      extra_topk_length {off, mixed, zero}: 45 cases.
//  * SparseEdgeCases/SparseDecodeEdge [*SparseDecodeEdge*]: topk 32768 at b 1 (split-K over the
//      device and over 3 SMs), all-invalid cases with every sink kind, every length 0, only the
//      main or only the extra list with keys, invalid entries of every kind at 30 % (the other
//      cache's range included, both ways), duplicates (also a 3-page cache read 5000 times), pages
//      1, 53, 64, 256, 576, padded strides with odd pages, lengths 0/1/topk/random, topk 1,
//      softmax scales default / 0.02 / 0.05 (V3.2) and 2.5 (V4, sharp), plans for 1, 3 and 8 SMs,
//      a 64 MB larger workspace, the DeepSeek V3.2 / V4 shapes at batch 128.
//  * SparseSanitizerSubset/SparseDecodeSanitizer [*SparseDecodeSanitizer*]: 14 small cases (split-K
//      on 1 and 3 SMs, extra caches of pages 2 and 64, all-invalid and all-invalid rows,
//      out-of-range indices, mixed lengths with duplicates, strides with page 53, topk 1, h_q 128
//      with mixed lengths and an extra cache on 3 SMs, h_q 128 with a single tile), every row
//      compared.
//  * SparseDecodeDeterminism: two runs (fresh plan, 0xff workspace each) give bitwise identical
//      out and lse: split-K at topk 32768, 3 SMs with an extra cache, batch 128.
//  * SparseDecodeNaN: a NaN in one byte of an attended token (an e4m3 code, a scale, a RoPE value;
//      main and extra cache; both layouts) makes exactly the query that attends it NaN (every head,
//      every element, and its lse); every other query still matches the reference. (NaN bytes in
//      every unattended slot are part of every case.)
//  * SparseDecodeApi: too small / null workspace -> hmla::InvalidArgument; CUDA-graph capture of
//      plan + run replays bitwise equal to the eager run.
//
// ================================================================================ each case
// Cache: every byte 0xff first (NaN in e4m3 codes, float32 scales, UE8M0 scales and bf16 RoPE
// values), then each slot that a counted valid index names gets a random bf16 token (0.1 x N(0,1)-
// like x a per-token factor in [0.5, 2.5] x per-tile factors 1/8..4, never zero) quantised with
// hmla::reference::pack_token. One slot in eight and the last page are never named by a counted
// index: the entries past a length and the padding of the index lists name them (or hold invalid
// values), so a kernel reading one of those gets NaN. Invalid entries: -1, INT_MIN, other
// negatives, num_blocks * page_size, INT_MAX, far out of range and the other cache's range. q: bf16
// 0.25 x N(0,1)-like; padding NaN. Before every run: out and lse poisoned with NaN, padding and
// 128-byte guards hold a finite sentinel, the workspace is 0xff.
// Checked on EVERY row: every element written, no NaN/inf (except queries attending a planted NaN,
// which must be all NaN), padding and guards unchanged, queries without keys out exactly 0 and lse
// exactly +inf, |out| <= max|V|, lse within log(n_keys) +- scale*|q|*max|k|. Against the reference:
// every row when that costs at most the case's budget (HMLA_TEST_REF_BUDGET, default 3e8
// multiply-adds, for the pairwise list; HMLA_TEST_SPECIAL_REF_BUDGET, 2e9, for the others), else a
// deterministic sample of (query, 4-head) units within it, the reference run on a params struct
// restricted to each unit. HMLA_TEST_FULL=1 compares every row.
//
// ================================================================================ tolerances
// (why: sparse_decode_harness.h, kSparseTolerance)
//   out: ||out - ref||_2 / ||ref||_2 <= 8e-3 per (b, s) group of the compared heads;
//        |out - ref| <= |ref|/64 + 2e-2 * max|ref row| + 1e-7 per element
//   lse: |lse - ref| <= 1e-3 * max(1, |ref|); +inf exactly where the query has no valid key.
//
// ================================================================================ how to run
//   ./build/tests/hmla_gpu_tests --gtest_filter='Sparse*'
//   HMLA_TEST_VERBOSE=1 ... (error statistics per case), HMLA_TEST_THREADS, HMLA_TEST_FULL=1
// Sanitizers (each must report 0 errors; one command per line):
//   compute-sanitizer --tool memcheck --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*SparseDecodeSanitizer*'
//   compute-sanitizer --tool racecheck --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*SparseDecodeSanitizer*'
//   compute-sanitizer --tool initcheck --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*SparseDecodeSanitizer*'
//   compute-sanitizer --tool synccheck --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*SparseDecodeSanitizer*'
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "harness_common.h"
#include "hmla/sparse_decode.h"
#include "hmla/types.h"
#include "sparse_decode_cases.h"
#include "sparse_decode_harness.h"

namespace hmla_test {

// gtest prints a failing parameter with this instead of a byte dump.
void PrintTo(const SparseCase& c, std::ostream* os) { *os << describe_case(c); }

namespace {

class SparseSummaryEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { print_sparse_summary(); }
};
[[maybe_unused]] ::testing::Environment* const g_sparse_summary_env =
    ::testing::AddGlobalTestEnvironment(new SparseSummaryEnvironment);

// ------------------------------------------------------------------------------ case lists
class SparseDecodeGrid : public ::testing::TestWithParam<SparseCase> {};
TEST_P(SparseDecodeGrid, MatchesReference) { run_and_check_sparse_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(SparsePairwise, SparseDecodeGrid,
                         ::testing::ValuesIn(sparse_pairwise_cases()), case_param_name<SparseCase>);

class SparseDecodeEdge : public ::testing::TestWithParam<SparseCase> {};
TEST_P(SparseDecodeEdge, MatchesReference) { run_and_check_sparse_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(SparseEdgeCases, SparseDecodeEdge,
                         ::testing::ValuesIn(sparse_edge_cases()), case_param_name<SparseCase>);

class SparseDecodeSanitizer : public ::testing::TestWithParam<SparseCase> {};
TEST_P(SparseDecodeSanitizer, MatchesReference) { run_and_check_sparse_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(SparseSanitizerSubset, SparseDecodeSanitizer,
                         ::testing::ValuesIn(sparse_sanitizer_cases()),
                         case_param_name<SparseCase>);

// ------------------------------------------------------------------------------ determinism
// Runs the case and checks it, then runs it `calls` more times in one stream (plan_and_run_repeatedly:
// a fresh plan before each, no host synchronisation between them) and expects the last output to be
// bitwise the first's.
void expect_reruns_identical(const SparseCase& c, int calls) {
  SCOPED_TRACE(c.name);
  SparseProblem p(c);
  Stream s;
  ASSERT_TRUE(p.plan_and_run(s.get())) << "run 1";
  const Outputs first = p.download();
  p.check(first, "determinism run 1");
  ASSERT_TRUE(p.plan_and_run_repeatedly(s.get(), calls)) << calls << " more runs";
  std::string where;
  EXPECT_TRUE(outputs_bitwise_equal(first, p.download(), &where))
      << c.name << ": the last of " << calls << " more runs differs from run 1 at " << where;
}

TEST(SparseDecodeDeterminism, SplitKOneQueryTopk32768) {
  expect_reruns_identical(sparse_case("Det_V32_b1_sq1_hq128_topk32768",
                                      hmla::SparseCacheLayout::kV32, 1, 1, 128, 32768), 1);
}
TEST(SparseDecodeDeterminism, ThreeSMsExtraCacheSink) {
  SparseCase c = with_extra(sparse_case("Det_MODEL1_b3_sq2_hq64_topk5000_sms3_extra",
                                        hmla::SparseCacheLayout::kModel1, 3, 2, 64, 5000),
                            2, 300, LengthMode::kMixed);
  c.num_sms = 3;
  c.sink = SinkMode::kFinite;
  c.topk_length = LengthMode::kMixed;
  expect_reruns_identical(c, 1);
}
TEST(SparseDecodeDeterminism, Batch128Invalid30Percent) {
  SparseCase c = sparse_case("Det_V32_b128_sq2_hq16_topk2048_invalid30",
                             hmla::SparseCacheLayout::kV32, 128, 2, 16, 2048);
  c.invalid = InvalidMode::kThirtyPercent;
  c.duplicates = true;
  expect_reruns_identical(c, 1);
}

// 16 calls in one stream, each planned afresh: a combine that read the plan's split list before
// that plan completed would merge nothing and leave poisoned rows. Split requests in both, one with
// the narrow form's 16 heads.
TEST(SparseDecodeDeterminism, FreshPlanEveryCallSplitK) {
  expect_reruns_identical(
      sparse_case("Replan_V32_b2_sq1_hq128_topk8192", hmla::SparseCacheLayout::kV32, 2, 1, 128, 8192), 16);
}
TEST(SparseDecodeDeterminism, FreshPlanEveryCallNarrowExtraCache) {
  SparseCase c = with_extra(sparse_case("Replan_MODEL1_b3_sq2_hq16_topk5000_extra",
                                        hmla::SparseCacheLayout::kModel1, 3, 2, 16, 5000),
                            64, 300, LengthMode::kMixed);
  c.sink = SinkMode::kFinite;
  expect_reruns_identical(c, 16);
}

// ------------------------------------------------------------------------------ NaN semantics
const char* nan_spot_name(NanSpot spot) {
  switch (spot) {
    case NanSpot::kNopeCode:
      return "e4m3 code";
    case NanSpot::kScale:
      return "scale";
    case NanSpot::kRope:
      return "RoPE value";
  }
  return "?";
}

void expect_planted_nan_reaches_exactly_its_query(hmla::SparseCacheLayout layout, NanSpot spot,
                                                  int num_sms) {
  const std::string name =
      std::string("NaN_") + (layout == hmla::SparseCacheLayout::kV32 ? "V32" : "MODEL1") + "_spot" +
      std::to_string(static_cast<int>(spot)) + "_sms" + std::to_string(num_sms);
  SCOPED_TRACE(name + ": NaN in a " + nan_spot_name(spot));
  // A large cache, so that most attended slots belong to one query only.
  SparseCase c = with_extra(sparse_case(name, layout, 3, 2, 16, 256), 2, 32);
  c.num_blocks = 64;          // 4096 slots
  c.extra_num_blocks = 1024;  // 2048 slots
  c.num_sms = num_sms;
  SparseProblem p(c);
  int64_t main_slot = -1, extra_slot = -1;
  ASSERT_TRUE(p.find_exclusive_slot(1, 1, false, &main_slot)) << "no slot only query (1,1) reads";
  ASSERT_TRUE(p.find_exclusive_slot(2, 0, true, &extra_slot)) << "no extra slot only (2,0) reads";
  p.plant_nan(false, main_slot, spot);
  p.plant_nan(true, extra_slot, spot);
  int expected = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int s = 0; s < c.s_q; ++s) expected += p.expects_nan(b, s);
  ASSERT_EQ(expected, 2) << "the planted slots were meant to be read by one query each";
  ASSERT_TRUE(p.expects_nan(1, 1) && p.expects_nan(2, 0));
  Stream stream;
  ASSERT_TRUE(p.plan_and_run(stream.get()));
  p.check(p.download(), "planted NaN");  // NaN queries all NaN, the others as the reference
}

TEST(SparseDecodeNaN, NanInAttendedTokenReachesOnlyItsQuery) {
  for (hmla::SparseCacheLayout layout :
       {hmla::SparseCacheLayout::kV32, hmla::SparseCacheLayout::kModel1}) {
    for (NanSpot spot : {NanSpot::kNopeCode, NanSpot::kScale, NanSpot::kRope}) {
      expect_planted_nan_reaches_exactly_its_query(layout, spot, 0);
    }
  }
}

TEST(SparseDecodeNaN, NanInAttendedTokenReachesOnlyItsQuerySplitK) {
  // One SM: every query's list is cut into pieces and merged, and the NaN must survive the merge.
  expect_planted_nan_reaches_exactly_its_query(hmla::SparseCacheLayout::kV32, NanSpot::kNopeCode,
                                               1);
  expect_planted_nan_reaches_exactly_its_query(hmla::SparseCacheLayout::kModel1, NanSpot::kScale,
                                               1);
}

// ------------------------------------------------------------------------------ API behaviour
TEST(SparseDecodeApi, TooSmallOrMissingWorkspaceThrowsInvalidArgument) {
  SparseProblem p(
      sparse_case("Api_sparse_small_workspace", hmla::SparseCacheLayout::kV32, 4, 2, 64, 256));
  Stream s;
  const size_t bytes = p.workspace_bytes();
  ASSERT_GT(bytes, 0u);
  DeviceBuffer ws(bytes);
  const hmla::SparseDecodeParams params = p.device_params();
  EXPECT_THROW(hmla::sparse_decode_plan(params, ws.get(), bytes - 1, s.get()),
               hmla::InvalidArgument);
  EXPECT_THROW(hmla::sparse_decode_plan(params, ws.get(), 0, s.get()), hmla::InvalidArgument);
  EXPECT_THROW(hmla::sparse_decode_plan(params, nullptr, bytes, s.get()), hmla::InvalidArgument);
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a rejected call left a CUDA error behind";
  ASSERT_TRUE(p.plan_and_run(s.get()));
  p.check(p.download(), "after rejected calls");
}

TEST(SparseDecodeApi, CudaGraphCaptureOfPlanAndRunReplays) {
  SparseCase c =
      with_extra(sparse_case("Api_sparse_graph", hmla::SparseCacheLayout::kModel1, 5, 2, 64, 2048),
                 64, 128, LengthMode::kMixed);
  c.topk_length = LengthMode::kMixed;
  c.sink = SinkMode::kFinite;
  SparseProblem p(c);
  Stream s(cudaStreamNonBlocking);
  ASSERT_TRUE(p.plan_and_run(s.get()));  // eager, as a serving engine warms up before capturing
  const Outputs eager = p.download();
  p.check(eager, "eager run before capture");

  const size_t bytes = p.workspace_bytes();
  DeviceBuffer ws(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(ws.get(), 0xff, bytes));
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  const hmla::SparseDecodeParams params = p.device_params();
  p.poison_outputs();
  cudaGraph_t graph = nullptr;
  HMLA_TEST_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  std::string capture_error;
  try {
    const hmla::DecodeSchedule sched = hmla::sparse_decode_plan(params, ws.get(), bytes, s.get());
    hmla::sparse_decode_run(params, sched, s.get());
  } catch (const std::exception& e) {
    capture_error = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(s.get(), &graph);
  ASSERT_TRUE(capture_error.empty()) << "plan/run threw during capture: " << capture_error;
  ASSERT_EQ(end, cudaSuccess) << "capture failed: " << cudaGetErrorString(end);
  ASSERT_NE(graph, nullptr);
  cudaGraphExec_t exec = nullptr;
  HMLA_TEST_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    p.poison_outputs();
    HMLA_TEST_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
    HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    HMLA_TEST_CUDA_CHECK(cudaGetLastError());
    std::string where;
    EXPECT_TRUE(outputs_bitwise_equal(eager, p.download(), &where))
        << "graph replay " << replay + 1 << " differs from the eager run at " << where;
  }
  HMLA_TEST_CUDA_CHECK(cudaGraphExecDestroy(exec));
  HMLA_TEST_CUDA_CHECK(cudaGraphDestroy(graph));
}

}  // namespace
}  // namespace hmla_test
