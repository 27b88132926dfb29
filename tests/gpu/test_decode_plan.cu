// The plan kernel (src/scheduler/decode_scheduler.cu) against the greedy written out on the host
// (tests/greedy_reference.h), field by field: every part's metadata, each request's piece count and
// accumulator base, the list of split requests. Random batches of both kinds of work (dense
// cache_seqlens with zeros and negatives; sparse main and extra lists with and without device
// lengths, lengths past the list and negative, 1-4 query tokens per batch entry), 1 to 16384
// requests, 1 to 1000 parts: both forms of the kernel (chains ranked by binary lifting, and the warp
// walk past 4096 requests or where the lifting levels do not fit in shared memory). The workspace is
// poisoned before every plan, so a field the kernel leaves unwritten shows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "greedy_reference.h"
#include "scheduler/decode_scheduler.h"

namespace {

using hmla::detail::DecodeWork;
using hmla::detail::PartMetadata;
using hmla::detail::WorkspaceLayout;
using hmla_test::DeviceBuffer;

struct PlanCase {
  int batch = 1, tokens_per_batch = 1, parts = 1;
  bool dense = false;
  std::vector<int32_t> seqlens;  // dense
  int topk = 0, extra_topk = 0;
  std::vector<int32_t> topk_length, extra_topk_length;  // sparse; empty: none
  int requests() const { return batch * tokens_per_batch; }

  std::string describe() const {
    return (dense ? "dense" : "sparse") + std::string(" batch ") + std::to_string(batch) + " x " +
           std::to_string(tokens_per_batch) + " tokens, " + std::to_string(parts) + " parts, topk " +
           std::to_string(topk) + (topk_length.empty() ? "" : " (lengths)") + ", extra " + std::to_string(extra_topk) +
           (extra_topk_length.empty() ? "" : " (lengths)");
  }
  // The work as the kernels see it, over `seqlens_ptr` etc. (host or device arrays).
  DecodeWork work(const int32_t* seqlens_ptr, const int32_t* topk_length_ptr, const int32_t* extra_ptr) const {
    DecodeWork w{};
    if (dense) {
      w.seqlens = seqlens_ptr;
      return w;
    }
    w.tokens_per_batch = tokens_per_batch;
    w.topk = topk;
    w.topk_length = topk_length.empty() ? nullptr : topk_length_ptr;
    w.extra_topk = extra_topk;
    w.extra_topk_length = extra_topk_length.empty() ? nullptr : extra_ptr;
    return w;
  }
};

// `requests` exactly when `exact` (one query token per batch entry), else about as many.
PlanCase random_case(std::mt19937& rng, int requests, int parts, bool exact = false) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  PlanCase c;
  c.parts = parts;
  c.dense = uniform(0, 2) == 0;
  c.tokens_per_batch = c.dense || exact ? 1 : uniform(1, 4);
  c.batch = std::max(1, requests / c.tokens_per_batch);
  const int shape = uniform(0, 2);  // 0: equal lengths, 1: uniform, 2: mostly short with a few long
  auto length = [&](int longest) {
    if (shape == 0) return longest;
    if (shape == 1) return uniform(0, longest);
    return uniform(0, 9) ? uniform(0, 64) : longest;
  };
  if (c.dense) {
    const int longest = uniform(1, 40000);
    c.seqlens.resize(c.batch);
    for (int32_t& s : c.seqlens) s = uniform(0, 19) ? length(longest) : -uniform(1, 100);
    return c;
  }
  c.topk = uniform(0, 3) ? uniform(1, 5000) : 64 * uniform(1, 40);
  if (uniform(0, 1)) {
    c.topk_length.resize(c.batch);
    for (int32_t& l : c.topk_length) l = uniform(0, 9) ? length(c.topk) : (uniform(0, 1) ? -uniform(1, 9) : c.topk + uniform(1, 99));
  }
  if (uniform(0, 1)) {
    c.extra_topk = uniform(1, 3000);
    if (uniform(0, 1)) {
      c.extra_topk_length.resize(c.batch);
      for (int32_t& l : c.extra_topk_length)
        l = uniform(0, 9) ? length(c.extra_topk) : (uniform(0, 1) ? -uniform(1, 9) : c.extra_topk + uniform(1, 99));
    }
  }
  return c;
}

// Plans `c` on the device (workspace poisoned first) and compares every output with the greedy's.
void expect_plan_matches_greedy(const PlanCase& c, cudaStream_t stream) {
  const int requests = c.requests(), parts = c.parts;
  auto upload = [&](const std::vector<int32_t>& v, DeviceBuffer& buf) {
    buf.allocate(sizeof(int32_t) * std::max<size_t>(v.size(), 1));
    if (!v.empty()) buf.upload(v.data(), sizeof(int32_t) * v.size());
  };
  DeviceBuffer seqlens, topk_length, extra_length;
  upload(c.seqlens, seqlens);
  upload(c.topk_length, topk_length);
  upload(c.extra_topk_length, extra_length);
  const WorkspaceLayout layout = WorkspaceLayout::make(requests, parts, 1, 1, 512);
  DeviceBuffer workspace(layout.lse_accum);  // the plan writes only what lies before the accumulators
  HMLA_TEST_CUDA_CHECK(cudaMemset(workspace.get(), 0x7f, layout.lse_accum));
  hmla::detail::launch_decode_scheduler(c.work(seqlens.as<int32_t>(), topk_length.as<int32_t>(), extra_length.as<int32_t>()),
                                        requests, parts, workspace.get(), layout, stream);
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<char> got(layout.lse_accum);
  workspace.download(got.data(), got.size());
  const auto* got_parts = reinterpret_cast<const PartMetadata*>(got.data() + layout.part_metadata);
  const auto* got_num_splits = reinterpret_cast<const int32_t*>(got.data() + layout.req_num_splits);
  const auto* got_split_base = reinterpret_cast<const int32_t*>(got.data() + layout.req_split_base);
  const auto* got_split_list = reinterpret_cast<const int32_t*>(got.data() + layout.split_list);

  const DecodeWork host_work = c.work(c.seqlens.data(), c.topk_length.data(), c.extra_topk_length.data());
  std::vector<int> units(requests);
  for (int r = 0; r < requests; ++r) units[r] = host_work.units(r);
  const hmla_test::Batch batch = hmla_test::make_batch(units, hmla_test::plan_overhead(units, parts), parts);
  const std::vector<PartMetadata> want = hmla_test::walk_one_at_a_time(batch, parts);
  const hmla_test::SplitNumbering numbering = hmla_test::number_by_requests(want, requests);

  for (int p = 0; p < parts; ++p) {
    PartMetadata w = want[p];
    if (w.begin_req < requests) {
      w.begin_seqlen = host_work.main_keys(w.begin_req);
      w.begin_extra_keys = host_work.extra_keys(w.begin_req);
    }
    const PartMetadata& g = got_parts[p];
    const bool same = g.begin_req == w.begin_req && g.begin_unit == w.begin_unit && g.end_req == w.end_req &&
                      g.end_unit == w.end_unit && g.begin_split_idx == w.begin_split_idx &&
                      g.begin_seqlen == w.begin_seqlen && g.begin_extra_keys == w.begin_extra_keys;
    ASSERT_TRUE(same) << c.describe() << ": part " << p << " is {" << g.begin_req << ":" << g.begin_unit << " .. "
                      << g.end_req << ":" << g.end_unit << ", piece " << g.begin_split_idx << ", keys "
                      << g.begin_seqlen << "/" << g.begin_extra_keys << "}, the greedy's {" << w.begin_req << ":"
                      << w.begin_unit << " .. " << w.end_req << ":" << w.end_unit << ", piece " << w.begin_split_idx
                      << ", keys " << w.begin_seqlen << "/" << w.begin_extra_keys << "}";
  }
  for (int r = 0; r < requests; ++r)
    ASSERT_TRUE(got_num_splits[r] == numbering.num_splits[r] && got_split_base[r] == numbering.split_base[r])
        << c.describe() << ": request " << r << " has " << got_num_splits[r] << " pieces from slot " << got_split_base[r]
        << ", the greedy " << numbering.num_splits[r] << " from " << numbering.split_base[r];
  for (size_t i = 0; i < numbering.split_list.size(); ++i)
    ASSERT_EQ(got_split_list[i], numbering.split_list[i]) << c.describe() << ": split_list[" << i << "]";
}

class DecodePlan : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("HMLA_SPLIT_OVERHEAD_UNITS") != nullptr)
      GTEST_SKIP() << "HMLA_SPLIT_OVERHEAD_UNITS forces the per-piece cost the reference chooses";
  }
  hmla_test::Stream stream_;
};

TEST_F(DecodePlan, RandomBatchesMatchTheGreedy) {
  std::mt19937 rng(20261206);
  for (int trial = 0; trial < 400; ++trial) {
    const int requests = std::uniform_int_distribution<int>(1, trial % 8 == 0 ? 4096 : 300)(rng);
    const int parts = std::uniform_int_distribution<int>(1, 132)(rng);
    expect_plan_matches_greedy(random_case(rng, requests, parts), stream_.get());
    if (HasFatalFailure()) return;
  }
}

// The sizes at the forms' edges: the largest chained plan, the first walked one, the largest plan,
// and part counts whose lifting levels outgrow shared memory (the walk takes over).
TEST_F(DecodePlan, FormEdgesMatchTheGreedy) {
  std::mt19937 rng(7);
  for (int requests : {1, 32, 33, 4095, 4096, 4097, 16384})
    for (int parts : {1, 66, 132, 1000}) {
      expect_plan_matches_greedy(random_case(rng, requests, parts, true), stream_.get());
      if (HasFatalFailure()) return;
    }
}

}  // namespace
