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

#include "scheduler/greedy_walk.h"

namespace {

using hmla::detail::ChainLink;
using hmla::detail::GreedyWalk;
using hmla::detail::PartMetadata;

struct Batch {
  std::vector<long long> prefix;
  int requests = 0;
  long long budget = 0, overhead = 0;
  GreedyWalk walk() const { return GreedyWalk{prefix.data(), requests, budget, overhead}; }
};

// As the plan kernel sets it up: units per request, the per-piece cost, num_sm_parts.
Batch make_batch(const std::vector<int>& units, int overhead, int parts) {
  Batch b;
  b.requests = static_cast<int>(units.size());
  b.overhead = overhead;
  b.prefix.assign(units.size() + 1, 0);
  for (size_t r = 0; r < units.size(); ++r) b.prefix[r + 1] = b.prefix[r] + units[r] + overhead;
  b.budget = (b.prefix.back() + parts - 1) / parts + overhead;
  return b;
}

// The greedy one part at a time, written out on its own (as the plan kernel walked the parts before
// the chains, with a linear search in place of its 32-wide one): the reference.
std::vector<PartMetadata> walk_one_at_a_time(const Batch& b, int parts) {
  const std::vector<long long>& c = b.prefix;
  const int requests = b.requests;
  std::vector<PartMetadata> out(parts);
  long long at = 0;
  int req = 0, mid_starts = 0;
  for (int p = 0; p < parts; ++p) {
    PartMetadata meta{};
    meta.begin_req = requests;
    meta.end_req = -1;
    if (req < requests) {
      const long long start = c[req];
      const bool mid = at > start;
      const long long end = at + b.budget - (mid ? b.overhead : 0);
      int last = req;
      while (last + 1 <= requests && c[last + 1] <= end) ++last;
      meta.begin_req = req;
      meta.begin_unit = mid ? static_cast<int>(at - start - b.overhead) : 0;
      mid_starts = mid ? mid_starts + 1 : 0;
      meta.begin_split_idx = mid_starts;
      auto units_of = [&](int r) { return static_cast<int>(c[r + 1] - c[r] - b.overhead); };
      if (last >= requests) {
        meta.end_req = requests - 1;
        meta.end_unit = units_of(requests - 1);
        at = c[requests];
        req = requests;
      } else if (end - c[last] > b.overhead) {
        meta.end_req = last;
        meta.end_unit = static_cast<int>(end - c[last] - b.overhead);
        at = end;
        req = last;
      } else {
        meta.end_req = last - 1;
        meta.end_unit = units_of(last - 1);
        at = c[last];
        req = last;
      }
      if (req != meta.begin_req) mid_starts = 0;
    }
    out[p] = meta;
  }
  return out;
}

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
// chain, the lifting levels, every part from the chain its descent finds.
std::vector<PartMetadata> walk_by_chains(const Batch& b, int parts) {
  const GreedyWalk w = b.walk();
  const int levels = hmla::detail::lifting_levels(b.requests, parts);
  const int row = b.requests + 1;
  std::vector<uint32_t> lift(static_cast<size_t>(levels) * row);
  for (int r = 0; r <= b.requests; ++r) lift[r] = r < b.requests ? w.chain_from(r, parts) : ChainLink::pack(b.requests, 0);
  for (int l = 1; l < levels; ++l)
    for (int r = 0; r <= b.requests; ++r) {
      const uint32_t first = lift[(l - 1) * row + r];
      lift[l * row + r] = ChainLink::then(first, lift[(l - 1) * row + ChainLink::next(first)]);
    }
  const hmla::detail::ChainLifting lifting{lift.data(), b.requests, levels};
  std::vector<PartMetadata> out(parts);
  for (int p = 0; p < parts; ++p) {
    int head = 0, first = 0;
    lifting.chain_of_part(p, head, first);
    PartMetadata meta{};
    meta.begin_req = b.requests;
    meta.end_req = -1;
    if (head < b.requests) meta = w.chain_part(head, p - first, lift[head]);
    out[p] = meta;
  }
  return out;
}

// The split requests' numbering (req_num_splits, req_split_base, split_list), the plan kernel's
// outputs besides the parts.
struct SplitNumbering {
  std::vector<int> num_splits, split_base, split_list;
  bool operator==(const SplitNumbering& o) const {
    return num_splits == o.num_splits && split_base == o.split_base && split_list == o.split_list;
  }
};

// Written out from the definition: a pass over the requests, in order, after the last part that
// begins mid-way in each split request recorded its piece count.
SplitNumbering number_by_requests(const std::vector<PartMetadata>& parts, int requests) {
  SplitNumbering n;
  n.num_splits.assign(requests, 1);
  const int num_parts = static_cast<int>(parts.size());
  for (int p = 0; p < num_parts; ++p) {
    const PartMetadata& m = parts[p];
    const bool last = p + 1 == num_parts || parts[p + 1].begin_req != m.begin_req;
    if (m.begin_req < requests && m.begin_split_idx > 0 && last) n.num_splits[m.begin_req] = 1 + m.begin_split_idx;
  }
  n.split_base.assign(requests, -1);
  n.split_list.assign(1, 0);
  int slot = 0;
  for (int r = 0; r < requests; ++r)
    if (n.num_splits[r] > 1) {
      n.split_base[r] = slot;
      slot += n.num_splits[r];
      n.split_list.push_back(r);
    }
  n.split_list[0] = static_cast<int>(n.split_list.size()) - 1;
  return n;
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
  for (const auto& [form, got] : {std::pair<const char*, std::vector<PartMetadata>>{"chains", walk_by_chains(b, parts)},
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
