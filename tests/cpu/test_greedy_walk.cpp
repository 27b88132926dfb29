// The split-KV plan's greedy partition (src/scheduler/greedy_walk.h): the form whose parts are
// computed independently (chains from request starts, ranked once, then each part from its chain's
// start) and GreedyWalk::step part after part give, part by part, what the greedy written out on its
// own gives, on random batches of every
// shape the plan sees: one request or thousands, equal or mixed lengths, empty requests (1 unit),
// more parts than requests, both per-piece costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "greedy_reference.h"
#include "scheduler/greedy_walk.h"

namespace {

using hmla::detail::ChainLink;
using hmla::detail::GreedyWalk;
using hmla::detail::PartMetadata;
using hmla_test::Batch;
using hmla_test::make_batch;
using hmla_test::number_by_requests;
using hmla_test::SplitNumbering;
using hmla_test::walk_one_at_a_time;

// GreedyWalk::step one part after another: the plan kernel's walk past kChainedPlanRequests (its warp
// passes a 32-wide search in place of the binary one).
std::vector<PartMetadata> walk_by_steps(const Batch& b, int parts) {
  const GreedyWalk w = b.walk();
  GreedyWalk::State s = w.start_of(0);
  std::vector<PartMetadata> out(parts);
  for (int p = 0; p < parts; ++p) out[p] = w.step(s);
  return out;
}

// The chained form, its phases as loops (one thread per index on the device): every request's
// chain, computed as the kernel's threads do (a contiguous chunk of requests each, every search
// starting at the previous request's first stop), the lifting levels, every part from the chain its
// descent finds. `closed` gets, per part, the pieces of the split request it closes (from where
// the part ends, as the kernel knows it).
std::vector<PartMetadata> walk_by_chains(const Batch& b, int parts, std::vector<int>& closed) {
  const GreedyWalk w = b.walk();
  const int levels = hmla::detail::lifting_levels(b.requests, parts);
  const int row = b.requests + 1;
  std::vector<uint32_t> lift(static_cast<size_t>(levels) * row);
  constexpr int kThreads = 512;
  const int per_thread = (b.requests + kThreads - 1) / kThreads;
  for (int r0 = 0; r0 < b.requests; r0 += per_thread) {
    int first_stop = r0;
    for (int r = r0; r < std::min(b.requests, r0 + per_thread); ++r) lift[r] = w.chain_from(r, parts, first_stop);
  }
  lift[b.requests] = ChainLink::pack(b.requests, 0);
  for (int l = 1; l < levels; ++l)
    for (int r = 0; r <= b.requests; ++r) {
      const uint32_t first = lift[(l - 1) * row + r];
      lift[l * row + r] = ChainLink::then(first, lift[(l - 1) * row + ChainLink::next(first)]);
    }
  const hmla::detail::ChainLifting lifting{lift.data(), b.requests, levels};
  std::vector<PartMetadata> out(parts);
  closed.assign(parts, 0);
  for (int p = 0; p < parts; ++p) {
    int head = 0, first = 0;
    lifting.chain_of_part(p, head, first);
    PartMetadata meta{};
    meta.begin_req = b.requests;
    meta.end_req = -1;
    int next_begin_req = b.requests;
    if (head < b.requests) meta = w.chain_part(head, p - first, lift[head], next_begin_req);
    out[p] = meta;
    closed[p] = hmla::detail::pieces_closed_by(meta, next_begin_req, p, parts, b.requests);
  }
  return out;
}

// As the plan kernel numbers them: every request unsplit, then the parts that close a request
// (pieces_closed_by) numbered by a scan over the parts.
SplitNumbering number_by_parts(const std::vector<PartMetadata>& parts, int requests) {
  SplitNumbering n;
  n.num_splits.assign(requests, 1);
  n.split_base.assign(requests, -1);
  n.split_list.assign(1, 0);
  const int num_parts = static_cast<int>(parts.size());
  int slot = 0;
  for (int p = 0; p < num_parts; ++p) {
    const int pieces = hmla::detail::pieces_closed_by(parts.data(), p, num_parts, requests);
    if (pieces == 0) continue;
    const int r = parts[p].begin_req;
    n.num_splits[r] = pieces;
    n.split_base[r] = slot;
    slot += pieces;
    n.split_list.push_back(r);
  }
  n.split_list[0] = static_cast<int>(n.split_list.size()) - 1;
  return n;
}

std::string describe(const PartMetadata& m) {
  return "{" + std::to_string(m.begin_req) + ":" + std::to_string(m.begin_unit) + " .. " + std::to_string(m.end_req) +
         ":" + std::to_string(m.end_unit) + ", piece " + std::to_string(m.begin_split_idx) + "}";
}

void expect_same_parts(const std::vector<int>& units, int overhead, int parts, const std::string& what) {
  const Batch b = make_batch(units, overhead, parts);
  const std::vector<PartMetadata> want = walk_one_at_a_time(b, parts);
  // The greedy from request 0 fits the parts (the chained form cuts longer chains at `parts`).
  int last = parts - 1;
  while (last > 0 && want[last].begin_req >= b.requests) --last;
  ASSERT_TRUE(want[last].end_req == b.requests - 1 && want[last].end_unit == units.back())
      << what << ": the greedy leaves work after its " << parts << " parts";
  const SplitNumbering by_parts = number_by_parts(want, b.requests);
  ASSERT_TRUE(by_parts == number_by_requests(want, b.requests)) << what << ": split numbering from the parts";
  int slots = 0;
  for (int r = 0; r < b.requests; ++r) slots += by_parts.num_splits[r] > 1 ? by_parts.num_splits[r] : 0;
  ASSERT_LE(slots, 2 * parts) << what << ": partial slots past the workspace's 2 per part";
  std::vector<int> closed;
  const std::vector<PartMetadata> chained = walk_by_chains(b, parts, closed);
  for (int p = 0; p < parts; ++p)
    ASSERT_EQ(closed[p], hmla::detail::pieces_closed_by(want.data(), p, parts, b.requests))
        << what << ": part " << p << " of " << parts << ": pieces it closes, from its end";
  for (const auto& [form, got] : {std::pair<const char*, std::vector<PartMetadata>>{"chains", chained},
                                   {"steps", walk_by_steps(b, parts)}}) {
    for (int p = 0; p < parts; ++p) {
      const PartMetadata &x = want[p], &y = got[p];
      const bool same = x.begin_req == y.begin_req && x.end_req == y.end_req &&
                        (x.begin_req >= b.requests || (x.begin_unit == y.begin_unit && x.end_unit == y.end_unit &&
                                                       x.begin_split_idx == y.begin_split_idx));
      ASSERT_TRUE(same) << what << ": part " << p << " of " << parts << ": walk " << describe(x) << ", " << form << " "
                        << describe(y);
    }
  }
}

TEST(GreedyWalk, NamedBatches) {
  expect_same_parts({1024}, 5, 132, "one long request");
  expect_same_parts(std::vector<int>(128, 32), 3, 132, "128 equal requests, fewer than the parts");
  expect_same_parts(std::vector<int>(132, 32), 5, 132, "as many equal requests as parts");
  expect_same_parts(std::vector<int>(4096, 2), 5, 132, "4096 short requests");
  expect_same_parts(std::vector<int>(16, 32), 5, 132, "16 requests on 132 parts");
  expect_same_parts({1, 1, 1}, 5, 8, "empty requests only");
  expect_same_parts({7}, 5, 1, "one part");
}

TEST(GreedyWalk, RandomBatches) {
  std::mt19937 rng(20261206);
  for (int trial = 0; trial < 3000; ++trial) {
    const int requests = std::uniform_int_distribution<int>(1, trial % 10 == 0 ? 4096 : 300)(rng);
    const int parts = std::uniform_int_distribution<int>(1, 132)(rng);
    const int overhead = trial % 2 ? 5 : 3;
    const int shape = trial % 4;
    const int longest = std::uniform_int_distribution<int>(1, 600)(rng);
    std::vector<int> units(requests);
    for (int& u : units) {
      if (shape == 0) u = longest;                                                  // equal
      else if (shape == 1) u = std::uniform_int_distribution<int>(1, longest)(rng);  // uniform
      else if (shape == 2) u = std::uniform_int_distribution<int>(0, 9)(rng) ? 1 : longest;  // mostly empty
      else u = std::uniform_int_distribution<int>(longest / 2 + 1, longest)(rng);    // near-equal
    }
    expect_same_parts(units, overhead, parts, "trial " + std::to_string(trial));
    if (HasFatalFailure()) return;
  }
}

// Thousands of equal short requests (the sparse decode rows of b 1024-4096 at topk 64-256) on every
// part count: the chains cross many requests per part and most stop in a fixed cost.
TEST(GreedyWalk, ManyShortRequestsEveryPartCount) {
  for (int requests : {1024, 2048, 3000, 4096})
    for (int units = 1; units <= 4; ++units)
      for (int overhead : {3, 5})
        for (int parts = 1; parts <= 132; ++parts) {
          expect_same_parts(std::vector<int>(requests, units), overhead, parts,
                            std::to_string(requests) + " x " + std::to_string(units) + " units");
          if (HasFatalFailure()) return;
        }
}

}  // namespace
