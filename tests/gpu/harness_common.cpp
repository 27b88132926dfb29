// Implementation of the pieces the decode test harnesses share (host code only).
#include "harness_common.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>

namespace hmla_test {

namespace {
constexpr int64_t kGuard4d = 64;   // elements before/after q and out (128 bytes: keeps alignment)
constexpr int64_t kGuardLse = 32;  // floats before/after lse
constexpr int kMaxExamples = 8;
}  // namespace

std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kDense:
      return "dense";
    case Layout::kPadded:
      return "padded";
    case Layout::kHeadMajor:
      return "head_major";
    case Layout::kTokenMajor:
      return "token_major";
  }
  return "?";
}

// ------------------------------------------------------------------------------ tensor layouts
Strided make_layout4(Layout layout, int64_t b, int64_t s, int64_t h, int64_t d, uint64_t seed) {
  Strided st;
  st.rank = 4;
  st.dims[0] = b;
  st.dims[1] = s;
  st.dims[2] = h;
  st.dims[3] = d;
  Rng rng(seed);
  int64_t sb = 0, ss = 0, sh = 0;
  switch (layout) {
    case Layout::kDense:
      sh = d;
      ss = h * d;
      sb = s * h * d;
      break;
    case Layout::kPadded:
      sh = d + 8 * rng.uniform_int(1, 4);
      ss = h * sh + 8 * rng.uniform_int(1, 3);
      sb = s * ss + 8 * rng.uniform_int(1, 5);
      break;
    case Layout::kHeadMajor:
      ss = d + 8;
      sb = s * ss;
      sh = b * sb;
      break;
    case Layout::kTokenMajor:
      sh = d;
      sb = h * d;
      ss = b * h * d;
      break;
  }
  st.strides[0] = sb;
  st.strides[1] = ss;
  st.strides[2] = sh;
  st.strides[3] = 1;
  st.guard = kGuard4d;
  const int64_t max_offset = (b - 1) * sb + (s - 1) * ss + (h - 1) * sh + d;
  st.total = kGuard4d + max_offset + kGuard4d;
  return st;
}

Strided make_layout_lse(bool padded, int64_t b, int64_t h, int64_t s) {
  Strided st;
  st.rank = 3;
  st.dims[0] = b;
  st.dims[1] = h;
  st.dims[2] = s;
  st.dims[3] = 1;
  const int64_t sh = padded ? s + 3 : s;
  const int64_t sb = padded ? h * sh + 5 : h * sh;
  st.strides[0] = sb;
  st.strides[1] = sh;
  st.strides[2] = 1;
  st.strides[3] = 1;
  st.guard = kGuardLse;
  st.total = kGuardLse + (b - 1) * sb + (h - 1) * sh + s + kGuardLse;
  return st;
}

void fill_half_rows(const Strided& layout, hmla::DType dtype, float amplitude, uint64_t value_seed,
                    std::vector<uint16_t>* host, std::vector<float>* row_norm) {
  const int64_t b = layout.dims[0], s = layout.dims[1], h = layout.dims[2], d = layout.dims[3];
  host->assign(layout.total, input_nan_bits(dtype));  // padding and guards: NaN
  row_norm->assign(static_cast<size_t>(b * s * h), 0.f);
  parallel_for(b, [&](int64_t r) {
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t k = 0; k < h; ++k) {
        uint16_t* dst = &(*host)[layout.offset(r, t, k)];
        const size_t row = static_cast<size_t>((r * s + t) * h + k);
        double norm2 = 0;
        for (int64_t i = 0; i < d; ++i) {
          const uint16_t bits = to_half_bits(dtype, amplitude * normalish(value_seed, row * d + i));
          dst[i] = bits;
          const double v = half_bits_to_float(dtype, bits);
          norm2 += v * v;
        }
        (*row_norm)[row] = static_cast<float>(std::sqrt(norm2));
      }
    }
  });
}

// ------------------------------------------------------------------------------ outputs
bool outputs_bitwise_equal(const Outputs& a, const Outputs& b, std::string* where) {
  if (a.out.size() != b.out.size() || a.lse.size() != b.lse.size()) {
    if (where) *where = "different buffer sizes";
    return false;
  }
  for (size_t i = 0; i < a.out.size(); ++i) {
    if (a.out[i] != b.out[i]) {
      if (where)
        *where = fmt("out element %zu of the allocation: 0x%04x vs 0x%04x", i, a.out[i], b.out[i]);
      return false;
    }
  }
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (float_bits(a.lse[i]) != float_bits(b.lse[i])) {
      if (where)
        *where = fmt("lse element %zu of the allocation: %.9g vs %.9g", i, a.lse[i], b.lse[i]);
      return false;
    }
  }
  return true;
}

namespace {
// Marks the logical elements of a layout (rank 4: rows of dims[3]; rank 3: single elements).
template <class Fn>
void for_each_logical_run(const Strided& st, Fn fn) {
  const int64_t run = st.rank == 4 ? st.dims[3] : 1;
  for (int64_t i0 = 0; i0 < st.dims[0]; ++i0)
    for (int64_t i1 = 0; i1 < st.dims[1]; ++i1)
      for (int64_t i2 = 0; i2 < st.dims[2]; ++i2) fn(st.offset(i0, i1, i2), run);
}
}  // namespace

Outputs make_poison_images(const Strided& out_layout, const Strided& lse_layout, uint16_t poison) {
  Outputs img;
  img.out.assign(out_layout.total, kOutSentinelBits);
  img.lse.assign(lse_layout.total, bits_float(kLseSentinelBits));
  for_each_logical_run(out_layout,
                       [&](int64_t at, int64_t n) { std::fill_n(&img.out[at], n, poison); });
  for_each_logical_run(lse_layout, [&](int64_t at, int64_t n) {
    std::fill_n(&img.lse[at], n, bits_float(kLsePoisonBits));
  });
  return img;
}

// ------------------------------------------------------------------------------ findings
void Findings::add(const std::string& what, const std::string& example) {
  int64_t& n = counts[what];
  if (n < kMaxExamples) examples[what].push_back(example);
  ++n;
}

void Findings::merge(const Findings& o) {
  for (const auto& kv : o.counts) {
    counts[kv.first] += kv.second;
    auto& ex = examples[kv.first];
    for (const auto& e : o.examples.at(kv.first)) {
      if (static_cast<int>(ex.size()) < kMaxExamples) ex.push_back(e);
    }
  }
}

std::string Findings::report(const std::string& header, const std::string& footer) const {
  std::ostringstream msg;
  msg << header << "\n";
  for (const auto& kv : counts) {
    msg << "  - " << kv.first << ": " << kv.second << " occurrence(s), e.g.\n";
    for (const auto& e : examples.at(kv.first)) msg << "      " << e << "\n";
  }
  msg << footer;
  return msg.str();
}

void check_padding_unchanged(const Outputs& got, const Strided& out_layout,
                             const Strided& lse_layout, Findings& f) {
  // Counting first (in parallel): the allocations reach gigabytes, locating is the rare case.
  std::vector<int64_t> part(64, 0);
  const int64_t n = out_layout.total, chunk = (n + 63) / 64;
  parallel_for(64, [&](int64_t i) {
    int64_t c = 0;
    for (int64_t k = i * chunk; k < std::min(n, (i + 1) * chunk); ++k)
      c += got.out[k] == kOutSentinelBits;
    part[i] = c;
  });
  const int64_t out_sentinels = std::accumulate(part.begin(), part.end(), int64_t{0});
  if (out_sentinels != out_layout.total - out_layout.logical_count()) {
    std::vector<uint8_t> logical(out_layout.total, 0);
    for_each_logical_run(out_layout,
                         [&](int64_t at, int64_t len) { std::fill_n(&logical[at], len, 1); });
    for (int64_t k = 0; k < out_layout.total; ++k) {
      if (!logical[k] && got.out[k] != kOutSentinelBits) {
        f.add("out written outside its logical elements (padding/guard changed)",
              fmt("element %lld from the allocation start (logical origin at %lld): 0x%04x",
                  (long long)k, (long long)out_layout.guard, got.out[k]));
      }
    }
  }
  int64_t lse_sentinels = 0;
  for (float v : got.lse) lse_sentinels += float_bits(v) == kLseSentinelBits;
  const int64_t lse_logical = lse_layout.dims[0] * lse_layout.dims[1] * lse_layout.dims[2];
  if (lse_sentinels != lse_layout.total - lse_logical) {
    std::vector<uint8_t> logical(lse_layout.total, 0);
    for_each_logical_run(lse_layout, [&](int64_t at, int64_t) { logical[at] = 1; });
    for (int64_t k = 0; k < lse_layout.total; ++k) {
      if (!logical[k] && float_bits(got.lse[k]) != kLseSentinelBits) {
        f.add("lse written outside its logical elements (padding/guard changed)",
              fmt("element %lld from the allocation start (logical origin at %lld): %g",
                  (long long)k, (long long)lse_layout.guard, got.lse[k]));
      }
    }
  }
}

void check_out_row(hmla::DType dt, const uint16_t* row, int d, uint16_t poison, int n_keys,
                   double hull, const std::string& pos, Findings& f) {
  int64_t unwritten = 0, nan = 0, inf = 0, nonzero = 0, outside = 0;
  for (int i = 0; i < d; ++i) {
    const uint16_t bits = row[i];
    if (bits == poison) {
      ++unwritten;
    } else if (half_is_nan(dt, bits)) {
      ++nan;
    } else if (half_is_inf(dt, bits)) {
      ++inf;
    } else {
      const float v = half_bits_to_float(dt, bits);
      if (n_keys == 0 && v != 0.f) ++nonzero;
      if (n_keys > 0 && std::fabs(v) > hull) ++outside;
    }
  }
  auto of_d = [&](int64_t k) { return fmt(" %lld of %d", (long long)k, d); };
  if (unwritten) f.add("out elements never written (poison left)", pos + of_d(unwritten));
  if (nan) f.add("out NaN", pos + of_d(nan));
  if (inf) f.add("out inf", pos + of_d(inf));
  if (nonzero) f.add("out not exactly 0 for a query without keys", pos + of_d(nonzero));
  if (outside)
    f.add("out outside the range of V (|out| > max|V|)",
          pos + of_d(outside) + fmt(", n_keys=%d", n_keys));
}

void check_lse_value(float l, int n_keys, double max_abs_score, const std::string& pos,
                     Findings& f) {
  if (float_bits(l) == kLsePoisonBits) {
    f.add("lse never written (poison left)", pos);
  } else if (std::isnan(l)) {
    f.add("lse NaN", pos);
  } else if (n_keys == 0) {
    if (!(std::isinf(l) && l > 0))
      f.add("lse not +inf for a query without keys", pos + fmt(" lse=%g", l));
  } else if (!std::isfinite(l)) {
    f.add("lse not finite for a query with keys", pos + fmt(" lse=%g n_keys=%d", l, n_keys));
  } else {
    const double bound = max_abs_score + 1e-4 * std::max(1.0, std::fabs(double(l)));
    if (std::fabs(l - std::log(double(n_keys))) > bound) {
      f.add("lse inconsistent with the number of keys",
            pos + fmt(" lse=%.6f log(n_keys=%d)=%.6f max|score|=%.4f", l, n_keys,
                      std::log(double(n_keys)), bound));
    }
  }
}

RowComparison compare_out_row(hmla::DType dt, const uint16_t* got, const float* ref, int d,
                              const Tolerance& tol) {
  RowComparison rc;
  for (int i = 0; i < d; ++i) rc.ref_row_max = std::max(rc.ref_row_max, std::fabs(ref[i]));
  for (int i = 0; i < d; ++i) {
    const double g = half_bits_to_float(dt, got[i]);
    const double e = std::fabs(g - ref[i]);
    const double bound =
        tol.out_elem_rel * std::fabs(ref[i]) + tol.out_elem_row_rel * rc.ref_row_max + 1e-7;
    rc.diff2 += std::isfinite(g) ? e * e : std::numeric_limits<double>::infinity();
    rc.ref2 += double(ref[i]) * ref[i];
    const double ratio = std::isfinite(e) ? e / bound : std::numeric_limits<double>::infinity();
    if (ratio > rc.worst_ratio) {
      rc.worst_ratio = ratio;
      rc.worst_d = i;
    }
    if (!(e <= bound)) ++rc.bad;
  }
  return rc;
}

void report_out_row(hmla::DType dt, const uint16_t* got, const float* ref, int d,
                    const RowComparison& rc, const std::string& pos, Findings& f) {
  if (rc.bad == 0) return;
  f.add("out elements outside the elementwise bound",
        pos + fmt(" %lld of %d; worst d=%d got %.7g ref %.7g (row max %.4g)", (long long)rc.bad, d,
                  rc.worst_d, half_bits_to_float(dt, got[rc.worst_d]), ref[rc.worst_d],
                  rc.ref_row_max));
}

double compare_lse(float got, float ref, double lse_rel, const std::string& pos, Findings& f) {
  const double err = std::fabs(double(got) - ref);
  const double bound = lse_rel * std::max(1.0, std::fabs(double(ref)));
  if (!(err <= bound)) {
    f.add("lse outside tolerance",
          pos + fmt(" got %.8g ref %.8g |diff| %.3g > %.3g", got, ref, err, bound));
  }
  return std::isfinite(err) ? err / bound : std::numeric_limits<double>::infinity();
}

// ------------------------------------------------------------------------------ running
bool run_guarded(const std::string& label, DeviceBuffer& workspace, size_t workspace_bytes,
                 cudaStream_t stream, const std::function<void()>& plan_and_run) {
  workspace.allocate(workspace_bytes);
  HMLA_TEST_CUDA_CHECK(
      cudaMemset(workspace.get(), 0xff, std::max<size_t>(workspace_bytes, 1)));  // NaN / -1
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  try {
    plan_and_run();
  } catch (const std::exception& e) {
    ADD_FAILURE() << label << ": plan/run threw: " << e.what();
    return false;
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);
  const cudaError_t last = cudaGetLastError();
  if (sync != cudaSuccess || last != cudaSuccess) {
    ADD_FAILURE() << label << ": CUDA error after run: sync " << cudaGetErrorName(sync) << ", last "
                  << cudaGetErrorName(last);
    abort_if_context_broken(label);
    return false;
  }
  return true;
}

// ------------------------------------------------------------------------------ sampling
std::vector<int64_t> sample_units(int64_t num_units, const std::function<double(int64_t)>& cost,
                                  const std::vector<int64_t>& priority, double budget, Rng& rng,
                                  double* taken_cost) {
  std::vector<int64_t> chosen;
  std::vector<uint8_t> taken(num_units, 0);
  double total = 0;
  auto take = [&](int64_t id) {
    taken[id] = 1;
    chosen.push_back(id);
    total += cost(id);
  };
  for (size_t i = 0; i < priority.size(); ++i) {
    const int64_t id = priority[i];
    if (!taken[id] && (i == 0 || total + cost(id) <= budget)) take(id);  // the first even over
  }
  std::vector<int64_t> order(num_units);
  std::iota(order.begin(), order.end(), 0);
  rng.shuffle(order);
  for (int64_t id : order) {
    if (!taken[id] && total + cost(id) <= budget) take(id);
  }
  if (taken_cost != nullptr) *taken_cost = total;
  return chosen;
}

// ------------------------------------------------------------------------------ statistics
void AccuracySummary::Worst::update(double v, const std::string& w) {
  if (v > value) {
    value = v;
    where = w;
  }
}

void AccuracySummary::record(const std::string& group, const std::string& case_name,
                             const CheckStats& s) {
  std::lock_guard<std::mutex> lock(mutex_);
  Group& g = groups_[group];
  ++g.cases;
  g.sampled_cases += s.sampled;
  g.rows_total += s.rows_total;
  g.rows_compared += s.rows_compared;
  g.ref_macs += s.ref_macs;
  g.ref_seconds += s.ref_seconds;
  g.rel_l2.update(s.rel_l2, case_name);
  g.elem.update(s.worst_elem, case_name);
  g.lse.update(s.worst_lse, case_name);
}

void AccuracySummary::print(const char* title,
                            const std::function<const Tolerance&(const std::string&)>& tol_of) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (groups_.empty()) return;
  std::printf("\n[hmla] %s accuracy summary (ratios are error / tolerance; < 1 passes)\n", title);
  for (const auto& kv : groups_) {
    const Group& g = kv.second;
    const Tolerance& tol = tol_of(kv.first);
    std::printf(
        "[hmla]   %s: %lld checks (%lld sampled), rows compared %lld of %lld, reference %.1f GMAC "
        "in %.1f s\n",
        kv.first.c_str(), (long long)g.cases, (long long)g.sampled_cases,
        (long long)g.rows_compared, (long long)g.rows_total, g.ref_macs * 1e-9, g.ref_seconds);
    std::printf("[hmla]     worst out rel L2 %.3g (tolerance %g) in %s\n", g.rel_l2.value,
                tol.out_rel_l2, g.rel_l2.where.c_str());
    std::printf("[hmla]     worst out element ratio %.3g in %s\n", g.elem.value,
                g.elem.where.c_str());
    std::printf("[hmla]     worst lse ratio %.3g (tolerance %g * max(1,|lse|)) in %s\n",
                g.lse.value, tol.lse_rel, g.lse.where.c_str());
  }
  std::fflush(stdout);
}

}  // namespace hmla_test
