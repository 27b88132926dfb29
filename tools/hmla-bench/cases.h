// hmla-bench: the dense-decode cases and the named sweeps.
#pragma once

#include <string>
#include <vector>

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
inline std::vector<DenseCase> default_sweep() {
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
inline std::vector<DenseCase> quick_sweep() {
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

inline bool sweep_by_name(const std::string& name, std::vector<DenseCase>& out) {
  if (name == "default") { out = default_sweep(); return true; }
  if (name == "quick") { out = quick_sweep(); return true; }
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

}  // namespace hmla_bench
