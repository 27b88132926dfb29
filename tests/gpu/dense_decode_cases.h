// The dense decode test cases: FlashMLA's grid and the edge-case lists. Pure host code with no
// CUDA calls, so the lists can be inspected (and their reference cost estimated) anywhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dense_decode_harness.h"

namespace hmla_test {

inline DecodeCase make_case(const std::string& name, hmla::DType dtype, int batch, int s_q, int h_q,
                            int h_kv, std::vector<int> lengths, bool causal, int page_size = 64) {
  DecodeCase c;
  c.name = name;
  c.dtype = dtype;
  c.batch = batch;
  c.s_q = s_q;
  c.h_q = h_q;
  c.h_kv = h_kv;
  c.page_size = page_size;
  c.causal = causal;
  c.lengths = std::move(lengths);
  return c;
}

// Uniform lengths in [lo, hi], with every `zero_every`-th request (if > 0) forced to 0.
inline std::vector<int> uniform_lengths(int batch, int lo, int hi, uint64_t seed,
                                        int zero_every = 0) {
  Rng rng(seed);
  std::vector<int> l(batch);
  for (int r = 0; r < batch; ++r) {
    l[r] = rng.uniform_int(lo, hi);
    if (zero_every > 0 && r % zero_every == zero_every - 1) l[r] = 0;
  }
  return l;
}

// FlashMLA's varlen rule: normal(mean, mean / 2) per request, clamped at 1 here (FlashMLA clamps
// at s_q; clamping at 1 keeps the lengths, and so the cache, independent of s_q, and lets causal
// queries with no keys appear in the grid too).
inline std::vector<int> grid_lengths(int batch, int s_k, bool varlen) {
  std::vector<int> l(batch, s_k);
  if (!varlen) return l;
  Rng rng(hash_string("grid-lengths/" + std::to_string(batch) + "/" + std::to_string(s_k)));
  for (int r = 0; r < batch; ++r) {
    const double v = rng.normal() * (s_k / 2.0) + s_k;
    l[r] = std::max(1, static_cast<int>(std::lround(v)));
  }
  return l;
}

// FlashMLA's test grid (tests/test_flash_mla_dense_decoding.py): every combination of
//   dtype {bf16, fp16} x b {1, 2, 6, 64} x s_k {20, 140, 4096} x varlen {no, yes} x
//   h_kv {1, 2, 3, 8} x h_q {1, 3, 9, 63, 64, 126, 128} (h_kv | h_q) x s_q {1, 2, 4} x causal
// = 4608 cases, page 64, default softmax scale. One case in four (chosen by a hash of its name)
// uses padded q and/or padded out+lse strides. Cases with the same (dtype, b, s_k, varlen, h_kv)
// share one cache (lengths, page permutation, values); q is seeded per case.
inline std::vector<DecodeCase> flashmla_grid() {
  std::vector<DecodeCase> cases;
  const hmla::DType dtypes[] = {hmla::DType::kBF16, hmla::DType::kFP16};
  const int batches[] = {1, 2, 6, 64};
  const int s_ks[] = {20, 140, 4096};
  const int h_kvs[] = {1, 2, 3, 8};
  const int h_qs[] = {1, 3, 9, 63, 64, 126, 128};
  const int s_qs[] = {1, 2, 4};
  for (hmla::DType dt : dtypes) {
    for (int b : batches) {
      for (int s_k : s_ks) {
        for (int varlen = 0; varlen < 2; ++varlen) {
          const std::vector<int> lengths = grid_lengths(b, s_k, varlen != 0);
          for (int h_kv : h_kvs) {
            const std::string cache_name = std::string(hmla::dtype_name(dt)) + "_b" +
                                           std::to_string(b) + "_sk" + std::to_string(s_k) +
                                           (varlen ? "_varlen" : "_fixlen") + "_hkv" +
                                           std::to_string(h_kv);
            for (int h_q : h_qs) {
              if (h_q % h_kv != 0) continue;
              for (int s_q : s_qs) {
                for (int causal = 0; causal < 2; ++causal) {
                  std::string name = cache_name + "_hq" + std::to_string(h_q) + "_sq" +
                                     std::to_string(s_q) + (causal ? "_causal" : "");
                  DecodeCase c = make_case(name, dt, b, s_q, h_q, h_kv, lengths, causal != 0);
                  switch (hash_string(name) % 4) {
                    case 0:
                      break;
                    case 1:
                      c.q_layout = Layout::kPadded;
                      c.name += "_qpad";
                      break;
                    case 2:
                      c.out_layout = Layout::kPadded;
                      c.pad_lse = true;
                      c.name += "_opad";
                      break;
                    case 3:
                      c.q_layout = Layout::kPadded;
                      c.out_layout = Layout::kPadded;
                      c.pad_lse = true;
                      c.name += "_qpad_opad";
                      break;
                  }
                  c.cache_seed = hash_string("grid-cache/" + cache_name);
                  c.grid_case = true;
                  cases.push_back(std::move(c));
                }
              }
            }
          }
        }
      }
    }
  }
  return cases;
}

// Planned for 4 SMs, the request is cut into tokens 0..127 and 128..131: causal query rows 0..10
// see no key of the second piece, whose LSE is then -inf for them. In the edge and sanitizer lists.
inline DecodeCase empty_piece_case() {
  DecodeCase c = make_case("FewSMs4_b1_sq16_causal_hq4_empty_piece", hmla::DType::kBF16, 1, 16, 4, 1, {132}, true);
  c.num_sms = 4;
  return c;
}

// Edge cases beyond the grid. Names say what each one is for.
inline std::vector<DecodeCase> edge_cases() {
  using hmla::DType;
  const DType bf16 = DType::kBF16, fp16 = DType::kFP16;
  std::vector<DecodeCase> v;
  auto add = [&](DecodeCase c) { v.push_back(std::move(c)); };

  // ---- zero-length requests (some, all) and causal queries that see no key
  add(make_case("ZeroLen_some_b8_sq1_hq16", bf16, 8, 1, 16, 1, {0, 100, 0, 5, 0, 0, 3000, 0},
                false));
  add(make_case("ZeroLen_some_b8_sq4_causal_hq128", bf16, 8, 4, 128, 1,
                {0, 100, 0, 5, 0, 0, 3000, 0}, true));
  add(make_case("ZeroLen_some_b9_sq2_causal_hq64_hkv2_fp16", fp16, 9, 2, 64, 2,
                {0, 1, 2, 0, 300, 0, 64, 65, 0}, true));
  add(make_case("ZeroLen_first_last_b5_sq1_hq63_hkv3", bf16, 5, 1, 63, 3, {0, 700, 800, 900, 0},
                false));
  add(make_case("ZeroLen_all_b1_sq1_hq16", bf16, 1, 1, 16, 1, {0}, false));
  add(make_case("ZeroLen_all_b4_sq2_causal_hq128", bf16, 4, 2, 128, 1, {0, 0, 0, 0}, true));
  add(make_case("ZeroLen_all_b64_sq1_hq128_fp16", fp16, 64, 1, 128, 1, std::vector<int>(64, 0),
                false));
  add(make_case("ZeroLen_all_b6_sq4_hq9_hkv3", bf16, 6, 4, 9, 3, std::vector<int>(6, 0), false));
  add(make_case("ShorterThanSq_causal_b4_sq4_hq16", bf16, 4, 4, 16, 1, {1, 2, 3, 4}, true));
  add(make_case("ShorterThanSq_causal_b3_sq16_hq8_fp16", fp16, 3, 16, 8, 1, {1, 9, 15}, true));

  // ---- one 128K request beside 127 short ones (b = 128), and 256K
  {
    std::vector<int> l = uniform_lengths(128, 1, 300, hash_string("long128k"));
    l[37] = 131072;
    DecodeCase c = make_case("Long128K_b128_sq1_hq16", bf16, 128, 1, 16, 1, l, false);
    c.ref_budget = -1;  // every row, the long request included
    add(c);
    c = make_case("Long128K_b128_sq2_causal_hq16_fp16", fp16, 128, 2, 16, 1, l, true);
    c.ref_budget = -1;
    add(c);
    c = make_case("Long128K_b128_sq1_hq128_deepseek", bf16, 128, 1, 128, 1, l, false);
    add(c);         // sampled rows (default special budget)
    l[0] = 131072;  // the long one first, and a second long one last
    l[127] = 100000;
    c = make_case("Long128K_two_long_b128_sq1_hq16_hkv2", bf16, 128, 1, 16, 2, l, false);
    add(c);
  }
  {
    DecodeCase c = make_case("Long256K_b2_sq1_hq16", bf16, 2, 1, 16, 1, {262144, 1000}, false);
    c.ref_budget = -1;
    add(c);
    add(make_case("Long256K_b3_sq2_causal_hq128", bf16, 3, 2, 128, 1, {262144, 17, 5000}, true));
  }

  // ---- every page size, lengths around page boundaries
  for (int p : {16, 32, 64, 128, 256}) {
    const std::string ps = "Page" + std::to_string(p) + "_";
    add(make_case(ps + "b6_sq1_hq16", bf16, 6, 1, 16, 1, {1, p - 1, p, p + 1, 3 * p + 7, 1000},
                  false, p));
    add(make_case(ps + "b3_sq4_causal_hq64_hkv2", bf16, 3, 4, 64, 2, {2 * p + 3, 777, 5}, true, p));
    add(make_case(ps + "b4_sq2_hq128_fp16", fp16, 4, 2, 128, 1, {5 * p - 1, 1, 4096, 0}, false, p));
    add(make_case(ps + "b2_sq1_hq9_hkv3", bf16, 2, 1, 9, 3, {2049, 300}, false, p));
    add(make_case(ps + "b32_varlen_sq2_causal_hq16_hkv8", bf16, 32, 2, 16, 8,
                  uniform_lengths(32, 0, 2000, hash_string(ps + "v"), 9), true, p));
  }

  // ---- varlen with lengths 0..300 mixed (every 7th request 0)
  {
    auto l = uniform_lengths(64, 0, 300, hash_string("varlen0to300"), 7);
    add(make_case("Varlen0to300_b64_sq1_hq16", bf16, 64, 1, 16, 1, l, false));
    add(make_case("Varlen0to300_b64_sq4_causal_hq16", bf16, 64, 4, 16, 1, l, true));
    add(make_case("Varlen0to300_b64_sq2_causal_hq128_fp16", fp16, 64, 2, 128, 1, l, true));
    add(make_case("Varlen0to300_b64_sq1_hq64_hkv8_page16", bf16, 64, 1, 64, 8, l, false, 16));
    add(make_case("Varlen0to300_b64_sq3_causal_hq3", bf16, 64, 3, 3, 1, l, true));
    add(make_case("Varlen0to300_b64_sq1_hq126_hkv2_fp16_page256", fp16, 64, 1, 126, 2, l, false,
                  256));
  }

  // ---- s_q up to 16, with and without the causal mask
  for (int s_q : {3, 5, 8, 11, 16}) {
    for (int causal = 0; causal < 2; ++causal) {
      add(make_case("Sq" + std::to_string(s_q) + (causal ? "_causal" : "") + "_b3_hq16", bf16, 3,
                    s_q, 16, 1, {std::max(0, s_q - 1), 300, 1500}, causal != 0));
    }
  }
  add(make_case("Sq16_causal_b2_hq128", bf16, 2, 16, 128, 1, {16, 2000}, true));
  add(make_case("Sq16_causal_b3_hq64_hkv8_fp16", fp16, 3, 16, 64, 8, {5, 600, 33}, true));
  add(make_case("Sq7_causal_b4_hq126_hkv3", bf16, 4, 7, 126, 3, {7, 8, 64, 1000}, true));
  add(make_case("Sq12_b2_hq32_hkv1_fp16_page32", fp16, 2, 12, 32, 1, {4097, 12}, false, 32));

  // ---- the DeepSeek shape: h_q 128, h_kv 1
  for (int s_k : {1, 63, 64, 65, 1000, 8192, 32768}) {
    const int b = s_k >= 32768 ? 2 : 4;
    const std::string base = "DeepSeek_hq128_sk" + std::to_string(s_k) + "_b" + std::to_string(b);
    add(make_case(base + "_sq1", bf16, b, 1, 128, 1, std::vector<int>(b, s_k), false));
    add(make_case(base + "_sq2_causal", bf16, b, 2, 128, 1, std::vector<int>(b, s_k), true));
    if (s_k == 65 || s_k == 8192) {
      add(make_case(base + "_sq1_fp16", fp16, b, 1, 128, 1, std::vector<int>(b, s_k), false));
    }
  }
  add(make_case("DeepSeek_hq128_b32_varlen_sq1", bf16, 32, 1, 128, 1,
                uniform_lengths(32, 1, 9000, hash_string("ds-varlen")), false));

  // ---- batch 4096 with short lengths
  {
    DecodeCase c = make_case("Batch4096_sq1_hq16_len0to160", bf16, 4096, 1, 16, 1,
                             uniform_lengths(4096, 0, 160, hash_string("b4096a"), 11), false);
    c.ref_budget = 8e9;  // every row
    add(c);
    add(make_case("Batch4096_sq1_hq128_len1to64", bf16, 4096, 1, 128, 1,
                  uniform_lengths(4096, 1, 64, hash_string("b4096b")), false));
    add(make_case("Batch4096_sq2_causal_hq16_len0to100_fp16", fp16, 4096, 2, 16, 1,
                  uniform_lengths(4096, 0, 100, hash_string("b4096c"), 13), true));
    add(make_case("Batch4096_sq1_hq64_hkv8_len1to40", bf16, 4096, 1, 64, 8,
                  uniform_lengths(4096, 1, 40, hash_string("b4096d")), false));
  }

  // ---- arbitrary q / out / lse / block-table strides (last dim contiguous, 16-byte multiples)
  {
    DecodeCase c = make_case("Strides_qHeadMajor_outTokenMajor_b5_sq2_hq16", bf16, 5, 2, 16, 1,
                             {100, 0, 513, 64, 2000}, false);
    c.q_layout = Layout::kHeadMajor;
    c.out_layout = Layout::kTokenMajor;
    c.pad_lse = true;
    c.pad_block_table = true;
    add(c);
    c = make_case("Strides_qTokenMajor_outHeadMajor_b3_sq4_causal_hq128_fp16", fp16, 3, 4, 128, 1,
                  {4, 300, 1025}, true);
    c.q_layout = Layout::kTokenMajor;
    c.out_layout = Layout::kHeadMajor;
    c.pad_block_table = true;
    add(c);
    c = make_case("Strides_qPadded_outPadded_b7_sq1_hq63_hkv3", bf16, 7, 1, 63, 3,
                  uniform_lengths(7, 0, 3000, hash_string("strides3")), false);
    c.q_layout = Layout::kPadded;
    c.out_layout = Layout::kPadded;
    c.pad_lse = true;
    add(c);
    c = make_case("Strides_qHeadMajor_outPadded_b64_sq1_hq9", bf16, 64, 1, 9, 1,
                  uniform_lengths(64, 1, 600, hash_string("strides4")), false);
    c.q_layout = Layout::kHeadMajor;
    c.out_layout = Layout::kPadded;
    c.pad_block_table = true;
    add(c);
    c = make_case("Strides_qPadded_outTokenMajor_b2_sq16_causal_hq16_hkv2_page16", bf16, 2, 16, 16,
                  2, {40, 1111}, true, 16);
    c.q_layout = Layout::kPadded;
    c.out_layout = Layout::kTokenMajor;
    c.pad_lse = true;
    add(c);
  }

  // ---- explicit softmax scales (0 means 1/sqrt(576) everywhere else); 5.0 makes the softmax
  // sharp, so the running max changes and rescaling matters
  {
    DecodeCase c =
        make_case("Scale0p0625_b4_sq2_hq64", bf16, 4, 2, 64, 1, {50, 700, 4096, 3}, false);
    c.softmax_scale = 0.0625f;
    add(c);
    c = make_case("Scale5_b4_sq1_hq128", bf16, 4, 1, 128, 1, {50, 700, 4096, 3}, false);
    c.softmax_scale = 5.0f;
    add(c);
    c = make_case("Scale5_b3_sq4_causal_hq16_fp16", fp16, 3, 4, 16, 1, {8000, 64, 4}, true);
    c.softmax_scale = 5.0f;
    add(c);
  }
  // ---- plans for fewer SMs than the device has (the num_sms argument): small problems split the way
  // large ones split on the whole GPU (two-piece requests, a piece whose causal rows see no key)
  {
    auto few = [&](DecodeCase c, int num_sms) {
      c.num_sms = num_sms;
      add(std::move(c));
    };
    few(make_case("FewSMs12_b2_sq1_hq128_two_pieces", bf16, 2, 1, 128, 1, {740, 740}, false), 12);
    few(make_case("FewSMs24_b3_sq2_causal_hq128_fp16", fp16, 3, 2, 128, 1, {740, 740, 0}, true), 24);
    add(empty_piece_case());
    few(make_case("FewSMs4_b2_sq1_hq16", bf16, 2, 1, 16, 1, {387, 387}, false), 4);
    few(make_case("FewSMs1_b3_sq1_hq16_one_part", bf16, 3, 1, 16, 1, {100, 5000, 0}, false), 1);
    few(make_case("FewSMs7_b5_sq2_hq64_odd_parts", bf16, 5, 2, 64, 1, {1, 900, 64, 2000, 333}, false), 7);
    // Every request in two pieces, some of them ending a part while the other piece starts the next
    // part; then two-, three- and many-piece requests and an empty one in one batch.
    few(make_case("FewSMs8_b6_sq1_hq16_two_piece_requests", bf16, 6, 1, 16, 1, {1024, 1024, 1024, 1024, 1024, 1024},
                  false),
        8);
    few(make_case("FewSMs12_b6_sq1_hq16_mixed_pieces", bf16, 6, 1, 16, 1, {2560, 192, 12800, 100, 0, 2112}, false), 12);
    few(make_case("FewSMs6_b4_sq1_hq16_two_and_three_pieces", bf16, 4, 1, 16, 1, {600, 600, 0, 130}, false), 6);
    few(make_case("FewSMs24_b5_sq2_causal_hq128_fp16_mixed_pieces", fp16, 5, 2, 128, 1, {2500, 2500, 9000, 1, 2500},
                  true),
        24);
  }

  return v;
}

// Small cases for compute-sanitizer (memcheck, racecheck, initcheck, synccheck): s_k 20..300,
// b 1..4, causal and varlen, pages 64 and 16, a few head shapes, both dtypes.
inline std::vector<DecodeCase> sanitizer_cases() {
  using hmla::DType;
  std::vector<DecodeCase> v;
  v.push_back(make_case("b1_sq1_hq16_sk20_page64", DType::kBF16, 1, 1, 16, 1, {20}, false, 64));
  v.push_back(make_case("b1_sq1_hq128_sk300_page64", DType::kBF16, 1, 1, 128, 1, {300}, false, 64));
  v.push_back(make_case("b2_sq2_causal_hq16_varlen_page16", DType::kBF16, 2, 2, 16, 1, {37, 300},
                        true, 16));
  v.push_back(make_case("b4_sq1_hq64_hkv2_varlen_page64", DType::kBF16, 4, 1, 64, 2,
                        {0, 20, 129, 300}, false, 64));
  v.push_back(make_case("b3_sq4_causal_hq128_varlen_page64", DType::kBF16, 3, 4, 128, 1,
                        {2, 150, 64}, true, 64));
  v.push_back(
      make_case("b2_sq1_hq9_hkv3_fp16_page16", DType::kFP16, 2, 1, 9, 3, {140, 33}, false, 16));
  DecodeCase c = make_case("b4_sq2_causal_hq3_varlen_strided_page16", DType::kBF16, 4, 2, 3, 1,
                           {299, 1, 0, 64}, true, 16);
  c.q_layout = Layout::kPadded;
  c.out_layout = Layout::kPadded;
  c.pad_lse = true;
  c.pad_block_table = true;
  v.push_back(c);
  v.push_back(make_case("b2_sq2_causal_hq64_hkv8_fp16_page64", DType::kFP16, 2, 2, 64, 8, {200, 21},
                        true, 64));
  v.push_back(empty_piece_case());
  // Parts holding several requests: a tail tile followed by another request in the same part (one
  // part), and two- and three-piece requests beside an empty one (6 parts).
  c = make_case("FewSMs1_b3_sq1_hq16_tail_then_requests", DType::kBF16, 3, 1, 16, 1, {100, 640, 0}, false, 64);
  c.num_sms = 1;
  v.push_back(c);
  c = make_case("FewSMs6_b4_sq1_hq16_pieces_and_empty", DType::kBF16, 4, 1, 16, 1, {600, 600, 0, 130}, false, 64);
  c.num_sms = 6;
  v.push_back(c);
  for (auto& x : v) x.ref_budget = -1;
  return v;
}

}  // namespace hmla_test
