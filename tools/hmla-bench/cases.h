// hmla-bench: the cases of each family (dense decode, sparse decode, sparse prefill, merge) and the
// named sweeps.
#pragma once

#include <string>
#include <vector>

#include "hmla/params.h"
#include "hmla/types.h"

namespace hmla_bench {

struct DenseCase {
  hmla::DType dtype = hmla::DType::kBF16;
  int b = 128;
  int s_q = 1;
  int h_q = 16;
  int h_kv = 1;
  int s_k = 8192;  // every request's length, or the nominal mean with varlen
  int page = 64;
  bool causal = false;
  bool varlen = false;
};

// The 45 dense rows of ../shared/anchors/flashmla-h200.md, in that file's order: bf16, page 64,
// h_kv 1, fixed lengths.
inline std::vector<DenseCase> dense_default_sweep() {
  std::vector<DenseCase> rows;
  const int h_qs[] = {16, 32, 64, 128};
  const int s_qs[] = {1, 2};
  const int s_ks[] = {1024, 4096, 8192, 16384, 32768};
  for (int h_q : h_qs)
    for (int s_q : s_qs)
      for (int s_k : s_ks) {
        DenseCase c;
        c.b = 128;
        c.s_q = s_q;
        c.h_q = h_q;
        c.s_k = s_k;
        rows.push_back(c);
      }
  for (int s_k : {4096, 32768}) {
    DenseCase c;
    c.b = 128;
    c.s_q = 2;
    c.h_q = 128;
    c.s_k = s_k;
    c.causal = true;
    rows.push_back(c);
  }
  for (int b : {1, 8, 32}) {
    DenseCase c;
    c.b = b;
    c.s_q = 1;
    c.h_q = 128;
    c.s_k = 8192;
    rows.push_back(c);
  }
  return rows;
}

// A handful of rows for smoke tests: one memory-bound, one compute-bound, one causal, one small
// batch (all four have anchors) and one varlen row (no anchor).
inline std::vector<DenseCase> dense_quick_sweep() {
  std::vector<DenseCase> rows;
  DenseCase c;
  c.b = 128; c.s_q = 1; c.h_q = 16; c.s_k = 4096;
  rows.push_back(c);
  c = DenseCase{};
  c.b = 128; c.s_q = 2; c.h_q = 128; c.s_k = 8192;
  rows.push_back(c);
  c = DenseCase{};
  c.b = 128; c.s_q = 2; c.h_q = 128; c.s_k = 4096; c.causal = true;
  rows.push_back(c);
  c = DenseCase{};
  c.b = 1; c.s_q = 1; c.h_q = 128; c.s_k = 8192;
  rows.push_back(c);
  c = DenseCase{};
  c.b = 128; c.s_q = 1; c.h_q = 64; c.s_k = 4096; c.varlen = true;
  rows.push_back(c);
  return rows;
}

// Token-sparse decode over an FP8 paged cache (a main cache, optionally an extra one).
// The topk_length array, one entry per request (decode) or per query token (prefill).
enum class TopkLength {
  kNone,    // no topk_length array: every list counts in full
  kFull,    // an array holding topk (extra_topk) for every entry
  kRandom,  // per entry uniform in [1, topk] (and [1, extra_topk]), the same in every input set
};

inline const char* topk_length_name(TopkLength t) {
  switch (t) {
    case TopkLength::kNone: return "none";
    case TopkLength::kFull: return "full";
    case TopkLength::kRandom: return "random";
  }
  return "unknown";
}

struct SparseCase {
  hmla::SparseCacheLayout layout = hmla::SparseCacheLayout::kV32;
  int b = 128;
  int s_q = 1;
  int h_q = 64;
  int s_k = 32768;  // positions [0, s_k) of each request the indices are drawn from
  int page = 64;
  int topk = 2048;
  int extra_topk = 0;  // 0: no extra cache
  int extra_page = 64;
  int extra_s_k = 0;
  TopkLength topk_length = TopkLength::kNone;
  bool sink = true;
};

// FlashMLA's anchor name of the layout ("fp8_v32", "fp8_model1").
inline const char* sparse_layout_name(hmla::SparseCacheLayout l) {
  return l == hmla::SparseCacheLayout::kV32 ? "fp8_v32" : "fp8_model1";
}

// The 14 sparse decode rows of ../shared/anchors/compare/compare.py, in its order: 10 with a FlashMLA
// anchor (b 128), then 4 tensor-parallel shards of 128-head models (16 and 32 heads, no anchor).
inline std::vector<SparseCase> sparse_default_sweep() {
  using hmla::SparseCacheLayout;
  auto row = [](SparseCacheLayout layout, int b, int s_q, int h_q, int s_k, int page, int topk, int extra_s_k,
                int extra_page, int extra_topk) {
    SparseCase c;
    c.layout = layout;
    c.b = b;
    c.s_q = s_q;
    c.h_q = h_q;
    c.s_k = s_k;
    c.page = page;
    c.topk = topk;
    c.extra_s_k = extra_s_k;
    c.extra_page = extra_topk ? extra_page : 64;
    c.extra_topk = extra_topk;
    return c;
  };
  const SparseCacheLayout v32 = SparseCacheLayout::kV32, model1 = SparseCacheLayout::kModel1;
  std::vector<SparseCase> rows;
  for (int h_q : {64, 128})
    for (int s_q : {1, 2}) rows.push_back(row(v32, 128, s_q, h_q, 32768, 64, 2048, 0, 0, 0));
  for (int h_q : {64, 128})
    for (int extra_topk : {512, 1024}) rows.push_back(row(model1, 128, 2, h_q, 16384, 256, 128, 16384, 64, extra_topk));
  rows.push_back(row(model1, 128, 2, 128, 16384, 256, 128, 0, 0, 0));
  rows.push_back(row(model1, 128, 2, 128, 32768, 64, 2048, 0, 0, 0));
  rows.push_back(row(v32, 128, 1, 16, 32768, 64, 2048, 0, 0, 0));
  rows.push_back(row(v32, 128, 1, 32, 32768, 64, 2048, 0, 0, 0));
  rows.push_back(row(v32, 16, 1, 16, 32768, 64, 2048, 0, 0, 0));
  rows.push_back(row(model1, 128, 2, 16, 16384, 256, 128, 16384, 64, 512));
  return rows;
}

// One V3.2 row and one MODEL1 row with an extra cache (both anchored).
inline std::vector<SparseCase> sparse_quick_sweep() {
  std::vector<SparseCase> all = sparse_default_sweep();
  return {all[0], all[4]};
}

// Token-sparse prefill (hmla::sparse_prefill_run): every query token attends, with all h_q heads, to
// topk rows of one bf16 kv tensor [s_kv, d_qk].
struct SparsePrefillCase {
  int s_q = 4096;
  int h_q = 64;
  int d_qk = 576;  // 576 (V3.2) or 512 (MODEL1)
  int s_kv = 8192;
  int topk = 2048;
  TopkLength topk_length = TopkLength::kNone;  // per query token, not per request
  bool sink = true;
};

// The 8 sparse prefill rows of ../shared/anchors/compare/compare.py, in its order (all anchored).
inline std::vector<SparsePrefillCase> sparse_prefill_default_sweep() {
  std::vector<SparsePrefillCase> rows;
  for (int h_q : {64, 128})
    for (int d_qk : {576, 512})
      for (int s_kv : {8192, 65536}) {
        SparsePrefillCase c;
        c.s_q = 4096;
        c.h_q = h_q;
        c.d_qk = d_qk;
        c.s_kv = s_kv;
        c.topk = 2048;
        rows.push_back(c);
      }
  return rows;
}

// compare.py --quick's one prefill row.
inline std::vector<SparsePrefillCase> sparse_prefill_quick_sweep() { return {sparse_prefill_default_sweep()[0]}; }

// n partial attention results of one shape, merged by hmla::merge_attention_states.
struct MergeCase {
  hmla::DType dtype = hmla::DType::kBF16;
  int b = 128;  // batch entries (or query tokens of a prefill, with s_q 1)
  int s_q = 1;
  int h = 128;
  int d_v = 512;
  int states = 2;
};

inline std::string describe(const MergeCase& c) {
  return "b=" + std::to_string(c.b) + " s_q=" + std::to_string(c.s_q) + " h=" + std::to_string(c.h) +
         " d_v=" + std::to_string(c.d_v) + " states=" + std::to_string(c.states) + " " + hmla::dtype_name(c.dtype);
}

struct Sweep {
  std::vector<DenseCase> dense;
  std::vector<SparseCase> sparse;
  std::vector<SparsePrefillCase> prefill;
};

inline bool sweep_by_name(const std::string& name, Sweep& out) {
  if (name == "default") {
    out.dense = dense_default_sweep();
    out.sparse = sparse_default_sweep();
    out.prefill = sparse_prefill_default_sweep();
    return true;
  }
  if (name == "quick") {
    out.dense = dense_quick_sweep();
    out.sparse = sparse_quick_sweep();
    out.prefill = sparse_prefill_quick_sweep();
    return true;
  }
  return false;
}

inline std::string describe(const DenseCase& c) {
  std::string s = "b=" + std::to_string(c.b) + " s_q=" + std::to_string(c.s_q) +
                  " h_q=" + std::to_string(c.h_q) + " h_kv=" + std::to_string(c.h_kv) +
                  " s_k=" + std::to_string(c.s_k) + " " + hmla::dtype_name(c.dtype) +
                  " page=" + std::to_string(c.page);
  if (c.causal) s += " causal";
  if (c.varlen) s += " varlen";
  return s;
}

inline std::string describe(const SparseCase& c) {
  std::string s = std::string(sparse_layout_name(c.layout)) + " b=" + std::to_string(c.b) +
                  " s_q=" + std::to_string(c.s_q) + " h_q=" + std::to_string(c.h_q) +
                  " s_k=" + std::to_string(c.s_k) + " page=" + std::to_string(c.page) +
                  " topk=" + std::to_string(c.topk);
  if (c.extra_topk)
    s += " extra(s_k=" + std::to_string(c.extra_s_k) + " page=" + std::to_string(c.extra_page) +
         " topk=" + std::to_string(c.extra_topk) + ")";
  if (c.topk_length != TopkLength::kNone) s += std::string(" topk_length=") + topk_length_name(c.topk_length);
  if (!c.sink) s += " no-sink";
  return s;
}

inline std::string describe(const SparsePrefillCase& c) {
  std::string s = "s_q=" + std::to_string(c.s_q) + " h_q=" + std::to_string(c.h_q) + " d_qk=" + std::to_string(c.d_qk) +
                  " s_kv=" + std::to_string(c.s_kv) + " topk=" + std::to_string(c.topk);
  if (c.topk_length != TopkLength::kNone) s += std::string(" topk_length=") + topk_length_name(c.topk_length);
  if (!c.sink) s += " no-sink";
  return s;
}

}  // namespace hmla_bench
