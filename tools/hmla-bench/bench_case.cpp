// hmla-bench: the driver and the --check pieces every family shares (see bench_case.h).
#include "bench_case.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <numeric>
#include <random>
#include <thread>

#include "device_util.h"
#include "hmla/reference.h"

namespace hmla_bench {

TimingConfig timing_config(const RowOptions& opt) {
  TimingConfig cfg;
  cfg.warmup = opt.warmup;
  cfg.warmup_ms = opt.warmup_ms;
  cfg.iters = opt.iters;
  cfg.backlog = opt.backlog;
  return cfg;
}

int rotation_sets(const RowOptions& opt, double touched, double alloc_per_set) {
  double sets = std::ceil((double)opt.rotate_min_bytes / std::max(touched, 1.0));
  sets = std::min(sets, std::max(1.0, std::floor((double)opt.max_rotation_bytes / std::max(alloc_per_set, 1.0))));
  return (int)std::max(1.0, std::min(sets, (double)opt.max_input_sets));
}

RowResult run_row(BenchCase& row, const RowOptions& opt, cudaStream_t stream) {
  row.setup(opt, stream);
  RowResult r;
  r.input_sets = row.input_sets();
  r.bytes_per_set = row.bytes_per_set();
  const TimingConfig cfg = timing_config(opt);
  const int sets = r.input_sets;
  std::vector<double> us = time_calls(cfg, stream, [&](int i) { row.run(i % sets, stream); }, &r.sm_mhz);
  HB_CUDA(cudaGetLastError());
  r.time = summarize(us);
  r.flops = row.flops();
  r.bytes = row.bytes();
  r.tflops = r.flops / (r.time.median * 1e-6) / 1e12;
  r.gbps = r.bytes / (r.time.median * 1e-6) / 1e9;
  row.time_extras(cfg, stream);
  HB_CUDA(cudaGetLastError());

  if (opt.check) {
    const auto t0 = std::chrono::steady_clock::now();
    r.check.checked = true;
    r.check.out_rel_l2_limit = row.check_out_rel_l2_limit();
    row.check(opt, stream, r.check);
    judge_check(r.check);
    r.check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return r;
}

std::vector<int> pick_check_requests(int batch, int requested, const std::function<double(int)>& reference_macs,
                                     int automatic) {
  const double budget_macs = 4e10;  // keeps the float64 CPU reference to seconds per row
  int n = requested > 0 ? std::min(requested, batch) : std::min(automatic, batch);
  auto select = [&](int count) {
    std::vector<int> ids;
    for (int j = 0; j < count; ++j) {
      int r = count == 1 ? 0 : (int)std::llround((double)j * (batch - 1) / (count - 1));
      if (ids.empty() || ids.back() != r) ids.push_back(r);
    }
    return ids;
  };
  std::vector<int> ids = select(n);
  if (requested <= 0) {
    auto macs = [&](const std::vector<int>& v) {
      double m = 0;
      for (int r : v) m += reference_macs(r);
      return m;
    };
    while (n > 1 && macs(ids) > budget_macs) ids = select(--n);
  }
  return ids;
}

void parallel_for(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  const int workers = (int)std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), (unsigned)n);
  std::atomic<int> next{0};
  std::vector<std::exception_ptr> errors(workers);
  auto work = [&](int w) {
    try {
      for (int j = next++; j < n; j = next++) fn(j);
    } catch (...) {
      errors[w] = std::current_exception();
      next = n;  // the others stop at their next item
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(work, w);
  work(0);
  for (std::thread& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<int32_t> topk_lengths(TopkLength mode, int entries, int topk, uint64_t seed) {
  std::vector<int32_t> lens(entries, topk);
  if (mode == TopkLength::kRandom) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> dist(1, topk);
    for (int32_t& l : lens) l = dist(rng);
  }
  return lens;
}

std::vector<int32_t> random_distinct_lists(int lists, int n, int topk, uint64_t seed,
                                           const std::function<int32_t(int, int32_t)>& map) {
  std::vector<int32_t> out((size_t)lists * topk);
  const int lists_per_job = 16;
  parallel_for((int)ceil_div((size_t)lists, (size_t)lists_per_job), [&](int job) {
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<int32_t> swapped_with(topk);
    const int first = job * lists_per_job, last = std::min(lists, first + lists_per_job);
    for (int list = first; list < last; ++list) {
      std::mt19937_64 rng(counter_hash(seed, (uint64_t)list));
      int32_t* dst = out.data() + (size_t)list * topk;
      for (int k = 0; k < topk; ++k) {
        std::uniform_int_distribution<int> pick(k, n - 1);
        const int j = pick(rng);
        std::swap(positions[k], positions[j]);
        swapped_with[k] = j;
        dst[k] = map ? map(list, positions[k]) : positions[k];
      }
      // undone in reverse, so that the next list starts from the identity again
      for (int k = topk - 1; k >= 0; --k) std::swap(positions[k], positions[swapped_with[k]]);
    }
  });
  return out;
}

std::vector<float> random_sink(int h_q, uint64_t seed) {
  std::mt19937_64 rng(counter_hash(seed, 77));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> sink(h_q);
  for (float& v : sink) v = normal(rng);
  return sink;
}

void compare_outputs(const uint16_t* out_got, hmla::DType dtype, const float* out_want, size_t count,
                     const float* lse_got, const float* lse_want, size_t lse_count, CheckOutcome& out) {
  double diff2 = 0, ref2 = 0, max_abs = 0;
  bool out_nan = false;
  for (size_t i = 0; i < count; ++i) {
    double got = hmla::reference::load_half(dtype, out_got, (int64_t)i);
    double want = out_want[i];
    double d = got - want;
    if (std::isnan(d)) out_nan = true;
    diff2 += d * d;
    ref2 += want * want;
    max_abs = std::max(max_abs, std::fabs(d));
  }
  out.out_rel_l2 = out_nan ? NAN : (ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2));
  out.out_max_abs = out_nan ? NAN : max_abs;
  double lse_err = 0, lse_diff2 = 0, lse_ref2 = 0;
  bool lse_nan = false;
  for (size_t k = 0; k < lse_count; ++k) {
    float got = lse_got[k], want = lse_want[k];
    double d;
    if (std::isinf(got) && std::isinf(want) && (got > 0) == (want > 0)) d = 0;
    else d = std::fabs((double)got - (double)want);
    if (std::isnan(d)) lse_nan = true;
    lse_err = std::max(lse_err, d);
    // an infinite reference (a query without keys) is judged by lse_max_abs alone
    if (std::isfinite(want)) {
      lse_diff2 += d * d;
      lse_ref2 += (double)want * want;
    }
  }
  out.lse_max_abs = lse_nan ? NAN : lse_err;
  out.lse_rel_l2 = lse_nan ? NAN : (lse_ref2 > 0 ? std::sqrt(lse_diff2 / lse_ref2) : std::sqrt(lse_diff2));
}

void judge_check(CheckOutcome& out) {
  out.pass = (out.out_rel_l2 <= out.out_rel_l2_limit) && (out.lse_max_abs <= kCheckLseAbs) &&
             out.nonfinite_out == 0 && out.bad_lse == 0;
  out.note.clear();
  if (out.pass) return;
  std::string note;
  if (!(out.out_rel_l2 <= out.out_rel_l2_limit)) note += "out rel-L2 above threshold; ";
  if (!(out.lse_max_abs <= kCheckLseAbs)) note += "lse error above threshold; ";
  if (out.nonfinite_out) note += std::to_string(out.nonfinite_out) + " non-finite out values in the batch; ";
  if (out.bad_lse) note += std::to_string(out.bad_lse) + " NaN/unexpected-inf lse values in the batch; ";
  if (note.size() >= 2) note.resize(note.size() - 2);
  out.note = note;
}

void poison_outputs(void* out, size_t out_bytes, float* lse, size_t lse_bytes, cudaStream_t stream) {
  HB_CUDA(cudaMemsetAsync(out, 0xff, out_bytes, stream));  // NaN in bf16 and fp16
  HB_CUDA(cudaMemsetAsync(lse, 0xff, lse_bytes, stream));  // NaN in float32
}

void copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  HB_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  HB_CUDA(cudaStreamSynchronize(stream));
}

void Slab::allocate(size_t bytes_per_set, int sets) {
  set_stride = round_up(std::max<size_t>(bytes_per_set, 1), kSlabAlign);
  buf.allocate(set_stride * (size_t)sets);
}

void require_device_memory(double need, const std::string& row) {
  size_t free_b = 0, total_b = 0;
  HB_CUDA(cudaMemGetInfo(&free_b, &total_b));
  if (need > 0.97 * (double)free_b) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), " needs %.2f GiB of device memory, %.2f GiB free", need / (double)kGiB,
                  (double)free_b / (double)kGiB);
    throw BenchError("row " + row + buf);
  }
}

}  // namespace hmla_bench
