// hmla-bench: the driver and the --check pieces every family shares (see bench_case.h).
#include "bench_case.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <thread>

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
    row.check(opt, stream, r.check);
    judge_check(r.check);
    r.check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return r;
}

std::vector<int> pick_check_requests(int batch, int requested, const std::function<double(int)>& reference_macs) {
  const double budget_macs = 4e10;  // keeps the float64 CPU reference to seconds per row
  int n = requested > 0 ? std::min(requested, batch) : std::min(8, batch);
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
  double lse_err = 0;
  bool lse_nan = false;
  for (size_t k = 0; k < lse_count; ++k) {
    float got = lse_got[k], want = lse_want[k];
    double d;
    if (std::isinf(got) && std::isinf(want) && (got > 0) == (want > 0)) d = 0;
    else d = std::fabs((double)got - (double)want);
    if (std::isnan(d)) lse_nan = true;
    lse_err = std::max(lse_err, d);
  }
  out.lse_max_abs = lse_nan ? NAN : lse_err;
}

void judge_check(CheckOutcome& out) {
  out.pass = (out.out_rel_l2 <= kCheckOutRelL2) && (out.lse_max_abs <= kCheckLseAbs) && out.nonfinite_out == 0 &&
             out.bad_lse == 0;
  out.note.clear();
  if (out.pass) return;
  std::string note;
  if (!(out.out_rel_l2 <= kCheckOutRelL2)) note += "out rel-L2 above threshold; ";
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
