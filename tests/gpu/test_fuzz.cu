// Randomized differential tests: dense decode and token-sparse decode on random small problems,
// each run on the GPU and checked by its harness (every structural check on every row, the CPU
// reference on every row or a bounded sample) exactly as the hand-written cases are.
//
//  * DenseDecodeFuzz.RandomCasesMatchReference [*Fuzz*]: dtype, batch 1..4, s_q 1..16 (mostly
//      <= 4), h_kv {1, 2, 3, 4, 8} and h_q = h_kv x group up to 128, page size {16 .. 256},
//      lengths 0, 1, 63, 64, 65 or up to 700 (per request), spare capacity past the lengths,
//      causal, q / out layouts (dense, padded, head-major, token-major), padded lse, block-table
//      and cache strides, softmax scale, plans for 1..17 SMs or the whole device.
//  * SparseDecodeFuzz.RandomCasesMatchReference [*Fuzz*]: layout (V3.2, MODEL1), batch 1..4,
//      s_q 1..4, h_q 1..128, topk 1, 2, 63, 64, 65, 128 or up to 600, page size 2..128, an
//      extra cache (its own page size, extra_topk), topk_length / extra_topk_length modes, sinks,
//      invalid indices, duplicates, strides, softmax scale, plans for 1..8 SMs or the device.
//
// Case i of seed S is a pure function of (S, i). Environment:
//   HMLA_FUZZ_SEED     the seed (default 0x484d4c41; printed at the start of each family)
//   HMLA_FUZZ_CASE     run only case i (the failure message of a case prints its command line)
//   HMLA_FUZZ_CASES    at most this many cases per family (default 20000)
//   HMLA_FUZZ_SECONDS  stop a family after this long (default 30, so ~60 s for both on the H200
//                      host; a few thousand cases each)
// A family stops after 5 failing cases.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "dense_decode_cases.h"
#include "dense_decode_harness.h"
#include "gpu_test_util.h"
#include "harness_common.h"
#include "sparse_decode_cases.h"
#include "sparse_decode_harness.h"

namespace hmla_test {
namespace {

constexpr uint64_t kDefaultSeed = 0x484d4c41;  // "HMLA"
constexpr int kMaxFailingCases = 5;
// Reference multiply-adds per case before rows are sampled: ~10 ms of one core.
constexpr double kFuzzRefBudget = 2e7;

struct FuzzConfig {
  uint64_t seed = kDefaultSeed;
  int64_t only_case = -1;
  int64_t max_cases = 20000;
  double max_seconds = 30;
};

FuzzConfig fuzz_config() {
  FuzzConfig f;
  if (const char* s = std::getenv("HMLA_FUZZ_SEED")) f.seed = std::strtoull(s, nullptr, 0);
  if (const char* s = std::getenv("HMLA_FUZZ_CASE")) f.only_case = std::strtoll(s, nullptr, 0);
  f.max_cases = static_cast<int64_t>(env_double("HMLA_FUZZ_CASES", static_cast<double>(f.max_cases)));
  f.max_seconds = env_double("HMLA_FUZZ_SECONDS", f.max_seconds);
  return f;
}

template <class T, size_t N>
T pick(Rng& rng, const T (&values)[N]) {
  return values[rng.uniform_int(0, static_cast<int>(N) - 1)];
}
bool chance(Rng& rng, int percent) { return rng.uniform_int(0, 99) < percent; }

// ------------------------------------------------------------------------------ dense
DecodeCase random_dense_case(uint64_t seed, int64_t index) {
  Rng rng(mix_seed(seed, static_cast<uint64_t>(index)));
  DecodeCase c;
  c.name = fmt("DenseFuzz_%016" PRIx64 "_%lld", seed, static_cast<long long>(index));
  c.dtype = chance(rng, 50) ? hmla::DType::kBF16 : hmla::DType::kFP16;
  c.batch = rng.uniform_int(1, 4);
  c.s_q = chance(rng, 85) ? rng.uniform_int(1, 4) : rng.uniform_int(5, 16);
  const int h_kvs[] = {1, 1, 1, 2, 3, 4, 8};
  c.h_kv = pick(rng, h_kvs);
  const int groups[] = {1, 2, 3, 4, 7, 8, 16, 21, 32, 64, 128};
  int group = pick(rng, groups);
  while (c.h_kv * group > 128) group /= 2;
  c.h_q = c.h_kv * group;
  const int pages[] = {16, 32, 64, 128, 256};
  c.page_size = pick(rng, pages);
  c.causal = chance(rng, 50);
  const int special_lengths[] = {0, 1, 2, 63, 64, 65, 127, 128, 129};
  for (int r = 0; r < c.batch; ++r) {
    c.lengths.push_back(chance(rng, 40) ? pick(rng, special_lengths) : rng.uniform_int(0, 700));
  }
  if (chance(rng, 30)) {
    for (int r = 0; r < c.batch; ++r) c.capacity.push_back(c.lengths[r] + rng.uniform_int(0, 300));
  }
  const Layout layouts[] = {Layout::kDense, Layout::kPadded, Layout::kHeadMajor, Layout::kTokenMajor};
  c.q_layout = chance(rng, 50) ? Layout::kDense : pick(rng, layouts);
  c.out_layout = chance(rng, 50) ? Layout::kDense : pick(rng, layouts);
  c.pad_lse = chance(rng, 30);
  c.pad_block_table = chance(rng, 30);
  c.pad_cache = chance(rng, 20);
  if (chance(rng, 30)) c.softmax_scale = static_cast<float>(rng.uniform_int(5, 200)) / 1000.f;
  const int sms[] = {0, 0, 0, 1, 2, 3, 5, 8, 17};
  c.num_sms = pick(rng, sms);
  c.ref_budget = kFuzzRefBudget;
  return c;
}

std::string describe(const DecodeCase& c) {
  std::string lengths, capacity;
  for (int v : c.lengths) lengths += (lengths.empty() ? "" : ",") + std::to_string(v);
  for (int v : c.capacity) capacity += (capacity.empty() ? "" : ",") + std::to_string(v);
  return fmt("%s: %s b=%d s_q=%d h_q=%d h_kv=%d page=%d causal=%d lengths={%s} capacity={%s} q=%s out=%s "
             "pad_lse=%d pad_bt=%d pad_cache=%d scale=%g num_sms=%d",
             c.name.c_str(), hmla::dtype_name(c.dtype), c.batch, c.s_q, c.h_q, c.h_kv, c.page_size, c.causal ? 1 : 0,
             lengths.c_str(), capacity.c_str(), layout_name(c.q_layout), layout_name(c.out_layout), c.pad_lse ? 1 : 0,
             c.pad_block_table ? 1 : 0, c.pad_cache ? 1 : 0, c.softmax_scale, c.num_sms);
}

// ------------------------------------------------------------------------------ sparse
SparseCase random_sparse_case(uint64_t seed, int64_t index) {
  Rng rng(mix_seed(seed ^ 0x5350415253450000ull, static_cast<uint64_t>(index)));
  SparseCase c;
  c.name = fmt("SparseFuzz_%016" PRIx64 "_%lld", seed, static_cast<long long>(index));
  const bool v32 = chance(rng, 50);
  c.layout = v32 ? hmla::SparseCacheLayout::kV32 : hmla::SparseCacheLayout::kModel1;
  c.batch = rng.uniform_int(1, 4);
  c.s_q = rng.uniform_int(1, 4);
  const int h_qs[] = {1, 2, 3, 8, 16, 17, 32, 64, 100, 128};
  c.h_q = pick(rng, h_qs);
  const int special_topk[] = {1, 2, 63, 64, 65, 128};
  c.topk = chance(rng, 40) ? pick(rng, special_topk) : rng.uniform_int(1, 600);
  const int pages[] = {2, 16, 53, 64, 128};
  c.page_size = pick(rng, pages);
  const LengthMode lengths[] = {LengthMode::kOff, LengthMode::kMixed, LengthMode::kZero, LengthMode::kFull};
  c.topk_length = chance(rng, 50) ? LengthMode::kOff : pick(rng, lengths);
  if (chance(rng, 30)) {
    c.extra = true;
    c.extra_page_size = pick(rng, pages);
    const int extra_topks[] = {1, 40, 64, 200};
    c.extra_topk = pick(rng, extra_topks);
    c.extra_topk_length = chance(rng, 50) ? LengthMode::kOff : pick(rng, lengths);
  }
  const SinkMode sinks[] = {SinkMode::kNone, SinkMode::kFinite, SinkMode::kNegInf, SinkMode::kPosInf, SinkMode::kMixed};
  c.sink = chance(rng, 50) ? SinkMode::kNone : pick(rng, sinks);
  const InvalidMode invalid[] = {InvalidMode::kNone, InvalidMode::kSome, InvalidMode::kThirtyPercent,
                                 InvalidMode::kRowsAllInvalid, InvalidMode::kAll};
  c.invalid = chance(rng, 40) ? InvalidMode::kNone : pick(rng, invalid);
  c.duplicates = chance(rng, 20);
  c.strided = chance(rng, 30);
  // The V3.2 lse tolerance holds for scales near the default only (sparse_decode_harness.h).
  if (chance(rng, 30)) {
    const float default_scale = 1.f / std::sqrt(v32 ? 576.f : 512.f);
    c.softmax_scale = default_scale * static_cast<float>(rng.uniform_int(50, v32 ? 150 : 300)) / 100.f;
  }
  const int sms[] = {0, 0, 1, 3, 8};
  c.num_sms = pick(rng, sms);
  c.ref_budget = kFuzzRefBudget;
  return c;
}

// ------------------------------------------------------------------------------ driver
// Runs cases 0, 1, ... of the seed (or the one HMLA_FUZZ_CASE names) until the count or the time
// is spent or kMaxFailingCases have failed. `run_case(seed, i)` builds, runs and checks case i;
// `describe_of(seed, i)` describes it for the failure message.
void fuzz(const char* family, const char* filter, const std::function<std::string(uint64_t, int64_t)>& describe_of,
          const std::function<void(uint64_t, int64_t)>& run_case) {
  const FuzzConfig cfg = fuzz_config();
  const auto t0 = Clock::now();
  std::printf("[hmla] %s fuzz: HMLA_FUZZ_SEED=0x%" PRIx64 ", %s\n", family, cfg.seed,
              cfg.only_case >= 0 ? fmt("case %lld only", static_cast<long long>(cfg.only_case)).c_str()
                                 : fmt("up to %lld cases or %.0f s", static_cast<long long>(cfg.max_cases),
                                       cfg.max_seconds)
                                       .c_str());
  std::fflush(stdout);
  const int64_t first = cfg.only_case >= 0 ? cfg.only_case : 0;
  const int64_t end = cfg.only_case >= 0 ? cfg.only_case + 1 : cfg.max_cases;
  int64_t ran = 0;
  int failing = 0;
  const ::testing::TestResult* result = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  for (int64_t i = first; i < end; ++i) {
    if (cfg.only_case < 0 && seconds_since(t0) > cfg.max_seconds) break;
    const int before = result->total_part_count();
    {
      SCOPED_TRACE(fmt("%s fuzz case %lld; re-run it alone: HMLA_FUZZ_SEED=0x%" PRIx64
                       " HMLA_FUZZ_CASE=%lld ./build/tests/hmla_gpu_tests --gtest_filter='%s'\n  %s",
                       family, static_cast<long long>(i), cfg.seed, static_cast<long long>(i), filter,
                       describe_of(cfg.seed, i).c_str()));
      run_case(cfg.seed, i);
    }
    ++ran;
    if (result->total_part_count() != before && ++failing >= kMaxFailingCases) {
      ADD_FAILURE() << family << " fuzz: stopped after " << failing << " failing cases";
      break;
    }
  }
  std::printf("[hmla] %s fuzz: %lld cases in %.1f s, %d failing (seed 0x%" PRIx64 ")\n", family,
              static_cast<long long>(ran), seconds_since(t0), failing, cfg.seed);
  std::fflush(stdout);
  EXPECT_GT(ran, 0) << "no case ran (HMLA_FUZZ_CASES / HMLA_FUZZ_SECONDS)";
}

TEST(DenseDecodeFuzz, RandomCasesMatchReference) {
  fuzz(
      "dense", "DenseDecodeFuzz.*", [](uint64_t s, int64_t i) { return describe(random_dense_case(s, i)); },
      [](uint64_t s, int64_t i) {
        const DecodeCase c = random_dense_case(s, i);
        run_and_check_case(c);
        release_cached_caches();  // every case has its own cache
      });
}

TEST(SparseDecodeFuzz, RandomCasesMatchReference) {
  fuzz(
      "sparse", "SparseDecodeFuzz.*", [](uint64_t s, int64_t i) { return describe_case(random_sparse_case(s, i)); },
      [](uint64_t s, int64_t i) { run_and_check_sparse_case(random_sparse_case(s, i)); });
}

}  // namespace
}  // namespace hmla_test
