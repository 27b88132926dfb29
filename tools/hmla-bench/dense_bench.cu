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
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "device_util.h"
#include "hmla/reference.h"

namespace hmla_bench {
namespace {

constexpr int kDqk = 576;
constexpr int kDv = 512;
constexpr size_t kElem = 2;

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

}  // namespace

void DenseBench::setup(const RowOptions& opt, cudaStream_t stream) {
  const DenseCase& c = c_;

  // ---- lengths and geometry
  lens_ = make_lengths(c, opt.seed);
  long long total = 0;
  int max_len = 0, min_len = lens_.empty() ? 0 : lens_[0];
  long long total_pages = 0;
  for (int l : lens_) {
    total += l;
    max_len = std::max(max_len, l);
    min_len = std::min(min_len, l);
    total_pages += (long long)ceil_div((size_t)l, (size_t)c.page);
  }
  if (total_pages > 0x7fffffffll) throw BenchError("row needs more than 2^31 cache pages");
  total_tokens_ = total;
  s_k_min_ = min_len;
  s_k_max_ = max_len;
  mbps_ = std::max(1, (int)ceil_div((size_t)max_len, (size_t)c.page));
  num_blocks_ = (int)total_pages;
  const int mbps = mbps_;
  const int num_blocks = num_blocks_;

  const size_t q_elems = (size_t)c.b * c.s_q * c.h_q * kDqk;
  const size_t page_elems = (size_t)c.page * c.h_kv * kDqk;
  const size_t cache_elems = (size_t)num_blocks * page_elems;
  const size_t out_elems = (size_t)c.b * c.s_q * c.h_q * kDv;
  const size_t lse_elems = (size_t)c.b * c.h_q * c.s_q;
  const size_t table_ints = (size_t)c.b * mbps;

  const size_t ws_bytes = hmla::dense_decode_workspace_bytes(c.b, c.s_q, c.h_q, c.h_kv);
  ws_bytes_ = ws_bytes;

  // ---- how many input sets
  const double touched = (double)(q_elems + cache_elems + out_elems) * kElem +
                         (double)lse_elems * 4 + (double)table_ints * 4 + (double)c.b * 4;
  bytes_per_set_ = touched;
  const double alloc_per_set =
      (double)(round_up(q_elems * kElem, kSlabAlign) + round_up(cache_elems * kElem, kSlabAlign) +
               round_up(out_elems * kElem, kSlabAlign) + round_up(lse_elems * 4, kSlabAlign) +
               round_up(table_ints * 4, kSlabAlign) + round_up((size_t)c.b * 4, kSlabAlign) +
               round_up(std::max<size_t>(ws_bytes, 1), kSlabAlign));
  const int sets = rotation_sets(opt, touched, alloc_per_set);
  sets_ = sets;
  require_device_memory((double)sets * alloc_per_set, describe());

  q_.allocate(q_elems * kElem, sets);
  cache_.allocate(cache_elems * kElem, sets);
  out_.allocate(out_elems * kElem, sets);
  lse_.allocate(lse_elems * 4, sets);
  table_.allocate(table_ints * 4, sets);
  seqlens_.allocate((size_t)c.b * 4, sets);
  ws_.allocate(ws_bytes, sets);

  fill_randn_half(q_.buf.get(), q_.buf.bytes() / kElem, c.dtype, opt.seed * 31 + 1, 0.1f, 1.0f, stream);
  fill_randn_half(cache_.buf.get(), cache_.buf.bytes() / kElem, c.dtype, opt.seed * 31 + 2, 0.1f, 1.0f, stream);
  HB_CUDA(cudaMemsetAsync(out_.buf.get(), 0, out_.buf.bytes(), stream));
  HB_CUDA(cudaMemsetAsync(lse_.buf.get(), 0, lse_.buf.bytes(), stream));
  for (int s = 0; s < sets; ++s) {
    std::vector<int32_t> t = make_block_table(lens_, c.page, mbps, num_blocks, opt.seed * 1000003ull + (uint64_t)s);
    copy_sync(table_.at(s), t.data(), t.size() * 4, cudaMemcpyHostToDevice, stream);
    copy_sync(seqlens_.at(s), lens_.data(), lens_.size() * 4, cudaMemcpyHostToDevice, stream);
  }

  // ---- parameters and one plan per set
  params_.assign(sets, hmla::DenseDecodeParams{});
  sched_.assign(sets, hmla::DecodeSchedule{});
  for (int s = 0; s < sets; ++s) {
    hmla::DenseDecodeParams& p = params_[s];
    p.dtype = c.dtype;
    p.batch = c.b;
    p.s_q = c.s_q;
    p.h_q = c.h_q;
    p.h_kv = c.h_kv;
    p.d_qk = kDqk;
    p.d_v = kDv;
    p.q = q_.at(s);
    p.q_head_stride = kDqk;
    p.q_token_stride = (int64_t)c.h_q * kDqk;
    p.q_batch_stride = (int64_t)c.s_q * c.h_q * kDqk;
    p.k_cache = cache_.at(s);
    p.num_blocks = num_blocks;
    p.page_size = c.page;
    p.k_head_stride = kDqk;
    p.k_token_stride = (int64_t)c.h_kv * kDqk;
    p.k_block_stride = (int64_t)page_elems;
    p.block_table = table_.at<const int32_t>(s);
    p.max_blocks_per_seq = mbps;
    p.block_table_batch_stride = mbps;
    p.cache_seqlens = seqlens_.at<const int32_t>(s);
    p.softmax_scale = 0.f;  // 1/sqrt(576)
    p.causal = c.causal;
    p.out = out_.at(s);
    p.out_head_stride = kDv;
    p.out_token_stride = (int64_t)c.h_q * kDv;
    p.out_batch_stride = (int64_t)c.s_q * c.h_q * kDv;
    p.lse = lse_.at<float>(s);
    p.lse_head_stride = c.s_q;
    p.lse_batch_stride = (int64_t)c.h_q * c.s_q;
    if (s == 0) hmla::validate(p);  // clean InvalidArgument before any plan or launch
    sched_[s] = hmla::dense_decode_plan(p.cache_seqlens, c.b, c.s_q, c.h_q, c.h_kv,
                                        ws_bytes ? ws_.at(s) : nullptr, ws_bytes, stream);
  }
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
  num_sm_parts_ = sched_[0].num_sm_parts;
  num_m_blocks_ = sched_[0].num_m_blocks;
}

// The steady-state call: split + combine, the plan reused.
void DenseBench::run(int set, cudaStream_t stream) { hmla::dense_decode_run(params_[set], sched_[set], stream); }

void DenseBench::check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& res) {
  const DenseCase& c = c_;
  const int mbps = mbps_;
  const int num_blocks = num_blocks_;
  const size_t page_elems = (size_t)c.page * c.h_kv * kDqk;
  const size_t out_elems = (size_t)c.b * c.s_q * c.h_q * kDv;
  const size_t lse_elems = (size_t)c.b * c.h_q * c.s_q;
  const size_t table_ints = (size_t)c.b * mbps;

  // one more run of set 0 into poisoned outputs
  poison_outputs(out_.at(0), out_elems * kElem, lse_.at<float>(0), lse_elems * 4, stream);
  hmla::dense_decode_run(params_[0], sched_[0], stream);
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());

  res.nonfinite_out = count_nonfinite_half(out_.at(0), out_elems, c.dtype, stream);

  // the inputs exactly as the device holds them
  std::vector<int32_t> lens_h(c.b), table_h(table_ints);
  std::vector<float> lse_h(lse_elems);
  copy_sync(lens_h.data(), seqlens_.at(0), (size_t)c.b * 4, cudaMemcpyDeviceToHost, stream);
  copy_sync(table_h.data(), table_.at(0), table_ints * 4, cudaMemcpyDeviceToHost, stream);
  copy_sync(lse_h.data(), lse_.at(0), lse_elems * 4, cudaMemcpyDeviceToHost, stream);

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
  std::vector<int> ids = pick_check_requests(c.b, opt.check_requests, [&](int r) {
    return (double)c.s_q * c.h_q * lens_[r] * (kDqk + kDv);
  });
  res.request_ids = ids;
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
  std::vector<float> out_ref_f32(out_row * n), lse_ref_h(lse_row * n), lse_dev_h(lse_row * n);
  std::vector<int32_t> local_table((size_t)n * local_mbps, -1), local_lens(n);
  long long next_page = 0;
  for (int j = 0; j < n; ++j) {
    int r = ids[j];
    local_lens[j] = lens_h[r];
    copy_sync(q_h.data() + j * q_row, q_.at<uint16_t>(0) + (size_t)r * q_row, q_row * kElem,
              cudaMemcpyDeviceToHost, stream);
    copy_sync(out_dev_h.data() + j * out_row, out_.at<uint16_t>(0) + (size_t)r * out_row, out_row * kElem,
              cudaMemcpyDeviceToHost, stream);
    std::copy(lse_h.begin() + (size_t)r * lse_row, lse_h.begin() + (size_t)(r + 1) * lse_row,
              lse_dev_h.begin() + (size_t)j * lse_row);
    int pages = (int)ceil_div((size_t)std::max(lens_h[r], 0), (size_t)c.page);
    for (int k = 0; k < pages; ++k) {
      int32_t phys = table_h[(size_t)r * mbps + k];
      if (phys < 0 || phys >= num_blocks)
        throw BenchError("block table entry out of range on the device: request " + std::to_string(r) +
                         " page " + std::to_string(k) + " = " + std::to_string(phys));
      copy_sync(cache_h.data() + (size_t)next_page * page_elems, cache_.at<uint16_t>(0) + (size_t)phys * page_elems,
                page_elems * kElem, cudaMemcpyDeviceToHost, stream);
      local_table[(size_t)j * local_mbps + k] = (int32_t)next_page++;
    }
  }

  // the reference, one request per thread (each call is a batch-1 problem over the compact cache)
  parallel_for(n, [&](int j) {
    hmla::DenseDecodeParams hp = params_[0];
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
  });

  compare_outputs(out_dev_h.data(), c.dtype, out_ref_f32.data(), out_row * n, lse_dev_h.data(), lse_ref_h.data(),
                  lse_row * n, res);
}

void DenseBench::release() {
  for (Slab* s : {&q_, &cache_, &out_, &lse_, &table_, &seqlens_, &ws_}) s->buf.release();
  params_.clear();
  sched_.clear();
}

std::string DenseBench::shape_header() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%5s %3s %3s %4s %6s %1s %1s %5s %4s %4s", "b", "s_q", "h_q", "h_kv", "s_k", "c", "v",
                "dtype", "page", "sets");
  return buf;
}

std::string DenseBench::shape_cells() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%5d %3d %3d %4d %6d %1d %1d %5s %4d %4d", c_.b, c_.s_q, c_.h_q, c_.h_kv, c_.s_k,
                (int)c_.causal, (int)c_.varlen, hmla::dtype_name(c_.dtype), c_.page, sets_);
  return buf;
}

void DenseBench::json_shape(Json& row) const {
  const DenseCase& c = c_;
  row["kind"] = "dense_decode";
  row["layout"] = hmla::dtype_name(c.dtype);
  row["dtype"] = hmla::dtype_name(c.dtype);
  row["b"] = c.b;
  row["s_q"] = c.s_q;
  row["h_q"] = c.h_q;
  row["h_kv"] = c.h_kv;
  row["s_k"] = c.s_k;
  row["s_k_mean"] = (double)total_tokens_ / c.b;
  row["s_k_min"] = s_k_min_;
  row["s_k_max"] = s_k_max_;
  row["topk"] = 0;
  row["extra_topk"] = 0;
  row["extra_s_k"] = 0;
  row["extra_page"] = 0;
  row["d_qk"] = kDqk;
  row["d_v"] = kDv;
  row["causal"] = c.causal;
  row["varlen"] = c.varlen;
  row["page"] = c.page;
  row["attn_sink"] = false;
}

void DenseBench::json_schedule(Json& row) const {
  row["num_sm_parts"] = num_sm_parts_;
  row["num_m_blocks"] = num_m_blocks_;
}

}  // namespace hmla_bench
