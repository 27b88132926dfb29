// Argument validation of the dense decode entry points: every wrong shape, stride, dtype, page size
// or pointer gives hmla::InvalidArgument naming the entry point, the argument and the value received.
// validate() never dereferences a pointer, so the tests use fake (but suitably aligned) addresses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "../../src/api/validate.h"
#include "validation_test_util.h"
#include "hmla/dense_decode.h"
#include "hmla/types.h"

namespace {

using hmla::DenseDecodeParams;
using hmla::DType;
using hmla::test::Fake;
using hmla::test::ThrowsInvalid;

constexpr int kBatch = 4;
constexpr int kSQ = 2;
constexpr int kHQ = 128;
constexpr int kPage = 64;
constexpr int kMaxBlocks = 16;

// FlashMLA-shaped contiguous tensors: q [4, 2, 128, 576], k [100, 64, 1, 576], block_table [4, 16],
// out [4, 2, 128, 512], lse [4, 128, 2].
DenseDecodeParams Valid() {
  DenseDecodeParams p;
  p.dtype = DType::kBF16;
  p.batch = kBatch;
  p.s_q = kSQ;
  p.h_q = kHQ;
  p.h_kv = 1;
  p.d_qk = 576;
  p.d_v = 512;

  p.q = Fake<const void>(0x10000);
  p.q_head_stride = 576;
  p.q_token_stride = int64_t{kHQ} * 576;
  p.q_batch_stride = int64_t{kSQ} * kHQ * 576;

  p.k_cache = Fake<const void>(0x7f0000000000);
  p.num_blocks = 100;
  p.page_size = kPage;
  p.k_head_stride = 576;
  p.k_token_stride = 576;
  p.k_block_stride = int64_t{kPage} * 576;

  p.block_table = Fake<const int32_t>(0x20000);
  p.max_blocks_per_seq = kMaxBlocks;
  p.block_table_batch_stride = kMaxBlocks;
  p.cache_seqlens = Fake<const int32_t>(0x30000);

  p.softmax_scale = 0.f;
  p.causal = true;

  p.out = Fake<void>(0x40000);
  p.out_head_stride = 512;
  p.out_token_stride = int64_t{kHQ} * 512;
  p.out_batch_stride = int64_t{kSQ} * kHQ * 512;

  p.lse = Fake<float>(0x50000);
  p.lse_head_stride = kSQ;
  p.lse_batch_stride = int64_t{kHQ} * kSQ;
  return p;
}

template <class F>
DenseDecodeParams With(F mutate) {
  DenseDecodeParams p = Valid();
  mutate(p);
  return p;
}

::testing::AssertionResult Rejects(const DenseDecodeParams& p, const std::string& argument,
                                   const std::string& got) {
  return ThrowsInvalid([&] { hmla::validate(p); }, "hmla::dense_decode", argument, got);
}

// ------------------------------------------------------------------------------ accepted layouts

TEST(Validation, AcceptsFlashMlaShapedTensors) {
  EXPECT_NO_THROW(hmla::validate(Valid()));
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) { p.dtype = DType::kFP16; })));
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) { p.softmax_scale = 0.0416f; })));
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) { p.causal = false; })));
}

TEST(Validation, AcceptsEveryPageSize) {
  for (int page : {16, 32, 64, 128, 256}) {
    DenseDecodeParams p = Valid();
    p.page_size = page;
    p.k_block_stride = int64_t{page} * 576;
    EXPECT_NO_THROW(hmla::validate(p)) << "page_size " << page;
  }
}

TEST(Validation, AcceptsShapeLimits) {
  for (int s_q : {1, 16}) {
    for (int h_q : {1, 16, 64, 128}) {
      DenseDecodeParams p = Valid();
      p.batch = 4096;
      p.s_q = s_q;
      p.h_q = h_q;
      p.q_head_stride = 576;
      p.q_token_stride = int64_t{h_q} * 576;
      p.q_batch_stride = int64_t{s_q} * h_q * 576;
      p.out_head_stride = 512;
      p.out_token_stride = int64_t{h_q} * 512;
      p.out_batch_stride = int64_t{s_q} * h_q * 512;
      p.lse_head_stride = s_q;
      p.lse_batch_stride = int64_t{h_q} * s_q;
      EXPECT_NO_THROW(hmla::validate(p)) << "s_q " << s_q << " h_q " << h_q;
    }
  }
}

TEST(Validation, AcceptsPaddedPagesAndRows) {
  // Padding between pages, between tokens and between heads of the cache.
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.k_token_stride = 640;
    p.k_block_stride = int64_t{kPage} * 640 + 4096;
  })));
  // q sliced out of a wider buffer; out with padding per request; block_table rows padded.
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.q_head_stride = 640;
    p.q_token_stride = int64_t{kHQ} * 640;
    p.q_batch_stride = int64_t{kSQ} * kHQ * 640 + 8;
    p.out_batch_stride = int64_t{kSQ} * kHQ * 512 + 512;
    p.block_table_batch_stride = kMaxBlocks + 3;
    p.lse_head_stride = kSQ + 1;
    p.lse_batch_stride = int64_t{kHQ} * (kSQ + 1) + 7;
  })));
}

TEST(Validation, AcceptsSeveralKvHeads) {
  // k [100, 64, 8, 576] contiguous, h_q 128 = 16 query heads per kv head.
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.h_kv = 8;
    p.k_head_stride = 576;
    p.k_token_stride = 8 * 576;
    p.k_block_stride = int64_t{kPage} * 8 * 576;
  })));
  // The same cache stored head-major inside each page: [100, 8, 64, 576].
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.h_kv = 8;
    p.k_token_stride = 576;
    p.k_head_stride = int64_t{kPage} * 576;
    p.k_block_stride = int64_t{kPage} * 8 * 576;
  })));
}

TEST(Validation, AcceptsPermutedOutputs) {
  // out stored as [batch, h_q, s_q, d_v] and lse as [h_q, batch, s_q].
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.out_token_stride = 512;
    p.out_head_stride = int64_t{kSQ} * 512;
    p.out_batch_stride = int64_t{kHQ} * kSQ * 512;
    p.lse_batch_stride = kSQ;
    p.lse_head_stride = int64_t{kBatch} * kSQ;
  })));
}

TEST(Validation, IgnoresStridesOfExtentOneDimensions) {
  // batch 1 and s_q 1: the batch and token strides are never multiplied by anything but 0.
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.batch = 1;
    p.s_q = 1;
    p.q_batch_stride = 0;
    p.q_token_stride = 0;
    p.out_batch_stride = 0;
    p.out_token_stride = 0;
    p.block_table_batch_stride = 0;
    p.lse_head_stride = 1;
    p.lse_batch_stride = 0;
  })));
  // A cache of one page.
  EXPECT_NO_THROW(hmla::validate(With([](DenseDecodeParams& p) {
    p.num_blocks = 1;
    p.k_block_stride = 0;
  })));
}

// ------------------------------------------------------------------------------ dtype and shape

TEST(Validation, RejectsDtype) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.dtype = static_cast<DType>(7); }), "dtype",
                      "DType(7)"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.dtype = static_cast<DType>(-1); }), "dtype",
                      "DType(-1)"));
}

TEST(Validation, RejectsShape) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.batch = 0; }), "batch", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.batch = -3; }), "batch", "-3"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.s_q = 0; }), "s_q", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.s_q = 17; }), "s_q", "17"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.h_q = 0; }), "h_q", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.h_q = 129; }), "h_q", "129"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.h_kv = 0; }), "h_kv", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.h_kv = -1; }), "h_kv", "-1"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.h_kv = 3; }), "h_kv", "3"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.d_qk = 512; }), "d_qk", "512"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.d_v = 576; }), "d_v", "576"));
}

TEST(Validation, ShapeMessageSaysWhatIsExpected) {
  try {
    hmla::validate(With([](DenseDecodeParams& p) { p.h_kv = 3; }));
    FAIL() << "did not throw";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "hmla::dense_decode: argument 'h_kv' is 3, expected a divisor of h_q = 128");
  }
  try {
    hmla::validate(With([](DenseDecodeParams& p) { p.s_q = 17; }));
    FAIL() << "did not throw";
  } catch (const std::invalid_argument& e) {  // InvalidArgument is a std::invalid_argument
    EXPECT_STREQ(e.what(), "hmla::dense_decode: argument 's_q' is 17, expected in [1, 16]");
  }
}

// ------------------------------------------------------------------------------ q

TEST(Validation, RejectsQ) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q = nullptr; }), "q", "null"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q = Fake<const void>(0x10008); }), "q",
                      "0x10008"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_head_stride = 577; }), "q_head_stride",
                      "577"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_head_stride = -576; }), "q_head_stride",
                      "-576"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_token_stride = 4; }), "q_token_stride",
                      "4"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_batch_stride = 1001; }), "q_batch_stride",
                      "1001"));
  // Overlapping rows: heads closer than d_qk, an unset token stride, requests that overlap.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_head_stride = 568; }), "q_head_stride",
                      "568"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_token_stride = 0; }), "q_token_stride",
                      "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.q_batch_stride = int64_t{kHQ} * 576; }),
                      "q_batch_stride", std::to_string(kHQ * 576)));
}

// ------------------------------------------------------------------------------ k_cache

TEST(Validation, RejectsKCachePointerAndPages) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_cache = nullptr; }), "k_cache", "null"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_cache = Fake<const void>(0x7f0000000002); }),
                      "k_cache", "0x7f0000000002"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.num_blocks = 0; }), "num_blocks", "0"));
  for (int page : {0, -64, 1, 8, 48, 96, 512}) {
    EXPECT_TRUE(Rejects(With([&](DenseDecodeParams& p) { p.page_size = page; }), "page_size",
                        std::to_string(page)));
  }
}

TEST(Validation, RejectsKCacheStrides) {
  // TMA needs 16-byte multiples.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_head_stride = 580; }), "k_head_stride",
                      "580"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_token_stride = 580; }), "k_token_stride",
                      "580"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_block_stride = 36866; }), "k_block_stride",
                      "36866"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_block_stride = -36864; }),
                      "k_block_stride", "-36864"));
  // TMA strides are below 2^40 bytes.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_block_stride = int64_t{1} << 39; }),
                      "k_block_stride", std::to_string(int64_t{1} << 39)));
  // Overlapping rows: an unset token stride, tokens closer than d_qk, pages closer than page_size
  // tokens, an unset head stride, tokens that step over one of two heads only.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_token_stride = 0; }), "k_token_stride",
                      "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_token_stride = 512; }), "k_token_stride",
                      "512"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.k_block_stride = 63 * 576; }),
                      "k_block_stride", std::to_string(63 * 576)));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) {
                        p.h_kv = 2;
                        p.k_head_stride = 0;
                        p.k_token_stride = 2 * 576;
                        p.k_block_stride = int64_t{kPage} * 2 * 576;
                      }),
                      "k_head_stride", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) {
                        p.h_kv = 2;
                        p.k_head_stride = 576;
                        p.k_token_stride = 576;  // tokens step over one head only
                        p.k_block_stride = int64_t{kPage} * 2 * 576;
                      }),
                      "k_token_stride", "576"));
}

// ------------------------------------------------------------------------------ block table, lengths

TEST(Validation, RejectsBlockTableAndSeqlens) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.block_table = nullptr; }), "block_table",
                      "null"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.block_table = Fake<const int32_t>(0x20002); }),
                      "block_table", "0x20002"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.max_blocks_per_seq = 0; }),
                      "max_blocks_per_seq", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.block_table_batch_stride = -16; }),
                      "block_table_batch_stride", "-16"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.block_table_batch_stride = 0; }),
                      "block_table_batch_stride", "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.block_table_batch_stride = kMaxBlocks - 1; }),
                      "block_table_batch_stride", std::to_string(kMaxBlocks - 1)));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.cache_seqlens = nullptr; }), "cache_seqlens",
                      "null"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.cache_seqlens = Fake<const int32_t>(0x30001); }),
                      "cache_seqlens", "0x30001"));
}

TEST(Validation, RejectsSoftmaxScale) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.softmax_scale = -1.f; }), "softmax_scale",
                      "-1"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) {
                        p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
                      }),
                      "softmax_scale", "nan"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) {
                        p.softmax_scale = std::numeric_limits<float>::infinity();
                      }),
                      "softmax_scale", "inf"));
}

// ------------------------------------------------------------------------------ out, lse

TEST(Validation, RejectsOut) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out = nullptr; }), "out", "null"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out = Fake<void>(0x40004); }), "out",
                      "0x40004"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_head_stride = 513; }), "out_head_stride",
                      "513"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_token_stride = -8; }), "out_token_stride",
                      "-8"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_batch_stride = 12; }), "out_batch_stride",
                      "12"));
  // Overlapping rows would be a write race.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_head_stride = 0; }), "out_head_stride",
                      "0"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_head_stride = 504; }), "out_head_stride",
                      "504"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_token_stride = 512 * 64; }),
                      "out_token_stride", std::to_string(512 * 64)));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.out_batch_stride = 0; }), "out_batch_stride",
                      "0"));
}

TEST(Validation, RejectsLse) {
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse = nullptr; }), "lse", "null"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse = Fake<float>(0x50002); }), "lse",
                      "0x50002"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse_head_stride = -2; }), "lse_head_stride",
                      "-2"));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse_batch_stride = -1; }), "lse_batch_stride",
                      "-1"));
  // s_q is the contiguous dimension: heads must step over s_q floats, requests over all heads.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse_head_stride = kSQ - 1; }),
                      "lse_head_stride", std::to_string(kSQ - 1)));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse_batch_stride = int64_t{kHQ} * kSQ - 1; }),
                      "lse_batch_stride", std::to_string(kHQ * kSQ - 1)));
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) { p.lse_batch_stride = 0; }), "lse_batch_stride",
                      "0"));
}

TEST(Validation, HugeStridesDoNotWrapAround) {
  // (extent - 1) * stride beyond int64 must still be seen as overlapping the next dimension.
  EXPECT_TRUE(Rejects(With([](DenseDecodeParams& p) {
                        p.batch = 2;
                        p.lse_head_stride = int64_t{1} << 62;
                        p.lse_batch_stride = (int64_t{1} << 62) + 8;
                      }),
                      "lse_batch_stride", std::to_string((int64_t{1} << 62) + 8)));
}

// ------------------------------------------------------------------------------ plan arguments

const int32_t* const kSeqlens = Fake<const int32_t>(0x60000);
void* const kWorkspace = Fake<void>(0x70000);

::testing::AssertionResult PlanRejects(const int32_t* seqlens, int batch, int s_q, int h_q, int h_kv,
                                       const void* workspace, size_t bytes, size_t required,
                                       const std::string& argument, const std::string& got) {
  return ThrowsInvalid(
      [&] {
        hmla::detail::validate_plan_args(seqlens, batch, s_q, h_q, h_kv, workspace, bytes, required);
      },
      "hmla::dense_decode_plan", argument, got);
}

TEST(PlanValidation, AcceptsValidArguments) {
  EXPECT_NO_THROW(hmla::detail::validate_plan_args(kSeqlens, 4, 1, 128, 1, kWorkspace, 4096, 4096));
  EXPECT_NO_THROW(hmla::detail::validate_plan_args(kSeqlens, 4096, 16, 128, 8, kWorkspace,
                                                   size_t{1} << 30, 123456));
  EXPECT_NO_THROW(hmla::detail::validate_plan_args(kSeqlens, 1, 2, 16, 16, kWorkspace, 0, 0));
}

TEST(PlanValidation, RejectsEachArgument) {
  EXPECT_TRUE(PlanRejects(nullptr, 4, 1, 128, 1, kWorkspace, 4096, 4096, "cache_seqlens", "null"));
  EXPECT_TRUE(PlanRejects(Fake<const int32_t>(0x60002), 4, 1, 128, 1, kWorkspace, 4096, 4096,
                          "cache_seqlens", "0x60002"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 0, 1, 128, 1, kWorkspace, 4096, 4096, "batch", "0"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 0, 128, 1, kWorkspace, 4096, 4096, "s_q", "0"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 17, 128, 1, kWorkspace, 4096, 4096, "s_q", "17"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 0, 1, kWorkspace, 4096, 4096, "h_q", "0"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 256, 1, kWorkspace, 4096, 4096, "h_q", "256"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 128, 0, kWorkspace, 4096, 4096, "h_kv", "0"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 128, 5, kWorkspace, 4096, 4096, "h_kv", "5"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 128, 1, nullptr, 4096, 4096, "workspace", "null"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 128, 1, Fake<void>(0x70004), 4096, 4096, "workspace",
                          "0x70004"));
  EXPECT_TRUE(PlanRejects(kSeqlens, 4, 1, 128, 1, kWorkspace, 4095, 4096, "workspace_bytes", "4095"));
}

TEST(PlanValidation, WorkspaceMessageSaysTheRequiredSize) {
  try {
    hmla::detail::validate_plan_args(kSeqlens, 4, 1, 128, 1, kWorkspace, 1000, 987654);
    FAIL() << "did not throw";
  } catch (const hmla::InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "workspace_bytes");
    EXPECT_NE(std::string(e.what()).find(">= 987654 bytes"), std::string::npos) << e.what();
  }
}

TEST(PlanValidation, ShapeChecksNameTheirEntryPoint) {
  EXPECT_TRUE(ThrowsInvalid([] { hmla::detail::validate_plan_shape("hmla::x", 4, 1, 100, 3); },
                            "hmla::x", "h_kv", "3"));
  EXPECT_NO_THROW(hmla::detail::validate_plan_shape("hmla::x", 4, 1, 128, 2));
  // The plan holds one prefix sum per request in shared memory: at most kMaxPlanRequests requests.
  EXPECT_NO_THROW(hmla::detail::validate_plan_shape("hmla::x", 16384, 1, 128, 1));
  EXPECT_TRUE(ThrowsInvalid([] { hmla::detail::validate_plan_shape("hmla::x", 16385, 1, 128, 1); }, "hmla::x",
                            "batch", "16385"));
}

// The entry points' own checks, which run before any CUDA call, so they are testable here.
TEST(PlanValidation, NegativeNumSmsIsRejectedBeforeAnyDeviceQuery) {
  EXPECT_TRUE(ThrowsInvalid([] { hmla::dense_decode_workspace_bytes(4, 1, 128, 1, -1); },
                            "hmla::dense_decode_workspace_bytes", "num_sms", "-1"));
  EXPECT_TRUE(ThrowsInvalid(
      [] { hmla::dense_decode_plan(kSeqlens, 4, 1, 128, 1, kWorkspace, 4096, nullptr, -2); },
      "hmla::dense_decode_plan", "num_sms", "-2"));
}

// dense_decode_schedule rebuilds what dense_decode_plan returns from the shape alone: views inside
// the workspace, nothing read (the workspace here is a fake address).
TEST(PlanValidation, ScheduleWithoutPlanningLiesInTheWorkspace) {
  const size_t bytes = hmla::dense_decode_workspace_bytes(64, 2, 128, 1, 132);
  const hmla::DecodeSchedule s = hmla::dense_decode_schedule(64, 2, 128, 1, kWorkspace, bytes, 132);
  EXPECT_EQ(s.batch, 64);
  EXPECT_EQ(s.s_q, 2);
  EXPECT_EQ(s.h_q, 128);
  EXPECT_EQ(s.h_kv, 1);
  EXPECT_GT(s.num_sm_parts, 0);
  EXPECT_EQ(s.workspace, kWorkspace);
  const auto* begin = static_cast<const char*>(kWorkspace);
  for (const void* view : {static_cast<const void*>(s.tile_metadata), static_cast<const void*>(s.num_splits),
                           static_cast<const void*>(s.split_base), static_cast<const void*>(s.split_list),
                           static_cast<const void*>(s.lse_accum), static_cast<const void*>(s.o_accum)}) {
    EXPECT_GE(static_cast<const char*>(view), begin);
    EXPECT_LT(static_cast<const char*>(view), begin + bytes);
  }
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::dense_decode_schedule(64, 2, 128, 1, kWorkspace, bytes - 1, 132); },
                            "hmla::dense_decode_schedule", "workspace_bytes", std::to_string(bytes - 1)));
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::dense_decode_schedule(64, 2, 128, 1, nullptr, bytes, 132); },
                            "hmla::dense_decode_schedule", "workspace", "null"));
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::dense_decode_schedule(64, 2, 128, 3, kWorkspace, bytes, 132); },
                            "hmla::dense_decode_schedule", "h_kv", "3"));
  EXPECT_TRUE(ThrowsInvalid([&] { hmla::dense_decode_schedule(64, 2, 128, 1, kWorkspace, bytes, -1); },
                            "hmla::dense_decode_schedule", "num_sms", "-1"));
}

TEST(RunValidation, RejectsAnEmptySchedule) {
  EXPECT_TRUE(ThrowsInvalid([] { hmla::dense_decode_run(Valid(), hmla::DecodeSchedule{}, nullptr); },
                            "hmla::dense_decode_run", "schedule", "an empty schedule"));
}

}  // namespace
