// Argument validation of the token-sparse decode entry points: every check of
// hmla::validate(const SparseDecodeParams&) and of the plan's checks fails with
// hmla::InvalidArgument naming the entry point, the field and the value received. Nothing is
// dereferenced, so the tests use fake (but suitably aligned) addresses.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "../../src/api/validate.h"
#include "hmla/params.h"
#include "hmla/reference.h"
#include "hmla/sparse_decode.h"
#include "hmla/sparse_prefill.h"
#include "hmla/types.h"
#include "validation_test_util.h"

namespace {

using hmla::SparseCacheLayout;
using hmla::SparseDecodeParams;
using hmla::test::Fake;
using hmla::test::ThrowsInvalid;

constexpr int kBatch = 4;
constexpr int kSQ = 2;
constexpr int kHQ = 128;
constexpr int kTopk = 2048;
constexpr int kPage = 64;
constexpr int kExtraTopk = 512;
constexpr int kExtraPage = 2;

// Contiguous tensors with FlashMLA's shapes. The caches have FlashMLA's quantiser's block strides:
// V3.2 leaves one token of padding per page, (page + 1) * 656 bytes.
SparseDecodeParams Valid(SparseCacheLayout layout = SparseCacheLayout::kV32) {
  SparseDecodeParams p;
  p.layout = layout;
  p.batch = kBatch;
  p.s_q = kSQ;
  p.h_q = kHQ;
  p.d_qk = hmla::reference::sparse_cache_d_qk(layout);
  p.d_v = 512;

  p.q = Fake<const uint16_t>(0x10000);
  p.q_head_stride = p.d_qk;
  p.q_token_stride = int64_t{kHQ} * p.d_qk;
  p.q_batch_stride = int64_t{kSQ} * kHQ * p.d_qk;

  p.cache.data = Fake<const uint8_t>(0x7f0000000000);
  p.cache.num_blocks = 1000;
  p.cache.page_size = kPage;
  p.cache.block_stride_bytes = layout == SparseCacheLayout::kV32
                                   ? int64_t{kPage + 1} * 656
                                   : hmla::reference::sparse_page_bytes(layout, kPage);
  p.indices = Fake<const int32_t>(0x20000);
  p.topk = kTopk;
  p.indices_token_stride = kTopk;
  p.indices_batch_stride = int64_t{kSQ} * kTopk;
  p.topk_length = nullptr;

  p.softmax_scale = 0.f;

  p.out = Fake<uint16_t>(0x40000);
  p.out_head_stride = 512;
  p.out_token_stride = int64_t{kHQ} * 512;
  p.out_batch_stride = int64_t{kSQ} * kHQ * 512;

  p.lse = Fake<float>(0x50000);
  p.lse_head_stride = kSQ;
  p.lse_batch_stride = int64_t{kHQ} * kSQ;
  return p;
}

// Valid() plus an extra cache with another page size, both length vectors and an attention sink.
SparseDecodeParams ValidWithExtra(SparseCacheLayout layout = SparseCacheLayout::kModel1) {
  SparseDecodeParams p = Valid(layout);
  p.topk_length = Fake<const int32_t>(0x60000);
  p.extra_cache.data = Fake<const uint8_t>(0x7e0000000000);
  p.extra_cache.num_blocks = 5000;
  p.extra_cache.page_size = kExtraPage;
  p.extra_cache.block_stride_bytes = hmla::reference::sparse_page_bytes(layout, kExtraPage);
  p.extra_indices = Fake<const int32_t>(0x70000);
  p.extra_topk = kExtraTopk;
  p.extra_indices_token_stride = kExtraTopk;
  p.extra_indices_batch_stride = int64_t{kSQ} * kExtraTopk;
  p.extra_topk_length = Fake<const int32_t>(0x80000);
  p.attn_sink = Fake<const float>(0x90000);
  return p;
}

template <class F>
SparseDecodeParams With(F mutate, SparseDecodeParams p = Valid()) {
  mutate(p);
  return p;
}

::testing::AssertionResult Rejects(const SparseDecodeParams& p, const std::string& argument,
                                   const std::string& got) {
  return ThrowsInvalid([&] { hmla::validate(p); }, "hmla::sparse_decode", argument, got);
}

constexpr uintptr_t kWorkspace = 0xa0000;

::testing::AssertionResult PlanRejects(const SparseDecodeParams& p, const void* workspace,
                                       size_t bytes, size_t required, const std::string& argument,
                                       const std::string& got) {
  return ThrowsInvalid(
      [&] { hmla::detail::validate_sparse_plan_args(p, workspace, bytes, required); },
      "hmla::sparse_decode_plan", argument, got);
}

// ------------------------------------------------------------------------------ accepted inputs

TEST(SparseValidation, AcceptsFlashMlaShapedTensors) {
  EXPECT_NO_THROW(hmla::validate(Valid(SparseCacheLayout::kV32)));
  EXPECT_NO_THROW(hmla::validate(Valid(SparseCacheLayout::kModel1)));
  EXPECT_NO_THROW(hmla::validate(ValidWithExtra(SparseCacheLayout::kModel1)));
  EXPECT_NO_THROW(hmla::validate(ValidWithExtra(SparseCacheLayout::kV32)));
  EXPECT_NO_THROW(hmla::validate(With([](SparseDecodeParams& p) { p.softmax_scale = 0.0416f; })));
}

TEST(SparseValidation, AcceptsTightPagesAndAnyPageSize) {
  for (SparseCacheLayout layout : {SparseCacheLayout::kV32, SparseCacheLayout::kModel1}) {
    for (int page : {1, 2, 61, 64, 69, 576}) {
      SparseDecodeParams p = Valid(layout);
      p.cache.page_size = page;
      p.cache.block_stride_bytes = hmla::reference::sparse_page_bytes(layout, page);
      EXPECT_NO_THROW(hmla::validate(p)) << "page_size " << page;
    }
  }
}

TEST(SparseValidation, AcceptsShapeLimits) {
  for (int h_q : {1, 16, 64, 100, 128}) {
    for (auto [batch, s_q] : {std::pair{1, 1}, std::pair{16384, 1}, std::pair{8192, 2},
                              std::pair{4096, 4}, std::pair{1, 16384}}) {
      SparseDecodeParams p = Valid();
      p.batch = batch;
      p.s_q = s_q;
      p.h_q = h_q;
      p.q_token_stride = int64_t{h_q} * 576;
      p.q_batch_stride = int64_t{s_q} * h_q * 576;
      p.indices_batch_stride = int64_t{s_q} * kTopk;
      p.out_token_stride = int64_t{h_q} * 512;
      p.out_batch_stride = int64_t{s_q} * h_q * 512;
      p.lse_head_stride = s_q;
      p.lse_batch_stride = int64_t{h_q} * s_q;
      EXPECT_NO_THROW(hmla::validate(p)) << "batch " << batch << " s_q " << s_q << " h_q " << h_q;
    }
  }
}

TEST(SparseValidation, IgnoresStridesOfExtentOneDimensionsAndAbsentExtras) {
  SparseDecodeParams p = Valid();
  p.batch = 1;
  p.s_q = 1;
  p.h_q = 1;
  p.q_batch_stride = p.q_token_stride = p.q_head_stride = 0;
  p.indices_batch_stride = p.indices_token_stride = 0;
  p.out_batch_stride = p.out_token_stride = p.out_head_stride = 0;
  p.lse_batch_stride = p.lse_head_stride = 0;
  p.cache.num_blocks = 1;
  // Without an extra cache its page geometry and extra_topk are not read.
  p.extra_topk = -5;
  p.extra_cache.page_size = -1;
  EXPECT_NO_THROW(hmla::validate(p));
}

// ------------------------------------------------------------------------------ layout and shape

TEST(SparseValidation, RejectsLayoutAndHeadDims) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.layout = static_cast<SparseCacheLayout>(7); }),
                      "layout", "SparseCacheLayout(7)"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.d_qk = 512; }), "d_qk", "512"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.d_qk = 576; }, Valid(SparseCacheLayout::kModel1)),
                      "d_qk", "576"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.d_v = 576; }), "d_v", "576"));
}

TEST(SparseValidation, RejectsShape) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.batch = 0; }), "batch", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.s_q = 0; }), "s_q", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.batch = 16385; }), "batch", "16385"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) {
                        p.batch = 32769;
                        p.s_q = 1;
                      }),
                      "batch", "32769"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) {
                        p.batch = 1;
                        p.s_q = 32769;
                      }),
                      "batch", "1 (batch * s_q = 32769"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.h_q = 0; }), "h_q", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.h_q = 129; }), "h_q", "129"));
}

TEST(SparseValidation, RequestLimitMessageSaysWhy) {
  try {
    hmla::validate(With([](SparseDecodeParams& p) {
      p.batch = 20000;
      p.s_q = 2;
    }));
    FAIL() << "did not throw";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "batch");
    EXPECT_NE(std::string(e.what()).find("batch * s_q = 40000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("<= 16384"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------ q

TEST(SparseValidation, RejectsQ) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q = nullptr; }), "q", "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q = Fake<const uint16_t>(0x10008); }), "q",
                      "0x10008"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q_batch_stride = -8; }), "q_batch_stride", "-8"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q_token_stride += 4; }), "q_token_stride",
                      std::to_string(int64_t{kHQ} * 576 + 4)));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q_head_stride = 577; }), "q_head_stride", "577"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q_head_stride = 0; }), "q_head_stride", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q_head_stride = 568; }), "q_head_stride", "568"));
  // model1 rows are 512 wide: 512 is enough there
  EXPECT_NO_THROW(hmla::validate(With([](SparseDecodeParams& p) { p.q_head_stride = 512; },
                                      Valid(SparseCacheLayout::kModel1))));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.q_token_stride = 576; }), "q_token_stride", "576"));
}

// ------------------------------------------------------------------------------ caches

TEST(SparseValidation, RejectsMainCache) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.data = nullptr; }), "cache.data", "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.data = Fake<const uint8_t>(0x7f0000000004); }),
                      "cache.data", "0x7f0000000004"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.num_blocks = 0; }), "cache.num_blocks", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.page_size = 0; }), "cache.page_size", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) {
                        p.cache.num_blocks = 33554432;  // 2^25 pages of 64 tokens: 2^31 tokens
                      }),
                      "cache.num_blocks", "33554432 (num_blocks * page_size = 2147483648 tokens)"));
  EXPECT_NO_THROW(hmla::validate(With([](SparseDecodeParams& p) {
    p.cache.num_blocks = 1;
    p.cache.page_size = std::numeric_limits<int32_t>::max();  // 2^31 - 1 tokens: the most indices reach
    p.cache.block_stride_bytes = hmla::reference::sparse_page_bytes(p.layout, p.cache.page_size);
  })));
  // one page size too small, one byte too small, not a multiple of 16
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.block_stride_bytes = 63 * 656; }),
                      "cache.block_stride_bytes", std::to_string(63 * 656)));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.block_stride_bytes = 64 * 656 + 8; }),
                      "cache.block_stride_bytes", std::to_string(64 * 656 + 8)));
  // model1: the dense 64 * 584 bytes are not enough, the page is padded to a multiple of 576
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.cache.block_stride_bytes = 64 * 584; },
                           Valid(SparseCacheLayout::kModel1)),
                      "cache.block_stride_bytes", std::to_string(64 * 584)));
  EXPECT_NO_THROW(hmla::validate(With([](SparseDecodeParams& p) { p.cache.block_stride_bytes = 64 * 656; })));
}

TEST(SparseValidation, BlockStrideMessageGivesTheLayoutsPageBytes) {
  try {
    hmla::validate(With([](SparseDecodeParams& p) { p.cache.block_stride_bytes = 0; },
                        Valid(SparseCacheLayout::kModel1)));
    FAIL() << "did not throw";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "cache.block_stride_bytes");
    EXPECT_NE(std::string(e.what()).find(">= 37440"), std::string::npos) << e.what();
  }
}

TEST(SparseValidation, RejectsExtraCache) {
  const SparseDecodeParams extra = ValidWithExtra();
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_cache.data = Fake<const uint8_t>(0x7e0000000001); },
                           extra),
                      "extra_cache.data", "0x7e0000000001"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_cache.num_blocks = 0; }, extra),
                      "extra_cache.num_blocks", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_cache.page_size = -2; }, extra),
                      "extra_cache.page_size", "-2"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_cache.num_blocks = 1073741824; }, extra),
                      "extra_cache.num_blocks", "1073741824"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_cache.block_stride_bytes = 576; }, extra),
                      "extra_cache.block_stride_bytes", "576"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices = nullptr; }, extra), "extra_indices",
                      "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices = Fake<const int32_t>(0x70002); }, extra),
                      "extra_indices", "0x70002"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_topk = 0; }, extra), "extra_topk", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices_batch_stride = -1; }, extra),
                      "extra_indices_batch_stride", "-1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices_token_stride = -1; }, extra),
                      "extra_indices_token_stride", "-1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices_token_stride = kExtraTopk - 1; }, extra),
                      "extra_indices_token_stride", std::to_string(kExtraTopk - 1)));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices_batch_stride = kExtraTopk; }, extra),
                      "extra_indices_batch_stride", std::to_string(kExtraTopk)));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_topk_length = Fake<const int32_t>(0x80001); },
                           extra),
                      "extra_topk_length", "0x80001"));
}

TEST(SparseValidation, RejectsExtraListsWithoutExtraCache) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_indices = Fake<const int32_t>(0x70000); }),
                      "extra_indices", "0x70000"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.extra_topk_length = Fake<const int32_t>(0x80000); }),
                      "extra_topk_length", "0x80000"));
  try {
    hmla::validate(With([](SparseDecodeParams& p) { p.extra_indices = Fake<const int32_t>(0x70000); }));
    FAIL() << "did not throw";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("given without extra_cache.data"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------ index lists

TEST(SparseValidation, RejectsIndices) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.indices = nullptr; }), "indices", "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.indices = Fake<const int32_t>(0x20002); }), "indices",
                      "0x20002"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.topk = 0; }), "topk", "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.indices_batch_stride = -1; }), "indices_batch_stride",
                      "-1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.indices_token_stride = -1; }), "indices_token_stride",
                      "-1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.indices_token_stride = 0; }), "indices_token_stride",
                      "0"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.indices_batch_stride = kTopk; }), "indices_batch_stride",
                      std::to_string(kTopk)));
  // [batch, s_q, topk] stored as [s_q, batch, topk] is fine
  EXPECT_NO_THROW(hmla::validate(With([](SparseDecodeParams& p) {
    p.indices_batch_stride = kTopk;
    p.indices_token_stride = int64_t{kBatch} * kTopk;
  })));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.topk_length = Fake<const int32_t>(0x60003); }),
                      "topk_length", "0x60003"));
}

// ------------------------------------------------------------------------------ sink, scale, outputs

TEST(SparseValidation, RejectsAttnSinkAndSoftmaxScale) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.attn_sink = Fake<const float>(0x90002); }), "attn_sink",
                      "0x90002"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.softmax_scale = -0.1f; }), "softmax_scale", "-0.1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.softmax_scale = NAN; }), "softmax_scale", "nan"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.softmax_scale = INFINITY; }), "softmax_scale", "inf"));
}

TEST(SparseValidation, RejectsOut) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.out = nullptr; }), "out", "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.out = Fake<uint16_t>(0x40004); }), "out", "0x40004"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.out_batch_stride = -512; }), "out_batch_stride", "-512"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.out_token_stride = 100; }), "out_token_stride", "100"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.out_head_stride = 504; }), "out_head_stride", "504"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.out_batch_stride = int64_t{kHQ} * 512; }),
                      "out_batch_stride", std::to_string(kHQ * 512)));
}

TEST(SparseValidation, RejectsLse) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.lse = nullptr; }), "lse", "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.lse = Fake<float>(0x50002); }), "lse", "0x50002"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.lse_batch_stride = -1; }), "lse_batch_stride", "-1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.lse_head_stride = -1; }), "lse_head_stride", "-1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.lse_head_stride = 1; }), "lse_head_stride", "1"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) { p.lse_batch_stride = kSQ; }), "lse_batch_stride",
                      std::to_string(kSQ)));
}

// The first failing check wins: a null q is reported before a broken cache or output.
TEST(SparseValidation, ReportsTheFirstProblem) {
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) {
                        p.q = nullptr;
                        p.cache.data = nullptr;
                        p.out = nullptr;
                      }),
                      "q", "null"));
  EXPECT_TRUE(Rejects(With([](SparseDecodeParams& p) {
                        p.h_q = 0;
                        p.q = nullptr;
                      }),
                      "h_q", "0"));
}

// ------------------------------------------------------------------------------ the plan's checks

TEST(SparsePlanValidation, AcceptsValidArguments) {
  const void* ws = Fake<const void>(kWorkspace);
  EXPECT_NO_THROW(hmla::detail::validate_sparse_plan_args(Valid(), ws, 4096, 4096));
  EXPECT_NO_THROW(hmla::detail::validate_sparse_plan_args(ValidWithExtra(), ws, size_t{1} << 30, 123456));
  // The plan reads nothing but the shape, topk, the lengths and the extra cache's presence.
  SparseDecodeParams only_plan_fields;
  only_plan_fields.batch = 3;
  only_plan_fields.s_q = 1;
  only_plan_fields.h_q = 16;
  only_plan_fields.topk = 64;
  EXPECT_NO_THROW(hmla::detail::validate_sparse_plan_args(only_plan_fields, ws, 0, 0));
}

TEST(SparsePlanValidation, RejectsEachArgument) {
  const void* ws = Fake<const void>(kWorkspace);
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.batch = 0; }), ws, 4096, 4096, "batch", "0"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.s_q = 0; }), ws, 4096, 4096, "s_q", "0"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.s_q = 8193; }), ws, 4096, 4096, "batch",
                          "4 (batch * s_q = 32772"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.h_q = 200; }), ws, 4096, 4096, "h_q", "200"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.topk = 0; }), ws, 4096, 4096, "topk", "0"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.topk_length = Fake<const int32_t>(0x60001); }), ws,
                          4096, 4096, "topk_length", "0x60001"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.extra_topk = 0; }, ValidWithExtra()), ws, 4096, 4096,
                          "extra_topk", "0"));
  EXPECT_TRUE(PlanRejects(
      With([](SparseDecodeParams& p) { p.extra_topk_length = Fake<const int32_t>(0x80002); }, ValidWithExtra()), ws,
      4096, 4096, "extra_topk_length", "0x80002"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.extra_topk_length = Fake<const int32_t>(0x80000); }),
                          ws, 4096, 4096, "extra_topk_length", "0x80000"));
  EXPECT_TRUE(PlanRejects(With([](SparseDecodeParams& p) { p.extra_indices = Fake<const int32_t>(0x70000); }), ws,
                          4096, 4096, "extra_indices", "0x70000"));
  EXPECT_TRUE(PlanRejects(Valid(), nullptr, 4096, 4096, "workspace", "null"));
  EXPECT_TRUE(PlanRejects(Valid(), Fake<const void>(kWorkspace + 8), 4096, 4096, "workspace",
                          "0xa0008"));
  EXPECT_TRUE(PlanRejects(Valid(), ws, 4095, 4096, "workspace_bytes", "4095"));
}

TEST(SparsePlanValidation, WorkspaceMessageGivesTheRequiredSize) {
  try {
    hmla::detail::validate_sparse_plan_args(Valid(), Fake<const void>(kWorkspace), 1000, 987654);
    FAIL() << "did not throw";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "workspace_bytes");
    EXPECT_NE(std::string(e.what()).find(">= 987654 bytes"), std::string::npos) << e.what();
  }
}

TEST(SparsePlanValidation, ShapeChecksNameTheirEntryPoint) {
  EXPECT_TRUE(ThrowsInvalid([] { hmla::detail::validate_sparse_plan_shape("hmla::x", 4, 1, 129); }, "hmla::x",
                            "h_q", "129"));
  EXPECT_NO_THROW(hmla::detail::validate_sparse_plan_shape("hmla::x", 16384, 1, 128));
  EXPECT_EQ(hmla::detail::kMaxSparseRequests, 16384);
}

// sparse_decode_schedule rebuilds what sparse_decode_plan returns from the shape alone (fake workspace:
// nothing is read).
TEST(SparsePlanValidation, ScheduleWithoutPlanningLiesInTheWorkspace) {
  void* ws = reinterpret_cast<void*>(kWorkspace);
  const size_t bytes = hmla::sparse_decode_workspace_bytes(128, 2, 16, 132);
  const hmla::DecodeSchedule s = hmla::sparse_decode_schedule(128, 2, 16, ws, bytes, 132);
  EXPECT_EQ(s.batch, 128);
  EXPECT_EQ(s.s_q, 2);
  EXPECT_EQ(s.h_q, 16);
  EXPECT_EQ(s.h_kv, 1);
  EXPECT_EQ(s.num_m_blocks, 1);
  EXPECT_EQ(s.num_sm_parts, 132);
  const auto* begin = static_cast<const char*>(ws);
  EXPECT_GE(reinterpret_cast<const char*>(s.tile_metadata), begin);
  EXPECT_LT(static_cast<const char*>(s.o_accum), begin + bytes);
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::sparse_decode_schedule(128, 2, 16, ws, bytes - 1, 132); },
                            "hmla::sparse_decode_schedule", "workspace_bytes", std::to_string(bytes - 1)));
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::sparse_decode_schedule(128, 2, 129, ws, bytes, 132); },
                            "hmla::sparse_decode_schedule", "h_q", "129"));
}

// ------------------------------------------------------------------------------ sparse prefill

hmla::SparsePrefillParams ValidPrefill() {
  hmla::SparsePrefillParams p;
  p.s_q = 100;
  p.s_kv = 4096;
  p.h_q = 64;
  p.d_qk = 576;
  p.q = Fake<const uint16_t>(0x100000);
  p.q_token_stride = 64 * 576;
  p.q_head_stride = 576;
  p.kv = Fake<const uint16_t>(0x200000);
  p.kv_token_stride = 576;
  p.indices = Fake<const int32_t>(0x300000);
  p.topk = 2048;
  p.indices_token_stride = 2048;
  p.out = Fake<uint16_t>(0x400000);
  p.out_token_stride = 64 * 512;
  p.out_head_stride = 512;
  p.max_logits = Fake<float>(0x500000);
  p.lse = Fake<float>(0x600000);
  return p;
}

::testing::AssertionResult PrefillRejects(const std::function<void(hmla::SparsePrefillParams&)>& edit,
                                          const std::string& argument, const std::string& got) {
  hmla::SparsePrefillParams p = ValidPrefill();
  edit(p);
  return ThrowsInvalid([&] { hmla::validate(p); }, "hmla::sparse_prefill", argument, got);
}

TEST(SparsePrefillValidation, AcceptsFlashMlaShapedTensors) {
  EXPECT_NO_THROW(hmla::validate(ValidPrefill()));
  hmla::SparsePrefillParams p = ValidPrefill();
  p.d_qk = 512;
  p.q_token_stride = 64 * 512;
  p.q_head_stride = 512;
  p.kv_token_stride = 520;  // padded rows
  p.h_q = 1;
  p.topk = 1;
  EXPECT_NO_THROW(hmla::validate(p));
}

TEST(SparsePrefillValidation, RejectsEachArgument) {
  using P = hmla::SparsePrefillParams;
  EXPECT_TRUE(PrefillRejects([](P& p) { p.s_q = 0; }, "s_q", "0"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.s_kv = 0; }, "s_kv", "0"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.h_q = 129; }, "h_q", "129"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.d_qk = 448; }, "d_qk", "448"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.d_v = 448; }, "d_v", "448"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.q = nullptr; }, "q", "null"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.q_head_stride = 100; }, "q_head_stride", "100"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.kv = Fake<const uint16_t>(0x200008); }, "kv", "0x200008"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.kv_token_stride = 512; }, "kv_token_stride", "512"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.indices = nullptr; }, "indices", "null"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.topk = 0; }, "topk", "0"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.topk_length = Fake<const int32_t>(0x700002); }, "topk_length", "0x700002"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.attn_sink = Fake<const float>(0x700002); }, "attn_sink", "0x700002"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.softmax_scale = -1.f; }, "softmax_scale", "-1"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.out = nullptr; }, "out", "null"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.max_logits = nullptr; }, "max_logits", "null"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.lse = Fake<float>(0x600002); }, "lse", "0x600002"));
  // The workspace's size needs the device's SM count: checked on the GPU (tests/gpu/test_sparse_prefill.cu).
  EXPECT_TRUE(PrefillRejects([](P& p) { p.workspace = Fake<void>(0x800080); }, "workspace", "0x800080"));
}

// The other kind of bad value of the same arguments (docs/API.md, "Bad inputs", sparse prefill).
TEST(SparsePrefillValidation, RejectsEachKindOfBadValue) {
  using P = hmla::SparsePrefillParams;
  EXPECT_TRUE(PrefillRejects([](P& p) { p.s_q = 2147483647; p.h_q = 128; }, "s_q", "2147483647"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.q = Fake<const uint16_t>(0x100008); }, "q", "0x100008"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.q_head_stride = 512; }, "q_head_stride", "512"));  // rows overlap
  EXPECT_TRUE(PrefillRejects([](P& p) { p.kv = nullptr; }, "kv", "null"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.kv_token_stride = 577; }, "kv_token_stride", "577"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.indices = Fake<const int32_t>(0x300002); }, "indices", "0x300002"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.indices_token_stride = -1; }, "indices_token_stride", "-1"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.indices_token_stride = 100; }, "indices_token_stride", "100"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.out = Fake<uint16_t>(0x400008); }, "out", "0x400008"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.out_head_stride = 100; }, "out_head_stride", "100"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.out_head_stride = 256; }, "out_head_stride", "256"));  // rows overlap
  EXPECT_TRUE(PrefillRejects([](P& p) { p.max_logits = Fake<float>(0x500002); }, "max_logits", "0x500002"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.lse = nullptr; }, "lse", "null"));
}

// The batched form: three device arrays of num_seqs (+ 1) int32 values.
hmla::SparsePrefillParams ValidBatchedPrefill() {
  hmla::SparsePrefillParams p = ValidPrefill();
  p.num_seqs = 3;
  p.cu_seqlens_q = Fake<const int32_t>(0x800000);
  p.seq_kv_offset = Fake<const int32_t>(0x810000);
  p.seq_kv_len = Fake<const int32_t>(0x820000);
  return p;
}

::testing::AssertionResult BatchedPrefillRejects(const std::function<void(hmla::SparsePrefillParams&)>& edit,
                                                 const std::string& argument, const std::string& got) {
  hmla::SparsePrefillParams p = ValidBatchedPrefill();
  edit(p);
  return ThrowsInvalid([&] { hmla::validate(p); }, "hmla::sparse_prefill", argument, got);
}

TEST(SparsePrefillValidation, AcceptsTheBatchedForm) {
  EXPECT_NO_THROW(hmla::validate(ValidBatchedPrefill()));
  hmla::SparsePrefillParams p = ValidBatchedPrefill();
  p.num_seqs = p.s_q;  // one token per sequence
  EXPECT_NO_THROW(hmla::validate(p));
  p.num_seqs = 1;
  EXPECT_NO_THROW(hmla::validate(p));
}

TEST(SparsePrefillValidation, RejectsEachBatchedFormArgument) {
  using P = hmla::SparsePrefillParams;
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.num_seqs = -1; }, "num_seqs", "-1"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.num_seqs = p.s_q + 1; }, "num_seqs", "101"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.cu_seqlens_q = nullptr; }, "cu_seqlens_q", "null"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.cu_seqlens_q = Fake<const int32_t>(0x800002); }, "cu_seqlens_q",
                                    "0x800002"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.seq_kv_offset = nullptr; }, "seq_kv_offset", "null"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.seq_kv_offset = Fake<const int32_t>(0x810001); }, "seq_kv_offset",
                                    "0x810001"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.seq_kv_len = nullptr; }, "seq_kv_len", "null"));
  EXPECT_TRUE(BatchedPrefillRejects([](P& p) { p.seq_kv_len = Fake<const int32_t>(0x820003); }, "seq_kv_len",
                                    "0x820003"));
  // An array without num_seqs: the call would silently be the flat form.
  EXPECT_TRUE(PrefillRejects([](P& p) { p.cu_seqlens_q = Fake<const int32_t>(0x800000); }, "cu_seqlens_q",
                             "0x800000"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.seq_kv_offset = Fake<const int32_t>(0x810000); }, "seq_kv_offset",
                             "0x810000"));
  EXPECT_TRUE(PrefillRejects([](P& p) { p.seq_kv_len = Fake<const int32_t>(0x820000); }, "seq_kv_len",
                             "0x820000"));
}

TEST(SparsePrefillValidation, BatchedFormMessagesSayWhatIsExpected) {
  hmla::SparsePrefillParams p = ValidBatchedPrefill();
  p.num_seqs = 101;
  try {
    hmla::validate(p);
    FAIL() << "num_seqs > s_q accepted";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expected <= s_q = 100"), std::string::npos) << e.what();
  }
  p = ValidPrefill();
  p.seq_kv_len = Fake<const int32_t>(0x820000);
  try {
    hmla::validate(p);
    FAIL() << "seq_kv_len without num_seqs accepted";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expected null (num_seqs is 0"), std::string::npos) << e.what();
  }
}

}  // namespace
