// hmla-bench: FlashMLA reference figures (../shared/anchors/flashmla-h200.json) for the ratio column.
#pragma once

#include <string>
#include <vector>

#include "cases.h"

namespace hmla_bench {

struct AnchorRow {
  std::string kind, dtype, layout;
  int b = 0, s_q = 0, h_q = 0, h_kv = 0, s_k = 0, topk = 0, extra_topk = 0, d_qk = 0, page = 0;
  int extra_s_k = 0, extra_page = 0;
  bool causal = false, varlen = false, attn_sink = false;
  double time_us = 0;
};

struct Anchors {
  std::string path;    // empty: none loaded
  std::string system;  // meta.system
  double copy_gbps = 0, matmul_tflops = 0;  // the anchor run's own ceilings (0 if absent)
  std::vector<AnchorRow> rows;

  bool loaded() const { return !path.empty(); }
  // The dense_decode row with exactly this case's shape (d_qk 576, topk 0), or nullptr.
  const AnchorRow* find_dense(const DenseCase& c) const;
  // The sparse_decode row of this case's layout and shape. FlashMLA's anchors passed attn_sink and
  // no topk_length, so a row without the sink or with random lengths has none.
  const AnchorRow* find_sparse(const SparseCase& c) const;
  // The sparse_prefill row of this shape (the anchor file's s_k is s_kv); as for sparse decode, none
  // without the sink or with random lengths.
  const AnchorRow* find_sparse_prefill(const SparsePrefillCase& c) const;
};

// Parses the anchor file; throws std::runtime_error with the reason on a missing or bad file.
Anchors load_anchors(const std::string& path);

// The default anchor file: $HMLA_ANCHORS, else shared/anchors/flashmla-h200.json or
// ../shared/anchors/flashmla-h200.json next to any ancestor of the executable's directory or of the
// working directory (so both a checkout with shared/ and the sibling layout are found). Empty if none.
std::string locate_default_anchors(const char* argv0);

}  // namespace hmla_bench
