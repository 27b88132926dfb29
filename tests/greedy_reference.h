// The split-KV plan's greedy partition written out from its definition, one part at a time, and
// its split-request numbering from a pass over the requests: the reference that the plan's forms are
// checked against (tests/cpu/test_greedy_walk.cpp: the host forms of src/scheduler/greedy_walk.h;
// tests/gpu/test_decode_plan.cu: the plan kernel's output).
#pragma once

#include <vector>

#include "scheduler/decode_schedule.h"
#include "scheduler/greedy_walk.h"

namespace hmla_test {

using hmla::detail::GreedyWalk;
using hmla::detail::PartMetadata;

struct Batch {
  std::vector<long long> prefix;
  int requests = 0;
  long long budget = 0, overhead = 0;
  GreedyWalk walk() const { return GreedyWalk{prefix.data(), requests, budget, overhead}; }
};

// As the plan kernel sets it up: units per request, the per-piece cost, num_sm_parts.
inline Batch make_batch(const std::vector<int>& units, int overhead, int parts) {
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
inline std::vector<PartMetadata> walk_one_at_a_time(const Batch& b, int parts) {
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
inline SplitNumbering number_by_requests(const std::vector<PartMetadata>& parts, int requests) {
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

// The per-piece cost the plan kernel chooses when none is forced (decode_scheduler.cu).
inline int plan_overhead(const std::vector<int>& units, int parts) {
  long long total = 0;
  for (int u : units) total += u;
  return total >= static_cast<long long>(hmla::detail::kLongPartTiles) * parts ? hmla::detail::kSplitOverheadUnitsLongParts
                                                                               : hmla::detail::kSplitOverheadUnits;
}

}  // namespace hmla_test
