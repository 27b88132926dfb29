// The driver of the randomized differential tests (test_fuzz.cu, test_sparse_prefill.cu): case i
// of seed S is a pure function of (S, i), every case is checked as a hand-written one is, and a
// failing case prints the command line that re-runs it alone. Environment:
//   HMLA_FUZZ_SEED     the seed (default 0x484d4c41; printed at the start of each family)
//   HMLA_FUZZ_CASE     run only case i
//   HMLA_FUZZ_CASES    at most this many cases per family (default 20000)
//   HMLA_FUZZ_SECONDS  stop a family after this long (default 30)
// A family stops after 5 failing cases.
#pragma once

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "gpu_test_util.h"
#include "harness_common.h"

namespace hmla_test {

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

inline FuzzConfig fuzz_config() {
  FuzzConfig f;
  if (const char* s = std::getenv("HMLA_FUZZ_SEED")) f.seed = std::strtoull(s, nullptr, 0);
  if (const char* s = std::getenv("HMLA_FUZZ_CASE")) f.only_case = std::strtoll(s, nullptr, 0);
  f.max_cases = static_cast<int64_t>(env_double("HMLA_FUZZ_CASES", static_cast<double>(f.max_cases)));
  f.max_seconds = env_double("HMLA_FUZZ_SECONDS", f.max_seconds);
  return f;
}

template <class T, size_t N>
inline T pick(Rng& rng, const T (&values)[N]) {
  return values[rng.uniform_int(0, static_cast<int>(N) - 1)];
}
inline bool chance(Rng& rng, int percent) { return rng.uniform_int(0, 99) < percent; }

// Runs cases 0, 1, ... of the seed (or the one HMLA_FUZZ_CASE names) until the count or the time
// is spent or kMaxFailingCases have failed. `run_case(seed, i)` builds, runs and checks case i;
// `describe_of(seed, i)` describes it for the failure message.
inline void fuzz(const char* family, const char* filter,
                 const std::function<std::string(uint64_t, int64_t)>& describe_of,
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

}  // namespace hmla_test
