// hmla-bench: the result file's document (see result_json.h and README.md "JSON").
#include "result_json.h"

#ifndef HMLA_BENCH_VERSION
#define HMLA_BENCH_VERSION "unknown"
#endif

namespace hmla_bench {

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

Json row_json(const RowRecord& rec, const Ceilings& ceil, const RowOptions& ro) {
  const RowResult& r = rec.r;
  const CheckOutcome& ck = r.check;
  Json row = Json::object();
  rec.row->json_shape(row);
  row["time_us"] = r.time.median;
  row["time_us_mean"] = r.time.mean;
  row["time_us_min"] = r.time.min;
  row["time_us_p10"] = r.time.p10;
  row["time_us_p90"] = r.time.p90;
  row["time_us_max"] = r.time.max;
  row["iters"] = r.time.count;
  row["warmup"] = ro.warmup;
  row["input_sets"] = r.input_sets;
  row["bytes_per_set"] = r.bytes_per_set;
  row["flop"] = r.flops;
  row["bytes"] = r.bytes;
  row["tflops"] = r.tflops;
  row["gbps"] = r.gbps;
  row["frac_stream"] = number_or_null(ceil.measured, r.gbps / ceil.read_gbps);
  row["frac_copy"] = number_or_null(ceil.measured, r.gbps / ceil.copy_gbps);
  row["frac_matmul"] = number_or_null(ceil.measured, r.tflops / ceil.matmul_tflops);
  row["anchor_time_us"] = number_or_null(rec.anchor != nullptr, rec.anchor ? rec.anchor->time_us : 0.0);
  row["ratio"] = number_or_null(rec.anchor != nullptr, rec.anchor ? rec.anchor->time_us / r.time.median : 0.0);
  rec.row->json_schedule(row);
  row["sm_clock_mhz"] = r.sm_mhz;
  row["workspace_bytes"] = (unsigned long long)rec.row->workspace_bytes();
  rec.row->json_extras(row);
  if (ck.checked) {
    row["check_pass"] = ck.pass;
    row["check_out_rel_l2"] = ck.out_rel_l2;
    row["check_out_max_abs"] = ck.out_max_abs;
    row["check_lse_max_abs"] = ck.lse_max_abs;
    row["check_lse_rel_l2"] = ck.lse_rel_l2;
    row["check_nonfinite_out"] = ck.nonfinite_out;
    row["check_bad_lse"] = ck.bad_lse;
    row["check_requests"] = ck.request_ids;
    row["check_seconds"] = ck.seconds;
    row["check_note"] = ck.note;
  }
  return row;
}

namespace {

Json device_json(const DeviceInfo& d) {
  Json j = Json::object();
  j["name"] = d.name;
  j["index"] = d.index;
  j["cc"] = std::to_string(d.major) + "." + std::to_string(d.minor);
  j["sm_count"] = d.sms;
  j["sm_clock_mhz_max"] = d.sm_clock_khz / 1000;
  j["mem_clock_mhz_max"] = d.mem_clock_khz / 1000;
  j["mem_bus_width_bits"] = d.bus_width;
  j["memory_bytes"] = (unsigned long long)d.memory_bytes;
  j["l2_bytes"] = d.l2_bytes;
  j["driver_version"] = version_string(d.driver);
  j["runtime_version"] = version_string(d.runtime);
  return j;
}

std::string timing_text(const RowOptions& ro) {
  return std::string(
             "CUDA events around each hmla::dense_decode_run call (split + combine; plan built once before "
             "timing) or hmla::sparse_decode_run call (plan built once before timing; plan_time_us times "
             "hmla::sparse_decode_plan alone the same way, plan_cold_us after a 256 MiB write; plan_step_us = median of plan + run minus median of run, "
             "timed alternately in one loop) or hmla::sparse_prefill_run call (nothing to plan), ") +
         std::to_string(ro.warmup) + " warm-up (repeated for at least " + std::to_string((int)ro.warmup_ms) +
         " ms), median of " + std::to_string(ro.iters) + ", input sets rotated until a pass touches " +
         std::to_string(ro.rotate_min_bytes >> 20) + " MiB" +
         (ro.backlog ? ", timed calls queued behind a spin kernel (GPU time only)" : ", no backlog");
}

Json formulas_json() {
  Json j = Json::object();
  j["merge"] = "bytes = (states + 1)*b*s_q*h_q*(2*d_v + 4) ; flop = 2*states*b*s_q*h_q*d_v";
  j["dense"] =
      "flop = b*s_q*h_q*(2*576 + 2*512)*s_k ; bytes = b*(s_q*h_q*576*2 + s_k*h_kv*576*2 + s_q*h_q*512*2), s_k = mean "
      "length; GB = 1e9 bytes, TFLOPS = 1e12 flop/s";
  j["sparse_decode"] =
      "flop = 2*h_q*attended*(d_qk + 512), attended = b*s_q*(topk + extra_topk) (the counted entries when "
      "topk_length is passed) ; bytes = 2*b*s_q*h_q*d_qk + unique_tokens_read*(656 if d_qk == 576 else 576) + "
      "2*b*s_q*h_q*512, unique_tokens_read = distinct tokens the counted entries name, mean over the input sets";
  j["sparse_prefill"] =
      "flop = 2*h_q*attended*(d_qk + 512), attended = s_q*topk (the counted entries when topk_length is passed) ; "
      "bytes = attended*d_qk*2 + s_q*h_q*(d_qk + 512)*2";
  return j;
}

Json ceilings_json(const Ceilings& ceil, const CeilingOptions& co) {
  if (!ceil.measured) return nullptr;
  Json j = Json::object();
  j["read_stream_gbps"] = ceil.read_gbps;
  j["copy_gbps_read_plus_write"] = ceil.copy_gbps;
  j["bf16_matmul_tflops_8192"] = ceil.matmul_tflops;
  j["read_bytes"] = ceil.read_bytes;
  j["read_best_variant"] = ceil.read_best_variant;
  Json variants = Json::array();
  for (const ReadVariant& v : ceil.read_variants) {
    Json variant = Json::object();
    variant["name"] = v.name;
    variant["gbps"] = v.gbps;
    variant["median_us"] = v.time.median;
    variants.push_back(std::move(variant));
  }
  j["read_variants"] = std::move(variants);
  j["copy_bytes_counted"] = ceil.copy_bytes_counted;
  j["copy_median_us"] = ceil.copy_time.median;
  j["matmul_n"] = ceil.matmul_n;
  j["matmul_median_us"] = ceil.matmul_time.median;
  j["cublas_version"] = ceil.cublas_version;
  j["warmup"] = co.warmup;
  j["iters"] = co.iters;
  return j;
}

Json options_json(const Cli& cli, const RowOptions& ro) {
  Json j = Json::object();
  j["iters"] = ro.iters;
  j["warmup"] = ro.warmup;
  j["warmup_ms"] = ro.warmup_ms;
  j["backlog"] = ro.backlog;
  j["rotate_min_mib"] = (unsigned long long)(ro.rotate_min_bytes >> 20);
  j["seed"] = (unsigned long long)ro.seed;
  j["sweep"] = cli.sweep;
  j["only"] = cli.only;
  j["check"] = ro.check;
  return j;
}

}  // namespace

Json results_json(const Cli& cli, const std::string& date, const DeviceInfo& d, const Ceilings& ceil,
                  const CeilingOptions& co, const Anchors& anchors, const RowOptions& ro,
                  const std::vector<RowRecord>& rows, size_t planned, const std::string& error) {
  Json meta = Json::object();
  meta["tool"] = "hmla-bench";
  meta["version"] = HMLA_BENCH_VERSION;
  meta["command"] = cli.command_line;
  meta["date"] = date;
  meta["device"] = device_json(d);
  meta["timing"] = timing_text(ro);
  meta["formulas"] = formulas_json();
  meta["ceilings"] = ceilings_json(ceil, co);
  if (anchors.loaded()) {
    meta["anchors"] = Json::object();
    meta["anchors"]["path"] = anchors.path;
    meta["anchors"]["system"] = anchors.system;
  } else {
    meta["anchors"] = nullptr;
  }
  meta["check_thresholds"] = Json::object();
  meta["check_thresholds"]["out_rel_l2"] = kCheckOutRelL2;
  meta["check_thresholds"]["out_rel_l2_sparse_prefill"] = kCheckSparsePrefillOutRelL2;
  meta["check_thresholds"]["lse_abs"] = kCheckLseAbs;
  meta["options"] = options_json(cli, ro);

  Json row_list = Json::array();
  int failures = 0;
  for (const RowRecord& rec : rows) {
    row_list.push_back(row_json(rec, ceil, ro));
    if (rec.r.check.checked && !rec.r.check.pass) ++failures;
  }

  Json summary = Json::object();
  summary["rows_planned"] = (unsigned long long)planned;
  summary["rows_done"] = (unsigned long long)rows.size();
  summary["check_failures"] = failures;
  summary["completed"] = error.empty() && rows.size() == planned;
  summary["error"] = error.empty() ? Json(nullptr) : Json(error);

  Json doc = Json::object();
  doc["meta"] = std::move(meta);
  doc["rows"] = std::move(row_list);
  doc["summary"] = std::move(summary);
  return doc;
}

}  // namespace hmla_bench
