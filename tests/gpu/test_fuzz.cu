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
//  * SparsePrefillFuzz.RandomCasesMatchReference [*Fuzz*] is in test_sparse_prefill.cu.
// Case i of seed S is a pure function of (S, i); the driver and its environment (seed, one case,
// case count, seconds per family) are tests/gpu/fuzz.h's.
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
#include "fuzz.h"
#include "gpu_test_util.h"
#include "harness_common.h"
#include "sparse_decode_cases.h"
#include "sparse_decode_harness.h"

namespace hmla_test {
namespace {

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
