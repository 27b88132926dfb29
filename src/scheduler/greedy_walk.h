// The greedy partition of the split-KV plan (docs/DENSE_DECODE.md "Work partition"), as host and
// device code: one part at a time (GreedyWalk::step, the plan kernel's walk past
// kChainedPlanRequests) and the form whose parts the plan kernel computes in parallel (chains from
// request starts ranked by binary lifting; tests/cpu/test_greedy_walk.cpp checks that both give the
// greedy's parts).
//
// The stream of costs: request r occupies [C[r], C[r + 1]) with C the exclusive prefix of
// units + overhead; its fixed cost comes first, its units after. Part p covers [V, E) where V is
// where part p - 1 stopped and E = V + budget (less one overhead when V is inside a request: that
// piece pays the fixed cost again); a stop inside a request's fixed cost rounds down to the
// request's start.
//
// Why chains: a part that starts at a request's start is a function of that request alone, and
// after it every part starts inside a request and ends `stride` = budget - overhead further on, an
// arithmetic progression, until one ends inside a later request's fixed cost (the greedy rounds it
// down: the next part starts at that request's start) or the stream ends. So each request's chain
// (its part count and the request the next chain starts at) costs one step per request its ends
// fall in, not per part, and every chain is independent of the others. The chains reached from
// request 0 are ranked by binary lifting (log2(min(requests, parts)) rounds over all requests)
// instead of a serial pass over up to num_sm_parts heads.
#pragma once

#include <cstdint>

#include "scheduler/decode_schedule.h"

#if defined(__CUDACC__)
#define HMLA_HD __host__ __device__ __forceinline__
#else
#define HMLA_HD inline
#endif

namespace hmla::detail {

// A chain, or a chain of chains after lifting, packed in 32 bits for shared memory: the request its
// successor starts at (requests: none) and its part count (saturating at 0xffff). Chained plans
// hold at most 0xffff requests and parts.
struct ChainLink {
  HMLA_HD static uint32_t pack(int next, int parts) {
    return (static_cast<uint32_t>(next) << 16) | static_cast<uint32_t>(parts < 0xffff ? parts : 0xffff);
  }
  HMLA_HD static int next(uint32_t link) { return static_cast<int>(link >> 16); }
  HMLA_HD static int parts(uint32_t link) { return static_cast<int>(link & 0xffffu); }
  // `first` followed by `second` (second = the link of first's successor).
  HMLA_HD static uint32_t then(uint32_t first, uint32_t second) { return pack(next(second), parts(first) + parts(second)); }
};

// Levels of binary lifting a plan needs: the chains reached from request 0 start at distinct requests
// and hold at least one part each, so a descent makes at most min(requests, parts) jumps, and
// 2^levels must exceed that (one level for one request, eight for 132 parts).
HMLA_HD int lifting_levels(int requests, int num_parts) {
  const int jumps = requests < num_parts ? requests : num_parts;
  int levels = 1;
  while ((1 << levels) <= jumps) ++levels;
  return levels;
}

struct GreedyWalk {
  const long long* prefix;  // [requests + 1]
  int requests;
  long long budget;
  long long overhead;

  // Where the walk stands between two parts: `at` in the stream of costs, the request holding it
  // (requests: none left), and how many parts in a row have begun inside that request.
  struct State {
    long long at;
    int req;
    int mid_starts;
  };

  HMLA_HD long long stride() const { return budget - overhead; }
  HMLA_HD State start_of(int r) const { return State{prefix[r], r, 0}; }

  // The largest i in [from, requests] with prefix[i] <= end (prefix[from] <= end; prefix increases),
  // galloping from `from`: a part's end is usually a few requests on.
  HMLA_HD int last_start_at_or_before(long long end, int from) const {
    int lo = from, step = 1;
    while (lo + step <= requests && prefix[lo + step] <= end) {
      lo += step;
      step *= 2;
    }
    int hi = lo + step - 1 < requests ? lo + step - 1 : requests;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix[mid] <= end) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  HMLA_HD int units_of(int r) const { return static_cast<int>(prefix[r + 1] - prefix[r] - overhead); }

  // A part's first or last-plus-one position in the stream of costs.
  struct Boundary {
    long long at;
    int req;  // requests: past the end of the work
    int mid;  // inside req's units (1) or at its start (0)
  };
  HMLA_HD Boundary end_of_work() const { return Boundary{prefix[requests], requests, 0}; }

  // The part from `begin` to `end` (the next part's start); begin_split_idx is left to the caller.
  HMLA_HD PartMetadata range_between(const Boundary& begin, const Boundary& end) const {
    PartMetadata meta{};
    meta.begin_req = requests;
    meta.end_req = -1;
    if (begin.req >= requests) return meta;
    meta.begin_req = begin.req;
    meta.begin_unit = begin.mid ? static_cast<int>(begin.at - prefix[begin.req] - overhead) : 0;
    if (end.req >= requests) {
      meta.end_req = requests - 1;
      meta.end_unit = units_of(requests - 1);
    } else if (end.mid) {
      meta.end_req = end.req;
      meta.end_unit = static_cast<int>(end.at - prefix[end.req] - overhead);
    } else {
      meta.end_req = end.req - 1;
      meta.end_unit = units_of(end.req - 1);
    }
    return meta;
  }

  // One part: its metadata (the lengths left to the caller), and the walk moved past it.
  // `last_start(end, from)` is last_start_at_or_before (the plan kernel's serial walk passes a
  // 32-wide search of its warp).
  HMLA_HD PartMetadata step(State& s) const {
    return step(s, [this](long long end, int from) { return last_start_at_or_before(end, from); });
  }
  template <typename LastStart>
  HMLA_HD PartMetadata step(State& s, LastStart&& last_start) const {
    if (s.req >= requests) return range_between(end_of_work(), end_of_work());
    const bool mid = s.at > prefix[s.req];
    const Boundary begin{s.at, s.req, mid ? 1 : 0};
    const long long end = s.at + budget - (mid ? overhead : 0);
    const int last = last_start(end, s.req);
    // The stop: the end of the work, inside request `last`, or rounded down to its start.
    const Boundary stop = last >= requests                 ? end_of_work()
                          : end - prefix[last] > overhead ? Boundary{end, last, 1}
                                                          : Boundary{prefix[last], last, 0};
    PartMetadata meta = range_between(begin, stop);
    s.mid_starts = mid ? s.mid_starts + 1 : 0;
    meta.begin_split_idx = s.mid_starts;
    if (stop.req != s.req) s.mid_starts = 0;
    s.at = stop.at;
    s.req = stop.req;
    return meta;
  }

  // ---- the chained form

  // Where part k of the chain from request r's start ends (k >= 0), while the chain lasts.
  HMLA_HD long long chain_end(int r, long long k) const { return prefix[r] + budget + k * stride(); }

  // The chain that starts at request r's start: its link (the request the next chain starts at,
  // requests when the stream ends in it, and its part count). A chain longer than `cap` parts (the
  // plan's part count: from request 0 the greedy never needs more) is cut there, without successor.
  // `first_stop`: a request at or before where the chain's first part ends (the search for it starts
  // there); updated to where it ends. The first stops grow with r, so a thread that computes the
  // chains of consecutive requests passes each one's stop on as the next one's hint.
  HMLA_HD uint32_t chain_from(int r, int cap, int& first_stop) const {
    long long k = 0;
    long long end = chain_end(r, 0);
    int q = r > first_stop ? r : first_stop;
    for (;;) {
      const int parts = k + 1 < cap ? static_cast<int>(k + 1) : cap;
      if (end >= prefix[requests]) return ChainLink::pack(requests, parts);
      q = last_start_at_or_before(end, q);
      if (k == 0) first_stop = q;
      if (end - prefix[q] <= overhead) return ChainLink::pack(q, parts);
      if (k + 1 >= cap) return ChainLink::pack(requests, cap);
      // Inside q's units: the chain's parts end in q until the first end at or past q + 1's start.
      const long long steps = (prefix[q + 1] - end + stride() - 1) / stride();
      k += steps;
      end += steps * stride();
    }
  }
  HMLA_HD uint32_t chain_from(int r, int cap) const {
    int first_stop = r;
    return chain_from(r, cap, first_stop);
  }

  // Where part j of the chain from request r starts: r's start for j = 0, else the end of part j - 1,
  // inside a request (the chain goes on past it). `from`: a request at or before it.
  HMLA_HD Boundary chain_part_start(int r, int j, int from) const {
    if (j == 0) return Boundary{prefix[r], r, 0};
    const long long at = chain_end(r, j - 1);
    return Boundary{at, last_start_at_or_before(at, from), 1};
  }

  // Part j of the chain from request `head`, whose link is `link`; `next_begin_req` gets the request
  // the next part begins in (requests: none), which tells whether this part closes a split request.
  HMLA_HD PartMetadata chain_part(int head, int j, uint32_t link, int& next_begin_req) const {
    const Boundary begin = chain_part_start(head, j, head);
    const int next = ChainLink::next(link);
    const Boundary end = j + 1 < ChainLink::parts(link) ? chain_part_start(head, j + 1, begin.req)
                         : next < requests               ? Boundary{prefix[next], next, 0}
                                                         : end_of_work();
    next_begin_req = end.req;
    return part_between(begin, end, head, j);
  }
  HMLA_HD PartMetadata chain_part(int head, int j, uint32_t link) const {
    int next_begin_req;
    return chain_part(head, j, link, next_begin_req);
  }

  // The part from `begin` to `end` of the chain from request `head`, of which it is part j: parts
  // j0 .. j of the chain begin inside begin.req, j0 - 1 being the first whose end passes its start.
  HMLA_HD PartMetadata part_between(const Boundary& begin, const Boundary& end, int head, int j) const {
    PartMetadata meta = range_between(begin, end);
    if (begin.req < requests && begin.mid) {
      const long long first_end = chain_end(head, 0);
      const long long j0 = first_end > prefix[begin.req] ? 1 : (prefix[begin.req] - first_end) / stride() + 2;
      meta.begin_split_idx = static_cast<int>(j - j0 + 1);
    }
    return meta;
  }
};

// Binary lifting over the chains: levels[l * (requests + 1) + r] is the link of 2^l chains in a row
// from request r's start (levels[.. + requests] the end: no successor, no parts).
struct ChainLifting {
  const uint32_t* levels;
  int requests;
  int num_levels;

  HMLA_HD uint32_t at(int level, int r) const { return levels[level * (requests + 1) + r]; }

  // The chain from request 0 that holds part p: its start request (requests: p is past the work)
  // and its first part's index.
  HMLA_HD void chain_of_part(int p, int& head, int& first) const {
    head = 0;
    first = 0;
    for (int l = num_levels - 1; l >= 0; --l) {
      const uint32_t link = at(l, head);
      if (head < requests && first + ChainLink::parts(link) <= p) {
        first += ChainLink::parts(link);
        head = ChainLink::next(link);
      }
    }
  }
};

// Split requests are numbered from the parts: a request cut n times is begun mid-way by n parts,
// numbered 1 .. n by begin_split_idx, and the last of them closes it. Returns the request's pieces
// (1 + n) for the part that closes one, else 0. At most one request per part, so the split
// requests' slots are one scan over the parts, whatever the batch.
// `next_begin_req`: the request part p + 1 begins in (any value for the last part).
HMLA_HD int pieces_closed_by(const PartMetadata& m, int next_begin_req, int p, int num_parts, int requests) {
  if (m.begin_req >= requests || m.begin_split_idx == 0) return 0;
  const bool last = p + 1 == num_parts || next_begin_req != m.begin_req;
  return last ? 1 + m.begin_split_idx : 0;
}
HMLA_HD int pieces_closed_by(const PartMetadata* parts, int p, int num_parts, int requests) {
  return pieces_closed_by(parts[p], p + 1 < num_parts ? parts[p + 1].begin_req : requests, p, num_parts, requests);
}

}  // namespace hmla::detail

#undef HMLA_HD
