// hmla-bench: benchmark of hmla's MLA kernels on the GPU, against the card's own ceilings and the
// FlashMLA anchor figures. Usage: hmla-bench --help.
#include <cuda_runtime_api.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anchors.h"
#include "bench_case.h"
#include "cases.h"
#include "ceilings.h"
#include "common.h"
#include "dense_bench.h"
#include "hmla/types.h"
#include "json.h"
#include "merge_bench.h"
#include "sparse_bench.h"

#include "hmla/version.h"

#ifndef HMLA_BENCH_VERSION
#define HMLA_BENCH_VERSION "unknown"
#endif

namespace hmla_bench {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;       // CUDA / runtime failure, no suitable device
constexpr int kExitUsage = 2;       // bad command line, or arguments the library rejects
constexpr int kExitCheckFail = 3;   // --check found a wrong result

const char* kUsage =
    "usage:\n"
    "  hmla-bench dense-decode --b N --h-q N --s-k N [--s-q N] [--h-kv N] [--varlen] [--causal]\n"
    "                          [--dtype bf16|fp16] [--page N] [common options]\n"
    "  hmla-bench sparse-decode --layout v32|model1 --b N --s-q N --h-q N --topk N [--s-k N] [--page N]\n"
    "                          [--extra-topk N [--extra-page N] [--extra-s-k N]]\n"
    "                          [--topk-length random|full] [--no-sink] [common options]\n"
    "  hmla-bench --sweep default|quick [--only dense|sparse_decode] [--dtype bf16|fp16] [--varlen]\n"
    "                          [common options]\n"
    "  hmla-bench merge --b N --h-q N [--s-q N] [--d-v N] [--states N] [--dtype bf16|fp16]\n"
    "                          [common options]\n"
    "  hmla-bench ceilings [common options]\n"
    "  hmla-bench --version\n"
    "\n"
    "sparse-decode (FP8 paged cache, bf16 q, h_kv 1, d_v 512; set up as compare.py does):\n"
    "  --layout v32|model1  DeepSeek-V3.2 (d_qk 576, 656 B/token) or V4 MODEL1 (d_qk 512, 584 B/token)\n"
    "  --topk N             indices per query token: distinct random positions in [0, s_k) of its request,\n"
    "                       mapped through a random block table to page * page_size + offset\n"
    "  --s-k N              positions per request the indices are drawn from (default 32768, >= topk)\n"
    "  --page N             tokens per page of the main cache (default 64)\n"
    "  --extra-topk N       an extra cache of the same layout and N indices per query token into it;\n"
    "                       --extra-page (default 64), --extra-s-k (default --s-k) shape it\n"
    "  --topk-length MODE   pass topk_length (and extra_topk_length): 'full' = topk for every request,\n"
    "                       'random' = uniform in [1, topk] per request (default: not passed)\n"
    "  --no-sink            no attn_sink (default: one random float per head)\n"
    "  The timed call is hmla::sparse_decode_run; the plan runs once per input set before timing, and its\n"
    "  own GPU time (hmla::sparse_decode_plan alone, once per decoding step in an engine) is the plan_us\n"
    "  column. flop = 2*h_q*attended*(d_qk+512), attended = b*s_q*(topk+extra_topk) (the counted entries\n"
    "  with --topk-length); bytes = 2*b*s_q*h_q*d_qk + unique_tokens_read*(656 if d_qk == 576 else 576)\n"
    "  + 2*b*s_q*h_q*512 (FlashMLA's formulas).\n"
    "\n"
    "merge (hmla::merge_attention_states, a memory-bound stream: compare GB/s with %read):\n"
    "  --states N           partial results merged per row (default 2, at most 32), each out\n"
    "                       [b, s_q, h_q, d_v] and lse [b, h_q, s_q] in the decode layouts\n"
    "  --d-v N              value columns (default 512, a multiple of 8)\n"
    "  bytes = (states + 1) * b*s_q*h_q*(2*d_v + 4) (every state read once, the result written once);\n"
    "  flop = 2*states*b*s_q*h_q*d_v.\n"
    "\n"
    "common options:\n"
    "  --check              after timing, run once more into NaN-poisoned outputs and compare with the\n"
    "                       CPU reference (up to 8 requests of the batch; --check-requests N to choose)\n"
    "  --json FILE          write every row (and the ceilings, device, settings) as JSON\n"
    "  --iters N            timed calls per row, median reported (default 50)\n"
    "  --warmup N           untimed calls first (default 5), repeated until --warmup-ms have passed\n"
    "  --warmup-ms T        minimum warm-up time per row in ms (default 25): the GPU leaves its idle\n"
    "                       clocks whatever ran before (e.g. the previous row's CPU --check)\n"
    "  --anchors FILE       FlashMLA reference figures for the ratio column (default: found next to\n"
    "                       the repository as ../shared/anchors/flashmla-h200.json, or $HMLA_ANCHORS)\n"
    "  --no-anchors         no anchor column\n"
    "  --no-ceilings        skip the ceiling measurements (no fraction columns; they are measured\n"
    "                       after the rows, so that their full-power matmul does not slow the rows)\n"
    "  --no-backlog         do not queue a spin kernel ahead of the timed calls (host launch cost is\n"
    "                       then included whenever a call is shorter than its launch)\n"
    "  --rotate-mib N       rotate input sets until one pass touches N MiB (default 512)\n"
    "  --seed N             random seed (default 20261129)\n"
    "  --device N           CUDA device (default 0)\n"
    "\n"
    "The default sweep is the 45 dense rows of ../shared/anchors/flashmla-h200.md (bf16, page 64,\n"
    "h_kv 1, fixed lengths), then the 14 sparse decode rows of ../shared/anchors/compare/compare.py (10\n"
    "with a FlashMLA anchor, 4 of 16 or 32 heads without); quick is 5 dense rows, one V3.2 and one\n"
    "MODEL1 row; --only keeps one family. --dtype and --varlen apply to the dense rows. --varlen draws\n"
    "each length uniformly in [s_k/2, s_k + s_k/2] (>= 1); the metrics use the mean.\n"
    "ratio = anchor time / hmla time (> 1: hmla is faster).\n"
    "Exit status: 0 ok, 1 CUDA/runtime error or no Hopper GPU, 2 bad arguments, 3 a --check failed.\n";

struct UsageError {
  std::string msg;
};

struct Cli {
  std::string command;  // "dense-decode", "sparse-decode", "ceilings", or "" with --sweep
  std::string sweep;
  std::string only;  // with --sweep: "", "dense" or "sparse_decode"
  // shape flags as given; the family's defaults fill the rest
  std::optional<int> b, s_q, h_q, h_kv, s_k, page, topk, extra_topk, extra_page, extra_s_k, d_v, states;
  std::optional<hmla::SparseCacheLayout> layout;
  std::optional<TopkLength> topk_length;
  bool causal = false, varlen = false, no_sink = false;
  std::optional<hmla::DType> dtype;
  DenseCase dense;
  SparseCase sparse;
  MergeCase merge;
  bool check = false;
  int check_requests = 0;
  std::string json_path;
  int iters = 50, warmup = 5;
  double warmup_ms = 25.0;
  std::string anchors_path;
  bool no_anchors = false, no_ceilings = false, no_backlog = false;
  long long rotate_mib = 512;
  unsigned long long seed = 20261129ull;
  int device = 0;
  std::string command_line;
};

long long parse_int(const std::string& flag, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end == nullptr || *end != '\0' || errno != 0)
    throw UsageError{flag + " expects an integer, got '" + v + "'"};
  if (x < lo || x > hi)
    throw UsageError{flag + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v};
  return x;
}

Cli parse_cli(int argc, char** argv) {
  Cli cli;
  for (int i = 0; i < argc; ++i) {
    if (i) cli.command_line += ' ';
    cli.command_line += argv[i];
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::string inline_value;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      size_t eq = a.find('=');
      if (eq != std::string::npos) {
        inline_value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
      return args[++i];
    };
    auto no_value = [&]() {
      if (has_inline) throw UsageError{a + " takes no value"};
    };
    const long long kMaxInt = 0x7fffffffll;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(kExitOk);
    } else if (a == "--version") {
      std::printf("hmla-bench %s (hmla %s)\n", HMLA_BENCH_VERSION, hmla::version());
      std::exit(kExitOk);
    } else if (a == "--sweep") {
      cli.sweep = value();
    } else if (a == "--only") {
      cli.only = value();
      if (cli.only != "dense" && cli.only != "sparse_decode")
        throw UsageError{"--only must be dense or sparse_decode, got '" + cli.only + "'"};
    } else if (a == "--b") {
      cli.b = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--s-q") {
      cli.s_q = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--h-q") {
      cli.h_q = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--h-kv") {
      cli.h_kv = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--s-k") {
      cli.s_k = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--page") {
      cli.page = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--topk") {
      cli.topk = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--extra-topk") {
      cli.extra_topk = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--extra-page") {
      cli.extra_page = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--extra-s-k") {
      cli.extra_s_k = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--d-v") {
      cli.d_v = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--states") {
      cli.states = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--layout") {
      std::string v = value();
      if (v == "v32") cli.layout = hmla::SparseCacheLayout::kV32;
      else if (v == "model1") cli.layout = hmla::SparseCacheLayout::kModel1;
      else throw UsageError{"--layout must be v32 or model1, got '" + v + "'"};
    } else if (a == "--topk-length") {
      std::string v = value();
      if (v == "random") cli.topk_length = TopkLength::kRandom;
      else if (v == "full") cli.topk_length = TopkLength::kFull;
      else throw UsageError{"--topk-length must be random or full, got '" + v + "'"};
    } else if (a == "--no-sink") {
      no_value();
      cli.no_sink = true;
    } else if (a == "--causal") {
      no_value();
      cli.causal = true;
    } else if (a == "--varlen") {
      no_value();
      cli.varlen = true;
    } else if (a == "--dtype") {
      std::string v = value();
      if (v == "bf16") cli.dtype = hmla::DType::kBF16;
      else if (v == "fp16") cli.dtype = hmla::DType::kFP16;
      else throw UsageError{"--dtype must be bf16 or fp16, got '" + v + "'"};
    } else if (a == "--check") {
      no_value();
      cli.check = true;
    } else if (a == "--check-requests") {
      cli.check_requests = (int)parse_int(a, value(), 1, kMaxInt);
    } else if (a == "--json") {
      cli.json_path = value();
      if (cli.json_path.empty()) throw UsageError{"--json needs a file name"};
    } else if (a == "--iters") {
      cli.iters = (int)parse_int(a, value(), 1, 100000);
    } else if (a == "--warmup") {
      cli.warmup = (int)parse_int(a, value(), 0, 100000);
    } else if (a == "--warmup-ms") {
      cli.warmup_ms = (double)parse_int(a, value(), 0, 100000);
    } else if (a == "--anchors") {
      cli.anchors_path = value();
    } else if (a == "--no-anchors") {
      no_value();
      cli.no_anchors = true;
    } else if (a == "--no-ceilings") {
      no_value();
      cli.no_ceilings = true;
    } else if (a == "--no-backlog") {
      no_value();
      cli.no_backlog = true;
    } else if (a == "--rotate-mib") {
      cli.rotate_mib = parse_int(a, value(), 0, 1 << 20);
    } else if (a == "--seed") {
      cli.seed = (unsigned long long)parse_int(a, value(), 0, 0x7fffffffffffffffll);
    } else if (a == "--device") {
      cli.device = (int)parse_int(a, value(), 0, 1023);
    } else if (a.rfind("-", 0) == 0) {
      throw UsageError{"unknown option '" + args[i] + "'"};
    } else if (cli.command.empty()) {
      if (a != "dense-decode" && a != "sparse-decode" && a != "merge" && a != "ceilings")
        throw UsageError{"unknown command '" + a + "'"};
      cli.command = a;
    } else {
      throw UsageError{"unexpected argument '" + a + "'"};
    }
  }

  // which flags each command takes
  const bool shared_shape = cli.b || cli.s_q || cli.h_q || cli.s_k || cli.page;
  const bool dense_shape = cli.h_kv || cli.causal;
  const bool dense_data = cli.dtype || cli.varlen;
  const bool sparse_shape = cli.layout || cli.topk || cli.extra_topk || cli.extra_page || cli.extra_s_k ||
                            cli.topk_length || cli.no_sink;
  const bool merge_shape = cli.d_v || cli.states;
  if (merge_shape && cli.command != "merge") throw UsageError{"--d-v and --states belong to merge"};
  if (!cli.sweep.empty()) {
    Sweep tmp;
    if (!sweep_by_name(cli.sweep, tmp)) throw UsageError{"unknown sweep '" + cli.sweep + "' (default, quick)"};
    // a family command with --sweep keeps that family's rows, as --only does
    if (cli.command == "ceilings") throw UsageError{"--sweep runs benchmark rows, not 'ceilings'"};
    if (cli.command == "merge") throw UsageError{"the sweeps have no merge rows: run 'merge' with a shape"};
    if (!cli.command.empty()) {
      const std::string family = cli.command == "dense-decode" ? "dense" : "sparse_decode";
      if (!cli.only.empty() && cli.only != family)
        throw UsageError{"'" + cli.command + "' with --only " + cli.only + " selects nothing"};
      cli.only = family;
    }
    if (shared_shape || dense_shape || sparse_shape)
      throw UsageError{"--sweep fixes the shapes; only --only, --dtype, --varlen and the common options go with it"};
  } else if (cli.command.empty()) {
    throw UsageError{"no command (dense-decode, sparse-decode, merge, ceilings) and no --sweep"};
  } else if (!cli.only.empty()) {
    throw UsageError{"--only selects the family of a --sweep"};
  } else if (cli.command == "dense-decode") {
    if (sparse_shape) throw UsageError{"--layout/--topk/--extra-*/--topk-length/--no-sink belong to sparse-decode"};
    if (!cli.b || !cli.h_q || !cli.s_k) throw UsageError{"dense-decode needs --b, --h-q and --s-k"};
    DenseCase& c = cli.dense;
    c.b = *cli.b;
    c.h_q = *cli.h_q;
    c.s_k = *cli.s_k;
    c.s_q = cli.s_q.value_or(c.s_q);
    c.h_kv = cli.h_kv.value_or(c.h_kv);
    c.page = cli.page.value_or(c.page);
    c.causal = cli.causal;
    c.varlen = cli.varlen;
    c.dtype = cli.dtype.value_or(c.dtype);
  } else if (cli.command == "sparse-decode") {
    if (dense_shape || dense_data) throw UsageError{"--h-kv/--causal/--dtype/--varlen belong to dense-decode"};
    if (!cli.layout || !cli.b || !cli.s_q || !cli.h_q || !cli.topk)
      throw UsageError{"sparse-decode needs --layout, --b, --s-q, --h-q and --topk"};
    if (!cli.extra_topk && (cli.extra_page || cli.extra_s_k))
      throw UsageError{"--extra-page and --extra-s-k shape the extra cache: they need --extra-topk"};
    SparseCase& c = cli.sparse;
    c.layout = *cli.layout;
    c.b = *cli.b;
    c.s_q = *cli.s_q;
    c.h_q = *cli.h_q;
    c.topk = *cli.topk;
    c.s_k = cli.s_k.value_or(c.s_k);
    c.page = cli.page.value_or(c.page);
    c.extra_topk = cli.extra_topk.value_or(0);
    c.extra_page = cli.extra_page.value_or(c.extra_page);
    c.extra_s_k = c.extra_topk ? cli.extra_s_k.value_or(c.s_k) : 0;
    c.topk_length = cli.topk_length.value_or(TopkLength::kNone);
    c.sink = !cli.no_sink;
    if (c.topk > c.s_k)
      throw UsageError{"--topk " + std::to_string(c.topk) + " exceeds --s-k " + std::to_string(c.s_k) +
                       ": a list holds distinct positions of [0, s_k)"};
    if (c.extra_topk > c.extra_s_k)
      throw UsageError{"--extra-topk " + std::to_string(c.extra_topk) + " exceeds --extra-s-k " +
                       std::to_string(c.extra_s_k) + ": a list holds distinct positions of [0, extra_s_k)"};
  } else if (cli.command == "merge") {
    if (dense_shape || cli.varlen || sparse_shape || cli.s_k || cli.page)
      throw UsageError{"merge takes --b, --h-q, --s-q, --d-v, --states, --dtype and the common options"};
    if (!cli.b || !cli.h_q) throw UsageError{"merge needs --b and --h-q"};
    MergeCase& c = cli.merge;
    c.b = *cli.b;
    c.h = *cli.h_q;
    c.s_q = cli.s_q.value_or(c.s_q);
    c.d_v = cli.d_v.value_or(c.d_v);
    c.states = cli.states.value_or(c.states);
    c.dtype = cli.dtype.value_or(c.dtype);
  } else if (cli.command == "ceilings") {
    if (shared_shape || dense_shape || dense_data || sparse_shape || cli.check)
      throw UsageError{"'ceilings' takes only the common options"};
    if (cli.no_ceilings) throw UsageError{"'ceilings' with --no-ceilings measures nothing"};
  }
  if (cli.no_anchors && !cli.anchors_path.empty()) throw UsageError{"--anchors and --no-anchors together"};
  return cli;
}

// ------------------------------------------------------------------------------------- device
struct DeviceInfo {
  std::string name;
  int index = 0, major = 0, minor = 0, sms = 0;
  int sm_clock_khz = 0, mem_clock_khz = 0, bus_width = 0, l2_bytes = 0;
  size_t memory_bytes = 0;
  int driver = 0, runtime = 0;
};

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

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

struct RowRecord {
  std::unique_ptr<BenchCase> row;  // released: only its figures remain
  RowResult r;
  const AnchorRow* anchor = nullptr;
};

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
    std::printf(" | %s rel %s lse %s", r.check.pass ? "PASS" : "FAIL", fmt("%.2e", r.check.out_rel_l2).c_str(),
                fmt("%.2e", r.check.lse_max_abs).c_str());
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

  JsonWriter w(f);
  w.begin_object();
  w.key("meta").begin_object();
  w.kv("tool", "hmla-bench").kv("version", HMLA_BENCH_VERSION).kv("command", cli.command_line).kv("date", date);
  w.key("device").begin_object();
  w.kv("name", d.name).kv("index", d.index).kv("cc", std::to_string(d.major) + "." + std::to_string(d.minor));
  w.kv("sm_count", d.sms).kv("sm_clock_mhz_max", d.sm_clock_khz / 1000).kv("mem_clock_mhz_max", d.mem_clock_khz / 1000);
  w.kv("mem_bus_width_bits", d.bus_width).kv("memory_bytes", (unsigned long long)d.memory_bytes);
  w.kv("l2_bytes", d.l2_bytes).kv("driver_version", version_string(d.driver));
  w.kv("runtime_version", version_string(d.runtime));
  w.end_object();
  w.kv("timing",
       std::string("CUDA events around each hmla::dense_decode_run call (split + combine; plan built once before "
                   "timing) or hmla::sparse_decode_run call (plan built once before timing; plan_time_us times "
                   "hmla::sparse_decode_plan alone the same way), ") +
           std::to_string(ro.warmup) + " warm-up (repeated for at least " + std::to_string((int)ro.warmup_ms) +
           " ms), median of " + std::to_string(ro.iters) +
           ", input sets rotated until a pass touches " + std::to_string(ro.rotate_min_bytes >> 20) + " MiB" +
           (ro.backlog ? ", timed calls queued behind a spin kernel (GPU time only)" : ", no backlog"));
  w.key("formulas").begin_object();
  w.kv("merge", "bytes = (states + 1)*b*s_q*h_q*(2*d_v + 4) ; flop = 2*states*b*s_q*h_q*d_v");
  w.kv("dense",
       "flop = b*s_q*h_q*(2*576 + 2*512)*s_k ; bytes = b*(s_q*h_q*576*2 + s_k*h_kv*576*2 + s_q*h_q*512*2), s_k = mean "
       "length; GB = 1e9 bytes, TFLOPS = 1e12 flop/s");
  w.kv("sparse_decode",
       "flop = 2*h_q*attended*(d_qk + 512), attended = b*s_q*(topk + extra_topk) (the counted entries when "
       "topk_length is passed) ; bytes = 2*b*s_q*h_q*d_qk + unique_tokens_read*(656 if d_qk == 576 else 576) + "
       "2*b*s_q*h_q*512, unique_tokens_read = distinct tokens the counted entries name, mean over the input sets");
  w.end_object();
  if (ceil.measured) {
    w.key("ceilings").begin_object();
    w.kv("read_stream_gbps", ceil.read_gbps);
    w.kv("copy_gbps_read_plus_write", ceil.copy_gbps);
    w.kv("bf16_matmul_tflops_8192", ceil.matmul_tflops);
    w.kv("read_bytes", ceil.read_bytes).kv("read_best_variant", ceil.read_best_variant);
    w.key("read_variants").begin_array();
    for (const ReadVariant& v : ceil.read_variants)
      w.begin_object().kv("name", v.name).kv("gbps", v.gbps).kv("median_us", v.time.median).end_object();
    w.end_array();
    w.kv("copy_bytes_counted", ceil.copy_bytes_counted).kv("copy_median_us", ceil.copy_time.median);
    w.kv("matmul_n", ceil.matmul_n).kv("matmul_median_us", ceil.matmul_time.median);
    w.kv("cublas_version", ceil.cublas_version).kv("warmup", co.warmup).kv("iters", co.iters);
    w.end_object();
  } else {
    w.kv_null("ceilings");
  }
  if (anchors.loaded()) {
    w.key("anchors").begin_object().kv("path", anchors.path).kv("system", anchors.system).end_object();
  } else {
    w.kv_null("anchors");
  }
  w.key("check_thresholds").begin_object();
  w.kv("out_rel_l2", kCheckOutRelL2).kv("lse_abs", kCheckLseAbs);
  w.end_object();
  w.key("options").begin_object();
  w.kv("iters", ro.iters).kv("warmup", ro.warmup).kv("warmup_ms", ro.warmup_ms).kv("backlog", ro.backlog);
  w.kv("rotate_min_mib", (unsigned long long)(ro.rotate_min_bytes >> 20)).kv("seed", (unsigned long long)ro.seed);
  w.kv("sweep", cli.sweep).kv("only", cli.only).kv("check", ro.check);
  w.end_object();
  w.end_object();  // meta

  w.key("rows").begin_array();
  int failures = 0;
  for (const RowRecord& rec : rows) {
    const RowResult& r = rec.r;
    const CheckOutcome& ck = r.check;
    w.begin_object();
    rec.row->json_shape(w);
    w.kv("time_us", r.time.median).kv("time_us_mean", r.time.mean).kv("time_us_min", r.time.min);
    w.kv("time_us_p10", r.time.p10).kv("time_us_p90", r.time.p90).kv("time_us_max", r.time.max);
    w.kv("iters", r.time.count).kv("warmup", ro.warmup).kv("input_sets", r.input_sets);
    w.kv("bytes_per_set", r.bytes_per_set);
    w.kv("flop", r.flops).kv("bytes", r.bytes).kv("tflops", r.tflops).kv("gbps", r.gbps);
    w.kv_opt("frac_stream", ceil.measured, r.gbps / ceil.read_gbps);
    w.kv_opt("frac_copy", ceil.measured, r.gbps / ceil.copy_gbps);
    w.kv_opt("frac_matmul", ceil.measured, r.tflops / ceil.matmul_tflops);
    w.kv_opt("anchor_time_us", rec.anchor != nullptr, rec.anchor ? rec.anchor->time_us : 0.0);
    w.kv_opt("ratio", rec.anchor != nullptr, rec.anchor ? rec.anchor->time_us / r.time.median : 0.0);
    rec.row->json_schedule(w);
    w.kv("sm_clock_mhz", r.sm_mhz);
    w.kv("workspace_bytes", (unsigned long long)rec.row->workspace_bytes());
    rec.row->json_extras(w);
    if (ck.checked) {
      w.kv("check_pass", ck.pass);
      w.kv("check_out_rel_l2", ck.out_rel_l2).kv("check_out_max_abs", ck.out_max_abs);
      w.kv("check_lse_max_abs", ck.lse_max_abs);
      w.kv("check_nonfinite_out", ck.nonfinite_out).kv("check_bad_lse", ck.bad_lse);
      w.key("check_requests").begin_array();
      for (int id : ck.request_ids) w.value(id);
      w.end_array();
      w.kv("check_seconds", ck.seconds).kv("check_note", ck.note);
      if (!ck.pass) ++failures;
    }
    w.end_object();
  }
  w.end_array();

  w.key("summary").begin_object();
  w.kv("rows_planned", (unsigned long long)planned).kv("rows_done", (unsigned long long)rows.size());
  w.kv("check_failures", failures).kv("completed", error.empty() && rows.size() == planned);
  if (error.empty()) w.kv_null("error");
  else w.kv("error", error);
  w.end_object();
  w.end_object();
  f.flush();
  if (!f) std::fprintf(stderr, "hmla-bench: error while writing '%s'\n", path.c_str());
}

int run(int argc, char** argv) {
  Cli cli;
  try {
    cli = parse_cli(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hmla-bench: %s\n\n%s", e.msg.c_str(), kUsage);
    return kExitUsage;
  }

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
  std::vector<MergeCase> merge_cases;
  if (!cli.sweep.empty()) {
    Sweep sweep;
    sweep_by_name(cli.sweep, sweep);
    if (cli.only != "sparse_decode") dense_cases = sweep.dense;
    if (cli.only != "dense") sparse_cases = sweep.sparse;
    for (DenseCase& c : dense_cases) {
      if (cli.dtype) c.dtype = *cli.dtype;
      if (cli.varlen) c.varlen = true;
    }
  } else if (cli.command == "dense-decode") {
    dense_cases.push_back(cli.dense);
  } else if (cli.command == "sparse-decode") {
    sparse_cases.push_back(cli.sparse);
  } else if (cli.command == "merge") {
    merge_cases.push_back(cli.merge);
  }
  const size_t planned = dense_cases.size() + sparse_cases.size() + merge_cases.size();
  auto make_row = [&](size_t i) -> std::unique_ptr<BenchCase> {
    if (i < dense_cases.size()) return std::make_unique<DenseBench>(dense_cases[i]);
    i -= dense_cases.size();
    if (i < sparse_cases.size()) return std::make_unique<SparseBench>(sparse_cases[i]);
    return std::make_unique<MergeBench>(merge_cases[i - sparse_cases.size()]);
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
      std::printf("check: out rel-L2 <= %.0e (vs float64 reference, unrounded), |lse - ref| <= %.0e, no NaN/inf in "
                  "the whole batch's out, lse +inf exactly where a query has no key\n",
                  kCheckOutRelL2, kCheckLseAbs);

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
    for (const char* kind : {"dense_decode", "sparse_decode"}) {
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
