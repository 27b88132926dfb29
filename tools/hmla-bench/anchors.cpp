// hmla-bench: anchor file loading and lookup (see anchors.h).
#include "anchors.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace hmla_bench {
namespace {

bool file_exists(const std::string& p) {
  std::ifstream f(p);
  return f.good();
}

std::string parent_dir(const std::string& p) {
  size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string executable_dir(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = '\0';
    return parent_dir(buf);
  }
  if (argv0 != nullptr) {
    char resolved[PATH_MAX];
    if (realpath(argv0, resolved) != nullptr) return parent_dir(resolved);
  }
  return "";
}

// A member of `obj` (an object: the row, meta, meta.ceilings), or nullptr when `obj` is not an
// object or has no such key.
const nlohmann::json* member(const nlohmann::json& obj, const char* k) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(k);
  return it == obj.end() ? nullptr : &*it;
}
// The anchor file's fields are optional and a field of the wrong type counts as absent: the file is
// written by hand and by compare.py, and a row lacking a field still matches on the others.
int num_or(const nlohmann::json& row, const char* k, int fallback) {
  const nlohmann::json* v = member(row, k);
  return (v && v->is_number()) ? (int)v->get<double>() : fallback;
}
bool bool_or(const nlohmann::json& row, const char* k, bool fallback) {
  const nlohmann::json* v = member(row, k);
  return (v && v->is_boolean()) ? v->get<bool>() : fallback;
}
std::string str_or(const nlohmann::json& row, const char* k, const std::string& fallback) {
  const nlohmann::json* v = member(row, k);
  return (v && v->is_string()) ? v->get<std::string>() : fallback;
}
double number_or(const nlohmann::json& obj, const char* k, double fallback) {
  const nlohmann::json* v = member(obj, k);
  return (v && v->is_number()) ? v->get<double>() : fallback;
}

}  // namespace

const AnchorRow* Anchors::find_dense(const DenseCase& c) const {
  for (const AnchorRow& r : rows) {
    if (r.kind == "dense_decode" && r.dtype == hmla::dtype_name(c.dtype) && r.b == c.b && r.s_q == c.s_q &&
        r.h_q == c.h_q && r.h_kv == c.h_kv && r.s_k == c.s_k && r.page == c.page && r.causal == c.causal &&
        r.varlen == c.varlen && r.topk == 0 && r.extra_topk == 0 && r.d_qk == 576)
      return &r;
  }
  return nullptr;
}

const AnchorRow* Anchors::find_sparse(const SparseCase& c) const {
  if (!c.sink || c.topk_length == TopkLength::kRandom) return nullptr;
  const int d_qk = c.layout == hmla::SparseCacheLayout::kV32 ? 576 : 512;
  const bool extra = c.extra_topk > 0;
  for (const AnchorRow& r : rows) {
    if (r.kind == "sparse_decode" && r.layout == sparse_layout_name(c.layout) && r.d_qk == d_qk && r.b == c.b &&
        r.s_q == c.s_q && r.h_q == c.h_q && r.s_k == c.s_k && r.page == c.page && r.topk == c.topk &&
        r.extra_topk == c.extra_topk && r.extra_s_k == (extra ? c.extra_s_k : 0) &&
        r.extra_page == (extra ? c.extra_page : 0) && r.attn_sink)
      return &r;
  }
  return nullptr;
}

const AnchorRow* Anchors::find_sparse_prefill(const SparsePrefillCase& c) const {
  if (!c.sink || c.topk_length == TopkLength::kRandom) return nullptr;
  for (const AnchorRow& r : rows) {
    if (r.kind == "sparse_prefill" && r.d_qk == c.d_qk && r.s_q == c.s_q && r.h_q == c.h_q && r.s_k == c.s_kv &&
        r.topk == c.topk && r.extra_topk == 0 && r.attn_sink)
      return &r;
  }
  return nullptr;
}

Anchors load_anchors(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open anchor file '" + path + "'");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error("anchor file '" + path + "': " + e.what());
  }
  const nlohmann::json* rows = member(doc, "rows");
  if (rows == nullptr || !rows->is_array())
    throw std::runtime_error("anchor file '" + path + "' has no \"rows\" array");
  Anchors a;
  a.path = path;
  if (const nlohmann::json* meta = member(doc, "meta")) {
    a.system = str_or(*meta, "system", "");
    if (const nlohmann::json* ceil = member(*meta, "ceilings")) {
      a.copy_gbps = number_or(*ceil, "copy_gbps_read_plus_write", 0);
      a.matmul_tflops = number_or(*ceil, "bf16_matmul_tflops_8192", 0);
    }
  }
  for (const nlohmann::json& row : *rows) {
    const nlohmann::json* t = member(row, "time_us");
    if (t == nullptr || !t->is_number()) continue;
    AnchorRow r;
    r.kind = str_or(row, "kind", "");
    r.dtype = str_or(row, "dtype", "bf16");
    r.layout = str_or(row, "layout", "");
    r.b = num_or(row, "b", 0);
    r.s_q = num_or(row, "s_q", 1);
    r.h_q = num_or(row, "h_q", 0);
    r.h_kv = num_or(row, "h_kv", 1);
    r.s_k = num_or(row, "s_k", 0);
    r.topk = num_or(row, "topk", 0);
    r.extra_topk = num_or(row, "extra_topk", 0);
    r.extra_s_k = num_or(row, "extra_s_k", 0);
    r.extra_page = num_or(row, "extra_page", 0);
    r.d_qk = num_or(row, "d_qk", 576);
    r.page = num_or(row, "page", 64);
    r.causal = bool_or(row, "causal", false);
    r.varlen = bool_or(row, "varlen", false);
    r.attn_sink = bool_or(row, "attn_sink", false);
    r.time_us = t->get<double>();
    a.rows.push_back(r);
  }
  return a;
}

std::string locate_default_anchors(const char* argv0) {
  if (const char* env = std::getenv("HMLA_ANCHORS"); env != nullptr && *env != '\0') return env;
  const char* rel[] = {"shared/anchors/flashmla-h200.json", "../shared/anchors/flashmla-h200.json"};
  std::vector<std::string> starts;
  std::string exe = executable_dir(argv0);
  if (!exe.empty()) starts.push_back(exe);
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) != nullptr) starts.push_back(cwd);
#ifdef HMLA_BENCH_SOURCE_DIR
  starts.push_back(HMLA_BENCH_SOURCE_DIR);
#endif
  for (const std::string& start : starts) {
    std::string dir = start;
    for (int depth = 0; depth < 8 && !dir.empty(); ++depth) {
      for (const char* r : rel) {
        std::string candidate = (dir == "/" ? std::string("/") : dir + "/") + r;
        if (file_exists(candidate)) {
          char resolved[PATH_MAX];
          return realpath(candidate.c_str(), resolved) != nullptr ? std::string(resolved) : candidate;
        }
      }
      if (dir == "/") break;
      dir = parent_dir(dir);
    }
  }
  return "";
}

}  // namespace hmla_bench
