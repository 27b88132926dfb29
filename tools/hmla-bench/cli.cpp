// hmla-bench: the command line (see cli.h). CLI11 reads the flags and rejects a malformed value
// naming the flag; which flags go with which command is checked here afterwards, as a family
// command may sit anywhere among the flags (`hmla-bench --check dense-decode --b 1 ...`).
#include "cli.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include "hmla/version.h"

#ifndef HMLA_BENCH_VERSION
#define HMLA_BENCH_VERSION "unknown"
#endif

namespace hmla_bench {
namespace {

const char* kSynopsis =
    "Benchmark of hmla's MLA kernels on the GPU, against the card's own ceilings and the FlashMLA anchor figures.\n"
    "\n"
    "  hmla-bench dense-decode --b N --h-q N --s-k N [--s-q N] [--h-kv N] [--varlen] [--causal]\n"
    "                          [--dtype bf16|fp16] [--page N] [common options]\n"
    "  hmla-bench sparse-decode --layout v32|model1 --b N --s-q N --h-q N --topk N [--s-k N] [--page N]\n"
    "                          [--extra-topk N [--extra-page N] [--extra-s-k N]]\n"
    "                          [--topk-length random|full] [--no-sink] [common options]\n"
    "  hmla-bench sparse-prefill --s-q N --h-q N --d-qk 576|512 --s-kv N --topk N\n"
    "                          [--topk-length random|full] [--no-sink] [common options]\n"
    "  hmla-bench --sweep default|quick [--only dense|sparse_decode|sparse_prefill] [--dtype bf16|fp16]\n"
    "                          [--varlen] [common options]\n"
    "  hmla-bench merge --b N --h-q N [--s-q N] [--d-v N] [--states N] [--dtype bf16|fp16]\n"
    "                          [common options]\n"
    "  hmla-bench ceilings [common options]\n"
    "  hmla-bench --version\n";

const char* kDetails =
    "\n"
    "sparse-decode (FP8 paged cache, bf16 q, h_kv 1, d_v 512; set up as compare.py does):\n"
    "  --topk draws distinct random positions in [0, s_k) of the query's request, mapped through a\n"
    "  random block table to page * page_size + offset. The timed call is hmla::sparse_decode_run;\n"
    "  the plan runs once per input set before timing, and its own GPU time (hmla::sparse_decode_plan\n"
    "  alone, once per decoding step in an engine) is the plan_us column, cold_us the same after a\n"
    "  256 MiB write has swept the L2, and step_us what a fresh plan adds to the attention call\n"
    "  behind it (medians of the two, timed alternately in one loop).\n"
    "  flop = 2*h_q*attended*(d_qk+512), attended = b*s_q*(topk+extra_topk) (the counted entries\n"
    "  with --topk-length); bytes = 2*b*s_q*h_q*d_qk + unique_tokens_read*(656 if d_qk == 576 else 576)\n"
    "  + 2*b*s_q*h_q*512 (FlashMLA's formulas).\n"
    "\n"
    "sparse-prefill (bf16 q [s_q, h_q, d_qk] and kv [s_kv, d_qk], d_v 512; set up as compare.py does):\n"
    "  each query token's --topk indices are distinct random rows of kv; q and kv are bf16 randn * 0.1,\n"
    "  softmax_scale = d_qk^-0.5, attn_sink one randn per head. The timed call is\n"
    "  hmla::sparse_prefill_run (nothing to plan) with the workspace that cuts the last round of items\n"
    "  (HMLA_BENCH_PREFILL_WHOLE_ITEMS=1: without it). --topk-length passes one length per query token.\n"
    "  --check compares 64 query tokens spread over s_q (--check-requests N: N tokens), out rel-L2 <= 4e-3.\n"
    "  flop = 2*h_q*attended*(d_qk+512), attended = s_q*topk (the counted entries with --topk-length);\n"
    "  bytes = attended*d_qk*2 + s_q*h_q*(d_qk+512)*2 (FlashMLA's formulas).\n"
    "\n"
    "merge (hmla::merge_attention_states, a memory-bound stream: compare GB/s with %read):\n"
    "  each state is out [b, s_q, h_q, d_v] and lse [b, h_q, s_q] in the decode layouts;\n"
    "  bytes = (states + 1) * b*s_q*h_q*(2*d_v + 4) (every state read once, the result written once);\n"
    "  flop = 2*states*b*s_q*h_q*d_v.\n"
    "\n"
    "The default sweep is the 45 dense rows of ../shared/anchors/flashmla-h200.md (bf16, page 64,\n"
    "h_kv 1, fixed lengths), then the 14 sparse decode rows of ../shared/anchors/compare/compare.py (10\n"
    "with a FlashMLA anchor, 4 of 16 or 32 heads without), then its 8 sparse prefill rows (s_q 4096,\n"
    "topk 2048, h_q 64/128, d_qk 576/512, s_kv 8192/65536); quick is 5 dense rows, one V3.2 and one\n"
    "MODEL1 decode row and one prefill row; --only keeps one family. --dtype and --varlen apply to the\n"
    "dense rows. --varlen draws each length uniformly in [s_k/2, s_k + s_k/2] (>= 1); the metrics use\n"
    "the mean.\n"
    "ratio = anchor time / hmla time (> 1: hmla is faster).\n"
    "Exit status: 0 ok, 1 CUDA/runtime error or no Hopper GPU, 2 bad arguments, 3 a --check failed.\n";

// A combination of flags that each parsed but do not go together.
struct UsageError {
  std::string msg;
};

// The shape flags as given: each family fills what is absent with its own defaults.
struct ShapeFlags {
  std::optional<int> b, s_q, h_q, h_kv, s_k, page, topk, extra_topk, extra_page, extra_s_k, d_v, states, d_qk, s_kv;
  std::optional<hmla::SparseCacheLayout> layout;
  std::optional<TopkLength> topk_length;
  bool causal = false, no_sink = false;
};

constexpr long long kMaxInt = INT_MAX;

// A decimal integer in [lo, hi], rewritten in canonical form: CLI11 itself converts with base 0,
// which would read "010" as 8 and accept "0x10". CLI11 prefixes the message with the flag.
CLI::Validator integer_in(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        const std::string expect =
            "expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'";
        const size_t first_digit = (!v.empty() && (v[0] == '+' || v[0] == '-')) ? 1 : 0;
        if (v.size() <= first_digit || v.find_first_not_of("0123456789", first_digit) != std::string::npos)
          return expect;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), nullptr, 10);
        if (errno != 0 || x < lo || x > hi) return expect;
        v = std::to_string(x);
        return "";
      },
      "");
}

std::string shortest(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// A decimal number in [lo, hi].
CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !(x >= lo && x <= hi))
          return "expects a number in [" + shortest(lo) + ", " + shortest(hi) + "], got '" + v + "'";
        return "";
      },
      "");
}

// The flag's value into `target`, which stays empty when the flag is absent.
CLI::Option* add_count(CLI::App& app, const std::string& flag, std::optional<int>& target, const std::string& help) {
  return app.add_option_function<int>(flag, [&target](const int& v) { target = v; }, help)
      ->transform(integer_in(1, kMaxInt))
      ->option_text("N");
}

// A flag whose value is one of `names` (listed in this order in the help), stored as the matching
// enumerator.
template <typename T>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, std::optional<T>& target,
                        const std::vector<std::pair<std::string, T>>& names, const std::string& help) {
  std::vector<std::string> keys;
  std::string text;
  for (const auto& [name, value] : names) {
    keys.push_back(name);
    text += (text.empty() ? "" : "|") + name;
  }
  return app.add_option_function<std::string>(
                flag,
                [&target, names](const std::string& v) {
                  for (const auto& [name, value] : names)
                    if (name == v) target = value;
                },
                help)
      ->check(CLI::IsMember(keys))
      ->option_text(text);
}

void build_parser(CLI::App& app, Cli& cli, ShapeFlags& f) {
  app.description(kSynopsis);
  app.footer(kDetails);
  app.get_formatter()->column_width(26);
  // A repeated flag keeps its last value, as hand-written command lines and scripts expect.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", std::string("hmla-bench ") + HMLA_BENCH_VERSION + " (hmla " + hmla::version() + ")",
                       "Print the version and exit");
  app.require_subcommand(0, 1);
  // The family commands only name the row's family; every flag lives on the top level, so a flag
  // after the command falls through to it and --help shows them all.
  app.fallthrough();
  for (const char* name : {"dense-decode", "sparse-decode", "sparse-prefill", "merge", "ceilings"}) {
    CLI::App* sub = app.add_subcommand(name);
    sub->set_help_flag();
    sub->callback([&cli, name]() { cli.command = name; });
  }
  app.get_subcommand("dense-decode")->description("one dense decode row (BF16/FP16 paged cache)");
  app.get_subcommand("sparse-decode")->description("one token-sparse decode row (FP8 paged cache)");
  app.get_subcommand("sparse-prefill")->description("one token-sparse prefill row (bf16 kv)");
  app.get_subcommand("merge")->description("one hmla::merge_attention_states row");
  app.get_subcommand("ceilings")->description("only the card's read, copy and matmul ceilings");

  const std::string shape = "Shape (dense-decode, sparse-decode, sparse-prefill, merge)";
  add_count(app, "--b", f.b, "batch entries")->group(shape);
  add_count(app, "--s-q", f.s_q, "query tokens per request (default 1; sparse-prefill: query tokens)")->group(shape);
  add_count(app, "--h-q", f.h_q, "query heads")->group(shape);
  add_count(app, "--s-k", f.s_k,
            "keys per request (dense), positions the sparse indices are drawn from (sparse, default 32768, "
            ">= topk)")->group(shape);
  add_count(app, "--page", f.page, "tokens per page of the (main) cache (default 64)")->group(shape);
  add_choice(app, "--dtype", cli.dtype, {{"bf16", hmla::DType::kBF16}, {"fp16", hmla::DType::kFP16}},
             "q, cache and out type of dense decode and merge (default bf16)")->group(shape);

  const std::string dense = "dense-decode";
  add_count(app, "--h-kv", f.h_kv, "key/value heads (default 1)")->group(dense);
  app.add_flag("--causal", f.causal, "causal mask over the s_q query tokens")->group(dense);
  app.add_flag("--varlen", cli.varlen, "lengths uniform in [s_k/2, s_k + s_k/2] (also with --sweep)")->group(dense);

  const std::string sparse = "sparse-decode";
  add_choice(app, "--layout", f.layout,
             {{"v32", hmla::SparseCacheLayout::kV32}, {"model1", hmla::SparseCacheLayout::kModel1}},
             "DeepSeek-V3.2 (d_qk 576, 656 B/token) or V4 MODEL1 (d_qk 512, 584 B/token)")->group(sparse);
  add_count(app, "--extra-topk", f.extra_topk,
            "an extra cache of the same layout and N indices per query token into it")->group(sparse);
  add_count(app, "--extra-page", f.extra_page, "tokens per page of the extra cache (default 64)")->group(sparse);
  add_count(app, "--extra-s-k", f.extra_s_k, "positions of the extra cache (default --s-k)")->group(sparse);

  const std::string prefill = "sparse-prefill";
  add_choice(app, "--d-qk", f.d_qk, {{"576", 576}, {"512", 512}},
             "q and kv columns: 576 (V3.2) or 512 (MODEL1); d_v is 512")->group(prefill);
  add_count(app, "--s-kv", f.s_kv, "rows of kv the indices name (>= topk)")->group(prefill);

  const std::string both_sparse = "sparse-decode and sparse-prefill";
  add_count(app, "--topk", f.topk, "indices per query token (sparse-decode: into the main cache)")->group(both_sparse);
  add_choice(app, "--topk-length", f.topk_length, {{"random", TopkLength::kRandom}, {"full", TopkLength::kFull}},
             "pass topk_length (and extra_topk_length): 'full' = topk for every request (prefill: query token), "
             "'random' = uniform in [1, topk] per request (query token) (default: not passed)")->group(both_sparse);
  app.add_flag("--no-sink", f.no_sink, "no attn_sink (default: one random float per head)")->group(both_sparse);

  const std::string merge = "merge";
  add_count(app, "--d-v", f.d_v, "value columns (default 512, a multiple of 8)")->group(merge);
  add_count(app, "--states", f.states, "partial results merged per row (default 2, at most 32)")->group(merge);

  const std::string sweep = "Sweep";
  app.add_option("--sweep", cli.sweep, "the named rows: default or quick")
      ->check(CLI::IsMember({"default", "quick"}))->option_text("default|quick")->group(sweep);
  app.add_option("--only", cli.only, "keep one family of the sweep")
      ->check(CLI::IsMember({"dense", "sparse_decode", "sparse_prefill"}))
      ->option_text("dense|sparse_decode|sparse_prefill")->group(sweep);

  const std::string common = "Common options";
  app.add_flag("--check", cli.check,
               "after timing, run once more into NaN-poisoned outputs and compare with the CPU reference "
               "(up to 8 requests of the batch; sparse-prefill: 64 query tokens)")->group(common);
  app.add_option("--check-requests", cli.check_requests,
                 "requests (sparse-prefill: query tokens) --check compares (default: automatic)")
      ->transform(integer_in(1, kMaxInt))->option_text("N")->group(common);
  app.add_option("--json", cli.json_path, "write every row (and the ceilings, device, settings) as JSON")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("needs a file name") : ""; },
                             "FILE"))
      ->option_text("FILE")->group(common);
  app.add_option("--iters", cli.iters, "timed calls per row, median reported (default 50)")
      ->transform(integer_in(1, 100000))->option_text("N")->group(common);
  app.add_option("--warmup", cli.warmup, "untimed calls first (default 5), repeated until --warmup-ms have passed")
      ->transform(integer_in(0, 100000))->option_text("N")->group(common);
  app.add_option("--warmup-ms", cli.warmup_ms,
                 "minimum warm-up time per row in ms (default 25): the GPU leaves its idle clocks whatever ran "
                 "before (e.g. the previous row's CPU --check)")
      ->check(number_in(0, 100000))->option_text("T")->group(common);
  app.add_option("--anchors", cli.anchors_path,
                 "FlashMLA reference figures for the ratio column (default: ../shared/anchors/flashmla-h200.json "
                 "next to the repository, or $HMLA_ANCHORS)")
      ->option_text("FILE")->group(common);
  app.add_flag("--no-anchors", cli.no_anchors, "no anchor column")->group(common);
  app.add_flag("--no-ceilings", cli.no_ceilings,
               "skip the ceiling measurements (no fraction columns; they are measured after the rows, so that "
               "their full-power matmul does not slow the rows)")->group(common);
  app.add_flag("--no-backlog", cli.no_backlog,
               "do not queue a spin kernel ahead of the timed calls (host launch cost is then included whenever "
               "a call is shorter than its launch)")->group(common);
  app.add_option("--rotate-mib", cli.rotate_mib, "rotate input sets until one pass touches N MiB (default 512)")
      ->transform(integer_in(0, 1LL << 20))->option_text("N")->group(common);
  app.add_option("--seed", cli.seed, "random seed (default 20261129)")
      ->transform(integer_in(0, LLONG_MAX))->option_text("N")->group(common);
  app.add_option("--device", cli.device, "CUDA device (default 0)")
      ->transform(integer_in(0, 1023))->option_text("N")->group(common);
}

// Which flags each command takes, and the family's row from the shape flags.
void resolve(Cli& cli, const ShapeFlags& f) {
  const bool shared_shape = f.b || f.s_q || f.h_q || f.s_k || f.page;
  const bool dense_shape = f.h_kv || f.causal;
  const bool dense_data = cli.dtype || cli.varlen;
  const bool sparse_shape =
      f.layout || f.topk || f.extra_topk || f.extra_page || f.extra_s_k || f.topk_length || f.no_sink;
  const bool prefill_shape = f.d_qk || f.s_kv;
  const bool merge_shape = f.d_v || f.states;
  if (merge_shape && cli.command != "merge") throw UsageError{"--d-v and --states belong to merge"};
  if (prefill_shape && cli.command != "sparse-prefill") throw UsageError{"--d-qk and --s-kv belong to sparse-prefill"};
  if (!cli.sweep.empty()) {
    // a family command with --sweep keeps that family's rows, as --only does
    if (cli.command == "ceilings") throw UsageError{"--sweep runs benchmark rows, not 'ceilings'"};
    if (cli.command == "merge") throw UsageError{"the sweeps have no merge rows: run 'merge' with a shape"};
    if (!cli.command.empty()) {
      const std::string family = cli.command == "dense-decode"    ? "dense"
                                 : cli.command == "sparse-decode" ? "sparse_decode"
                                                                  : "sparse_prefill";
      if (!cli.only.empty() && cli.only != family)
        throw UsageError{"'" + cli.command + "' with --only " + cli.only + " selects nothing"};
      cli.only = family;
    }
    if (shared_shape || dense_shape || sparse_shape || prefill_shape)
      throw UsageError{"--sweep fixes the shapes; only --only, --dtype, --varlen and the common options go with it"};
  } else if (cli.command.empty()) {
    throw UsageError{"no command (dense-decode, sparse-decode, sparse-prefill, merge, ceilings) and no --sweep"};
  } else if (!cli.only.empty()) {
    throw UsageError{"--only selects the family of a --sweep"};
  } else if (cli.command == "dense-decode") {
    if (sparse_shape)
      throw UsageError{"--layout/--extra-* belong to sparse-decode, --topk/--topk-length/--no-sink to sparse-decode "
                       "and sparse-prefill"};
    if (!f.b || !f.h_q || !f.s_k) throw UsageError{"dense-decode needs --b, --h-q and --s-k"};
    DenseCase& c = cli.dense;
    c.b = *f.b;
    c.h_q = *f.h_q;
    c.s_k = *f.s_k;
    c.s_q = f.s_q.value_or(c.s_q);
    c.h_kv = f.h_kv.value_or(c.h_kv);
    c.page = f.page.value_or(c.page);
    c.causal = f.causal;
    c.varlen = cli.varlen;
    c.dtype = cli.dtype.value_or(c.dtype);
  } else if (cli.command == "sparse-decode") {
    if (dense_shape || dense_data) throw UsageError{"--h-kv/--causal/--dtype/--varlen belong to dense-decode"};
    if (!f.layout || !f.b || !f.s_q || !f.h_q || !f.topk)
      throw UsageError{"sparse-decode needs --layout, --b, --s-q, --h-q and --topk"};
    if (!f.extra_topk && (f.extra_page || f.extra_s_k))
      throw UsageError{"--extra-page and --extra-s-k shape the extra cache: they need --extra-topk"};
    SparseCase& c = cli.sparse;
    c.layout = *f.layout;
    c.b = *f.b;
    c.s_q = *f.s_q;
    c.h_q = *f.h_q;
    c.topk = *f.topk;
    c.s_k = f.s_k.value_or(c.s_k);
    c.page = f.page.value_or(c.page);
    c.extra_topk = f.extra_topk.value_or(0);
    c.extra_page = f.extra_page.value_or(c.extra_page);
    c.extra_s_k = c.extra_topk ? f.extra_s_k.value_or(c.s_k) : 0;
    c.topk_length = f.topk_length.value_or(TopkLength::kNone);
    c.sink = !f.no_sink;
    if (c.topk > c.s_k)
      throw UsageError{"--topk " + std::to_string(c.topk) + " exceeds --s-k " + std::to_string(c.s_k) +
                       ": a list holds distinct positions of [0, s_k)"};
    if (c.extra_topk > c.extra_s_k)
      throw UsageError{"--extra-topk " + std::to_string(c.extra_topk) + " exceeds --extra-s-k " +
                       std::to_string(c.extra_s_k) + ": a list holds distinct positions of [0, extra_s_k)"};
  } else if (cli.command == "sparse-prefill") {
    if (f.b || f.s_k || f.page || dense_shape || dense_data || f.layout || f.extra_topk || f.extra_page || f.extra_s_k)
      throw UsageError{"sparse-prefill takes --s-q, --h-q, --d-qk, --s-kv, --topk, --topk-length, --no-sink and the "
                       "common options"};
    if (!f.s_q || !f.h_q || !f.d_qk || !f.s_kv || !f.topk)
      throw UsageError{"sparse-prefill needs --s-q, --h-q, --d-qk, --s-kv and --topk"};
    SparsePrefillCase& c = cli.prefill;
    c.s_q = *f.s_q;
    c.h_q = *f.h_q;
    c.d_qk = *f.d_qk;
    c.s_kv = *f.s_kv;
    c.topk = *f.topk;
    c.topk_length = f.topk_length.value_or(TopkLength::kNone);
    c.sink = !f.no_sink;
    if (c.topk > c.s_kv)
      throw UsageError{"--topk " + std::to_string(c.topk) + " exceeds --s-kv " + std::to_string(c.s_kv) +
                       ": a list holds distinct rows of kv"};
  } else if (cli.command == "merge") {
    if (dense_shape || cli.varlen || sparse_shape || f.s_k || f.page)
      throw UsageError{"merge takes --b, --h-q, --s-q, --d-v, --states, --dtype and the common options"};
    if (!f.b || !f.h_q) throw UsageError{"merge needs --b and --h-q"};
    MergeCase& c = cli.merge;
    c.b = *f.b;
    c.h = *f.h_q;
    c.s_q = f.s_q.value_or(c.s_q);
    c.d_v = f.d_v.value_or(c.d_v);
    c.states = f.states.value_or(c.states);
    c.dtype = cli.dtype.value_or(c.dtype);
  } else if (cli.command == "ceilings") {
    if (shared_shape || dense_shape || dense_data || sparse_shape || cli.check)
      throw UsageError{"'ceilings' takes only the common options"};
    if (cli.no_ceilings) throw UsageError{"'ceilings' with --no-ceilings measures nothing"};
  }
  if (cli.no_anchors && !cli.anchors_path.empty()) throw UsageError{"--anchors and --no-anchors together"};
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv) {
  ParsedCommandLine parsed;
  Cli& cli = parsed.cli;
  for (int i = 0; i < argc; ++i) {
    if (i) cli.command_line += ' ';
    cli.command_line += argv[i];
  }
  ShapeFlags flags;
  CLI::App app{"", "hmla-bench"};
  build_parser(app, cli, flags);
  using Outcome = ParsedCommandLine::Outcome;
  try {
    app.parse(argc, argv);
    resolve(cli, flags);
  } catch (const CLI::CallForHelp&) {
    parsed.outcome = Outcome::kHelp;
    // App::help would describe the command given, which has no flags of its own: always the top level.
    parsed.text = app.get_formatter()->make_help(&app, "hmla-bench", CLI::AppFormatMode::Normal);
  } catch (const CLI::CallForVersion& e) {
    parsed.outcome = Outcome::kVersion;
    parsed.text = std::string(e.what()) + "\n";
  } catch (const CLI::ParseError& e) {
    parsed.outcome = Outcome::kUsageError;
    parsed.text = e.what();
  } catch (const UsageError& e) {
    parsed.outcome = Outcome::kUsageError;
    parsed.text = e.msg;
  }
  return parsed;
}

}  // namespace hmla_bench
