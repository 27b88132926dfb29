// hmla-bench: one dense-decode row (see dense_bench.h).
//
// Inputs (per input set, all on the device):
//   q      [b, s_q, h_q, 576]            randn * 0.1 clamped to +-1, in the row's dtype
//   cache  [num_blocks, page, h_kv, 576] same distribution; num_blocks = pages the lengths need
//   block_table [b, max_blocks_per_seq]  a random permutation of the physical pages, row by row;
//                                        entries past a request's last page are -1 (never read)
//   cache_seqlens [b]                    all s_k, or with --varlen uniform in [s_k/2, s_k + s_k/2]
//                                        clipped to >= 1 (the same lengths in every set)
//   out    [b, s_q, h_q, 512], lse [b, h_q, s_q]
// When one set touches less than RowOptions::rotate_min_bytes (512 MiB), several independent sets
// (own q, cache, table, lengths copy, out, lse, workspace and plan) are rotated call by call.
#include "dense_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <thread>

#include "device_util.h"
#include "hmla/dense_decode.h"
#include "hmla/reference.h"
#include "timing.h"

namespace hmla_bench {
namespace {

constexpr int kDqk = 576;
constexpr int kDv = 512;
constexpr size_t kAlign = 256;

std::vector<int> make_lengths(const DenseCase& c, uint64_t seed) {
  std::vector<int> lens(c.b, c.s_k);
  if (c.varlen) {
    std::mt19937_64 rng(seed ^ 0x6c656e67746873ull);
    std::uniform_int_distribution<int> dist(c.s_k / 2, c.s_k + c.s_k / 2);
    for (int& l : lens) l = std::max(1, dist(rng));
  }
  return lens;
}

// Row-major [b, mbps] table: request r's pages, in order, are the next ones of a random
// permutation of all physical pages; the rest of the row is -1.
std::vector<int32_t> make_block_table(const std::vector<int>& lens, int page, int mbps, int num_blocks,
                                      uint64_t seed) {
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table((size_t)lens.size() * mbps, -1);
  size_t cursor = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    int pages = (int)ceil_div((size_t)lens[r], (size_t)page);
    for (int j = 0; j < pages; ++j) table[r * mbps + j] = perm[cursor++];
  }
  return table;
}

// Requests the check compares: n spread evenly over the batch (first and last included).
std::vector<int> pick_requests(const DenseCase& c, const std::vector<int>& lens, int requested) {
  const double budget_macs = 4e10;  // keeps the float64 CPU reference to seconds per row
  int n = requested > 0 ? std::min(requested, c.b) : std::min(8, c.b);
  auto select = [&](int count) {
    std::vector<int> ids;
    for (int j = 0; j < count; ++j) {
      int r = count == 1 ? 0 : (int)std::llround((double)j * (c.b - 1) / (count - 1));
      if (ids.empty() || ids.back() != r) ids.push_back(r);
    }
    return ids;
  };
  std::vector<int> ids = select(n);
  if (requested <= 0) {
    auto macs = [&](const std::vector<int>& v) {
      double m = 0;
      for (int r : v) m += (double)c.s_q * c.h_q * lens[r] * (kDqk + kDv);
      return m;
    };
    while (n > 1 && macs(ids) > budget_macs) ids = select(--n);
  }
  return ids;
}

struct Slab {
  DeviceBuffer buf;
  size_t set_stride = 0;  // bytes between sets
  void allocate(size_t bytes_per_set, int sets) {
    set_stride = round_up(std::max<size_t>(bytes_per_set, 1), kAlign);
    buf.allocate(set_stride * (size_t)sets);
  }
  template <typename T = void>
  T* at(int set) const {
    return reinterpret_cast<T*>(buf.get<char>() + set_stride * (size_t)set);
  }
};

// Every copy goes through the row's (non-blocking) stream and completes before returning.
void copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  HB_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  HB_CUDA(cudaStreamSynchronize(stream));
}

std::string format_gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (double)kGiB);
  return buf;
}

}  // namespace

DenseResult run_dense_case(const DenseCase& c, const RowOptions& opt, cudaStream_t stream) {
  DenseResult res;
  res.c = c;
  const size_t elem = 2;

  // ---- lengths and geometry
  std::vector<int> lens = make_lengths(c, opt.seed);
  long long total = 0;
  int max_len = 0, min_len = lens.empty() ? 0 : lens[0];
  long long total_pages = 0;
  for (int l : lens) {
    total += l;
    max_len = std::max(max_len, l);
    min_len = std::min(min_len, l);
    total_pages += (long long)ceil_div((size_t)l, (size_t)c.page);
  }
  if (total_pages > 0x7fffffffll) throw BenchError("row needs more than 2^31 cache pages");
  res.total_tokens = total;
  res.s_k_mean = (double)total / c.b;
  res.s_k_min = min_len;
  res.s_k_max = max_len;
  const int mbps = std::max(1, (int)ceil_div((size_t)max_len, (size_t)c.page));
  const int num_blocks = (int)total_pages;

  const size_t q_elems = (size_t)c.b * c.s_q * c.h_q * kDqk;
  const size_t page_elems = (size_t)c.page * c.h_kv * kDqk;
  const size_t cache_elems = (size_t)num_blocks * page_elems;
  const size_t out_elems = (size_t)c.b * c.s_q * c.h_q * kDv;
  const size_t lse_elems = (size_t)c.b * c.h_q * c.s_q;
  const size_t table_ints = (size_t)c.b * mbps;

  const size_t ws_bytes = hmla::dense_decode_workspace_bytes(c.b, c.s_q, c.h_q, c.h_kv);
  res.workspace_bytes = ws_bytes;

  // ---- how many input sets
  const double touched = (double)(q_elems + cache_elems + out_elems) * elem +
                         (double)lse_elems * 4 + (double)table_ints * 4 + (double)c.b * 4;
  res.bytes_per_set = touched;
  const double alloc_per_set =
      (double)(round_up(q_elems * elem, kAlign) + round_up(cache_elems * elem, kAlign) +
               round_up(out_elems * elem, kAlign) + round_up(lse_elems * 4, kAlign) +
               round_up(table_ints * 4, kAlign) + round_up((size_t)c.b * 4, kAlign) +
               round_up(std::max<size_t>(ws_bytes, 1), kAlign));
  int sets = (int)std::ceil((double)opt.rotate_min_bytes / std::max(touched, 1.0));
  // the workspace (split partials) of tiny shapes can dwarf their inputs: bound the rotation's memory
  sets = std::min(sets, (int)std::max(1.0, std::floor((double)opt.max_rotation_bytes / alloc_per_set)));
  sets = std::max(1, std::min(sets, opt.max_input_sets));
  res.input_sets = sets;

  const double need = (double)sets * alloc_per_set;
  {
    size_t free_b = 0, total_b = 0;
    HB_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (need > 0.97 * (double)free_b) {
      throw BenchError("row " + describe(c) + " needs " + format_gib(need) + " of device memory, " +
                       format_gib((double)free_b) + " free");
    }
  }

  Slab q, cache, out, lse, table, seqlens, ws;
  q.allocate(q_elems * elem, sets);
  cache.allocate(cache_elems * elem, sets);
  out.allocate(out_elems * elem, sets);
  lse.allocate(lse_elems * 4, sets);
  table.allocate(table_ints * 4, sets);
  seqlens.allocate((size_t)c.b * 4, sets);
  ws.allocate(ws_bytes, sets);

  fill_randn_half(q.buf.get(), q.buf.bytes() / elem, c.dtype, opt.seed * 31 + 1, 0.1f, 1.0f, stream);
  fill_randn_half(cache.buf.get(), cache.buf.bytes() / elem, c.dtype, opt.seed * 31 + 2, 0.1f, 1.0f, stream);
  HB_CUDA(cudaMemsetAsync(out.buf.get(), 0, out.buf.bytes(), stream));
  HB_CUDA(cudaMemsetAsync(lse.buf.get(), 0, lse.buf.bytes(), stream));
  for (int s = 0; s < sets; ++s) {
    std::vector<int32_t> t = make_block_table(lens, c.page, mbps, num_blocks, opt.seed * 1000003ull + (uint64_t)s);
    copy_sync(table.at(s), t.data(), t.size() * 4, cudaMemcpyHostToDevice, stream);
    copy_sync(seqlens.at(s), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream);
  }

  // ---- parameters and one plan per set
  std::vector<hmla::DenseDecodeParams> params(sets);
  std::vector<hmla::DecodeSchedule> sched(sets);
  for (int s = 0; s < sets; ++s) {
    hmla::DenseDecodeParams& p = params[s];
    p.dtype = c.dtype;
    p.batch = c.b;
    p.s_q = c.s_q;
    p.h_q = c.h_q;
    p.h_kv = c.h_kv;
    p.d_qk = kDqk;
    p.d_v = kDv;
    p.q = q.at(s);
    p.q_head_stride = kDqk;
    p.q_token_stride = (int64_t)c.h_q * kDqk;
    p.q_batch_stride = (int64_t)c.s_q * c.h_q * kDqk;
    p.k_cache = cache.at(s);
    p.num_blocks = num_blocks;
    p.page_size = c.page;
    p.k_head_stride = kDqk;
    p.k_token_stride = (int64_t)c.h_kv * kDqk;
    p.k_block_stride = (int64_t)page_elems;
    p.block_table = table.at<const int32_t>(s);
    p.max_blocks_per_seq = mbps;
    p.block_table_batch_stride = mbps;
    p.cache_seqlens = seqlens.at<const int32_t>(s);
    p.softmax_scale = 0.f;  // 1/sqrt(576)
    p.causal = c.causal;
    p.out = out.at(s);
    p.out_head_stride = kDv;
    p.out_token_stride = (int64_t)c.h_q * kDv;
    p.out_batch_stride = (int64_t)c.s_q * c.h_q * kDv;
    p.lse = lse.at<float>(s);
    p.lse_head_stride = c.s_q;
    p.lse_batch_stride = (int64_t)c.h_q * c.s_q;
    if (s == 0) hmla::validate(p);  // clean InvalidArgument before any plan or launch
    sched[s] = hmla::dense_decode_plan(p.cache_seqlens, c.b, c.s_q, c.h_q, c.h_kv,
                                       ws_bytes ? ws.at(s) : nullptr, ws_bytes, stream);
  }
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
  res.num_sm_parts = sched[0].num_sm_parts;
  res.num_m_blocks = sched[0].num_m_blocks;

  // ---- timing: only dense_decode_run (split + combine), sets rotated call by call
  TimingConfig cfg;
  cfg.warmup = opt.warmup;
  cfg.warmup_ms = opt.warmup_ms;
  cfg.iters = opt.iters;
  cfg.backlog = opt.backlog;
  std::vector<double> us = time_calls(
      cfg, stream,
      [&](int i) {
        int s = i % sets;
        hmla::dense_decode_run(params[s], sched[s], stream);
      },
      &res.sm_mhz);
  HB_CUDA(cudaGetLastError());
  res.time = summarize(us);
  res.flops = dense_flops(c, total);
  res.bytes = dense_bytes(c, total);
  res.tflops = res.flops / (res.time.median * 1e-6) / 1e12;
  res.gbps = res.bytes / (res.time.median * 1e-6) / 1e9;

  if (!opt.check) return res;

  // ---- check: one more run of set 0 into poisoned outputs, against the CPU reference
  auto t0 = std::chrono::steady_clock::now();
  res.checked = true;
  HB_CUDA(cudaMemsetAsync(out.at(0), 0xff, out_elems * elem, stream));  // NaN in bf16 and fp16
  HB_CUDA(cudaMemsetAsync(lse.at(0), 0xff, lse_elems * 4, stream));     // NaN in float32
  hmla::dense_decode_run(params[0], sched[0], stream);
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());

  res.nonfinite_out = count_nonfinite_half(out.at(0), out_elems, c.dtype, stream);

  // the inputs exactly as the device holds them
  std::vector<int32_t> lens_h(c.b), table_h(table_ints);
  std::vector<float> lse_h(lse_elems);
  copy_sync(lens_h.data(), seqlens.at(0), (size_t)c.b * 4, cudaMemcpyDeviceToHost, stream);
  copy_sync(table_h.data(), table.at(0), table_ints * 4, cudaMemcpyDeviceToHost, stream);
  copy_sync(lse_h.data(), lse.at(0), lse_elems * 4, cudaMemcpyDeviceToHost, stream);

  // lse over the whole batch: never NaN; +inf exactly where a query has no key
  for (int r = 0; r < c.b; ++r)
    for (int h = 0; h < c.h_q; ++h)
      for (int i = 0; i < c.s_q; ++i) {
        long long keys = c.causal ? (long long)lens_h[r] - c.s_q + i + 1 : (long long)lens_h[r];
        float v = lse_h[((size_t)r * c.h_q + h) * c.s_q + i];
        bool expect_inf = keys <= 0;
        bool is_pos_inf = std::isinf(v) && v > 0;
        if (std::isnan(v) || expect_inf != is_pos_inf) ++res.bad_lse;
      }

  // compact host copy of the checked requests: q rows, the pages they use, a local block table
  std::vector<int> ids = pick_requests(c, lens, opt.check_requests);
  res.check_request_ids = ids;
  const int n = (int)ids.size();
  int local_mbps = 1;
  long long local_pages = 0;
  for (int r : ids) {
    int pages = (int)ceil_div((size_t)std::max(lens_h[r], 0), (size_t)c.page);
    local_mbps = std::max(local_mbps, pages);
    local_pages += pages;
  }
  const size_t q_row = (size_t)c.s_q * c.h_q * kDqk;
  const size_t out_row = (size_t)c.s_q * c.h_q * kDv;
  const size_t lse_row = (size_t)c.h_q * c.s_q;
  std::vector<uint16_t> q_h(q_row * n), cache_h(std::max<size_t>((size_t)local_pages, 1) * page_elems);
  std::vector<uint16_t> out_dev_h(out_row * n), out_ref_h(out_row * n);
  std::vector<float> out_ref_f32(out_row * n), lse_ref_h(lse_row * n);
  std::vector<int32_t> local_table((size_t)n * local_mbps, -1), local_lens(n);
  long long next_page = 0;
  for (int j = 0; j < n; ++j) {
    int r = ids[j];
    local_lens[j] = lens_h[r];
    copy_sync(q_h.data() + j * q_row, q.at<uint16_t>(0) + (size_t)r * q_row, q_row * elem,
              cudaMemcpyDeviceToHost, stream);
    copy_sync(out_dev_h.data() + j * out_row, out.at<uint16_t>(0) + (size_t)r * out_row, out_row * elem,
              cudaMemcpyDeviceToHost, stream);
    int pages = (int)ceil_div((size_t)std::max(lens_h[r], 0), (size_t)c.page);
    for (int k = 0; k < pages; ++k) {
      int32_t phys = table_h[(size_t)r * mbps + k];
      if (phys < 0 || phys >= num_blocks)
        throw BenchError("block table entry out of range on the device: request " + std::to_string(r) +
                         " page " + std::to_string(k) + " = " + std::to_string(phys));
      copy_sync(cache_h.data() + (size_t)next_page * page_elems, cache.at<uint16_t>(0) + (size_t)phys * page_elems,
                page_elems * elem, cudaMemcpyDeviceToHost, stream);
      local_table[(size_t)j * local_mbps + k] = (int32_t)next_page++;
    }
  }

  // the reference, one request per thread (each call is a batch-1 problem over the compact cache)
  std::vector<std::exception_ptr> errors(n);
  auto ref_one = [&](int j) {
    try {
      hmla::DenseDecodeParams hp = params[0];
      hp.batch = 1;
      hp.q = q_h.data() + j * q_row;
      hp.k_cache = cache_h.data();
      hp.num_blocks = (int)std::max<long long>(local_pages, 1);
      hp.block_table = local_table.data() + (size_t)j * local_mbps;
      hp.max_blocks_per_seq = local_mbps;
      hp.block_table_batch_stride = local_mbps;
      hp.cache_seqlens = local_lens.data() + j;
      hp.out = out_ref_h.data() + j * out_row;
      hp.lse = lse_ref_h.data() + j * lse_row;
      hmla::reference::dense_decode(hp, out_ref_f32.data() + j * out_row);
    } catch (...) {
      errors[j] = std::current_exception();
    }
  };
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  for (int start = 0; start < n; start += (int)hw) {
    std::vector<std::thread> threads;
    for (int j = start; j < std::min(n, start + (int)hw); ++j) threads.emplace_back(ref_one, j);
    for (std::thread& t : threads) t.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  // compare
  double diff2 = 0, ref2 = 0, max_abs = 0;
  bool out_nan = false;
  for (size_t i = 0; i < out_row * n; ++i) {
    double got = hmla::reference::load_half(c.dtype, out_dev_h.data(), (int64_t)i);
    double want = out_ref_f32[i];
    double d = got - want;
    if (std::isnan(d)) out_nan = true;
    diff2 += d * d;
    ref2 += want * want;
    max_abs = std::max(max_abs, std::fabs(d));
  }
  res.out_rel_l2 = out_nan ? NAN : (ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2));
  res.out_max_abs = out_nan ? NAN : max_abs;
  double lse_err = 0;
  bool lse_nan = false;
  for (int j = 0; j < n; ++j)
    for (size_t k = 0; k < lse_row; ++k) {
      float got = lse_h[(size_t)ids[j] * lse_row + k];
      float want = lse_ref_h[(size_t)j * lse_row + k];
      double d;
      if (std::isinf(got) && std::isinf(want) && (got > 0) == (want > 0)) d = 0;
      else d = std::fabs((double)got - (double)want);
      if (std::isnan(d)) lse_nan = true;
      lse_err = std::max(lse_err, d);
    }
  res.lse_max_abs = lse_nan ? NAN : lse_err;

  res.check_pass = (res.out_rel_l2 <= kCheckOutRelL2) && (res.lse_max_abs <= kCheckLseAbs) &&
                   res.nonfinite_out == 0 && res.bad_lse == 0;
  if (!res.check_pass) {
    std::string note;
    if (!(res.out_rel_l2 <= kCheckOutRelL2)) note += "out rel-L2 above threshold; ";
    if (!(res.lse_max_abs <= kCheckLseAbs)) note += "lse error above threshold; ";
    if (res.nonfinite_out) note += std::to_string(res.nonfinite_out) + " non-finite out values in the batch; ";
    if (res.bad_lse) note += std::to_string(res.bad_lse) + " NaN/unexpected-inf lse values in the batch; ";
    if (note.size() >= 2) note.resize(note.size() - 2);
    res.check_note = note;
  }
  res.check_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace hmla_bench
