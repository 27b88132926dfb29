// Dense decode with hostile data: NaN in q or in the cache, and the device-side values the host
// cannot check (cache_seqlens and block-table entries out of range), against the CPU reference.
//
//  * DenseDecodeNaN [*DenseDecodeNaN*]: a NaN in one q element makes exactly that (request, token,
//      head) row NaN (every out element and its lse); a NaN in an attended cache row makes exactly
//      the rows of the queries that attend it NaN (all heads of its kv head; with causal, a RoPE
//      column of the last key reaches only the last token); a NaN in a slot no query attends (past
//      cache_seqlens within the request's pages, and the cache's spare pages, which are NaN in
//      every test) changes nothing. Each on the unsplit path (a plan for 1 SM: one part holds
//      every request) and the split path (a plan for 6 SMs: the long request is cut into pieces
//      and merged by the combine), both dtypes, causal and not. Every other row is compared with
//      the reference as in every other test.
//  * DenseDecodeDeviceValuesSanitizer [*Sanitizer*]: cache_seqlens negative (-1, INT_MIN: as 0,
//      out 0 and lse +inf) or past max_blocks_per_seq * page_size (as that many keys), block-table
//      entries of attended pages negative or >= num_blocks (-1, INT_MIN, num_blocks, INT_MAX:
//      read as a page of zeros), split and unsplit. Small enough for compute-sanitizer memcheck,
//      which shows that none of them is dereferenced.
//  * DenseDecodeDeviceValues.LengthNearIntMaxIsClamped: cache_seqlens INT_MAX (the plan's and the
//      kernel's unit counts must not overflow); about 2^25 tiles of work, so not in the sanitizer
//      subset.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "dense_decode_cases.h"
#include "dense_decode_harness.h"
#include "gpu_test_util.h"

namespace hmla_test {
namespace {

struct PathSpec {
  const char* name;
  int num_sms;
};
// One SM: a single part, nothing split. Six SMs: three parts per kv head with h_kv = 2 (six with
// h_kv = 1), and the longest request (24 or more units) is cut over them, so its rows come out of
// the combine.
constexpr PathSpec kPaths[] = {{"unsplit", 1}, {"split", 6}};

DecodeCase nan_case(const std::string& what, hmla::DType dtype, bool causal, const PathSpec& path) {
  const std::string name = "NaN_" + what + "_" + hmla::dtype_name(dtype) + (causal ? "_causal" : "") + "_" + path.name;
  DecodeCase c = make_case(name, dtype, 2, 2, 16, 2, {700, 1500}, causal);
  c.capacity = {1000, 2000};  // real data past the lengths: a NaN planted there is not attended
  c.num_sms = path.num_sms;
  c.ref_budget = -1;
  return c;
}

void run_and_check(DecodeProblem& p, const std::string& what) {
  Stream s;
  ASSERT_TRUE(p.plan_and_run(s.get()));
  p.check(p.download(), what);
}

template <class Fn>
void for_each_variant(Fn fn) {
  for (const PathSpec& path : kPaths)
    for (hmla::DType dt : {hmla::DType::kBF16, hmla::DType::kFP16})
      for (bool causal : {false, true}) fn(dt, causal, path);
}

TEST(DenseDecodeNaN, NanInOneQElementMakesOnlyItsRowNaN) {
  for_each_variant([](hmla::DType dt, bool causal, const PathSpec& path) {
    DecodeProblem p(nan_case("q", dt, causal, path));
    SCOPED_TRACE(p.spec().name);
    p.plant_nan_in_q(1, 1, 5, 100);   // the long request, a NoPE column
    p.plant_nan_in_q(0, 0, 12, 570);  // the short one, a RoPE column, the second kv head
    ASSERT_TRUE(p.expects_nan(1, 1, 5) && p.expects_nan(0, 0, 12) && !p.expects_nan(1, 1, 4) &&
                !p.expects_nan(1, 0, 5));
    run_and_check(p, "NaN in q");
  });
}

TEST(DenseDecodeNaN, NanInAnAttendedCacheRowReachesTheQueriesThatAttendIt) {
  for_each_variant([](hmla::DType dt, bool causal, const PathSpec& path) {
    DecodeProblem p(nan_case("cache", dt, causal, path));
    SCOPED_TRACE(p.spec().name);
    p.plant_nan_in_cache(1, 500, 0, 7);  // a V column of a key every query of request 1 sees
    // A RoPE column of request 0's last key: causal, only its last token sees it.
    p.plant_nan_in_cache(0, 699, 1, 560);
    ASSERT_TRUE(p.expects_nan(1, 0, 0) && p.expects_nan(1, 1, 7) && !p.expects_nan(1, 0, 8));
    ASSERT_TRUE(p.expects_nan(0, 1, 8) && !p.expects_nan(0, 1, 7));
    ASSERT_EQ(p.expects_nan(0, 0, 8), !causal);
    run_and_check(p, "NaN in an attended cache row");
  });
}

TEST(DenseDecodeNaN, NanInUnattendedSlotsChangesNothing) {
  for_each_variant([](hmla::DType dt, bool causal, const PathSpec& path) {
    DecodeProblem p(nan_case("unattended", dt, causal, path));
    SCOPED_TRACE(p.spec().name);
    // Just past each length, in the page the last key is in and in later pages of the request;
    // V and RoPE columns, both kv heads.
    p.plant_nan_in_cache(0, 700, 0, 0);
    p.plant_nan_in_cache(0, 767, 1, 575);
    p.plant_nan_in_cache(0, 999, 0, 300);
    p.plant_nan_in_cache(1, 1500, 1, 511);
    p.plant_nan_in_cache(1, 1536, 0, 5);
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < 2; ++t)
        for (int h = 0; h < 16; ++h) ASSERT_FALSE(p.expects_nan(b, t, h));
    run_and_check(p, "NaN in unattended slots");
  });
}

TEST(DenseDecodeNaN, NanRowsFollowTheLengthsOfEachRun) {
  // The same NaN key is attended or not as cache_seqlens moves past it between runs.
  DecodeCase c = nan_case("lengths", hmla::DType::kBF16, false, kPaths[1]);
  DecodeProblem p(c);
  p.plant_nan_in_cache(1, 1600, 0, 3);
  run_and_check(p, "NaN key past the length");
  p.set_lengths({700, 1601});
  ASSERT_TRUE(p.expects_nan(1, 0, 0));
  run_and_check(p, "NaN key now attended");
}

// ------------------------------------------------------------------------------ device-side values
// Capacities in whole pages: the slots past a request's data in its last page are NaN, and a
// length past the block table's size attends up to its end.
DecodeCase device_values_case(const std::string& what, int page_size, const PathSpec& path) {
  DecodeCase c = make_case("DeviceValues_" + what + "_page" + std::to_string(page_size) + "_" + path.name,
                           hmla::DType::kBF16, 5, 2, 16, 1, {0, 1500, 512, 1, 0}, true, page_size);
  for (int keys : {1024, 2048, 512, 64, 768}) c.capacity.push_back((keys + page_size - 1) / page_size * page_size);
  c.num_sms = path.num_sms;
  c.ref_budget = -1;
  return c;
}

TEST(DenseDecodeDeviceValuesSanitizer, NegativeLengthsAreZero) {
  for (const PathSpec& path : kPaths) {
    DecodeProblem p(device_values_case("negative", 64, path));
    SCOPED_TRACE(p.spec().name);
    p.set_device_lengths_unchecked({-1, 1500, INT_MIN, 1, -64});
    ASSERT_EQ(p.lengths(), (std::vector<int>{0, 1500, 0, 1, 0}));
    run_and_check(p, "negative cache_seqlens");
  }
}

TEST(DenseDecodeDeviceValuesSanitizer, LengthsPastTheBlockTableAreClamped) {
  for (int page : {16, 64, 256}) {
    for (const PathSpec& path : kPaths) {
      DecodeProblem p(device_values_case("too_long", page, path));
      SCOPED_TRACE(p.spec().name);
      const int max_keys = p.max_blocks_per_seq() * page;
      // The entries past each request's own pages hold out-of-range ids (the harness's), so the
      // keys up to max_keys beyond the data read as zero pages.
      p.set_device_lengths_unchecked({max_keys + 1, 2 * max_keys, max_keys, 1 << 20, max_keys + 64});
      ASSERT_EQ(p.lengths(), std::vector<int>(5, max_keys));
      run_and_check(p, "cache_seqlens past max_blocks_per_seq * page_size");
    }
  }
}

TEST(DenseDecodeDeviceValuesSanitizer, OutOfRangeBlockIdsReadAsZeroPages) {
  for (int page : {16, 64}) {
    for (const PathSpec& path : kPaths) {
      DecodeProblem p(device_values_case("bad_ids", page, path));
      SCOPED_TRACE(p.spec().name);
      p.set_lengths({1024, 2043, 512, 1, 768});
      p.set_block_table_entry(0, 1, -1);
      p.set_block_table_entry(1, 0, INT_MIN);
      p.set_block_table_entry(1, 2048 / page - 1, p.num_blocks());  // its last page, partly attended
      p.set_block_table_entry(2, 1, INT_MAX);
      p.set_block_table_entry(3, 0, -7);
      run_and_check(p, "out-of-range block ids in attended pages");
    }
  }
}

TEST(DenseDecodeDeviceValues, LengthNearIntMaxIsClamped) {
  DecodeCase c = make_case("DeviceValues_int_max", hmla::DType::kBF16, 2, 1, 16, 1, {256, 100}, false);
  c.ref_budget = -1;
  DecodeProblem p(c);
  p.set_device_lengths_unchecked({INT_MAX, 100});
  ASSERT_EQ(p.lengths()[0], p.max_blocks_per_seq() * 64);
  run_and_check(p, "cache_seqlens INT_MAX");
}

}  // namespace
}  // namespace hmla_test
