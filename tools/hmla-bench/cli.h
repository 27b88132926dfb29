// hmla-bench: the command line (CLI11) into a settings struct, with no GPU involved, so that what a
// command line means is testable on any machine.
#pragma once

#include <optional>
#include <string>

#include "cases.h"
#include "hmla/types.h"

namespace hmla_bench {

struct Cli {
  std::string command;  // "dense-decode", "sparse-decode", "sparse-prefill", "merge", "ceilings", or "" with --sweep
  std::string sweep;    // "", "default" or "quick"
  std::string only;     // with --sweep: "", "dense", "sparse_decode" or "sparse_prefill"
  // With --sweep, --dtype and --varlen override the dense rows'; a single row's case holds them too.
  std::optional<hmla::DType> dtype;
  bool varlen = false;
  // The row of a family command, its defaults filled in.
  DenseCase dense;
  SparseCase sparse;
  SparsePrefillCase prefill;
  MergeCase merge;
  bool check = false;
  int check_requests = 0;  // 0: automatic
  std::string json_path;
  int iters = 50, warmup = 5;
  double warmup_ms = 25.0;
  std::string anchors_path;
  bool no_anchors = false, no_ceilings = false, no_backlog = false;
  long long rotate_mib = 512;
  unsigned long long seed = 20261129ull;
  int device = 0;
  std::string command_line;  // argv joined by spaces, for the JSON's meta.command
};

struct ParsedCommandLine {
  enum class Outcome {
    kRun,         // `cli` holds the settings
    kHelp,        // `text` is the help, for stdout
    kVersion,     // `text` is the version line, for stdout
    kUsageError,  // `text` names the flag or combination at fault, for stderr
  };
  Outcome outcome = Outcome::kRun;
  Cli cli;
  std::string text;
};

// Never exits and never prints: the caller decides where the text goes and the exit status.
ParsedCommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace hmla_bench
