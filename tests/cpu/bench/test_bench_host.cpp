// hmla-bench's host side on the CPU: what command lines mean (CLI11), the anchor file (nlohmann-json
// reading), and the result file's rows and document (nlohmann-json writing, schema and key order
// that tools/plot_results.py and the committed bench/results/*.json rely on).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "anchors.h"
#include "bench_case.h"
#include "bench_json.h"
#include "cli.h"
#include "hmla/version.h"
#include "result_json.h"

namespace hmla_bench {
namespace {

using Outcome = ParsedCommandLine::Outcome;

ParsedCommandLine parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"hmla-bench"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parse_command_line((int)argv.size(), argv.data());
}

Cli parse_ok(std::initializer_list<const char*> args) {
  ParsedCommandLine p = parse(args);
  EXPECT_EQ(p.outcome, Outcome::kRun) << p.text;
  return p.cli;
}

// The error names the flag and the value at fault.
void expect_usage_error(std::initializer_list<const char*> args, std::initializer_list<const char*> mentions) {
  ParsedCommandLine p = parse(args);
  ASSERT_EQ(p.outcome, Outcome::kUsageError);
  for (const char* m : mentions) EXPECT_NE(p.text.find(m), std::string::npos) << "'" << m << "' not in: " << p.text;
}

TEST(BenchCli, DenseDecodeFillsTheFamilyDefaults) {
  Cli cli = parse_ok({"dense-decode", "--b", "4", "--h-q", "16", "--s-k", "1024"});
  EXPECT_EQ(cli.command, "dense-decode");
  EXPECT_TRUE(cli.sweep.empty());
  EXPECT_EQ(cli.dense.b, 4);
  EXPECT_EQ(cli.dense.h_q, 16);
  EXPECT_EQ(cli.dense.s_k, 1024);
  EXPECT_EQ(cli.dense.s_q, 1);
  EXPECT_EQ(cli.dense.h_kv, 1);
  EXPECT_EQ(cli.dense.page, 64);
  EXPECT_EQ(cli.dense.dtype, hmla::DType::kBF16);
  EXPECT_FALSE(cli.dense.causal);
  EXPECT_EQ(cli.iters, 50);
  EXPECT_EQ(cli.warmup, 5);
  EXPECT_EQ(cli.seed, 20261129ull);
  EXPECT_EQ(cli.command_line, "hmla-bench dense-decode --b 4 --h-q 16 --s-k 1024");
}

TEST(BenchCli, FlagsBeforeAndAfterTheCommandAndInlineValues) {
  Cli cli = parse_ok({"--check", "--json=out.json", "dense-decode", "--b=2", "--h-q", "8", "--s-k", "512", "--causal",
                      "--dtype", "fp16", "--s-q", "2", "--iters", "3", "--iters", "7", "--seed", "42", "--no-ceilings",
                      "--anchors", "a.json", "--warmup-ms", "10", "--rotate-mib", "0", "--device", "1"});
  EXPECT_EQ(cli.command, "dense-decode");
  EXPECT_TRUE(cli.check);
  EXPECT_EQ(cli.json_path, "out.json");
  EXPECT_EQ(cli.dense.b, 2);
  EXPECT_EQ(cli.dense.s_q, 2);
  EXPECT_TRUE(cli.dense.causal);
  EXPECT_EQ(cli.dense.dtype, hmla::DType::kFP16);
  EXPECT_EQ(cli.iters, 7);  // a repeated flag keeps its last value
  EXPECT_EQ(cli.seed, 42ull);
  EXPECT_TRUE(cli.no_ceilings);
  EXPECT_EQ(cli.anchors_path, "a.json");
  EXPECT_DOUBLE_EQ(cli.warmup_ms, 10.0);
  EXPECT_EQ(cli.rotate_mib, 0);
  EXPECT_EQ(cli.device, 1);
  // decimal, whatever the leading zeros (CLI11 alone would read "010" as octal)
  EXPECT_EQ(parse_ok({"--sweep", "quick", "--device", "010"}).device, 10);
}

TEST(BenchCli, SparseDecodeWithAnExtraCache) {
  Cli cli = parse_ok({"sparse-decode", "--layout", "model1", "--b", "8", "--s-q", "2", "--h-q", "64", "--topk", "128",
                      "--s-k", "16384", "--page", "256", "--extra-topk", "512", "--topk-length", "random",
                      "--no-sink"});
  EXPECT_EQ(cli.command, "sparse-decode");
  const SparseCase& c = cli.sparse;
  EXPECT_EQ(c.layout, hmla::SparseCacheLayout::kModel1);
  EXPECT_EQ(c.b, 8);
  EXPECT_EQ(c.s_q, 2);
  EXPECT_EQ(c.topk, 128);
  EXPECT_EQ(c.page, 256);
  EXPECT_EQ(c.extra_topk, 512);
  EXPECT_EQ(c.extra_s_k, 16384);  // --extra-s-k defaults to --s-k
  EXPECT_EQ(c.extra_page, 64);
  EXPECT_EQ(c.topk_length, TopkLength::kRandom);
  EXPECT_FALSE(c.sink);

  Cli plain = parse_ok({"sparse-decode", "--layout", "v32", "--b", "1", "--s-q", "1", "--h-q", "16", "--topk", "64"});
  EXPECT_EQ(plain.sparse.layout, hmla::SparseCacheLayout::kV32);
  EXPECT_EQ(plain.sparse.extra_topk, 0);
  EXPECT_EQ(plain.sparse.extra_s_k, 0);  // no extra cache
  EXPECT_EQ(plain.sparse.topk_length, TopkLength::kNone);
  EXPECT_TRUE(plain.sparse.sink);
}

TEST(BenchCli, SparsePrefill) {
  Cli cli = parse_ok({"sparse-prefill", "--s-q", "4096", "--h-q", "128", "--d-qk", "512", "--s-kv", "65536", "--topk",
                      "2048", "--topk-length", "random", "--no-sink", "--check"});
  EXPECT_EQ(cli.command, "sparse-prefill");
  EXPECT_TRUE(cli.check);
  const SparsePrefillCase& c = cli.prefill;
  EXPECT_EQ(c.s_q, 4096);
  EXPECT_EQ(c.h_q, 128);
  EXPECT_EQ(c.d_qk, 512);
  EXPECT_EQ(c.s_kv, 65536);
  EXPECT_EQ(c.topk, 2048);
  EXPECT_EQ(c.topk_length, TopkLength::kRandom);
  EXPECT_FALSE(c.sink);

  // flags in any order, around the command
  Cli plain =
      parse_ok({"--topk", "64", "sparse-prefill", "--d-qk", "576", "--s-kv", "64", "--s-q", "1", "--h-q", "16"});
  EXPECT_EQ(plain.prefill.d_qk, 576);
  EXPECT_EQ(plain.prefill.s_kv, 64);  // topk == s_kv: every row once
  EXPECT_EQ(plain.prefill.topk, 64);
  EXPECT_EQ(plain.prefill.topk_length, TopkLength::kNone);
  EXPECT_TRUE(plain.prefill.sink);
  EXPECT_EQ(parse_ok({"sparse-prefill", "--s-q", "2", "--h-q", "64", "--d-qk", "576", "--s-kv", "128", "--topk", "64",
                      "--topk-length", "full"})
                .prefill.topk_length,
            TopkLength::kFull);
}

TEST(BenchCli, MergeAndCeilings) {
  Cli m = parse_ok({"merge", "--b", "16", "--h-q", "128", "--states", "4", "--d-v", "256", "--dtype", "fp16"});
  EXPECT_EQ(m.command, "merge");
  EXPECT_EQ(m.merge.b, 16);
  EXPECT_EQ(m.merge.h, 128);
  EXPECT_EQ(m.merge.states, 4);
  EXPECT_EQ(m.merge.d_v, 256);
  EXPECT_EQ(m.merge.dtype, hmla::DType::kFP16);
  EXPECT_EQ(parse_ok({"ceilings", "--device", "0"}).command, "ceilings");
}

TEST(BenchCli, SweepAndItsFamily) {
  Cli s = parse_ok({"--sweep", "quick", "--only", "dense", "--varlen", "--dtype", "fp16"});
  EXPECT_TRUE(s.command.empty());
  EXPECT_EQ(s.sweep, "quick");
  EXPECT_EQ(s.only, "dense");
  EXPECT_TRUE(s.varlen);
  ASSERT_TRUE(s.dtype.has_value());
  EXPECT_EQ(*s.dtype, hmla::DType::kFP16);
  // a family command with --sweep keeps that family's rows
  EXPECT_EQ(parse_ok({"sparse-decode", "--sweep", "default"}).only, "sparse_decode");
  EXPECT_EQ(parse_ok({"sparse-prefill", "--sweep", "default"}).only, "sparse_prefill");
  EXPECT_EQ(parse_ok({"--sweep", "default", "--only", "sparse_prefill"}).only, "sparse_prefill");
  EXPECT_EQ(parse_ok({"--sweep", "default", "--only", "sparse_decode"}).only, "sparse_decode");
  EXPECT_TRUE(parse_ok({"--sweep", "default"}).only.empty());
}

// compare.py's run_sparse_prefill: s_q 4096, topk 2048, h_q x d_qk x s_kv in its loop order; --quick
// keeps the first.
TEST(BenchSweep, SparsePrefillRowsAreComparePys) {
  Sweep sweep;
  ASSERT_TRUE(sweep_by_name("default", sweep));
  ASSERT_EQ(sweep.prefill.size(), 8u);
  size_t i = 0;
  for (int h_q : {64, 128})
    for (int d_qk : {576, 512})
      for (int s_kv : {8192, 65536}) {
        const SparsePrefillCase& c = sweep.prefill[i++];
        EXPECT_EQ(c.s_q, 4096);
        EXPECT_EQ(c.topk, 2048);
        EXPECT_EQ(c.h_q, h_q);
        EXPECT_EQ(c.d_qk, d_qk);
        EXPECT_EQ(c.s_kv, s_kv);
        EXPECT_EQ(c.topk_length, TopkLength::kNone);
        EXPECT_TRUE(c.sink);
      }
  EXPECT_EQ(sweep.dense.size(), 45u);
  EXPECT_EQ(sweep.sparse.size(), 14u);
  Sweep quick;
  ASSERT_TRUE(sweep_by_name("quick", quick));
  ASSERT_EQ(quick.prefill.size(), 1u);
  EXPECT_EQ(describe(quick.prefill[0]), describe(sweep.prefill[0]));
  EXPECT_EQ(describe(quick.prefill[0]), "s_q=4096 h_q=64 d_qk=576 s_kv=8192 topk=2048");
}

TEST(BenchCli, HelpAndVersion) {
  ParsedCommandLine help = parse({"--help"});
  ASSERT_EQ(help.outcome, Outcome::kHelp);
  for (const char* name : {"dense-decode", "sparse-decode", "sparse-prefill", "merge", "ceilings", "--sweep", "--only",
                           "--json", "--check", "--anchors", "--no-ceilings", "--topk-length", "--extra-s-k", "--d-qk",
                           "--s-kv", "sparse_prefill", "--version", "Exit status"})
    EXPECT_NE(help.text.find(name), std::string::npos) << name;
  // after a command too, the whole help (the commands have no flags of their own)
  ParsedCommandLine sub_help = parse({"sparse-decode", "-h"});
  ASSERT_EQ(sub_help.outcome, Outcome::kHelp);
  EXPECT_EQ(sub_help.text, help.text);

  ParsedCommandLine version = parse({"--version"});
  ASSERT_EQ(version.outcome, Outcome::kVersion);
  EXPECT_EQ(version.text, std::string("hmla-bench ") + HMLA_BENCH_VERSION + " (hmla " + hmla::version() + ")\n");
}

TEST(BenchCli, MalformedValuesNameTheFlagAndValue) {
  expect_usage_error({"dense-decode", "--b", "0", "--h-q", "16", "--s-k", "1024"}, {"--b", "0"});
  expect_usage_error({"dense-decode", "--b", "many", "--h-q", "16", "--s-k", "1024"}, {"--b", "many"});
  expect_usage_error({"sparse-decode", "--layout", "v33"}, {"--layout", "v33"});
  expect_usage_error({"--sweep", "fast"}, {"--sweep", "fast"});
  expect_usage_error({"--sweep", "quick", "--only", "merge"}, {"--only", "merge"});
  expect_usage_error({"merge", "--b", "1", "--h-q", "1", "--dtype", "fp8"}, {"--dtype", "fp8"});
  expect_usage_error({"--sweep", "quick", "--iters", "0"}, {"--iters", "0"});
  expect_usage_error({"--sweep", "quick", "--device", "5000"}, {"--device", "5000"});
  expect_usage_error({"--sweep", "quick", "--frobnicate"}, {"--frobnicate"});
  expect_usage_error({"--sweep", "quick", "--json="}, {"--json"});
  expect_usage_error({"dense-decode", "--b"}, {"--b"});
  expect_usage_error({"--sweep", "quick", "--rotate-mib", "0x10"}, {"--rotate-mib", "0x10"});
  expect_usage_error({"--sweep", "quick", "--warmup-ms", "soon"}, {"--warmup-ms", "soon"});
  expect_usage_error({"frobnicate"}, {"frobnicate"});
  expect_usage_error({"sparse-prefill", "--s-q", "1", "--h-q", "64", "--d-qk", "600", "--s-kv", "64", "--topk", "8"},
                     {"--d-qk", "600"});
  expect_usage_error({"sparse-prefill", "--s-q", "1", "--h-q", "64", "--d-qk", "0576", "--s-kv", "64", "--topk", "8"},
                     {"--d-qk", "0576"});
  expect_usage_error({"sparse-prefill", "--s-q", "1", "--h-q", "64", "--d-qk", "576", "--s-kv", "0", "--topk", "8"},
                     {"--s-kv", "0"});
  expect_usage_error({"--sweep", "quick", "--only", "prefill"}, {"--only", "prefill"});
}

TEST(BenchCli, FlagsThatDoNotGoTogether) {
  expect_usage_error({}, {"no command"});
  expect_usage_error({"dense-decode", "--b", "1", "--h-q", "1"}, {"--s-k"});
  expect_usage_error({"dense-decode", "--b", "1", "--h-q", "1", "--s-k", "1", "--topk", "4"}, {"sparse-decode"});
  expect_usage_error({"sparse-decode", "--layout", "v32", "--b", "1", "--s-q", "1", "--h-q", "16", "--topk", "4096",
                      "--s-k", "1024"},
                     {"--topk 4096", "--s-k 1024"});
  expect_usage_error({"sparse-decode", "--layout", "v32", "--b", "1", "--s-q", "1", "--h-q", "16", "--topk", "64",
                      "--extra-page", "64"},
                     {"--extra-topk"});
  expect_usage_error({"--sweep", "quick", "--b", "4"}, {"--sweep fixes the shapes"});
  expect_usage_error({"dense-decode", "--sweep", "quick", "--only", "sparse_decode"}, {"selects nothing"});
  expect_usage_error({"--only", "dense", "dense-decode", "--b", "1", "--h-q", "1", "--s-k", "1"}, {"--only"});
  expect_usage_error({"ceilings", "--no-ceilings"}, {"--no-ceilings"});
  expect_usage_error({"--sweep", "quick", "--anchors", "a.json", "--no-anchors"}, {"--no-anchors"});
  expect_usage_error({"dense-decode", "--d-v", "64"}, {"--d-v"});
  expect_usage_error({"dense-decode", "merge"}, {"merge"});
}

TEST(BenchCli, SparsePrefillFlagsThatAreMissingOrDoNotGo) {
  // each of the five shape flags is required
  const char* full[] = {"--s-q", "16", "--h-q", "64", "--d-qk", "576", "--s-kv", "128", "--topk", "64"};
  for (int drop = 0; drop < 10; drop += 2) {
    std::vector<const char*> argv{"hmla-bench", "sparse-prefill"};
    for (int i = 0; i < 10; i += 2)
      if (i != drop) argv.insert(argv.end(), {full[i], full[i + 1]});
    ParsedCommandLine p = parse_command_line((int)argv.size(), argv.data());
    ASSERT_EQ(p.outcome, Outcome::kUsageError) << full[drop];
    EXPECT_NE(p.text.find("sparse-prefill needs"), std::string::npos) << p.text;
    EXPECT_NE(p.text.find(full[drop]), std::string::npos) << p.text;
  }
  expect_usage_error({"sparse-prefill", "--s-q", "16", "--h-q", "64", "--d-qk", "576", "--s-kv", "1024", "--topk",
                      "2048"},
                     {"--topk 2048", "--s-kv 1024"});
  // the flags of the other families
  for (std::initializer_list<const char*> extra :
       {std::initializer_list<const char*>{"--b", "1"}, {"--s-k", "128"}, {"--page", "64"}, {"--layout", "v32"},
        {"--extra-topk", "8"}, {"--h-kv", "1"}, {"--causal"}, {"--dtype", "bf16"}, {"--varlen"}}) {
    std::vector<const char*> argv{"hmla-bench", "sparse-prefill", "--s-q", "16", "--h-q", "64", "--d-qk", "576",
                                  "--s-kv", "128", "--topk", "64"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ParsedCommandLine p = parse_command_line((int)argv.size(), argv.data());
    ASSERT_EQ(p.outcome, Outcome::kUsageError) << *extra.begin();
    EXPECT_NE(p.text.find("sparse-prefill takes"), std::string::npos) << p.text;
  }
  expect_usage_error({"sparse-prefill", "--s-q", "16", "--h-q", "64", "--d-qk", "576", "--s-kv", "128", "--topk", "64",
                      "--d-v", "512"},
                     {"--d-v"});
  // and its own flags elsewhere
  expect_usage_error({"sparse-decode", "--layout", "v32", "--b", "1", "--s-q", "1", "--h-q", "64", "--topk", "64",
                      "--d-qk", "576"},
                     {"--d-qk", "sparse-prefill"});
  expect_usage_error({"dense-decode", "--b", "1", "--h-q", "1", "--s-k", "1", "--s-kv", "8"},
                     {"--s-kv", "sparse-prefill"});
  expect_usage_error({"--sweep", "quick", "--s-kv", "8"}, {"--s-kv", "sparse-prefill"});
  expect_usage_error({"sparse-prefill", "--sweep", "quick", "--s-kv", "8"}, {"--sweep fixes the shapes"});
  expect_usage_error({"sparse-prefill", "--sweep", "quick", "--only", "dense"}, {"selects nothing"});
  expect_usage_error({"ceilings", "--d-qk", "512"}, {"--d-qk"});
}

// ------------------------------------------------------------------------------------- anchors
class BenchAnchors : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    path_ = ::testing::TempDir() + "hmla_bench_anchors_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override {
    if (!path_.empty()) std::remove(path_.c_str());
  }
  std::string path_;
};

// The shape of .deps/anchors/flashmla-h200.json (and ../shared/anchors/), plus rows the loader skips.
const char* kAnchorFile = R"json({
  "meta": {"system": "FlashMLA commit 9241ae3 (sm_90a build, bf16)", "date": "2026-11-29",
           "ceilings": {"copy_gbps_read_plus_write": 4243, "bf16_matmul_tflops_8192": 769.3}},
  "rows": [
    {"kind": "dense_decode", "layout": "bf16", "dtype": "bf16", "b": 128, "s_q": 1, "h_q": 16, "h_kv": 1,
     "s_k": 1024, "topk": 0, "extra_topk": 0, "extra_s_k": 0, "extra_page": 0, "d_qk": 576, "causal": false,
     "varlen": false, "page": 64, "attn_sink": false, "time_us": 46.2, "tflops": 98.8, "gbps": 3364.0},
    {"kind": "sparse_decode", "layout": "fp8_model1", "dtype": "bf16", "b": 128, "s_q": 2, "h_q": 64, "h_kv": 1,
     "s_k": 16384, "topk": 128, "extra_topk": 512, "extra_s_k": 16384, "extra_page": 64, "d_qk": 512,
     "causal": false, "varlen": false, "page": 256, "attn_sink": true, "time_us": 88.25},
    {"kind": "dense_decode", "b": 1, "h_q": 128, "s_k": 8192, "time_us": null},
    "not a row",
    {"kind": "dense_decode", "b": 8.0, "h_q": 128, "s_k": 8192, "time_us": 20},
    {"kind": "sparse_prefill", "layout": "bf16", "dtype": "bf16", "b": 1, "s_q": 4096, "h_q": 64, "h_kv": 1,
     "s_k": 8192, "topk": 2048, "extra_topk": 0, "extra_s_k": 0, "extra_page": 0, "d_qk": 512, "causal": false,
     "varlen": false, "page": 0, "attn_sink": true, "time_us": 1747.2}
  ]
})json";

TEST_F(BenchAnchors, ReadsMetaAndRowsAndSkipsRowsWithoutATime) {
  Anchors a = load_anchors(write(kAnchorFile));
  EXPECT_TRUE(a.loaded());
  EXPECT_EQ(a.path, path_);
  EXPECT_EQ(a.system, "FlashMLA commit 9241ae3 (sm_90a build, bf16)");
  EXPECT_DOUBLE_EQ(a.copy_gbps, 4243);
  EXPECT_DOUBLE_EQ(a.matmul_tflops, 769.3);
  ASSERT_EQ(a.rows.size(), 4u);
  const AnchorRow& sparse = a.rows[1];
  EXPECT_EQ(sparse.kind, "sparse_decode");
  EXPECT_EQ(sparse.layout, "fp8_model1");
  EXPECT_EQ(sparse.d_qk, 512);
  EXPECT_EQ(sparse.extra_topk, 512);
  EXPECT_EQ(sparse.extra_page, 64);
  EXPECT_TRUE(sparse.attn_sink);
  EXPECT_DOUBLE_EQ(sparse.time_us, 88.25);
  // absent fields take the anchor format's defaults
  const AnchorRow& fields_left_out = a.rows[2];
  EXPECT_EQ(fields_left_out.b, 8);
  EXPECT_EQ(fields_left_out.s_q, 1);
  EXPECT_EQ(fields_left_out.h_kv, 1);
  EXPECT_EQ(fields_left_out.page, 64);
  EXPECT_EQ(fields_left_out.d_qk, 576);
  EXPECT_EQ(fields_left_out.dtype, "bf16");
  EXPECT_DOUBLE_EQ(fields_left_out.time_us, 20);
}

TEST_F(BenchAnchors, FindsTheRowOfIdenticalShape) {
  Anchors a = load_anchors(write(kAnchorFile));
  DenseCase d;
  d.b = 128;
  d.s_q = 1;
  d.h_q = 16;
  d.s_k = 1024;
  ASSERT_NE(a.find_dense(d), nullptr);
  EXPECT_DOUBLE_EQ(a.find_dense(d)->time_us, 46.2);
  d.causal = true;
  EXPECT_EQ(a.find_dense(d), nullptr);

  SparseCase s;
  s.layout = hmla::SparseCacheLayout::kModel1;
  s.b = 128;
  s.s_q = 2;
  s.h_q = 64;
  s.s_k = 16384;
  s.page = 256;
  s.topk = 128;
  s.extra_topk = 512;
  s.extra_s_k = 16384;
  s.extra_page = 64;
  ASSERT_NE(a.find_sparse(s), nullptr);
  EXPECT_DOUBLE_EQ(a.find_sparse(s)->time_us, 88.25);
  s.sink = false;  // FlashMLA's anchors all ran with the sink
  EXPECT_EQ(a.find_sparse(s), nullptr);

  SparsePrefillCase p;
  p.s_q = 4096;
  p.h_q = 64;
  p.d_qk = 512;
  p.s_kv = 8192;  // the anchor's s_k
  p.topk = 2048;
  ASSERT_NE(a.find_sparse_prefill(p), nullptr);
  EXPECT_DOUBLE_EQ(a.find_sparse_prefill(p)->time_us, 1747.2);
  p.topk_length = TopkLength::kFull;  // the same lists, passed as an array
  EXPECT_NE(a.find_sparse_prefill(p), nullptr);
  p.topk_length = TopkLength::kRandom;
  EXPECT_EQ(a.find_sparse_prefill(p), nullptr);
  p.topk_length = TopkLength::kNone;
  p.sink = false;
  EXPECT_EQ(a.find_sparse_prefill(p), nullptr);
  p.sink = true;
  p.d_qk = 576;
  EXPECT_EQ(a.find_sparse_prefill(p), nullptr);
}

// The anchor file the tool reads (a copy of ../shared/anchors/ under .deps/, when staged) has a
// FlashMLA figure for every default-sweep row that compare.py anchors: all 8 prefill rows.
TEST(BenchAnchorFile, EverySparsePrefillSweepRowHasAnAnchor) {
  const std::string path = std::string(HMLA_BENCH_SOURCE_DIR) + "/.deps/anchors/flashmla-h200.json";
  if (!std::ifstream(path).good()) GTEST_SKIP() << path << " not staged";
  Anchors a = load_anchors(path);
  Sweep sweep;
  ASSERT_TRUE(sweep_by_name("default", sweep));
  for (const SparsePrefillCase& c : sweep.prefill) {
    const AnchorRow* r = a.find_sparse_prefill(c);
    ASSERT_NE(r, nullptr) << describe(c);
    EXPECT_EQ(r->kind, "sparse_prefill");
    EXPECT_GT(r->time_us, 0) << describe(c);
  }
}

TEST_F(BenchAnchors, BadFilesSayWhy) {
  auto message = [](const std::string& path) -> std::string {
    try {
      load_anchors(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string missing = message(::testing::TempDir() + "hmla_bench_no_such_anchors.json");
  EXPECT_NE(missing.find("cannot open"), std::string::npos) << missing;
  std::string broken = message(write("{\"rows\": [1, 2,"));
  EXPECT_NE(broken.find(path_), std::string::npos) << broken;
  EXPECT_NE(broken.find("parse error"), std::string::npos) << broken;
  std::string no_rows = message(write("{\"meta\": {}}"));
  EXPECT_NE(no_rows.find("\"rows\""), std::string::npos) << no_rows;
  std::string not_object = message(write("[1, 2]"));
  EXPECT_NE(not_object.find("\"rows\""), std::string::npos) << not_object;
}

// ------------------------------------------------------------------------------------- result file
// A row with fixed fields in each of the family's three places.
class FixedCase : public BenchCase {
 public:
  const char* kind() const override { return "dense_decode"; }
  std::string describe() const override { return "fixed"; }
  const AnchorRow* find_anchor(const Anchors&) const override { return nullptr; }
  void setup(const RowOptions&, cudaStream_t) override {}
  int input_sets() const override { return 1; }
  double bytes_per_set() const override { return 0; }
  size_t workspace_bytes() const override { return 4096; }
  void run(int, cudaStream_t) override {}
  double flops() const override { return 0; }
  double bytes() const override { return 0; }
  void check(const RowOptions&, cudaStream_t, CheckOutcome&) override {}
  void release() override {}
  std::string shape_header() const override { return ""; }
  std::string shape_cells() const override { return ""; }
  void json_shape(Json& row) const override {
    row["kind"] = "dense_decode";
    row["b"] = 128;
    row["causal"] = false;
  }
  void json_schedule(Json& row) const override { row["num_sm_parts"] = 66; }
  void json_extras(Json& row) const override { row["plan_time_us"] = 3.5; }
};

RowRecord fixed_record(const AnchorRow* anchor, bool checked) {
  RowRecord rec;
  rec.row = std::make_unique<FixedCase>();
  rec.anchor = anchor;
  RowResult& r = rec.r;
  r.input_sets = 4;
  r.bytes_per_set = 1048576;
  r.time = TimeStats{/*median*/ 50, /*mean*/ 50.5, /*min*/ 49.25, /*max*/ 60, /*p10*/ 49.5, /*p90*/ 52.75, 50};
  r.flops = 2e12;
  r.bytes = 1.5e8;
  r.tflops = 40;
  r.gbps = 3000;
  r.sm_mhz = 1980;
  if (checked) {
    r.check.checked = true;
    r.check.pass = false;
    r.check.request_ids = {0, 127};
    r.check.out_rel_l2 = NAN;  // JSON has no NaN: null
    r.check.out_max_abs = 0.125;
    r.check.lse_max_abs = 0.0009765625;
    r.check.lse_rel_l2 = 0.0001220703125;
    r.check.nonfinite_out = 3;
    r.check.bad_lse = 0;
    r.check.seconds = 1.5;
    r.check.note = "3 non-finite out values in the batch";
  }
  return rec;
}

Ceilings measured_ceilings() {
  Ceilings c;
  c.measured = true;
  c.read_gbps = 4000;
  c.copy_gbps = 4800;
  c.matmul_tflops = 800;
  return c;
}

// The row as it is written: the keys in this order (readers and diffs of result files rely on it),
// NaN as null, doubles in their shortest round-trip form.
const char* kCheckedAnchoredRow = R"json({
  "kind": "dense_decode",
  "b": 128,
  "causal": false,
  "time_us": 50.0,
  "time_us_mean": 50.5,
  "time_us_min": 49.25,
  "time_us_p10": 49.5,
  "time_us_p90": 52.75,
  "time_us_max": 60.0,
  "iters": 50,
  "warmup": 5,
  "input_sets": 4,
  "bytes_per_set": 1048576.0,
  "flop": 2000000000000.0,
  "bytes": 150000000.0,
  "tflops": 40.0,
  "gbps": 3000.0,
  "frac_stream": 0.75,
  "frac_copy": 0.625,
  "frac_matmul": 0.05,
  "anchor_time_us": 55.0,
  "ratio": 1.1,
  "num_sm_parts": 66,
  "sm_clock_mhz": 1980.0,
  "workspace_bytes": 4096,
  "plan_time_us": 3.5,
  "check_pass": false,
  "check_out_rel_l2": null,
  "check_out_max_abs": 0.125,
  "check_lse_max_abs": 0.0009765625,
  "check_lse_rel_l2": 0.0001220703125,
  "check_nonfinite_out": 3,
  "check_bad_lse": 0,
  "check_requests": [
    0,
    127
  ],
  "check_seconds": 1.5,
  "check_note": "3 non-finite out values in the batch"
}
)json";

TEST(BenchResultJson, RowFieldsInOrder) {
  AnchorRow anchor;
  anchor.time_us = 55;
  RowRecord rec = fixed_record(&anchor, /*checked=*/true);
  EXPECT_EQ(dump_json(row_json(rec, measured_ceilings(), RowOptions{})), kCheckedAnchoredRow);
}

TEST(BenchResultJson, AbsentCeilingsAnchorAndCheckAreNullOrLeftOut) {
  RowRecord rec = fixed_record(nullptr, /*checked=*/false);
  Json row = row_json(rec, Ceilings{}, RowOptions{});
  for (const char* k : {"frac_stream", "frac_copy", "frac_matmul", "anchor_time_us", "ratio"}) {
    ASSERT_TRUE(row.contains(k)) << k;
    EXPECT_TRUE(row[k].is_null()) << k;
  }
  EXPECT_FALSE(row.contains("check_pass"));
  EXPECT_FALSE(row.contains("check_requests"));
}

TEST(BenchResultJson, DocumentLayout) {
  Cli cli = parse_ok({"--sweep", "quick", "--only", "dense"});
  DeviceInfo d;
  d.name = "NVIDIA H200";
  d.major = 9;
  d.sms = 132;
  d.sm_clock_khz = 1980000;
  d.memory_bytes = 150ull << 30;
  d.driver = 13000;
  d.runtime = 13000;
  Ceilings ceil = measured_ceilings();
  ceil.read_variants.push_back(ReadVariant{"nc x8", 4000, TimeStats{}});
  Anchors anchors;
  anchors.path = "/x/flashmla-h200.json";
  anchors.system = "FlashMLA";
  std::vector<RowRecord> rows;
  rows.push_back(fixed_record(nullptr, /*checked=*/true));
  RowOptions ro;
  ro.check = true;
  Json doc = results_json(cli, "2026-12-02T00:00:00Z", d, ceil, CeilingOptions{}, anchors, ro, rows, 5,
                          "row 2 failed");

  auto keys = [](const Json& obj) {
    std::vector<std::string> k;
    for (auto it = obj.begin(); it != obj.end(); ++it) k.push_back(it.key());
    return k;
  };
  EXPECT_EQ(keys(doc), (std::vector<std::string>{"meta", "rows", "summary"}));
  const Json& meta = doc["meta"];
  EXPECT_EQ(keys(meta), (std::vector<std::string>{"tool", "version", "command", "date", "device", "timing",
                                                   "formulas", "ceilings", "anchors", "check_thresholds",
                                                   "options"}));
  EXPECT_EQ(meta["command"], "hmla-bench --sweep quick --only dense");
  EXPECT_EQ(meta["device"]["cc"], "9.0");
  EXPECT_EQ(meta["device"]["driver_version"], "13.0");
  EXPECT_EQ(meta["device"]["memory_bytes"], 150ull << 30);
  EXPECT_EQ(keys(meta["formulas"]), (std::vector<std::string>{"merge", "dense", "sparse_decode", "sparse_prefill"}));
  EXPECT_EQ(meta["ceilings"]["read_variants"][0]["name"], "nc x8");
  EXPECT_EQ(meta["ceilings"]["copy_gbps_read_plus_write"], 4800.0);
  EXPECT_EQ(meta["anchors"]["path"], "/x/flashmla-h200.json");
  EXPECT_EQ(meta["check_thresholds"]["out_rel_l2"], kCheckOutRelL2);
  EXPECT_EQ(meta["check_thresholds"]["out_rel_l2_sparse_prefill"], kCheckSparsePrefillOutRelL2);
  EXPECT_EQ(keys(meta["options"]), (std::vector<std::string>{"iters", "warmup", "warmup_ms", "backlog",
                                                             "rotate_min_mib", "seed", "sweep", "only", "check"}));
  EXPECT_EQ(meta["options"]["only"], "dense");
  EXPECT_EQ(meta["options"]["rotate_min_mib"], 512);
  ASSERT_EQ(doc["rows"].size(), 1u);
  const Json& summary = doc["summary"];
  EXPECT_EQ(keys(summary),
            (std::vector<std::string>{"rows_planned", "rows_done", "check_failures", "completed", "error"}));
  EXPECT_EQ(summary["rows_planned"], 5);
  EXPECT_EQ(summary["rows_done"], 1);
  EXPECT_EQ(summary["check_failures"], 1);
  EXPECT_EQ(summary["completed"], false);
  EXPECT_EQ(summary["error"], "row 2 failed");

  Json bare = results_json(cli, "d", d, Ceilings{}, CeilingOptions{}, Anchors{}, RowOptions{}, {}, 0, "");
  EXPECT_TRUE(bare["meta"]["ceilings"].is_null());
  EXPECT_TRUE(bare["meta"]["anchors"].is_null());
  EXPECT_TRUE(bare["summary"]["error"].is_null());
  EXPECT_EQ(bare["summary"]["completed"], true);
  EXPECT_EQ(dump_json(bare["rows"]), "[]\n");
}

TEST(BenchResultJson, BytesThatAreNotUtf8AreReplacedNotFatal) {
  Json j = Json::object();
  j["name"] = std::string("GPU \xff");
  EXPECT_EQ(dump_json(j), "{\n  \"name\": \"GPU \xef\xbf\xbd\"\n}\n");
}

}  // namespace
}  // namespace hmla_bench
