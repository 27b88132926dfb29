// A greedy pairwise (strength-2) covering array over test axes, shared by the GPU test lists of the
// kernel families (tests/gpu/sparse_decode_cases.h, test_sparse_prefill.cu). Pure host code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace hmla_test {

// A greedy covering array of strength 2 (each candidate row starts from an uncovered pair and
// fills the other axes with the values that cover the most uncovered pairs; the best of a few
// seeded candidates is kept). Conditional axes only count where their condition holds, so that no
// required pair is unreachable.
struct PairwiseAxis {
  std::string name;
  int values = 0;
  int condition_axis = -1;  // >= 0: this axis matters only when that axis's value is not 0
};

inline std::vector<std::vector<int>> pairwise_rows(const std::vector<PairwiseAxis>& axes,
                                                   uint64_t seed) {
  const int n = static_cast<int>(axes.size());
  auto active = [&](const std::vector<int>& row, int a) {
    return axes[a].condition_axis < 0 || row[axes[a].condition_axis] != 0;
  };
  // uncovered[a][b][va * values_b + vb]
  std::vector<std::vector<std::vector<uint8_t>>> uncovered(n, std::vector<std::vector<uint8_t>>(n));
  int64_t remaining = 0;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      auto& cell = uncovered[a][b];
      cell.assign(static_cast<size_t>(axes[a].values) * axes[b].values, 1);
      for (int va = 0; va < axes[a].values; ++va) {
        for (int vb = 0; vb < axes[b].values; ++vb) {
          // a conditional axis paired with its condition's "off" value is never required
          const bool unreachable =
              (axes[b].condition_axis == a && va == 0) || (axes[a].condition_axis == b && vb == 0);
          if (unreachable) cell[va * axes[b].values + vb] = 0;
        }
      }
      for (uint8_t u : cell) remaining += u;
    }
  }
  auto gain = [&](const std::vector<int>& row, const std::vector<uint8_t>& set) {
    int64_t g = 0;
    for (int a = 0; a < n; ++a) {
      if (!set[a] || !active(row, a)) continue;
      for (int b = a + 1; b < n; ++b) {
        if (!set[b] || !active(row, b)) continue;
        g += uncovered[a][b][row[a] * axes[b].values + row[b]];
      }
    }
    return g;
  };
  Rng rng(seed);
  std::vector<std::vector<int>> rows;
  while (remaining > 0) {
    // the first uncovered pair, in axis order
    int pa = -1, pb = -1, pva = 0, pvb = 0;
    for (int a = 0; a < n && pa < 0; ++a) {
      for (int b = a + 1; b < n && pa < 0; ++b) {
        const auto& cell = uncovered[a][b];
        for (size_t k = 0; k < cell.size(); ++k) {
          if (cell[k]) {
            pa = a, pb = b, pva = static_cast<int>(k / axes[b].values),
            pvb = static_cast<int>(k % axes[b].values);
            break;
          }
        }
      }
    }
    std::vector<int> best;
    int64_t best_gain = -1;
    for (int attempt = 0; attempt < 8; ++attempt) {
      std::vector<int> row(n, 0);
      std::vector<uint8_t> set(n, 0);
      row[pa] = pva, row[pb] = pvb, set[pa] = set[pb] = 1;
      // a conditional axis of the starting pair needs its condition on
      for (int a : {pa, pb}) {
        const int cond = axes[a].condition_axis;
        if (cond >= 0 && !set[cond]) {
          row[cond] = 1 + static_cast<int>(rng.next() % (axes[cond].values - 1));
          set[cond] = 1;
        }
      }
      // conditions first, so that conditional axes see their condition's value
      std::vector<int> order;
      for (int a = 0; a < n; ++a)
        if (!set[a]) order.push_back(a);
      rng.shuffle(order);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
        return (axes[x].condition_axis >= 0) < (axes[y].condition_axis >= 0);
      });
      for (int a : order) {
        int best_v = 0;
        int64_t best_v_gain = -1;
        const int start = static_cast<int>(rng.next() % axes[a].values);
        for (int k = 0; k < axes[a].values; ++k) {
          const int v = (start + k) % axes[a].values;
          row[a] = v;
          set[a] = 1;
          const int64_t g = gain(row, set);
          if (g > best_v_gain) best_v_gain = g, best_v = v;
        }
        row[a] = best_v;
      }
      const int64_t g = gain(row, set);
      if (g > best_gain) best_gain = g, best = row;
    }
    for (int a = 0; a < n; ++a) {
      if (!active(best, a)) continue;
      for (int b = a + 1; b < n; ++b) {
        if (!active(best, b)) continue;
        uint8_t& u = uncovered[a][b][best[a] * axes[b].values + best[b]];
        remaining -= u;
        u = 0;
      }
    }
    rows.push_back(best);
  }
  return rows;
}

}  // namespace hmla_test
