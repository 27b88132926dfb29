// The sparse decode test cases: a pairwise covering list over every axis of the contract, the
// named edge cases and the sanitizer subset. Pure host code with no CUDA calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "pairwise.h"
#include "sparse_decode_harness.h"

namespace hmla_test {

// ------------------------------------------------------------------------------ the grid
// Every value of every axis below and every pair of values of two axes appears in at least one
// case (extra_topk and extra_topk_length only count in cases with an extra cache).
inline std::vector<SparseCase> sparse_pairwise_cases() {
  using hmla::SparseCacheLayout;
  const SparseCacheLayout layouts[] = {SparseCacheLayout::kV32, SparseCacheLayout::kModel1};
  const int h_qs[] = {1, 8, 16, 32, 64, 100, 128};
  const int s_qs[] = {1, 2, 4};
  const int topks[] = {1, 63, 128, 2048, 5000};
  const int batches[] = {1, 3, 128};
  const int extra_pages[] = {0, 2, 64, 128};  // 0: no extra cache
  // (every length 0 makes every query lonely and the case's other axes moot: that is covered by
  // the named edge cases instead; kMixed holds 0, 1, topk and random lengths)
  const LengthMode lengths[] = {LengthMode::kOff, LengthMode::kMixed, LengthMode::kFull};
  const SinkMode sinks[] = {SinkMode::kNone, SinkMode::kFinite, SinkMode::kNegInf,
                            SinkMode::kPosInf, SinkMode::kMixed};
  const int pages[] = {64, 256, 53};
  const InvalidMode invalids[] = {InvalidMode::kNone, InvalidMode::kSome,
                                  InvalidMode::kThirtyPercent, InvalidMode::kRowsAllInvalid};
  // 0.03 instead of the default 1/sqrt(d_qk) = 0.042 (V3.2) or 0.044 (V4): a kernel that ignores
  // it is off by 30 % in every score. Not larger: see kSparseTolerance on V3.2's score error.
  const float scales[] = {0.f, 0.03f};
  const int num_sms[] = {0, 1, 3, 8};
  const int extra_topks[] = {1, 64, 200};
  const LengthMode extra_lengths[] = {LengthMode::kOff, LengthMode::kMixed, LengthMode::kZero};
  enum {
    kLayout,
    kHq,
    kSq,
    kTopk,
    kBatch,
    kExtra,
    kLength,
    kSink,
    kPage,
    kInvalid,
    kDup,
    kStrided,
    kScale,
    kSms,
    kSlack,
    kExtraTopk,
    kExtraLength
  };
  const std::vector<PairwiseAxis> axes = {{"layout", 2},
                                          {"h_q", 7},
                                          {"s_q", 3},
                                          {"topk", 5},
                                          {"batch", 3},
                                          {"extra", 4},
                                          {"length", 3},
                                          {"sink", 5},
                                          {"page", 3},
                                          {"invalid", 4},
                                          {"dup", 2},
                                          {"strided", 2},
                                          {"scale", 2},
                                          {"sms", 4},
                                          {"slack", 2},
                                          {"extra_topk", 3, kExtra},
                                          {"extra_length", 3, kExtra}};
  std::vector<SparseCase> cases;
  for (const std::vector<int>& r : pairwise_rows(axes, hash_string("sparse-pairwise"))) {
    SparseCase c;
    c.layout = layouts[r[kLayout]];
    c.h_q = h_qs[r[kHq]];
    c.s_q = s_qs[r[kSq]];
    c.topk = topks[r[kTopk]];
    c.batch = batches[r[kBatch]];
    c.extra = extra_pages[r[kExtra]] != 0;
    c.topk_length = lengths[r[kLength]];
    c.sink = sinks[r[kSink]];
    c.page_size = pages[r[kPage]];
    c.invalid = invalids[r[kInvalid]];
    c.duplicates = r[kDup] != 0;
    c.strided = r[kStrided] != 0;
    c.softmax_scale = scales[r[kScale]];
    c.num_sms = num_sms[r[kSms]];
    c.workspace_slack = r[kSlack] ? (size_t{1} << 20) + 4096 : 0;
    std::string name = std::string(c.layout == SparseCacheLayout::kV32 ? "V32" : "MODEL1") + "_b" +
                       std::to_string(c.batch) + "_sq" + std::to_string(c.s_q) + "_hq" +
                       std::to_string(c.h_q) + "_topk" + std::to_string(c.topk) + "_page" +
                       std::to_string(c.page_size);
    if (c.extra) {
      c.extra_page_size = extra_pages[r[kExtra]];
      c.extra_topk = extra_topks[r[kExtraTopk]];
      c.extra_topk_length = extra_lengths[r[kExtraLength]];
      name += "_extra" + std::to_string(c.extra_topk) + "page" + std::to_string(c.extra_page_size);
      if (c.extra_topk_length != LengthMode::kOff)
        name += std::string("xlen") + length_mode_name(c.extra_topk_length);
    }
    if (c.topk_length != LengthMode::kOff)
      name += std::string("_len") + length_mode_name(c.topk_length);
    if (c.sink != SinkMode::kNone) name += std::string("_sink") + sink_mode_name(c.sink);
    if (c.invalid != InvalidMode::kNone)
      name += std::string("_invalid") + invalid_mode_name(c.invalid);
    if (c.duplicates) name += "_dup";
    if (c.strided) name += "_strided";
    if (c.softmax_scale != 0.f) name += "_scale0p03";
    if (c.num_sms != 0) name += "_sms" + std::to_string(c.num_sms);
    if (c.workspace_slack != 0) name += "_bigws";
    c.name = name + "_" + std::to_string(cases.size());  // the index keeps names unique
    c.grid_case = true;
    cases.push_back(std::move(c));
  }
  return cases;
}

inline SparseCase sparse_case(const std::string& name, hmla::SparseCacheLayout layout, int batch,
                              int s_q, int h_q, int topk, int page_size = 64) {
  SparseCase c;
  c.name = name;
  c.layout = layout;
  c.batch = batch;
  c.s_q = s_q;
  c.h_q = h_q;
  c.topk = topk;
  c.page_size = page_size;
  return c;
}

inline SparseCase with_extra(SparseCase c, int page_size, int extra_topk,
                             LengthMode lengths = LengthMode::kOff) {
  c.extra = true;
  c.extra_page_size = page_size;
  c.extra_topk = extra_topk;
  c.extra_topk_length = lengths;
  return c;
}

// ------------------------------------------------------------------------------ edge cases
// Names say what each one is for.
inline std::vector<SparseCase> sparse_edge_cases() {
  using hmla::SparseCacheLayout;
  const SparseCacheLayout v32 = SparseCacheLayout::kV32, m1 = SparseCacheLayout::kModel1;
  std::vector<SparseCase> v;
  auto add = [&](SparseCase c) { v.push_back(std::move(c)); };

  // ---- one query, a 32768-entry list: split-K over the whole GPU and over a few SMs
  for (SparseCacheLayout l : {v32, m1}) {
    const std::string ln = l == v32 ? "V32" : "MODEL1";
    add(sparse_case("SplitK_" + ln + "_b1_sq1_hq128_topk32768", l, 1, 1, 128, 32768));
    SparseCase c =
        sparse_case("SplitK_" + ln + "_b1_sq2_hq64_topk32768_sms3_sink", l, 1, 2, 64, 32768);
    c.num_sms = 3;
    c.sink = SinkMode::kMixed;
    add(c);
    c = with_extra(sparse_case("SplitK_" + ln + "_b1_sq1_hq16_topk32768_extra2048_invalid30", l, 1,
                               1, 16, 32768),
                   64, 2048);
    c.invalid = InvalidMode::kThirtyPercent;
    c.topk_length = LengthMode::kMixed;
    add(c);
  }

  // ---- no valid key anywhere (out 0, lse +inf, whatever the sink)
  for (SinkMode sink : {SinkMode::kNone, SinkMode::kFinite, SinkMode::kNegInf, SinkMode::kPosInf}) {
    SparseCase c =
        sparse_case(std::string("AllInvalid_V32_b3_sq2_hq64_topk128_sink") + sink_mode_name(sink),
                    v32, 3, 2, 64, 128);
    c.invalid = InvalidMode::kAll;
    c.sink = sink;
    add(c);
  }
  {
    SparseCase c = with_extra(
        sparse_case("AllInvalid_MODEL1_b4_sq1_hq128_topk2048_extra", m1, 4, 1, 128, 2048), 2, 64);
    c.invalid = InvalidMode::kAll;
    c.num_sms = 8;
    add(c);
    c = with_extra(sparse_case("ZeroLengths_V32_b5_sq2_hq16_topk63_extra_zero", v32, 5, 2, 16, 63),
                   64, 64, LengthMode::kZero);
    c.topk_length = LengthMode::kZero;
    c.sink = SinkMode::kFinite;
    add(c);
    // only the extra list has keys
    c = with_extra(sparse_case("OnlyExtra_MODEL1_b3_sq1_hq64_topk128_mainzero", m1, 3, 1, 64, 128),
                   2, 200);
    c.topk_length = LengthMode::kZero;
    add(c);
    c = with_extra(sparse_case("OnlyMain_V32_b3_sq1_hq64_topk128_extrazero", v32, 3, 1, 64, 128),
                   128, 200, LengthMode::kZero);
    add(c);
    c = sparse_case("RowsAllInvalid_V32_b128_sq4_hq16_topk2048_sms8", v32, 128, 4, 16, 2048);
    c.invalid = InvalidMode::kRowsAllInvalid;
    c.num_sms = 8;
    c.sink = SinkMode::kFinite;
    add(c);
  }

  // ---- invalid entries of every kind, 30 %, both lists, the other cache's range included
  for (SparseCacheLayout l : {v32, m1}) {
    const std::string ln = l == v32 ? "V32" : "MODEL1";
    SparseCase c = with_extra(
        sparse_case("OutOfRange_" + ln + "_b3_sq2_hq64_topk2048_extra", l, 3, 2, 64, 2048), 2, 500);
    c.invalid = InvalidMode::kThirtyPercent;
    add(c);
    // the extra cache larger than the main one: main indices in the extra's range are invalid
    c = with_extra(
        sparse_case("OutOfRange_" + ln + "_b2_sq1_hq16_topk100_extra_larger", l, 2, 1, 16, 100), 64,
        4000);
    c.invalid = InvalidMode::kThirtyPercent;
    add(c);
  }

  // ---- duplicates (each counts twice)
  {
    SparseCase c = sparse_case("Duplicates_V32_b3_sq2_hq128_topk2048", v32, 3, 2, 128, 2048);
    c.duplicates = true;
    add(c);
    c = sparse_case("Duplicates_MODEL1_b1_sq1_hq64_topk5000_tinycache", m1, 1, 1, 64, 5000);
    c.num_blocks = 3;  // 128 attendable slots for 5000 entries: every slot many times
    add(c);
    c = with_extra(sparse_case("Duplicates_MODEL1_b4_sq1_hq16_topk128_extra", m1, 4, 1, 16, 128), 2,
                   64);
    c.duplicates = true;
    c.extra_num_blocks = 8;  // 14 slots for 64 extra entries
    add(c);
  }

  // ---- page sizes, including odd ones, and padded strides everywhere
  for (int page : {1, 53, 64, 256, 576}) {
    for (SparseCacheLayout l : {v32, m1}) {
      const std::string ln = l == v32 ? "V32" : "MODEL1";
      SparseCase c = sparse_case("Page" + std::to_string(page) + "_" + ln + "_b3_sq2_hq32_topk300",
                                 l, 3, 2, 32, 300, page);
      c.strided = page == 53;
      add(c);
    }
  }
  {
    SparseCase c = with_extra(
        sparse_case("Strided_V32_b4_sq3_hq100_topk777_page53_extra2", v32, 4, 3, 100, 777, 53), 2,
        77, LengthMode::kMixed);
    c.strided = true;
    c.topk_length = LengthMode::kMixed;
    c.sink = SinkMode::kMixed;
    add(c);
    c = with_extra(
        sparse_case("Strided_MODEL1_b2_sq4_hq8_topk64_page256_extra128", m1, 2, 4, 8, 64, 256), 128,
        128);
    c.strided = true;
    add(c);
  }

  // ---- lengths: 0, 1, topk, random, and exactly one entry
  for (SparseCacheLayout l : {v32, m1}) {
    const std::string ln = l == v32 ? "V32" : "MODEL1";
    SparseCase c =
        sparse_case("Lengths_" + ln + "_b128_sq2_hq64_topk2048_mixed", l, 128, 2, 64, 2048);
    c.topk_length = LengthMode::kMixed;
    add(c);
    c = sparse_case("Topk1_" + ln + "_b3_sq4_hq128", l, 3, 4, 128, 1);
    add(c);
    c = with_extra(
        sparse_case("Lengths_" + ln + "_b7_sq1_hq16_topk65_full_extra_mixed", l, 7, 1, 16, 65), 64,
        65, LengthMode::kMixed);
    c.topk_length = LengthMode::kFull;
    add(c);
  }

  // ---- softmax scale: default, explicit below and above it, and a sharp softmax (2.5: scores of
  // several units, the running maximum changes often) on kModel1, whose dequantised K is exact in
  // bf16 (on V3.2's float scales the score error grows with |score|: kSparseTolerance)
  {
    const struct {
      const char* name;
      hmla::SparseCacheLayout layout;
      float scale;
    } scales[] = {{"ScaleDefault_V32", v32, 0.f},
                  {"Scale0p02_V32", v32, 0.02f},
                  {"Scale0p05_V32", v32, 0.05f},
                  {"Scale2p5_MODEL1", m1, 2.5f}};
    for (const auto& sc : scales) {
      SparseCase c =
          sparse_case(std::string(sc.name) + "_b3_sq2_hq64_topk2048", sc.layout, 3, 2, 64, 2048);
      c.softmax_scale = sc.scale;
      add(c);
      c = sparse_case(std::string(sc.name) + "_b2_sq1_hq16_topk1", sc.layout, 2, 1, 16, 1);
      c.softmax_scale = sc.scale;  // one key: lse is the scaled score itself
      add(c);
    }
  }

  // ---- q and cache magnitudes far from the defaults, the softmax scale moved the other way so
  // that the scores stay those of the default cases: q up to ~1e5 (beyond fp16's 65504: the
  // kernel's power-of-two prescale of each request's Q absorbs it) and ~1e-5 (kept at full
  // precision by the same prescale), and caches of values ~1e-4 (scales near 2^-20, applied as two
  // f16 factors on V3.2: src/common/fp8_dequant.cuh)
  {
    const struct {
      const char* name;
      hmla::SparseCacheLayout layout;
      float q_amplitude, kv_amplitude;
    } magnitudes[] = {{"QHuge_MODEL1", m1, 2.5e4f, 0.1f},
                      {"QHuge_V32", v32, 2.5e4f, 0.1f},
                      {"QTiny_V32", v32, 2.5e-6f, 0.1f},
                      {"KvTiny_V32", v32, 0.25f, 1e-4f},
                      {"KvTiny_MODEL1", m1, 0.25f, 1e-4f}};
    for (const auto& mg : magnitudes) {
      SparseCase c = sparse_case(std::string(mg.name) + "_b3_sq2_hq64_topk2048", mg.layout, 3, 2, 64, 2048);
      c.q_amplitude = mg.q_amplitude;
      c.kv_amplitude = mg.kv_amplitude;
      const double d_qk = mg.layout == v32 ? 576.0 : 512.0;
      c.softmax_scale = static_cast<float>(1.0 / std::sqrt(d_qk) * (0.25 / mg.q_amplitude) * (0.1 / mg.kv_amplitude));
      add(c);
    }
  }

  // ---- plans for a few SMs (split-K over the top-k list) and a larger workspace
  for (int sms : {1, 3, 8}) {
    SparseCase c = with_extra(
        sparse_case("FewSMs" + std::to_string(sms) + "_MODEL1_b3_sq2_hq64_topk5000_extra200",
                    hmla::SparseCacheLayout::kModel1, 3, 2, 64, 5000),
        64, 200);
    c.num_sms = sms;
    c.sink = SinkMode::kFinite;
    add(c);
  }
  {
    SparseCase c = sparse_case("BigWorkspace_V32_b3_sq1_hq128_topk2048", v32, 3, 1, 128, 2048);
    c.workspace_slack = size_t{64} << 20;
    add(c);
  }

  // ---- the DeepSeek shapes: h_q 128 (V3.2) and 64 (V4), batch 128, s_q 1..2, topk 2048
  {
    SparseCase c = sparse_case("DeepSeekV32_b128_sq1_hq128_topk2048", v32, 128, 1, 128, 2048);
    add(c);
    c = with_extra(sparse_case("DeepSeekV4_b128_sq2_hq64_topk512_extra", m1, 128, 2, 64, 512), 256,
                   128, LengthMode::kMixed);
    c.topk_length = LengthMode::kMixed;
    c.sink = SinkMode::kFinite;
    add(c);
  }
  return v;
}

// ------------------------------------------------------------------------------ sanitizer subset
// Small cases for compute-sanitizer: split-K (a few SMs), extra cache, all-invalid rows,
// out-of-range indices of every kind, lengths, sinks, strides, both layouts. Every row compared.
inline std::vector<SparseCase> sparse_sanitizer_cases() {
  using hmla::SparseCacheLayout;
  const SparseCacheLayout v32 = SparseCacheLayout::kV32, m1 = SparseCacheLayout::kModel1;
  std::vector<SparseCase> v;
  v.push_back(sparse_case("V32_b1_sq1_hq16_topk64", v32, 1, 1, 16, 64));
  v.push_back(sparse_case("MODEL1_b2_sq2_hq64_topk128", m1, 2, 2, 64, 128));
  SparseCase c = sparse_case("SplitK_V32_b1_sq1_hq128_topk1000_sms1", v32, 1, 1, 128, 1000);
  c.num_sms = 1;
  v.push_back(c);
  c = sparse_case("SplitK_MODEL1_b2_sq1_hq16_topk700_sms3_sink", m1, 2, 1, 16, 700);
  c.num_sms = 3;
  c.sink = SinkMode::kMixed;
  v.push_back(c);
  c = with_extra(sparse_case("Extra_V32_b2_sq2_hq16_topk63_extra2", v32, 2, 2, 16, 63), 2, 40,
                 LengthMode::kMixed);
  v.push_back(c);
  c = with_extra(sparse_case("Extra_MODEL1_b3_sq1_hq8_topk128_extra64_sms8", m1, 3, 1, 8, 128), 64,
                 64);
  c.num_sms = 8;
  v.push_back(c);
  c = sparse_case("AllInvalid_V32_b2_sq2_hq16_topk64_sink", v32, 2, 2, 16, 64);
  c.invalid = InvalidMode::kAll;
  c.sink = SinkMode::kFinite;
  v.push_back(c);
  c = sparse_case("RowsAllInvalid_MODEL1_b3_sq2_hq32_topk200", m1, 3, 2, 32, 200);
  c.invalid = InvalidMode::kRowsAllInvalid;
  v.push_back(c);
  c = with_extra(sparse_case("OutOfRange_V32_b2_sq1_hq16_topk256_extra", v32, 2, 1, 16, 256), 64,
                 600);
  c.invalid = InvalidMode::kThirtyPercent;
  v.push_back(c);
  c = sparse_case("Lengths_MODEL1_b4_sq1_hq16_topk130_mixed_dup", m1, 4, 1, 16, 130);
  c.topk_length = LengthMode::kMixed;
  c.duplicates = true;
  v.push_back(c);
  c = with_extra(sparse_case("Strided_V32_b2_sq2_hq100_topk77_page53", v32, 2, 2, 100, 77, 53), 2,
                 20);
  c.strided = true;
  c.sink = SinkMode::kPosInf;
  v.push_back(c);
  c = sparse_case("Topk1_MODEL1_b3_sq4_hq1", m1, 3, 4, 1, 1);
  v.push_back(c);
  // Two head tiles (h_q 128): mixed lengths of both lists (requests with no tile between others),
  // parts of odd tile counts on 3 SMs; a single tile in all.
  c = with_extra(sparse_case("HeadTiles2_MODEL1_b3_sq2_hq128_topk130_extra64_sms3", m1, 3, 2, 128, 130), 64, 70,
                 LengthMode::kMixed);
  c.topk_length = LengthMode::kMixed;
  c.num_sms = 3;
  v.push_back(c);
  v.push_back(sparse_case("HeadTiles2_V32_b1_sq1_hq128_topk64", v32, 1, 1, 128, 64));
  for (auto& x : v) x.ref_budget = -1;
  return v;
}

}  // namespace hmla_test
