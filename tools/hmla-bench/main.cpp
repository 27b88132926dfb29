// hmla-bench: benchmark of hmla's MLA kernels on the GPU, against the card's own ceilings and the
// FlashMLA anchor figures. Usage: hmla-bench --help.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "anchors.h"
#include "bench_case.h"
#include "cases.h"
#include "ceilings.h"
#include "cli.h"
#include "common.h"
#include "dense_bench.h"
#include "hmla/types.h"
#include "merge_bench.h"
#include "result_json.h"
#include "sparse_bench.h"
#include "sparse_prefill_bench.h"

#ifndef HMLA_BENCH_VERSION
#define HMLA_BENCH_VERSION "unknown"
#endif

namespace hmla_bench {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;       // CUDA / runtime failure, no suitable device
constexpr int kExitUsage = 2;       // bad command line, or arguments the library rejects
constexpr int kExitCheckFail = 3;   // --check found a wrong result

// ------------------------------------------------------------------------------------- output
std::string fmt(const char* f, double v) {
  char buf[64];
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

void print_device_and_ceilings(const DeviceInfo& d, const Ceilings& c, const CeilingOptions& co) {
  std::printf("hmla-bench %s on %s (sm_%d%d, %d SMs, SM clock up to %d MHz, %.0f GiB, L2 %d MiB), driver %s, runtime %s\n",
              HMLA_BENCH_VERSION, d.name.c_str(), d.major, d.minor, d.sms, d.sm_clock_khz / 1000,
              (double)d.memory_bytes / (double)kGiB, d.l2_bytes >> 20, version_string(d.driver).c_str(),
              version_string(d.runtime).c_str());
  if (!c.measured) {
    std::printf("ceilings: not measured (--no-ceilings)\n");
    return;
  }
  std::printf("ceilings (this run; %d warm-up, median of %d):\n", co.warmup, co.iters);
  std::printf("  read-only stream %9.1f GB/s    %.2f GiB read with 16-byte loads; best of %zu variants: %s\n",
              c.read_gbps, c.read_bytes / (double)kGiB, c.read_variants.size(), c.read_best_variant.c_str());
  for (const ReadVariant& v : c.read_variants)
    std::printf("      %-44s %9.1f GB/s  (%.1f us)\n", v.name.c_str(), v.gbps, v.time.median);
  std::printf("  device copy      %9.1f GB/s    cudaMemcpyAsync D2D of %.2f GiB, bytes read + written\n", c.copy_gbps,
              c.copy_bytes_counted / 2.0 / (double)kGiB);
  std::printf("  bf16 matmul      %9.1f TFLOPS  cuBLAS GemmEx %d^3, fp32 accumulate, random data (%.1f us)\n",
              c.matmul_tflops, c.matmul_n, c.matmul_time.median);
}

void print_table_header(const BenchCase& row, bool ceil, bool anchors, bool check) {
  std::printf("\n%s | %9s %7s %7s", row.shape_header().c_str(), "time_us", "TFLOPS", "GB/s");
  if (ceil) std::printf(" %6s %6s %6s", "%read", "%copy", "%mm");
  std::printf("%s", row.extra_header().c_str());
  if (anchors) std::printf(" | %9s %6s", "anchor_us", "ratio");
  if (check) std::printf(" | check");
  std::printf(" | SM MHz\n");
  std::fflush(stdout);
}

void print_row(const RowRecord& rec, const Ceilings& ceil, bool anchors) {
  const RowResult& r = rec.r;
  std::printf("%s | %9.2f %7.1f %7.1f", rec.row->shape_cells().c_str(), r.time.median, r.tflops, r.gbps);
  if (ceil.measured)
    std::printf(" %6.1f %6.1f %6.1f", 100.0 * r.gbps / ceil.read_gbps, 100.0 * r.gbps / ceil.copy_gbps,
                100.0 * r.tflops / ceil.matmul_tflops);
  std::printf("%s", rec.row->extra_cells().c_str());
  if (anchors) {
    if (rec.anchor) std::printf(" | %9.2f %6.3f", rec.anchor->time_us, rec.anchor->time_us / r.time.median);
    else std::printf(" | %9s %6s", "-", "-");
  }
  if (r.check.checked) {
    std::printf(" | %s rel %s lse %s lse_rel %s", r.check.pass ? "PASS" : "FAIL",
                fmt("%.2e", r.check.out_rel_l2).c_str(), fmt("%.2e", r.check.lse_max_abs).c_str(),
                fmt("%.2e", r.check.lse_rel_l2).c_str());
    if (!r.check.pass) std::printf(" (%s)", r.check.note.c_str());
  }
  std::printf(" | %4.0f\n", r.sm_mhz);
  std::fflush(stdout);
}

void write_json(const std::string& path, const Cli& cli, const DeviceInfo& d, const Ceilings& ceil,
                const CeilingOptions& co, const Anchors& anchors, const RowOptions& ro,
                const std::vector<RowRecord>& rows, size_t planned, const std::string& error) {
  std::ofstream f(path);
  if (!f) {
    std::fprintf(stderr, "hmla-bench: cannot write JSON to '%s'\n", path.c_str());
    return;
  }
  char date[64];
  std::time_t now = std::time(nullptr);
  std::tm tm_utc{};
  gmtime_r(&now, &tm_utc);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  f << dump_json(results_json(cli, date, d, ceil, co, anchors, ro, rows, planned, error));
  f.flush();
  if (!f) std::fprintf(stderr, "hmla-bench: error while writing '%s'\n", path.c_str());
}

int run(int argc, char** argv) {
  ParsedCommandLine parsed = parse_command_line(argc, argv);
  switch (parsed.outcome) {
    case ParsedCommandLine::Outcome::kHelp:
    case ParsedCommandLine::Outcome::kVersion:
      std::fputs(parsed.text.c_str(), stdout);
      return kExitOk;
    case ParsedCommandLine::Outcome::kUsageError:
      std::fprintf(stderr, "hmla-bench: %s\nRun 'hmla-bench --help' for every command and option.\n",
                   parsed.text.c_str());
      return kExitUsage;
    case ParsedCommandLine::Outcome::kRun:
      break;
  }
  const Cli& cli = parsed.cli;

  // anchors (before touching the GPU: a bad path is a usage error)
  Anchors anchors;
  if (!cli.no_anchors && cli.command != "ceilings") {
    std::string path = cli.anchors_path.empty() ? locate_default_anchors(argv[0]) : cli.anchors_path;
    if (!path.empty()) {
      try {
        anchors = load_anchors(path);
      } catch (const std::exception& e) {
        if (!cli.anchors_path.empty()) {
          std::fprintf(stderr, "hmla-bench: %s\n", e.what());
          return kExitUsage;
        }
        std::fprintf(stderr, "hmla-bench: warning: %s; no anchor column\n", e.what());
      }
    }
  }

  // device
  DeviceInfo d;
  {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      std::fprintf(stderr, "hmla-bench: no CUDA device found (needs an NVIDIA Hopper GPU, sm_90a)\n");
      if (err != cudaSuccess) std::fprintf(stderr, "  (cudaGetDeviceCount: %s: %s)\n", cudaGetErrorName(err), cudaGetErrorString(err));
      return kExitError;
    }
    if (cli.device >= count) {
      std::fprintf(stderr, "hmla-bench: --device %d, but only %d CUDA device(s)\n", cli.device, count);
      return kExitUsage;
    }
  }
  try {
    d.index = cli.device;
    HB_CUDA(cudaSetDevice(d.index));
    cudaDeviceProp prop{};
    HB_CUDA(cudaGetDeviceProperties(&prop, d.index));
    d.name = prop.name;
    d.major = prop.major;
    d.minor = prop.minor;
    d.sms = prop.multiProcessorCount;
    d.memory_bytes = prop.totalGlobalMem;
    HB_CUDA(cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, d.index));
    HB_CUDA(cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, d.index));
    HB_CUDA(cudaDeviceGetAttribute(&d.bus_width, cudaDevAttrGlobalMemoryBusWidth, d.index));
    HB_CUDA(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, d.index));
    HB_CUDA(cudaDriverGetVersion(&d.driver));
    HB_CUDA(cudaRuntimeGetVersion(&d.runtime));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hmla-bench: %s\n", e.what());
    return kExitError;
  }
  if (d.major != 9) {
    std::fprintf(stderr,
                 "hmla-bench: device %d is %s (sm_%d%d), not a Hopper GPU; hmla's kernels need an NVIDIA Hopper "
                 "GPU (sm_90a, e.g. H100/H200)\n",
                 d.index, d.name.c_str(), d.major, d.minor);
    return kExitError;
  }

  RowOptions ro;
  ro.warmup = cli.warmup;
  ro.warmup_ms = cli.warmup_ms;
  ro.iters = cli.iters;
  ro.backlog = !cli.no_backlog;
  ro.seed = cli.seed;
  ro.rotate_min_bytes = (size_t)cli.rotate_mib * kMiB;
  ro.check = cli.check;
  ro.check_requests = cli.check_requests;

  // the rows, dense first (each is built when its turn comes: it holds device memory)
  std::vector<DenseCase> dense_cases;
  std::vector<SparseCase> sparse_cases;
  std::vector<SparsePrefillCase> prefill_cases;
  std::vector<MergeCase> merge_cases;
  if (!cli.sweep.empty()) {
    Sweep sweep;
    sweep_by_name(cli.sweep, sweep);
    auto keep = [&](const char* family) { return cli.only.empty() || cli.only == family; };
    if (keep("dense")) dense_cases = sweep.dense;
    if (keep("sparse_decode")) sparse_cases = sweep.sparse;
    if (keep("sparse_prefill")) prefill_cases = sweep.prefill;
    for (DenseCase& c : dense_cases) {
      if (cli.dtype) c.dtype = *cli.dtype;
      if (cli.varlen) c.varlen = true;
    }
  } else if (cli.command == "dense-decode") {
    dense_cases.push_back(cli.dense);
  } else if (cli.command == "sparse-decode") {
    sparse_cases.push_back(cli.sparse);
  } else if (cli.command == "sparse-prefill") {
    prefill_cases.push_back(cli.prefill);
  } else if (cli.command == "merge") {
    merge_cases.push_back(cli.merge);
  }
  const size_t planned = dense_cases.size() + sparse_cases.size() + prefill_cases.size() + merge_cases.size();
  auto make_row = [&](size_t i) -> std::unique_ptr<BenchCase> {
    if (i < dense_cases.size()) return std::make_unique<DenseBench>(dense_cases[i]);
    i -= dense_cases.size();
    if (i < sparse_cases.size()) return std::make_unique<SparseBench>(sparse_cases[i]);
    i -= sparse_cases.size();
    if (i < prefill_cases.size()) return std::make_unique<SparsePrefillBench>(prefill_cases[i]);
    return std::make_unique<MergeBench>(merge_cases[i - prefill_cases.size()]);
  };

  Ceilings ceil;
  CeilingOptions co;
  std::vector<RowRecord> rows;
  auto fail = [&](const std::string& msg, int code) {
    std::fprintf(stderr, "hmla-bench: %s\n", msg.c_str());
    if (!cli.json_path.empty()) write_json(cli.json_path, cli, d, ceil, co, anchors, ro, rows, planned, msg);
    return code;
  };

  try {
    Stream stream;
    // The rows are timed before the ceilings: right after the ceilings' full-power matmul and
    // streams, the first rows of a sweep ran up to 6 % slower than the same rows timed alone
    // (measured on the H200; docs/PERF.md), which is the card's state, not the kernel's.
    for (size_t i = 0; i < planned; ++i) {
      RowRecord rec;
      rec.row = make_row(i);
      if (!cli.sweep.empty()) std::fprintf(stderr, "[%zu/%zu] %s ...\n", i + 1, planned, rec.row->describe().c_str());
      rec.r = run_row(*rec.row, ro, stream.get());
      rec.row->release();
      rec.anchor = anchors.loaded() ? rec.row->find_anchor(anchors) : nullptr;
      if (!cli.sweep.empty() && rec.r.check.checked)
        std::fprintf(stderr, "        check %s in %.1f s\n", rec.r.check.pass ? "PASS" : "FAIL", rec.r.check.seconds);
      rows.push_back(std::move(rec));
    }
    if (!cli.no_ceilings) {
      if (!cli.sweep.empty()) std::fprintf(stderr, "[ceilings] read stream, device copy, bf16 matmul ...\n");
      ceil = measure_ceilings(co, stream.get());
    }
    print_device_and_ceilings(d, ceil, co);
    if (anchors.loaded() && planned > 0)
      std::printf("anchors: %s (%s); ratio = anchor time / hmla time\n", anchors.path.c_str(), anchors.system.c_str());
    if (cli.check && planned > 0)
      std::printf("check: out rel-L2 <= %.0e (sparse prefill %.0e; vs float64 reference, unrounded), |lse - ref| <= "
                  "%.0e, no NaN/inf in the whole batch's out, lse +inf exactly where a query has no key\n",
                  kCheckOutRelL2, kCheckSparsePrefillOutRelL2, kCheckLseAbs);

    // one table per family, in the order the rows ran
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i == 0 || std::string(rows[i].row->kind()) != rows[i - 1].row->kind())
        print_table_header(*rows[i].row, ceil.measured, anchors.loaded(), cli.check);
      print_row(rows[i], ceil, anchors.loaded());
    }
  } catch (const hmla::InvalidArgument& e) {
    return fail(std::string("invalid argument: ") + e.what(), kExitUsage);
  } catch (const std::exception& e) {
    return fail(e.what(), kExitError);
  }

  int failures = 0;
  for (const RowRecord& rec : rows) failures += (rec.r.check.checked && !rec.r.check.pass) ? 1 : 0;
  if (anchors.loaded() && !rows.empty()) {
    for (const char* kind : {"dense_decode", "sparse_decode", "sparse_prefill"}) {
      int with = 0;
      double log_sum = 0, worst = INFINITY;
      for (const RowRecord& rec : rows)
        if (rec.anchor && std::string(rec.row->kind()) == kind) {
          double ratio = rec.anchor->time_us / rec.r.time.median;
          ++with;
          log_sum += std::log(ratio);
          worst = std::min(worst, ratio);
        }
      if (with > 1)
        std::printf("\nratio over %d anchored %s rows: geometric mean %.3f, worst %.3f\n", with, kind,
                    std::exp(log_sum / with), worst);
    }
  }
  if (cli.check && !rows.empty()) std::printf("check: %d of %zu rows FAIL\n", failures, rows.size());
  if (!cli.json_path.empty()) write_json(cli.json_path, cli, d, ceil, co, anchors, ro, rows, planned, "");
  return failures ? kExitCheckFail : kExitOk;
}

}  // namespace
}  // namespace hmla_bench

int main(int argc, char** argv) { return hmla_bench::run(argc, argv); }
