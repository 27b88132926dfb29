// hmla-bench: the result file (--json): meta (tool, device, timing, formulas, ceilings, anchors,
// options), one object per row, summary. Built apart from the GPU code so that its schema is tested
// on any machine (tests/cpu/bench/).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "anchors.h"
#include "bench_case.h"
#include "bench_json.h"
#include "ceilings.h"
#include "cli.h"

namespace hmla_bench {

struct DeviceInfo {
  std::string name;
  int index = 0, major = 0, minor = 0, sms = 0;
  int sm_clock_khz = 0, mem_clock_khz = 0, bus_width = 0, l2_bytes = 0;
  size_t memory_bytes = 0;
  int driver = 0, runtime = 0;
};

// "13.0" from CUDA's 13000.
std::string version_string(int v);

struct RowRecord {
  std::unique_ptr<BenchCase> row;  // released: only its figures remain
  RowResult r;
  const AnchorRow* anchor = nullptr;
};

// One element of "rows".
Json row_json(const RowRecord& rec, const Ceilings& ceil, const RowOptions& ro);

// The whole document; `date` is meta.date (ISO 8601, UTC), `error` the fatal error ("" for none).
Json results_json(const Cli& cli, const std::string& date, const DeviceInfo& d, const Ceilings& ceil,
                  const CeilingOptions& co, const Anchors& anchors, const RowOptions& ro,
                  const std::vector<RowRecord>& rows, size_t planned, const std::string& error);

}  // namespace hmla_bench
