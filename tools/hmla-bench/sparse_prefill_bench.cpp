// hmla-bench: one sparse-prefill row (see sparse_prefill_bench.h), set up as
// ../shared/anchors/compare/compare.py sets up FlashMLA's sparse prefill rows.
//
// Inputs (per input set, on the device):
//   q            [s_q, h_q, d_qk] bf16 randn * 0.1 clamped to +-10 (compare.py's rand_bf16(clamp=10))
//   kv           [s_kv, d_qk] bf16, the same distribution
//   indices      [s_q, topk]: per query token topk distinct random rows of kv in random order
//                (compare.py: the top-k of a random vector over the s_kv rows)
//   topk_length  none, all topk, or per query token uniform in [1, topk] (the same in every set)
//   attn_sink    [h_q] randn (float32), unless --no-sink
//   out [s_q, h_q, 512] bf16, max_logits and lse [s_q, h_q] float32
// softmax_scale = d_qk^-0.5 (compare.py's). Every set has its own kv too: a small kv shared by the
// rotated sets would stay in the L2.
#include "sparse_prefill_bench.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "device_util.h"
#include "hmla/reference.h"
#include "hmla/sparse_prefill.h"

namespace hmla_bench {
namespace {

constexpr int kDv = 512;
constexpr size_t kElem = 2;

}  // namespace

double SparsePrefillBench::flops() const { return 2.0 * c_.h_q * attended_ * (c_.d_qk + kDv); }

// FlashMLA's byte formula: one kv row per counted index (reuse across query tokens not discounted),
// q read and out written once.
double SparsePrefillBench::bytes() const {
  return attended_ * c_.d_qk * (double)kElem + (double)c_.s_q * c_.h_q * (c_.d_qk + kDv) * (double)kElem;
}

void SparsePrefillBench::setup(const RowOptions& opt, cudaStream_t stream) {
  const SparsePrefillCase& c = c_;
  if (c.topk > c.s_kv)
    throw BenchError("row " + describe() + ": topk " + std::to_string(c.topk) + " > s_kv " + std::to_string(c.s_kv) +
                     " (the indices of a list are distinct rows of kv)");
  softmax_scale_ = (float)std::pow((double)c.d_qk, -0.5);
  const bool lengths_given = c.topk_length != TopkLength::kNone;
  lengths_ = topk_lengths(c.topk_length, c.s_q, c.topk, opt.seed * 31 + 13);
  attended_ = std::accumulate(lengths_.begin(), lengths_.end(), 0.0);

  const size_t q_elems = (size_t)c.s_q * c.h_q * c.d_qk;
  const size_t kv_elems = (size_t)c.s_kv * c.d_qk;
  const size_t index_ints = (size_t)c.s_q * c.topk;
  const size_t out_elems = (size_t)c.s_q * c.h_q * kDv;
  const size_t stat_elems = (size_t)c.s_q * c.h_q;  // max_logits, and lse

  // ---- how many input sets
  const double per_set_fixed = (double)(q_elems + out_elems) * kElem + (double)stat_elems * 8 +
                               (double)index_ints * 4 + (lengths_given ? 4.0 * c.s_q : 0.0);
  const double touched_estimate = per_set_fixed + std::min(attended_, (double)c.s_kv) * c.d_qk * (double)kElem;
  const double alloc_per_set =
      (double)(round_up(q_elems * kElem, kSlabAlign) + round_up(kv_elems * kElem, kSlabAlign) +
               round_up(index_ints * 4, kSlabAlign) + round_up((size_t)c.s_q * 4, kSlabAlign) +
               round_up(out_elems * kElem, kSlabAlign) + 2 * round_up(stat_elems * 4, kSlabAlign));
  const int sets = rotation_sets(opt, touched_estimate, alloc_per_set);
  sets_ = sets;
  require_device_memory((double)sets * alloc_per_set, describe());

  // ---- device buffers and parameters (validated before anything is filled)
  q_.allocate(q_elems * kElem, sets);
  kv_.allocate(kv_elems * kElem, sets);
  indices_.allocate(index_ints * 4, sets);
  lengths_dev_.allocate((size_t)c.s_q * 4, sets);
  out_.allocate(out_elems * kElem, sets);
  max_logits_.allocate(stat_elems * 4, sets);
  lse_.allocate(stat_elems * 4, sets);
  if (c.sink) sink_dev_.allocate((size_t)c.h_q * sizeof(float));

  params_.assign(sets, hmla::SparsePrefillParams{});
  for (int s = 0; s < sets; ++s) {
    hmla::SparsePrefillParams& p = params_[s];
    p.s_q = c.s_q;
    p.s_kv = c.s_kv;
    p.h_q = c.h_q;
    p.d_qk = c.d_qk;
    p.d_v = kDv;
    p.q = q_.at<const uint16_t>(s);
    p.q_token_stride = (int64_t)c.h_q * c.d_qk;
    p.q_head_stride = c.d_qk;
    p.kv = kv_.at<const uint16_t>(s);
    p.kv_token_stride = c.d_qk;
    p.indices = indices_.at<const int32_t>(s);
    p.topk = c.topk;
    p.indices_token_stride = c.topk;
    p.topk_length = lengths_given ? lengths_dev_.at<const int32_t>(s) : nullptr;
    p.attn_sink = c.sink ? sink_dev_.get<const float>() : nullptr;
    p.softmax_scale = softmax_scale_;
    p.out = out_.at<uint16_t>(s);
    p.out_token_stride = (int64_t)c.h_q * kDv;
    p.out_head_stride = kDv;
    p.max_logits = max_logits_.at<float>(s);
    p.lse = lse_.at<float>(s);
  }
  const char* whole = std::getenv("HMLA_BENCH_PREFILL_WHOLE_ITEMS");
  workspace_bytes_ = whole != nullptr && std::string(whole) == "1" ? 0 : hmla::sparse_prefill_workspace_bytes(params_[0]);
  if (workspace_bytes_ > 0) {
    workspace_.allocate(workspace_bytes_);
    for (auto& p : params_) {
      p.workspace = workspace_.get<void>();
      p.workspace_bytes = workspace_bytes_;
    }
  }
  hmla::validate(params_[0]);  // clean InvalidArgument before building or launching anything

  // ---- contents
  fill_randn_half(q_.buf.get(), q_.buf.bytes() / kElem, hmla::DType::kBF16, opt.seed * 31 + 3, 0.1f, 10.0f, stream);
  fill_randn_half(kv_.buf.get(), kv_.buf.bytes() / kElem, hmla::DType::kBF16, opt.seed * 31 + 4, 0.1f, 10.0f, stream);
  for (int s = 0; s < sets; ++s) {
    std::vector<int32_t> indices =
        random_distinct_lists(c.s_q, c.s_kv, c.topk, counter_hash(opt.seed * 1000003ull + 3, (uint64_t)s));
    if (s == 0) {
      // the kv rows one call reads: FlashMLA's bytes count a row once per index, this once per call
      std::vector<uint8_t> seen(c.s_kv, 0);
      double distinct = 0;
      for (int t = 0; t < c.s_q; ++t)
        for (int k = 0; k < lengths_[t]; ++k) {
          const int32_t row = indices[(size_t)t * c.topk + k];
          if (!seen[row]) {
            seen[row] = 1;
            ++distinct;
          }
        }
      bytes_per_set_ = per_set_fixed + distinct * c.d_qk * (double)kElem;
    }
    copy_sync(indices_.at(s), indices.data(), indices.size() * 4, cudaMemcpyHostToDevice, stream);
    copy_sync(lengths_dev_.at(s), lengths_.data(), lengths_.size() * 4, cudaMemcpyHostToDevice, stream);
  }
  HB_CUDA(cudaMemsetAsync(out_.buf.get(), 0, out_.buf.bytes(), stream));
  HB_CUDA(cudaMemsetAsync(max_logits_.buf.get(), 0, max_logits_.buf.bytes(), stream));
  HB_CUDA(cudaMemsetAsync(lse_.buf.get(), 0, lse_.buf.bytes(), stream));
  if (c.sink) {
    sink_ = random_sink(c.h_q, opt.seed);
    copy_sync(sink_dev_.get(), sink_.data(), sink_.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
  }
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
}

// The steady-state call: one layer's prefill attention (nothing to plan; with a workspace, a memset of
// its counters and the kernel).
void SparsePrefillBench::run(int set, cudaStream_t stream) { hmla::sparse_prefill_run(params_[set], stream); }

void SparsePrefillBench::check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& res) {
  const SparsePrefillCase& c = c_;
  const size_t out_elems = (size_t)c.s_q * c.h_q * kDv;
  const size_t stat_elems = (size_t)c.s_q * c.h_q;

  poison_outputs(out_.at(0), out_elems * kElem, lse_.at<float>(0), stat_elems * 4, stream);
  run(0, stream);
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
  res.nonfinite_out = count_nonfinite_half(out_.at(0), out_elems, hmla::DType::kBF16, stream);

  // the inputs exactly as the device holds them
  std::vector<uint16_t> kv_h((size_t)c.s_kv * c.d_qk);
  std::vector<int32_t> indices_h((size_t)c.s_q * c.topk), lengths_h(c.s_q);
  std::vector<float> lse_h(stat_elems);
  copy_sync(kv_h.data(), kv_.at(0), kv_h.size() * kElem, cudaMemcpyDeviceToHost, stream);
  copy_sync(indices_h.data(), indices_.at(0), indices_h.size() * 4, cudaMemcpyDeviceToHost, stream);
  copy_sync(lengths_h.data(), lengths_dev_.at(0), lengths_h.size() * 4, cudaMemcpyDeviceToHost, stream);
  copy_sync(lse_h.data(), lse_.at(0), stat_elems * 4, cudaMemcpyDeviceToHost, stream);
  const bool lengths_given = params_[0].topk_length != nullptr;

  // lse over every query token: never NaN; +inf exactly where a query has no valid index
  for (int t = 0; t < c.s_q; ++t) {
    const int32_t* list = indices_h.data() + (size_t)t * c.topk;
    const int counted = lengths_given ? lengths_h[t] : c.topk;
    long long keys = 0;
    for (int e = 0; e < counted; ++e) keys += (list[e] >= 0 && list[e] < c.s_kv) ? 1 : 0;
    for (int h = 0; h < c.h_q; ++h) {
      const float v = lse_h[(size_t)t * c.h_q + h];
      const bool is_pos_inf = std::isinf(v) && v > 0;
      if (std::isnan(v) || (keys == 0) != is_pos_inf) ++res.bad_lse;
    }
  }

  // The checked query tokens: compare.py checks its first 64; these 64 are spread over all of s_q,
  // so that the last CTAs are compared too.
  const std::vector<int> ids = pick_check_requests(
      c.s_q, opt.check_requests, [&](int t) { return (double)c.h_q * lengths_[t] * (c.d_qk + kDv); }, 64);
  res.request_ids = ids;
  const int n = (int)ids.size();
  const size_t q_row = (size_t)c.h_q * c.d_qk;
  const size_t out_row = (size_t)c.h_q * kDv;
  const size_t stat_row = (size_t)c.h_q;
  std::vector<uint16_t> q_h(q_row * n), out_dev_h(out_row * n);
  std::vector<float> out_ref_f32(out_row * n), lse_ref_h(stat_row * n), lse_dev_h(stat_row * n);
  for (int j = 0; j < n; ++j) {
    const int t = ids[j];
    copy_sync(q_h.data() + j * q_row, q_.at<uint16_t>(0) + (size_t)t * q_row, q_row * kElem, cudaMemcpyDeviceToHost,
              stream);
    copy_sync(out_dev_h.data() + j * out_row, out_.at<uint16_t>(0) + (size_t)t * out_row, out_row * kElem,
              cudaMemcpyDeviceToHost, stream);
    std::copy(lse_h.begin() + (size_t)t * stat_row, lse_h.begin() + (size_t)(t + 1) * stat_row,
              lse_dev_h.begin() + (size_t)j * stat_row);
  }

  // the reference, one query token per thread (each an s_q = 1 problem over the whole kv)
  parallel_for(n, [&](int j) {
    const int t = ids[j];
    hmla::SparsePrefillParams hp = params_[0];
    hp.s_q = 1;
    hp.q = q_h.data() + j * q_row;
    hp.kv = kv_h.data();
    hp.indices = indices_h.data() + (size_t)t * c.topk;
    hp.topk_length = lengths_given ? lengths_h.data() + t : nullptr;
    hp.attn_sink = c.sink ? sink_.data() : nullptr;
    hp.out = nullptr;  // compared unrounded, through out_f32
    hp.max_logits = nullptr;
    hp.lse = lse_ref_h.data() + j * stat_row;
    hmla::reference::sparse_prefill(hp, out_ref_f32.data() + j * out_row);
  });

  compare_outputs(out_dev_h.data(), hmla::DType::kBF16, out_ref_f32.data(), out_row * n, lse_dev_h.data(),
                  lse_ref_h.data(), stat_row * n, res);
}

void SparsePrefillBench::release() {
  for (Slab* s : {&q_, &kv_, &indices_, &lengths_dev_, &out_, &max_logits_, &lse_}) s->buf.release();
  sink_dev_.release();
  workspace_.release();
  params_.clear();
}

std::string SparsePrefillBench::shape_header() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%5s %3s %4s %6s %5s %6s %4s %4s", "s_q", "h_q", "d_qk", "s_kv", "topk", "len",
                "sink", "sets");
  return buf;
}

std::string SparsePrefillBench::shape_cells() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%5d %3d %4d %6d %5d %6s %4d %4d", c_.s_q, c_.h_q, c_.d_qk, c_.s_kv, c_.topk,
                topk_length_name(c_.topk_length), (int)c_.sink, sets_);
  return buf;
}

// The anchor file's fields: s_k is s_kv, b 1, page 0.
void SparsePrefillBench::json_shape(Json& row) const {
  const SparsePrefillCase& c = c_;
  row["kind"] = "sparse_prefill";
  row["layout"] = "bf16";
  row["dtype"] = "bf16";
  row["b"] = 1;
  row["s_q"] = c.s_q;
  row["h_q"] = c.h_q;
  row["h_kv"] = 1;
  row["s_k"] = c.s_kv;
  row["topk"] = c.topk;
  row["extra_topk"] = 0;
  row["extra_s_k"] = 0;
  row["extra_page"] = 0;
  row["d_qk"] = c.d_qk;
  row["d_v"] = kDv;
  row["causal"] = false;
  row["varlen"] = false;
  row["page"] = 0;
  row["attn_sink"] = c.sink;
  row["topk_length"] = topk_length_name(c.topk_length);
  row["topk_length_mean"] = c.s_q > 0 ? attended_ / c.s_q : 0.0;
  row["attended"] = attended_;
  row["softmax_scale"] = (double)softmax_scale_;
}

}  // namespace hmla_bench
