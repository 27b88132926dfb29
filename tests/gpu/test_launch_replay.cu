// hmla::LaunchReplay (hmla/launch_replay.h): a run replayed as the stream's graph gives the bits the
// direct launches give, for every kernel the run entry points choose (the graph's nodes get another
// kernel, grid and arguments from call to call); on a stream being captured the kernels go into the
// caller's graph; several streams, a moved-from or cleared replay, a fresh host thread and rejected
// arguments behave as the header says. The stats say which path each run took, so a replay that
// silently launched directly fails here.
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dense_decode_cases.h"
#include "dense_decode_harness.h"
#include "gpu_test_util.h"
#include "hmla/dense_decode.h"
#include "hmla/launch_replay.h"
#include "hmla/sparse_decode.h"
#include "hmla/types.h"
#include "sparse_decode_cases.h"
#include "sparse_decode_harness.h"

namespace hmla_test {
namespace {

// One planned problem of either family: run() with or without a replay, on a stream.
struct Planned {
  std::function<void(cudaStream_t, hmla::LaunchReplay*)> run;
  std::function<Outputs()> download;
  std::function<void()> poison;
  std::function<void(const Outputs&, const std::string&)> check;
  std::string name;
};

// A problem of either family with its planned workspace.
template <typename Problem, typename Case>
struct Fixture {
  explicit Fixture(Case c) : problem(std::move(c)) {}
  Problem problem;
  DeviceBuffer ws;
  hmla::DecodeSchedule schedule{};
};
using DenseFixture = Fixture<DecodeProblem, DecodeCase>;
using SparseFixture = Fixture<SparseProblem, SparseCase>;

template <typename Fixture>
Planned planned(Fixture& f, std::string name, std::function<void(cudaStream_t, hmla::LaunchReplay*)> run) {
  Planned p;
  p.name = std::move(name);
  p.run = std::move(run);
  p.download = [&f] { return f.problem.download(); };
  p.poison = [&f] { f.problem.poison_outputs(); };
  p.check = [&f](const Outputs& o, const std::string& what) { f.problem.check(o, what); };
  return p;
}

Planned plan_dense(DenseFixture& f, cudaStream_t s) {
  const DecodeCase& c = f.problem.spec();
  const size_t bytes = f.problem.workspace_bytes();
  f.ws = DeviceBuffer(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(f.ws.get(), 0xff, bytes));
  f.schedule = hmla::dense_decode_plan(f.problem.device_seqlens(), c.batch, c.s_q, c.h_q, c.h_kv, f.ws.get(), bytes, s);
  return planned(f, c.name, [&f](cudaStream_t stream, hmla::LaunchReplay* replay) {
    if (replay != nullptr) hmla::dense_decode_run(f.problem.device_params(), f.schedule, stream, *replay);
    else hmla::dense_decode_run(f.problem.device_params(), f.schedule, stream);
  });
}

Planned plan_sparse(SparseFixture& f, cudaStream_t s) {
  const size_t bytes = f.problem.workspace_bytes();
  f.ws = DeviceBuffer(bytes);
  HMLA_TEST_CUDA_CHECK(cudaMemset(f.ws.get(), 0xff, bytes));
  f.schedule = hmla::sparse_decode_plan(f.problem.device_params(), f.ws.get(), bytes, s);
  return planned(f, f.problem.spec().name, [&f](cudaStream_t stream, hmla::LaunchReplay* replay) {
    if (replay != nullptr) hmla::sparse_decode_run(f.problem.device_params(), f.schedule, stream, *replay);
    else hmla::sparse_decode_run(f.problem.device_params(), f.schedule, stream);
  });
}

Outputs run_once(const Planned& p, cudaStream_t s, hmla::LaunchReplay* replay) {
  p.poison();
  p.run(s, replay);
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  return p.download();
}

// Each problem run directly (checked against the reference), then twice through all of them with
// one replay on one stream: each replayed run bitwise equal to the direct one.
void expect_replays_equal_direct_runs(const std::vector<Planned>& problems, cudaStream_t s) {
  std::vector<Outputs> direct;
  for (const Planned& p : problems) {
    direct.push_back(run_once(p, s, nullptr));
    p.check(direct.back(), p.name + ", direct launches");
  }
  hmla::LaunchReplay replay;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < problems.size(); ++i) {
      const Outputs got = run_once(problems[i], s, &replay);
      std::string where;
      EXPECT_TRUE(outputs_bitwise_equal(direct[i], got, &where))
          << problems[i].name << ", replayed (pass " << pass + 1 << "): " << where;
    }
  }
  const hmla::LaunchReplay::Stats stats = replay.stats();
  EXPECT_EQ(stats.replayed, 2 * problems.size()) << "every run on an uncaptured stream is replayed";
  EXPECT_EQ(stats.launched_directly, 0u);
  EXPECT_EQ(stats.graphs_built, 1u) << "one graph per stream, its nodes updated with each run's kernels";
}

TEST(LaunchReplay, DenseRunsEqualDirectLaunchesAcrossKernels) {
  Stream s(cudaStreamNonBlocking);
  std::vector<std::unique_ptr<DenseFixture>> fixtures;
  fixtures.push_back(std::make_unique<DenseFixture>(
      make_case("Replay_bf16_b4_sq2_causal_hq64", hmla::DType::kBF16, 4, 2, 64, 1, {100, 0, 2048, 513}, true)));
  fixtures.push_back(std::make_unique<DenseFixture>(
      make_case("Replay_fp16_b3_sq1_hq16", hmla::DType::kFP16, 3, 1, 16, 1, {5000, 1, 64}, false)));
  fixtures.push_back(std::make_unique<DenseFixture>(
      make_case("Replay_bf16_b1_sq1_hq128_split", hmla::DType::kBF16, 1, 1, 128, 1, {20000}, false)));
  std::vector<Planned> problems;
  for (auto& f : fixtures) problems.push_back(plan_dense(*f, s.get()));
  expect_replays_equal_direct_runs(problems, s.get());
}

TEST(LaunchReplay, SparseRunsEqualDirectLaunchesAcrossKernels) {
  Stream s(cudaStreamNonBlocking);
  std::vector<std::unique_ptr<SparseFixture>> fixtures;
  fixtures.push_back(std::make_unique<SparseFixture>(
      sparse_case("Replay_v32_b3_sq1_hq16_narrow", hmla::SparseCacheLayout::kV32, 3, 1, 16, 2048)));
  SparseCase model1 = with_extra(sparse_case("Replay_model1_b2_sq2_hq64_extra_sink", hmla::SparseCacheLayout::kModel1,
                                             2, 2, 64, 512),
                                 64, 128, LengthMode::kMixed);
  model1.sink = SinkMode::kFinite;
  fixtures.push_back(std::make_unique<SparseFixture>(model1));
  fixtures.push_back(std::make_unique<SparseFixture>(
      sparse_case("Replay_v32_b1_sq1_hq128_split", hmla::SparseCacheLayout::kV32, 1, 1, 128, 5000)));
  std::vector<Planned> problems;
  for (auto& f : fixtures) problems.push_back(plan_sparse(*f, s.get()));
  expect_replays_equal_direct_runs(problems, s.get());
}

TEST(LaunchReplay, TwoStreamsGetAGraphEach) {
  Stream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  DenseFixture fa(make_case("Replay_streams_a", hmla::DType::kBF16, 2, 1, 64, 1, {3000, 17}, false));
  DenseFixture fb(make_case("Replay_streams_b", hmla::DType::kBF16, 3, 1, 16, 1, {1, 700, 4096}, false));
  const Planned pa = plan_dense(fa, a.get()), pb = plan_dense(fb, b.get());
  const Outputs direct_a = run_once(pa, a.get(), nullptr), direct_b = run_once(pb, b.get(), nullptr);
  hmla::LaunchReplay replay;
  for (int i = 0; i < 3; ++i) {
    pa.poison();
    pb.poison();
    pa.run(a.get(), &replay);
    pb.run(b.get(), &replay);
    HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
    HMLA_TEST_CUDA_CHECK(cudaGetLastError());
    std::string where;
    EXPECT_TRUE(outputs_bitwise_equal(direct_a, pa.download(), &where)) << "stream a, round " << i << ": " << where;
    EXPECT_TRUE(outputs_bitwise_equal(direct_b, pb.download(), &where)) << "stream b, round " << i << ": " << where;
  }
  EXPECT_EQ(replay.stats().replayed, 6u);
  EXPECT_EQ(replay.stats().graphs_built, 2u);
  replay.clear();
  const Outputs after_clear = run_once(pa, a.get(), &replay);
  std::string where;
  EXPECT_TRUE(outputs_bitwise_equal(direct_a, after_clear, &where)) << "after clear(): " << where;
  EXPECT_EQ(replay.stats().graphs_built, 3u) << "clear() drops the graphs; the next run builds one";
}

TEST(LaunchReplay, RunOnACapturingStreamGoesIntoTheCallersGraph) {
  Stream s(cudaStreamNonBlocking);
  DenseFixture f(make_case("Replay_capture", hmla::DType::kBF16, 4, 2, 64, 1, {100, 0, 2048, 513}, true));
  const Planned p = plan_dense(f, s.get());
  const Outputs direct = run_once(p, s.get(), nullptr);
  hmla::LaunchReplay replay;
  p.poison();
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  cudaGraph_t graph = nullptr;
  HMLA_TEST_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  std::string capture_error;
  try {
    p.run(s.get(), &replay);
  } catch (const std::exception& e) {
    capture_error = e.what();
  }
  HMLA_TEST_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  ASSERT_TRUE(capture_error.empty()) << capture_error;
  size_t nodes = 0;
  HMLA_TEST_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 2u) << "the run's two kernels are captured as nodes of the caller's graph";
  EXPECT_EQ(replay.stats().launched_directly, 1u);
  EXPECT_EQ(replay.stats().replayed, 0u);
  cudaGraphExec_t exec = nullptr;
  HMLA_TEST_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  HMLA_TEST_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  std::string where;
  EXPECT_TRUE(outputs_bitwise_equal(direct, p.download(), &where)) << "captured graph: " << where;
  HMLA_TEST_CUDA_CHECK(cudaGraphExecDestroy(exec));
  HMLA_TEST_CUDA_CHECK(cudaGraphDestroy(graph));
  // The same replay, eager again, replays.
  EXPECT_TRUE(outputs_bitwise_equal(direct, run_once(p, s.get(), &replay), &where)) << "eager after capture: " << where;
  EXPECT_EQ(replay.stats().replayed, 1u);
}

TEST(LaunchReplay, RejectedArgumentsLaunchNothingAndLeaveNoRecordingBehind) {
  Stream s(cudaStreamNonBlocking);
  DenseFixture f(make_case("Replay_rejected", hmla::DType::kBF16, 3, 1, 16, 1, {40, 4000, 1}, false));
  const Planned p = plan_dense(f, s.get());
  const Outputs direct = run_once(p, s.get(), nullptr);
  hmla::LaunchReplay replay;
  hmla::DenseDecodeParams bad = f.problem.device_params();
  bad.h_q = 0;
  EXPECT_THROW(hmla::dense_decode_run(bad, f.schedule, s.get(), replay), hmla::InvalidArgument);
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a rejected call left a CUDA error behind";
  const hmla::LaunchReplay::Stats after_throw = replay.stats();
  EXPECT_EQ(after_throw.replayed + after_throw.launched_directly, 0u);
  // The thread's recorder is gone: a direct run launches at once, a replayed one replays.
  std::string where;
  EXPECT_TRUE(outputs_bitwise_equal(direct, run_once(p, s.get(), nullptr), &where)) << "direct after throw: " << where;
  EXPECT_TRUE(outputs_bitwise_equal(direct, run_once(p, s.get(), &replay), &where)) << "replayed after throw: " << where;
  EXPECT_EQ(replay.stats().replayed, 1u);
}

TEST(LaunchReplay, MovedFromReplayLaunchesDirectly) {
  Stream s(cudaStreamNonBlocking);
  DenseFixture f(make_case("Replay_moved", hmla::DType::kBF16, 2, 1, 64, 1, {900, 9000}, false));
  const Planned p = plan_dense(f, s.get());
  const Outputs direct = run_once(p, s.get(), nullptr);
  hmla::LaunchReplay first;
  std::string where;
  EXPECT_TRUE(outputs_bitwise_equal(direct, run_once(p, s.get(), &first), &where)) << where;
  hmla::LaunchReplay second(std::move(first));
  EXPECT_TRUE(outputs_bitwise_equal(direct, run_once(p, s.get(), &first), &where)) << "moved-from: " << where;
  EXPECT_TRUE(outputs_bitwise_equal(direct, run_once(p, s.get(), &second), &where)) << "moved-to: " << where;
  EXPECT_EQ(second.stats().replayed, 2u) << "the moved-to replay keeps the graph and the counts";
  EXPECT_EQ(second.stats().graphs_built, 1u);
  EXPECT_EQ(first.stats().replayed, 0u);
}

TEST(LaunchReplay, FreshHostThread) {
  // A thread that never used CUDA has no current context: its first run's attention kernel goes
  // through the runtime (which makes the primary context current), so only its combine is held and
  // launched directly after it; the second run replays.
  Stream s(cudaStreamNonBlocking);
  DenseFixture f(make_case("Replay_fresh_thread", hmla::DType::kBF16, 5, 2, 64, 1, {3000, 1, 0, 700, 129}, true));
  const Planned p = plan_dense(f, s.get());
  const Outputs direct = run_once(p, s.get(), nullptr);
  Outputs threaded[2];
  hmla::LaunchReplay replay;
  std::exception_ptr failure;
  std::thread fresh([&] {
    try {
      for (int run = 0; run < 2; ++run) {
        p.poison();
        p.run(s.get(), &replay);
        if (cudaStreamSynchronize(s.get()) != cudaSuccess) throw std::runtime_error("sync failed");
        threaded[run] = p.download();
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  fresh.join();
  ASSERT_FALSE(failure) << "a replayed run threw in a fresh host thread";
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  for (int run = 0; run < 2; ++run) {
    std::string where;
    EXPECT_TRUE(outputs_bitwise_equal(direct, threaded[run], &where)) << "run " << run + 1 << ": " << where;
  }
  EXPECT_EQ(replay.stats().replayed + replay.stats().launched_directly, 2u);
  EXPECT_GE(replay.stats().replayed, 1u);
}

}  // namespace
}  // namespace hmla_test
