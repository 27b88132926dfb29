// hmla-bench: one merge row (see merge_bench.h).
//
// Inputs (per input set, on the device): `states` partial results in the decode layouts, stacked:
//   out [b, s_q, h, d_v] randn * 0.5 clamped to +-1 (the row's dtype), lse [b, h, s_q] uniform in
//   [-4, 12] (float32), and the merged out / lse. Rotated like the other families until a pass
//   touches RowOptions::rotate_min_bytes. The op streams its inputs once, so its figure of merit is
//   GB/s against the read ceiling.
#include "merge_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "device_util.h"
#include "hmla/reference.h"

namespace hmla_bench {
namespace {

constexpr size_t kElem = 2;

size_t rows_of(const MergeCase& c) { return (size_t)c.b * c.s_q * c.h; }

}  // namespace

hmla::MergeAttentionParams MergeBench::params(int set) const {
  hmla::MergeAttentionParams p;
  p.dtype = c_.dtype;
  p.batch = c_.b;
  p.s_q = c_.s_q;
  p.h = c_.h;
  p.d_v = c_.d_v;
  p.num_states = c_.states;
  p.states = views_[set].data();
  p.output = hmla::AttentionOutput::contiguous(out_.at(set), lse_.at<float>(set), c_.s_q, c_.h, c_.d_v);
  return p;
}

void MergeBench::setup(const RowOptions& opt, cudaStream_t stream) {
  const MergeCase& c = c_;
  const size_t rows = rows_of(c);
  const size_t out_elems = rows * c.d_v;
  const double touched = merge_bytes(c);
  const double alloc_per_set = (double)(round_up(out_elems * kElem * c.states, kSlabAlign) +
                                        round_up(rows * 4 * c.states, kSlabAlign) +
                                        round_up(out_elems * kElem, kSlabAlign) + round_up(rows * 4, kSlabAlign));
  const int sets = rotation_sets(opt, touched, alloc_per_set);
  sets_ = sets;
  require_device_memory((double)sets * alloc_per_set, describe());

  states_out_.allocate(out_elems * kElem * c.states, sets);
  states_lse_.allocate(rows * 4 * c.states, sets);
  out_.allocate(out_elems * kElem, sets);
  lse_.allocate(rows * 4, sets);
  fill_randn_half(states_out_.buf.get(), states_out_.buf.bytes() / kElem, c.dtype, opt.seed * 31 + 5, 0.5f, 1.0f,
                  stream);
  std::mt19937_64 rng(opt.seed ^ 0x6d65726765ull);
  std::uniform_real_distribution<float> lse_dist(-4.f, 12.f);
  std::vector<float> lse_h(rows * c.states);
  for (int s = 0; s < sets; ++s) {
    for (float& v : lse_h) v = lse_dist(rng);
    copy_sync(states_lse_.at(s), lse_h.data(), lse_h.size() * 4, cudaMemcpyHostToDevice, stream);
  }
  HB_CUDA(cudaMemsetAsync(out_.buf.get(), 0, out_.buf.bytes(), stream));
  HB_CUDA(cudaMemsetAsync(lse_.buf.get(), 0, lse_.buf.bytes(), stream));

  views_.assign(sets, {});
  for (int s = 0; s < sets; ++s) {
    for (int i = 0; i < c.states; ++i)
      views_[s].push_back(hmla::AttentionState::contiguous(states_out_.at<uint16_t>(s) + out_elems * i,
                                                           states_lse_.at<float>(s) + rows * i, c.s_q, c.h, c.d_v));
    if (s == 0) hmla::validate(params(0));  // a clean InvalidArgument before any launch
  }
  HB_CUDA(cudaStreamSynchronize(stream));
}

void MergeBench::run(int set, cudaStream_t stream) { hmla::merge_attention_states(params(set), stream); }

void MergeBench::check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& res) {
  const MergeCase& c = c_;
  const size_t rows = rows_of(c);
  const size_t out_elems = rows * c.d_v;
  poison_outputs(out_.at(0), out_elems * kElem, lse_.at<float>(0), rows * 4, stream);
  run(0, stream);
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
  // The inputs are finite, so every merged value must be.
  res.nonfinite_out = count_nonfinite_half(out_.at(0), out_elems, c.dtype, stream);
  std::vector<float> lse_all(rows);
  copy_sync(lse_all.data(), lse_.at(0), rows * 4, cudaMemcpyDeviceToHost, stream);
  for (float v : lse_all)
    if (!std::isfinite(v)) ++res.bad_lse;

  // the checked batch entries, each a contiguous block of every tensor, copied out compactly
  const std::vector<int> ids = pick_check_requests(c.b, opt.check_requests, [&](int) {
    return (double)c.s_q * c.h * c.d_v * c.states;
  });
  res.request_ids = ids;
  const size_t n = ids.size();
  const size_t entry_rows = (size_t)c.s_q * c.h;
  const size_t entry_out = entry_rows * c.d_v;
  std::vector<uint16_t> states_out_h(entry_out * n * c.states), out_dev_h(entry_out * n);
  std::vector<float> states_lse_h(entry_rows * n * c.states), lse_dev_h(entry_rows * n);
  for (size_t j = 0; j < n; ++j) {
    const size_t b = (size_t)ids[j];
    for (int i = 0; i < c.states; ++i) {
      copy_sync(states_out_h.data() + (i * n + j) * entry_out,
                states_out_.at<uint16_t>(0) + out_elems * i + b * entry_out, entry_out * kElem,
                cudaMemcpyDeviceToHost, stream);
      copy_sync(states_lse_h.data() + (i * n + j) * entry_rows, states_lse_.at<float>(0) + rows * i + b * entry_rows,
                entry_rows * 4, cudaMemcpyDeviceToHost, stream);
    }
    copy_sync(out_dev_h.data() + j * entry_out, out_.at<uint16_t>(0) + b * entry_out, entry_out * kElem,
              cudaMemcpyDeviceToHost, stream);
    std::copy(lse_all.begin() + b * entry_rows, lse_all.begin() + (b + 1) * entry_rows,
              lse_dev_h.begin() + j * entry_rows);
  }
  std::vector<hmla::AttentionState> host_views;
  for (int i = 0; i < c.states; ++i)
    host_views.push_back(hmla::AttentionState::contiguous(states_out_h.data() + i * n * entry_out,
                                                          states_lse_h.data() + i * n * entry_rows, c.s_q, c.h, c.d_v));
  std::vector<float> out_ref_f32(entry_out * n), lse_ref(entry_rows * n);
  hmla::MergeAttentionParams hp;
  hp.dtype = c.dtype;
  hp.batch = (int)n;
  hp.s_q = c.s_q;
  hp.h = c.h;
  hp.d_v = c.d_v;
  hp.num_states = c.states;
  hp.states = host_views.data();
  hp.output = hmla::AttentionOutput::contiguous(nullptr, lse_ref.data(), c.s_q, c.h, c.d_v);
  hmla::reference::merge_attention_states(hp, out_ref_f32.data());
  compare_outputs(out_dev_h.data(), c.dtype, out_ref_f32.data(), entry_out * n, lse_dev_h.data(), lse_ref.data(),
                  entry_rows * n, res);
}

void MergeBench::release() {
  for (Slab* s : {&states_out_, &states_lse_, &out_, &lse_}) s->buf.release();
  views_.clear();
}

std::string MergeBench::shape_header() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%6s %3s %4s %4s %6s %5s %4s", "b", "s_q", "h", "d_v", "states", "dtype", "sets");
  return buf;
}

std::string MergeBench::shape_cells() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%6d %3d %4d %4d %6d %5s %4d", c_.b, c_.s_q, c_.h, c_.d_v, c_.states,
                hmla::dtype_name(c_.dtype), sets_);
  return buf;
}

void MergeBench::json_shape(Json& row) const {
  row["kind"] = "merge";
  row["dtype"] = hmla::dtype_name(c_.dtype);
  row["b"] = c_.b;
  row["s_q"] = c_.s_q;
  row["h_q"] = c_.h;
  row["d_v"] = c_.d_v;
  row["states"] = c_.states;
}

}  // namespace hmla_bench
