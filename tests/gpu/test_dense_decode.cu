// Dense MLA decode (hmla::dense_decode_plan / dense_decode_run) against the float64 CPU reference
// hmla::reference::dense_decode, on the H200.
//
// ================================================================================ what runs
// Suites (gtest --gtest_filter patterns in brackets):
//  * FlashMLAGrid/DenseDecodeGrid [*DenseDecodeGrid*]: FlashMLA's own grid, every combination
//      dtype {bf16, fp16} x b {1, 2, 6, 64} x s_k {20, 140, 4096} x varlen {no, yes} x
//      h_q {1, 3, 9, 63, 64, 126, 128} x h_kv {1, 2, 3, 8} (dividing h_q) x s_q {1, 2, 4} x causal
//      = 4608 cases, page 64. Varlen lengths: normal(s_k, s_k/2) clamped at 1 (dense_decode_cases.h).
//      One case in four uses padded q and/or padded out+lse strides (suffix _qpad/_opad).
//      EVERY case runs on the GPU and gets every structural check on every output row (below).
//      The comparison with the reference covers every row of a case when that costs at most
//      HMLA_TEST_REF_BUDGET (default 3e8 multiply-adds, ~b*s_q*s_k*(h_q*1088 + 2000*h_kv); about
//      0.15 s of one core), otherwise a deterministic sample of whole rows within the budget: units
//      of one request x up to 4 consecutive heads of one kv-head group x all s_q tokens: first
//      (while they fit; the first always) the unit with the last head of the last request, the one
//      with the first head of the first request, a middle unit of the longest request and one unit
//      of every kv-head group, then seeded random units while they fit. With the default budget
//      (each line: 384 cases = 2 dtypes x 2 varlen x 16 (h_q, h_kv) x 3 s_q x 2 causal):
//        s_k 20:   b 1, 2, 6: every row; b 64: 248 cases every row, 136 sampled
//        s_k 140:  b 1, 2: every row; b 6: 332 every row, 52 sampled; b 64: 98 / 286
//        s_k 4096: b 1: 184 every row, 200 sampled; b 2: 104 / 280; b 6: 36 / 348; b 64: all sampled
//      i.e. 2922 of the 4608 cases are compared row for row, 1686 on samples.
//      HMLA_TEST_FULL=1 compares every row of every case (~2.3e13 multiply-adds: ~20-40 min on 16 cores).
//  * EdgeCases/DenseDecodeEdge [*DenseDecodeEdge*]: zero-length requests (some and all), causal
//      queries with no key, one 128K request beside 127 short ones (b = 128; h_q 16 compared in
//      full, h_q 128 sampled), 256K, every page size {16, 32, 64, 128, 256} around page
//      boundaries, varlen 0..300 mixed, s_q up to 16 with and without causal, the DeepSeek shape
//      (h_q 128, h_kv 1) at s_k 1..32768, batch 4096, arbitrary q/out/lse/block-table strides
//      (head-major, token-major, padded), explicit softmax scales, fp16 throughout, plans for
//      1..24 SMs (the num_sms argument: requests cut in two pieces, one piece whose causal rows see
//      no key, one part holding every request, an odd part count, two-, three- and many-piece
//      requests in one batch). Budget
//      HMLA_TEST_SPECIAL_REF_BUDGET (default 2e9) unless the case sets its own.
//  * DenseDecodeCacheStrides: padded cache head/token/block strides (skipped if validate()
//      rejects them; never a wrong answer).
//  * DenseDecodeDeterminism: the same inputs three times (fresh plan and 0xff-filled workspace each
//      time): out and lse bitwise identical.
//  * DenseDecodeApi: too small / null workspace -> hmla::InvalidArgument; a larger workspace is
//      accepted; run with a schedule of another shape -> hmla::InvalidArgument; one plan reused for
//      two runs -> identical; runs from a fresh host thread (no current context, then the one
//      the first run left) -> identical to the planning thread's; one plan for three layers (three
//      caches, one seqlens tensor); CUDA-graph capture of plan+run on a non-default stream, replayed with new q and new
//      cache_seqlens.
//  * SanitizerSubset/DenseDecodeSanitizer [*Sanitizer*]: 11 small cases (s_k 20..640, b 1..4,
//      causal + varlen, pages 64 and 16, both dtypes; three planned for 1, 4 and 6 SMs, two of them
//      with parts holding several requests), every row compared.
//
// ================================================================================ each case
// Inputs: bf16/fp16 values 0.1 * N(0,1)-like (never zero), fixed seed per case (q) and per cache.
// Paged cache [num_blocks, page, h_kv, 576]: num_blocks = pages needed + 3 + 1/8 spare, pages from a
// random permutation; every slot no request owns (rows past a request's length in its last page,
// spare pages, stride padding) is NaN. Block-table entries past a request's pages hold 1<<30, -7,
// INT_MAX, -1, INT_MIN, num_blocks, 1<<20, -1000000. q padding/guards are NaN. Before every run: out
// logical elements = NaN poison (0xffa5 bf16 / 0xfda5 fp16), lse = NaN poison, everything else in
// the out/lse allocations (padding, 128-byte guards before and after) = a finite sentinel; the
// workspace is filled with 0xff.
// Structural checks on EVERY row: no poison left (every element written), no NaN/inf, padding and
// guards unchanged, rows without keys: out exactly 0 and lse exactly +inf, |out| <= max|V| (a convex
// combination), lse within log(n_keys) +- scale*|q|*max|k| (catches dropped or doubled keys).
//
// ================================================================================ tolerances
// out vs the reference's unrounded float output:
//   bf16: ||out-ref||_2/||ref||_2 <= 1e-2 per case; |out-ref| <= |ref|/128 + 1e-2*max|ref row| + 1e-7
//   fp16: ||out-ref||_2/||ref||_2 <= 5e-3 per case; |out-ref| <= |ref|/512 + 2.5e-3*max|ref row| + 1e-7
//   (bf16 output rounding is up to 2^-8 relative and P enters the PV product as bf16 (2^-9); fp16
//   is 4x finer on both, hence 4x tighter.)
// lse (float32): |lse-ref| <= 1e-5 * max(1, |ref|), both dtypes; +inf exactly where ref is +inf.
// The end of the run prints the worst error/tolerance ratios seen per dtype and the reference time.
//
// ================================================================================ how to run
//   ./build/tests/hmla_gpu_tests                         # everything (~5 min on the H200 host)
//   ./build/tests/hmla_gpu_tests --gtest_filter='*DenseDecodeEdge*'
//   HMLA_TEST_VERBOSE=1 ...                               # one line of error statistics per case
//   HMLA_TEST_THREADS=16, HMLA_TEST_REF_BUDGET=3e8, HMLA_TEST_SPECIAL_REF_BUDGET=2e9, HMLA_TEST_FULL=1
// Sanitizers (each must print "ERROR SUMMARY: 0 errors" and exit 0; one command per line):
//   compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*Sanitizer*'
//   compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*Sanitizer*'
//   compute-sanitizer --tool initcheck --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*Sanitizer*'
//   compute-sanitizer --tool synccheck --error-exitcode 1 ./build/tests/hmla_gpu_tests --gtest_filter='*Sanitizer*'
// (memcheck and racecheck are the ones the issue requires; initcheck also proves the kernels never
// read workspace/output bytes they did not write first.)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <exception>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "dense_decode_cases.h"
#include "dense_decode_harness.h"
#include "gpu_test_util.h"
#include "hmla/dense_decode.h"
#include "hmla/types.h"

namespace hmla_test {

// gtest prints a failing parameter with this instead of a byte dump.
void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

namespace {

// Prints the accuracy summary and frees the shared cache before the CUDA runtime goes away.
class SummaryEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    print_summary();
    release_cached_caches();
  }
};
[[maybe_unused]] ::testing::Environment* const g_summary_env =
    ::testing::AddGlobalTestEnvironment(new SummaryEnvironment);

// ------------------------------------------------------------------------------ grid
class DenseDecodeGrid : public ::testing::TestWithParam<DecodeCase> {};
TEST_P(DenseDecodeGrid, MatchesReference) { run_and_check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(FlashMLAGrid, DenseDecodeGrid, ::testing::ValuesIn(flashmla_grid()),
                         case_param_name<DecodeCase>);

// ------------------------------------------------------------------------------ edge cases
class DenseDecodeEdge : public ::testing::TestWithParam<DecodeCase> {};
TEST_P(DenseDecodeEdge, MatchesReference) { run_and_check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(EdgeCases, DenseDecodeEdge, ::testing::ValuesIn(edge_cases()),
                         case_param_name<DecodeCase>);

// ------------------------------------------------------------------------------ sanitizer subset
class DenseDecodeSanitizer : public ::testing::TestWithParam<DecodeCase> {};
TEST_P(DenseDecodeSanitizer, MatchesReference) { run_and_check_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(SanitizerSubset, DenseDecodeSanitizer,
                         ::testing::ValuesIn(sanitizer_cases()), case_param_name<DecodeCase>);

// ------------------------------------------------------------------------------ cache strides
TEST(DenseDecodeCacheStrides, PaddedCacheStridesAreHonouredOrRejected) {
  for (int page : {16, 64}) {
    DecodeCase c = make_case("PaddedCache_page" + std::to_string(page), hmla::DType::kBF16, 5, 2,
                             32, 2, {0, 1, page + 1, 1000, 3000}, true, page);
    c.pad_cache = true;  // head stride 640, token stride h_kv*640+8, block stride page*token+128
    DecodeProblem p(c);
    try {
      hmla::validate(p.device_params());
    } catch (const hmla::InvalidArgument& e) {
      GTEST_SKIP() << "validate() rejects padded cache strides (allowed by the contract only if "
                      "docs/API.md says so): "
                   << e.what();
    }
    Stream s;
    ASSERT_TRUE(p.plan_and_run(s.get()));
    p.check(p.download(), "padded cache strides");
  }
}

// ------------------------------------------------------------------------------ determinism
void expect_deterministic(const DecodeCase& c) {
  SCOPED_TRACE(c.name);
  DecodeProblem p(c);
  Stream s;
  Outputs first;
  for (int run = 0; run < 3; ++run) {
    ASSERT_TRUE(p.plan_and_run(s.get())) << "run " << run;
    Outputs o = p.download();
    if (run == 0) {
      p.check(o, "determinism run 1");
      first = std::move(o);
    } else {
      std::string where;
      EXPECT_TRUE(DecodeProblem::bitwise_equal(first, o, &where))
          << c.name << ": run " << run + 1 << " differs from run 1 at " << where;
    }
  }
}

TEST(DenseDecodeDeterminism, OneLongRequestSplitOverAllSMs) {
  expect_deterministic(
      make_case("Det_b1_sk131072_sq1_hq16", hmla::DType::kBF16, 1, 1, 16, 1, {131072}, false));
}
TEST(DenseDecodeDeterminism, TwoLongRequestsCausalDeepSeek) {
  expect_deterministic(make_case("Det_b2_sk16384_sq2_causal_hq128", hmla::DType::kBF16, 2, 2, 128,
                                 1, {16384, 16000}, true));
}
TEST(DenseDecodeDeterminism, Batch64Varlen) {
  expect_deterministic(make_case("Det_b64_varlen4096_sq1_hq16", hmla::DType::kBF16, 64, 1, 16, 1,
                                 grid_lengths(64, 4096, true), false));
}
TEST(DenseDecodeDeterminism, MixedLengthsFp16) {
  expect_deterministic(make_case("Det_b133_mixed_sq1_hq64_hkv2_fp16", hmla::DType::kFP16, 133, 1,
                                 64, 2, uniform_lengths(133, 0, 5000, hash_string("det-mixed"), 10),
                                 false));
}

// ------------------------------------------------------------------------------ API behaviour
DecodeCase api_case(const std::string& name) {
  return make_case(name, hmla::DType::kBF16, 4, 2, 64, 1, {100, 0, 2048, 513}, true);
}

// p's case planned on stream s into ws, a workspace of p's size filled with 0xff first (a byte the
// plan leaves unwritten is garbage, never zero).
hmla::DecodeSchedule plan_into_poisoned_workspace(const DecodeProblem& p, DeviceBuffer& ws, cudaStream_t s) {
  const DecodeCase& c = p.spec();
  const size_t bytes = p.workspace_bytes();
  ws = DeviceBuffer(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(ws.get(), 0xff, bytes));
  return hmla::dense_decode_plan(p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, ws.get(), bytes, s);
}

TEST(DenseDecodeApi, TooSmallOrMissingWorkspaceThrowsInvalidArgument) {
  DecodeProblem p(api_case("Api_small_workspace"));
  const DecodeCase& c = p.spec();
  Stream s;
  const size_t bytes = p.workspace_bytes();
  ASSERT_GT(bytes, 0u);
  DeviceBuffer ws(bytes);
  EXPECT_THROW(hmla::dense_decode_plan(p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, ws.get(),
                                       bytes - 1, s.get()),
               hmla::InvalidArgument);
  EXPECT_THROW(hmla::dense_decode_plan(p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, ws.get(),
                                       0, s.get()),
               hmla::InvalidArgument);
  EXPECT_THROW(hmla::dense_decode_plan(p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, nullptr,
                                       bytes, s.get()),
               hmla::InvalidArgument);
  // A workspace sized for a smaller batch is too small for this one.
  const size_t smaller = hmla::dense_decode_workspace_bytes(1, c.s_q, c.h_q, c.h_kv);
  if (smaller < bytes) {
    EXPECT_THROW(hmla::dense_decode_plan(p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv,
                                         ws.get(), smaller, s.get()),
                 hmla::InvalidArgument);
  }
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a rejected call left a CUDA error behind";
  // Nothing was broken: a correct call still works.
  ASSERT_TRUE(p.plan_and_run(s.get()));
  p.check(p.download(), "after rejected calls");
}

TEST(DenseDecodeApi, LargerWorkspaceIsAccepted) {
  // The workspace is allocated once and reused for every step, so a workspace sized for a larger
  // batch must be accepted for a smaller one.
  DecodeProblem p(api_case("Api_larger_workspace"));
  const DecodeCase& c = p.spec();
  Stream s;
  const size_t bytes = hmla::dense_decode_workspace_bytes(64, c.s_q, c.h_q, c.h_kv) + 4096;
  ASSERT_GE(bytes, p.workspace_bytes());
  DeviceBuffer ws(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(ws.get(), 0xff, bytes));
  p.poison_outputs();
  hmla::DecodeSchedule sched;
  ASSERT_NO_THROW(sched = hmla::dense_decode_plan(p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv,
                                                  ws.get(), bytes, s.get()));
  ASSERT_NO_THROW(hmla::dense_decode_run(p.device_params(), sched, s.get()));
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  p.check(p.download(), "larger workspace");
}

TEST(DenseDecodeApi, RunRejectsScheduleOfAnotherShape) {
  DecodeProblem p(api_case("Api_schedule_mismatch"));
  const DecodeCase& c = p.spec();
  Stream s;
  const size_t bytes = p.workspace_bytes();
  DeviceBuffer ws(bytes);
  const hmla::DecodeSchedule sched = hmla::dense_decode_plan(
      p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, ws.get(), bytes, s.get());
  hmla::DenseDecodeParams params = p.device_params();
  params.batch = c.batch - 1;  // planned for 4 requests
  EXPECT_THROW(hmla::dense_decode_run(params, sched, s.get()), hmla::InvalidArgument) << "batch";
  params = p.device_params();
  params.s_q = 1;  // planned for s_q 2
  EXPECT_THROW(hmla::dense_decode_run(params, sched, s.get()), hmla::InvalidArgument) << "s_q";
  params = p.device_params();
  params.h_q = 32;  // planned for h_q 64
  EXPECT_THROW(hmla::dense_decode_run(params, sched, s.get()), hmla::InvalidArgument) << "h_q";
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(DenseDecodeApi, PlanReusedForTwoRunsGivesIdenticalResults) {
  DecodeProblem p(make_case("Api_plan_reuse", hmla::DType::kBF16, 6, 2, 128, 1,
                            {1, 4096, 0, 777, 20000, 65}, true));
  Stream s;
  DeviceBuffer ws;
  const hmla::DecodeSchedule sched = plan_into_poisoned_workspace(p, ws, s.get());
  Outputs runs[2];
  for (int i = 0; i < 2; ++i) {
    p.poison_outputs();
    ASSERT_NO_THROW(hmla::dense_decode_run(p.device_params(), sched, s.get()));
    HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    HMLA_TEST_CUDA_CHECK(cudaGetLastError());
    runs[i] = p.download();
  }
  p.check(runs[0], "plan reuse, run 1");
  std::string where;
  EXPECT_TRUE(DecodeProblem::bitwise_equal(runs[0], runs[1], &where)) << "run 2 differs: " << where;
}

TEST(DenseDecodeApi, RunFromAFreshHostThread) {
  // The run entry points launch through the driver with the calling thread's current context; a
  // thread that never called CUDA has none, so its first run takes the runtime's launch (which makes
  // the device's primary context current) and its second the driver's. Both must launch the same
  // kernels on the caller's stream as a run from the planning thread.
  DecodeProblem p(make_case("Api_fresh_thread", hmla::DType::kBF16, 5, 2, 64, 1, {3000, 1, 0, 700, 129}, true));
  Stream s;
  DeviceBuffer ws;
  const hmla::DecodeSchedule sched = plan_into_poisoned_workspace(p, ws, s.get());
  p.poison_outputs();
  ASSERT_NO_THROW(hmla::dense_decode_run(p.device_params(), sched, s.get()));
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  const Outputs reference_run = p.download();
  p.check(reference_run, "planning thread");
  // Both runs in one new thread: the first finds no current context, the second the one the first
  // left current.
  Outputs threaded[2];
  std::exception_ptr failure;
  cudaError_t status = cudaSuccess;
  std::thread fresh([&] {
    try {
      for (int run = 0; run < 2 && status == cudaSuccess; ++run) {
        p.poison_outputs();
        hmla::dense_decode_run(p.device_params(), sched, s.get());
        status = cudaStreamSynchronize(s.get());
        if (status == cudaSuccess) status = cudaGetLastError();
        if (status == cudaSuccess) threaded[run] = p.download();
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  fresh.join();
  ASSERT_FALSE(failure) << "dense_decode_run threw in a fresh host thread";
  ASSERT_EQ(status, cudaSuccess) << cudaGetErrorString(status);
  for (int run = 0; run < 2; ++run) {
    std::string where;
    EXPECT_TRUE(DecodeProblem::bitwise_equal(reference_run, threaded[run], &where))
        << "run " << run + 1 << " from a fresh thread differs from the planning thread's: " << where;
  }
}

TEST(DenseDecodeApi, PlanOnceRunPerLayer) {
  // One decoding step of a model: one plan, then one run per layer, each layer its own cache and q,
  // all with the step's single cache_seqlens tensor.
  const std::vector<int> lengths = {300, 5000, 1, 0, 2048, 64, 65, 9000};
  std::vector<std::unique_ptr<DecodeProblem>> layers;
  for (int layer = 0; layer < 3; ++layer) {
    DecodeCase c = make_case("Api_layer" + std::to_string(layer), hmla::DType::kBF16, 8, 1, 128, 1,
                             lengths, false);
    c.cache_seed = hash_string("layer-cache/" + std::to_string(layer));
    layers.push_back(std::make_unique<DecodeProblem>(c));
  }
  const DecodeCase& c = layers[0]->spec();
  Stream s;
  const size_t bytes = layers[0]->workspace_bytes();
  DeviceBuffer ws(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(ws.get(), 0xff, bytes));
  const int32_t* step_seqlens = layers[0]->device_seqlens();
  const hmla::DecodeSchedule sched = hmla::dense_decode_plan(step_seqlens, c.batch, c.s_q, c.h_q,
                                                             c.h_kv, ws.get(), bytes, s.get());
  for (auto& layer : layers) layer->poison_outputs();
  for (auto& layer : layers) {
    hmla::DenseDecodeParams params = layer->device_params();
    params.cache_seqlens = step_seqlens;
    ASSERT_NO_THROW(hmla::dense_decode_run(params, sched, s.get()));
  }
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  for (size_t i = 0; i < layers.size(); ++i)
    layers[i]->check(layers[i]->download(), "layer " + std::to_string(i));
}

TEST(DenseDecodeApi, CudaGraphCaptureOfPlanAndRunReplays) {
  // Capacity = the lengths of the second replay; the first uses shorter lengths on the same pages.
  const std::vector<int> long_lengths = {4096, 300, 17000, 64, 1, 2500, 0, 8191};
  const std::vector<int> short_lengths = {1000, 0, 129, 64, 1, 7, 0, 8000};
  DecodeCase c = make_case("Api_graph", hmla::DType::kBF16, 8, 2, 64, 1, short_lengths, true);
  c.capacity = long_lengths;
  DecodeProblem p(c);
  Stream s(cudaStreamNonBlocking);
  const size_t bytes = p.workspace_bytes();
  DeviceBuffer ws(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(ws.get(), 0xff, bytes));
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  const hmla::DenseDecodeParams params = p.device_params();

  // Warm-up outside the graph (as a serving engine does before capturing).
  p.poison_outputs();
  {
    const hmla::DecodeSchedule sched = hmla::dense_decode_plan(
        p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, ws.get(), bytes, s.get());
    hmla::dense_decode_run(params, sched, s.get());
    HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    HMLA_TEST_CUDA_CHECK(cudaGetLastError());
    p.check(p.download(), "graph warm-up (eager)");
  }

  // Capture plan + run.
  p.poison_outputs();
  cudaGraph_t graph = nullptr;
  HMLA_TEST_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  std::string capture_error;
  try {
    const hmla::DecodeSchedule sched = hmla::dense_decode_plan(
        p.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, ws.get(), bytes, s.get());
    hmla::dense_decode_run(params, sched, s.get());
  } catch (const std::exception& e) {
    capture_error = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(s.get(), &graph);
  ASSERT_TRUE(capture_error.empty()) << "plan/run threw during capture: " << capture_error;
  ASSERT_EQ(end, cudaSuccess) << "capture failed: " << cudaGetErrorString(end)
                              << " (plan/run used an operation that cannot be captured?)";
  ASSERT_NE(graph, nullptr);
  size_t nodes = 0;
  HMLA_TEST_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_GE(nodes, 2u) << "expected at least the scheduler and the attention kernel in the graph";
  {
    // Capturing must not have executed anything.
    const Outputs untouched = p.download();
    int64_t written = 0;
    const uint16_t poison = out_poison_bits(c.dtype);
    for (uint16_t v : untouched.out) written += v != poison && v != kOutSentinelBits;
    EXPECT_EQ(written, 0) << "out changed while capturing";
  }
  cudaGraphExec_t exec = nullptr;
  HMLA_TEST_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  // Replay 1: the captured inputs.
  HMLA_TEST_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  p.check(p.download(), "graph replay 1");

  // Replay 2: new q values and new (longer) cache_seqlens in the same buffers; the plan inside the
  // graph must read the new lengths on the device.
  p.set_lengths(long_lengths);
  p.refill_q(hash_string("graph-q-2"));
  p.poison_outputs();
  HMLA_TEST_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  const Outputs second = p.download();
  p.check(second, "graph replay 2 (new q, new lengths)");

  // Replay 3: unchanged inputs, bitwise the same as replay 2.
  p.poison_outputs();
  HMLA_TEST_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  std::string where;
  EXPECT_TRUE(DecodeProblem::bitwise_equal(second, p.download(), &where))
      << "replay 3 differs: " << where;

  HMLA_TEST_CUDA_CHECK(cudaGraphExecDestroy(exec));
  HMLA_TEST_CUDA_CHECK(cudaGraphDestroy(graph));
}

}  // namespace
}  // namespace hmla_test
