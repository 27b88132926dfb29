// hmla-bench: one sparse-decode row (see sparse_bench.h), set up as ../shared/anchors/compare/compare.py
// sets up FlashMLA's sparse decode rows.
//
// Inputs:
//   main cache   b * ceil(s_k / page) pages of the layout; every token some index of the row names
//                is quantised by hmla::reference::pack_token from bf16 randn * 0.1 clamped to +-1
//                (on the host, all cores), the other slots are zero bytes that nothing reads; copied
//                to the device. Quantising every slot cost minutes at b 1024 (33.5M tokens at the
//                default s_k) where topk 128 names 0.4 % of them. The most recent images are kept and
//                grow by the tokens each row names, so rows of one geometry share one build
//   block table  (host only) a random permutation of the pages, [b, ceil(s_k / page)]
//   indices      per input set [b, s_q, topk]: per (b, s) topk distinct random positions in [0, s_k),
//                each mapped through request b's block table to page * page_size + offset (what
//                FlashMLA's abs_indices2indices_in_kvcache does)
//   extra cache  the same with its own s_k, page and topk (--extra-*)
//   topk_length  none, all topk, or per request uniform in [1, topk] (the same in every set)
//   attn_sink    [h_q] randn (float32), unless --no-sink
//   q            per set [b, s_q, h_q, d_qk] bf16 randn clamped to +-1 (scale 1.0 as compare.py)
//   out [b, s_q, h_q, 512] bf16, lse [b, h_q, s_q] float32, workspace and plan per set
// softmax_scale = d_qk^-0.55 (compare.py's). When one set touches less than rotate_min_bytes, sets
// are rotated call by call; every set draws its own indices, and when the caches themselves are
// smaller than rotate_min_bytes, the sets also rotate over copies of them.
#include "sparse_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>

#include "device_util.h"
#include "hmla/reference.h"
#include "hmla/sparse_decode.h"

namespace hmla_bench {

struct HostCache {
  hmla::SparseCacheLayout layout = hmla::SparseCacheLayout::kV32;
  int num_blocks = 0, page = 0;
  int64_t page_bytes = 0;
  uint64_t seed = 0;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> quantised;  // per token slot: its values are in `bytes`
};

namespace {

constexpr int kDv = 512;
constexpr size_t kElem = 2;
constexpr uint64_t kMainScope = 1, kExtraScope = 2;
constexpr float kTwoPi = 6.28318530718f;

// A cache image with no token quantised yet (zero bytes).
std::shared_ptr<HostCache> empty_host_cache(hmla::SparseCacheLayout layout, int num_blocks, int page, uint64_t seed) {
  auto cache = std::make_shared<HostCache>();
  cache->layout = layout;
  cache->num_blocks = num_blocks;
  cache->page = page;
  cache->seed = seed;
  cache->page_bytes = hmla::reference::sparse_page_bytes(layout, page);
  cache->bytes.resize((size_t)num_blocks * (size_t)cache->page_bytes);
  cache->quantised.assign((size_t)num_blocks * (size_t)page, 0);
  return cache;
}

// Quantises, on all cores, the tokens the index lists name that the image does not hold yet
// (entries outside the cache are skipped, as the kernel skips them). Token g's value j comes from
// counter_hash(seed, g * d_qk / 2 + j / 2) (two normals per hash), so a token's bytes depend only on
// (layout, page, seed, g), never on the thread count or on which other tokens were quantised.
void quantise_named_tokens(HostCache& cache, const std::vector<std::vector<int32_t>>& index_lists) {
  const int64_t slots = (int64_t)cache.num_blocks * cache.page;
  std::vector<int64_t> pending;
  for (const std::vector<int32_t>& list : index_lists)
    for (const int32_t idx : list)
      if (idx >= 0 && idx < slots && !cache.quantised[(size_t)idx]) {
        cache.quantised[(size_t)idx] = 1;
        pending.push_back(idx);
      }
  const int d_qk = hmla::reference::sparse_cache_d_qk(cache.layout);
  const size_t tokens_per_job = 4096;
  const int jobs = (int)ceil_div(pending.size(), tokens_per_job);
  parallel_for(jobs, [&](int job) {
    std::vector<uint16_t> token(d_qk);
    const size_t first = (size_t)job * tokens_per_job, last = std::min(pending.size(), first + tokens_per_job);
    for (size_t k = first; k < last; ++k) {
      const uint64_t g = (uint64_t)pending[k];
      for (int j = 0; j < d_qk; j += 2) {
        const uint64_t h = counter_hash(cache.seed, g * (uint64_t)(d_qk / 2) + (uint64_t)(j / 2));
        // Box-Muller from two 24-bit uniforms; u1 in (0, 1] so the log is finite.
        const float u1 = (float)((h >> 40) + 1) * (1.0f / 16777216.0f);
        const float u2 = (float)(h & 0xffffffull) * (1.0f / 16777216.0f);
        const float r = std::sqrt(-2.0f * std::log(u1)) * 0.1f;
        const float angle = kTwoPi * u2;
        token[j] = hmla::reference::float_to_bf16(std::clamp(r * std::cos(angle), -1.0f, 1.0f));
        token[j + 1] = hmla::reference::float_to_bf16(std::clamp(r * std::sin(angle), -1.0f, 1.0f));
      }
      uint8_t* page_ptr = cache.bytes.data() + (size_t)(g / cache.page) * (size_t)cache.page_bytes;
      hmla::reference::pack_token(cache.layout, token.data(), page_ptr, cache.page, (int)(g % cache.page));
    }
  });
}

// The two most recent images: a sweep's rows of one geometry (the four V3.2 rows, the MODEL1 rows
// with an extra cache) reuse one image (up to 2.7 GB) and quantise only the tokens it lacks.
std::shared_ptr<HostCache> host_cache(hmla::SparseCacheLayout layout, int num_blocks, int page, uint64_t seed) {
  static std::vector<std::shared_ptr<HostCache>> recent;
  for (size_t i = 0; i < recent.size(); ++i) {
    const HostCache& h = *recent[i];
    if (h.layout == layout && h.num_blocks == num_blocks && h.page == page && h.seed == seed) {
      std::shared_ptr<HostCache> hit = recent[i];
      recent.erase(recent.begin() + (long)i);
      recent.insert(recent.begin(), hit);
      return hit;
    }
  }
  if (recent.size() >= 2) recent.pop_back();  // before allocating: never three images at once
  std::shared_ptr<HostCache> image = empty_host_cache(layout, num_blocks, page, seed);
  recent.insert(recent.begin(), image);
  return image;
}

// [b, s_q, topk]: per (b, s) topk distinct positions of [0, s_k) in random order, mapped through
// request b's row of block_table.
std::vector<int32_t> make_indices(int b, int s_q, int s_k, int page, int topk, const std::vector<int32_t>& block_table,
                                  int pages_per_request, uint64_t seed) {
  return random_distinct_lists(b * s_q, s_k, topk, seed, [&](int list, int32_t pos) {
    const int request = list / s_q;
    return block_table[(size_t)request * pages_per_request + pos / page] * page + pos % page;
  });
}

// Distinct tokens named by the entries that count (the first lengths[b] of every list of request b).
double count_unique(const std::vector<int32_t>& indices, const std::vector<int32_t>& lengths, int s_q, int topk,
                    int64_t tokens) {
  std::vector<uint8_t> seen((size_t)tokens, 0);
  double unique = 0;
  for (size_t request = 0; request < lengths.size(); ++request)
    for (int s = 0; s < s_q; ++s) {
      const int32_t* list = indices.data() + (request * s_q + s) * (size_t)topk;
      for (int k = 0; k < lengths[request]; ++k) {
        const int32_t idx = list[k];
        if (idx >= 0 && idx < tokens && !seen[idx]) {
          seen[idx] = 1;
          ++unique;
        }
      }
    }
  return unique;
}

}  // namespace

SparseBench::SparseBench(const SparseCase& c) : c_(c) {}
SparseBench::~SparseBench() = default;

double SparseBench::flops() const { return 2.0 * c_.h_q * attended_ * (d_qk_ + kDv); }

// FlashMLA's byte formula: q, the distinct tokens read (656 B for V3.2, 576 for MODEL1 as in the
// anchors, its per-token scale bytes not counted) and out.
double SparseBench::bytes() const {
  const double rows = (double)c_.b * c_.s_q * c_.h_q;
  return 2.0 * rows * d_qk_ + unique_tokens_ * (d_qk_ == 576 ? 656.0 : 576.0) + 2.0 * rows * kDv;
}

void SparseBench::setup(const RowOptions& opt, cudaStream_t stream) {
  const SparseCase& c = c_;
  d_qk_ = hmla::reference::sparse_cache_d_qk(c.layout);
  softmax_scale_ = (float)std::pow((double)d_qk_, -0.55);
  const int64_t token_bytes = hmla::reference::sparse_token_bytes(c.layout);

  // ---- geometry of both caches and the counted entries
  auto shape_scope = [&](Scope& sc, bool present, int s_k, int page, int topk, uint64_t length_seed) {
    sc.present = present;
    if (!present) return;
    if (topk > s_k)
      throw BenchError("row " + describe() + ": topk " + std::to_string(topk) + " > s_k " + std::to_string(s_k) +
                       " (the indices of a list are distinct positions in [0, s_k))");
    sc.s_k = s_k;
    sc.page = page;
    sc.topk = topk;
    sc.pages_per_request = (int)ceil_div((size_t)s_k, (size_t)page);
    const long long blocks = (long long)c.b * sc.pages_per_request;
    if (blocks * page > 0x7fffffffll)
      throw BenchError("row " + describe() + ": a cache of " + std::to_string(blocks * page) +
                       " tokens does not fit int32 indices");
    sc.num_blocks = (int)blocks;
    sc.page_bytes = hmla::reference::sparse_page_bytes(c.layout, page);
    sc.lengths = topk_lengths(c.topk_length, c.b, topk, length_seed);
  };
  shape_scope(main_, true, c.s_k, c.page, c.topk, opt.seed * 31 + 11);
  shape_scope(extra_, c.extra_topk > 0, c.extra_s_k, c.extra_page, c.extra_topk, opt.seed * 31 + 12);

  double entries = 0, touched_tokens_estimate = 0;
  for (const Scope* sc : {&main_, &extra_}) {
    if (!sc->present) continue;
    double e = 0;
    for (int32_t l : sc->lengths) e += (double)c.s_q * l;
    entries += e;
    touched_tokens_estimate += std::min(e, (double)sc->num_blocks * sc->page);
  }
  attended_ = entries;

  const size_t q_elems = (size_t)c.b * c.s_q * c.h_q * d_qk_;
  const size_t out_elems = (size_t)c.b * c.s_q * c.h_q * kDv;
  const size_t lse_elems = (size_t)c.b * c.h_q * c.s_q;
  const size_t main_ints = (size_t)c.b * c.s_q * c.topk;
  const size_t extra_ints = extra_.present ? (size_t)c.b * c.s_q * c.extra_topk : 0;
  ws_bytes_ = hmla::sparse_decode_workspace_bytes(c.b, c.s_q, c.h_q);

  // ---- how many input sets, and how many copies of the caches
  const double per_set_fixed = (double)(q_elems + out_elems) * kElem + (double)lse_elems * 4 +
                               (double)(main_ints + extra_ints) * 4 + (c.topk_length != TopkLength::kNone ? 8.0 * c.b : 0.0);
  const double touched_estimate = per_set_fixed + touched_tokens_estimate * (double)token_bytes;
  const double alloc_per_set =
      (double)(round_up(q_elems * kElem, kSlabAlign) + round_up(out_elems * kElem, kSlabAlign) +
               round_up(lse_elems * 4, kSlabAlign) + round_up(main_ints * 4, kSlabAlign) +
               round_up(std::max<size_t>(extra_ints, 1) * 4, kSlabAlign) + 2 * round_up((size_t)c.b * 4, kSlabAlign) +
               round_up(std::max<size_t>(ws_bytes_, 1), kSlabAlign));
  const int sets = rotation_sets(opt, touched_estimate, alloc_per_set);
  sets_ = sets;
  const double cache_bytes = (double)main_.num_blocks * main_.page_bytes +
                             (extra_.present ? (double)extra_.num_blocks * extra_.page_bytes : 0.0);
  int copies = (int)std::ceil((double)opt.rotate_min_bytes / std::max(cache_bytes, 1.0));
  copies = std::min(copies, (int)std::max(1.0, std::floor((double)opt.max_rotation_bytes / cache_bytes)));
  cache_copies_ = std::max(1, std::min(copies, sets));
  require_device_memory((double)sets * alloc_per_set + cache_copies_ * cache_bytes, describe());

  // ---- device buffers and parameters (validated before the host builds anything)
  q_.allocate(q_elems * kElem, sets);
  out_.allocate(out_elems * kElem, sets);
  lse_.allocate(lse_elems * 4, sets);
  ws_.allocate(ws_bytes_, sets);
  for (Scope* sc : {&main_, &extra_}) {
    if (!sc->present) continue;
    sc->cache_dev.allocate((size_t)sc->num_blocks * (size_t)sc->page_bytes, cache_copies_);
    sc->indices_dev.allocate((size_t)c.b * c.s_q * sc->topk * 4, sets);
    sc->lengths_dev.allocate((size_t)c.b * 4, sets);
  }
  if (c.sink) sink_dev_.allocate((size_t)c.h_q * sizeof(float));

  params_.assign(sets, hmla::SparseDecodeParams{});
  sched_.assign(sets, hmla::DecodeSchedule{});
  const bool lengths_given = c.topk_length != TopkLength::kNone;
  for (int s = 0; s < sets; ++s) {
    hmla::SparseDecodeParams& p = params_[s];
    p.layout = c.layout;
    p.batch = c.b;
    p.s_q = c.s_q;
    p.h_q = c.h_q;
    p.d_qk = d_qk_;
    p.d_v = kDv;
    p.q = q_.at<const uint16_t>(s);
    p.q_head_stride = d_qk_;
    p.q_token_stride = (int64_t)c.h_q * d_qk_;
    p.q_batch_stride = (int64_t)c.s_q * c.h_q * d_qk_;
    auto bind = [&](const Scope& sc, hmla::SparseKVCache& cache, const int32_t*& indices, int& topk,
                    int64_t& batch_stride, int64_t& token_stride, const int32_t*& lengths) {
      cache.data = sc.cache_dev.at<const uint8_t>(s % cache_copies_);
      cache.num_blocks = sc.num_blocks;
      cache.page_size = sc.page;
      cache.block_stride_bytes = sc.page_bytes;
      indices = sc.indices_dev.at<const int32_t>(s);
      topk = sc.topk;
      batch_stride = (int64_t)c.s_q * sc.topk;
      token_stride = sc.topk;
      lengths = lengths_given ? sc.lengths_dev.at<const int32_t>(s) : nullptr;
    };
    bind(main_, p.cache, p.indices, p.topk, p.indices_batch_stride, p.indices_token_stride, p.topk_length);
    if (extra_.present)
      bind(extra_, p.extra_cache, p.extra_indices, p.extra_topk, p.extra_indices_batch_stride,
           p.extra_indices_token_stride, p.extra_topk_length);
    p.attn_sink = c.sink ? sink_dev_.get<const float>() : nullptr;
    p.softmax_scale = softmax_scale_;
    p.out = out_.at<uint16_t>(s);
    p.out_head_stride = kDv;
    p.out_token_stride = (int64_t)c.h_q * kDv;
    p.out_batch_stride = (int64_t)c.s_q * c.h_q * kDv;
    p.lse = lse_.at<float>(s);
    p.lse_head_stride = c.s_q;
    p.lse_batch_stride = (int64_t)c.h_q * c.s_q;
  }
  hmla::validate(params_[0]);  // clean InvalidArgument before building or launching anything

  // ---- contents
  const uint64_t scope_seed[2] = {kMainScope, kExtraScope};
  int scope_number = 0;
  std::vector<double> unique_per_set(sets, 0.0);
  for (Scope* sc : {&main_, &extra_}) {
    const uint64_t tag = scope_seed[scope_number++];
    if (!sc->present) continue;
    std::vector<int32_t> table(sc->num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::mt19937_64 rng(counter_hash(opt.seed, 1000 + tag));
    std::shuffle(table.begin(), table.end(), rng);
    sc->indices.assign(sets, {});
    sc->unique_tokens.assign(sets, 0.0);
    for (int s = 0; s < sets; ++s) {
      sc->indices[s] = make_indices(c.b, c.s_q, sc->s_k, sc->page, sc->topk, table, sc->pages_per_request,
                                    counter_hash(opt.seed * 1000003ull + tag, (uint64_t)s));
      sc->unique_tokens[s] = count_unique(sc->indices[s], sc->lengths, c.s_q, sc->topk,
                                          (int64_t)sc->num_blocks * sc->page);
      unique_per_set[s] += sc->unique_tokens[s];
      copy_sync(sc->indices_dev.at(s), sc->indices[s].data(), sc->indices[s].size() * 4, cudaMemcpyHostToDevice, stream);
      copy_sync(sc->lengths_dev.at(s), sc->lengths.data(), sc->lengths.size() * 4, cudaMemcpyHostToDevice, stream);
    }
    std::shared_ptr<HostCache> image = host_cache(c.layout, sc->num_blocks, sc->page, opt.seed * 31 + 4 + tag);
    quantise_named_tokens(*image, sc->indices);
    sc->image = image;
    for (int k = 0; k < cache_copies_; ++k)
      copy_sync(sc->cache_dev.at(k), sc->image->bytes.data(), sc->image->bytes.size(), cudaMemcpyHostToDevice, stream);
  }
  unique_tokens_ = std::accumulate(unique_per_set.begin(), unique_per_set.end(), 0.0) / sets;
  bytes_per_set_ = per_set_fixed + unique_per_set[0] * (double)token_bytes;

  fill_randn_half(q_.buf.get(), q_.buf.bytes() / kElem, hmla::DType::kBF16, opt.seed * 31 + 3, 1.0f, 1.0f, stream);
  HB_CUDA(cudaMemsetAsync(out_.buf.get(), 0, out_.buf.bytes(), stream));
  HB_CUDA(cudaMemsetAsync(lse_.buf.get(), 0, lse_.buf.bytes(), stream));
  if (c.sink) {
    sink_ = random_sink(c.h_q, opt.seed);
    copy_sync(sink_dev_.get(), sink_.data(), sink_.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
  }

  // ---- one plan per set, before any timing (engines plan once per decoding step)
  for (int s = 0; s < sets; ++s)
    sched_[s] = hmla::sparse_decode_plan(params_[s], ws_bytes_ ? ws_.at(s) : nullptr, ws_bytes_, stream);
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
  num_sm_parts_ = sched_[0].num_sm_parts;
  num_m_blocks_ = sched_[0].num_m_blocks;
}

// The steady-state call: the attention of one layer, the plan reused.
void SparseBench::run(int set, cudaStream_t stream) { hmla::sparse_decode_run(params_[set], sched_[set], stream); }

namespace {
// A kernel that returns at once, holding `dynamic smem` bytes of shared memory.
__global__ void empty_with_smem_kernel() {
  extern __shared__ int unused_smem[];
  if (threadIdx.x == 1 && blockDim.x == 0) unused_smem[0] = 0;  // keeps the allocation
}

// What precedes the attention in the planned calls of the step timing: the plan, or for a
// diagnostic (HMLA_BENCH_STEP_BEFORE) spin0 / spin10 (a one-thread kernel that returns at once /
// after 10 us), smemN (empty_with_smem_kernel holding N KiB), eT_N (the same with T threads),
// event (one more event record) or plan_event (the plan, then an event record).
class StepPrelude {
 public:
  StepPrelude() {
    const char* env = std::getenv("HMLA_BENCH_STEP_BEFORE");
    mode_ = env ? env : "plan";
    HB_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    if (mode_.rfind("smem", 0) == 0) smem_bytes_ = std::atoi(mode_.c_str() + 4) * 1024;
    if (mode_.size() > 1 && mode_[0] == 'e' && mode_[1] >= '0' && mode_[1] <= '9') {
      threads_ = std::atoi(mode_.c_str() + 1);
      smem_bytes_ = std::atoi(mode_.c_str() + mode_.find('_') + 1) * 1024;
    }
    if (smem_bytes_ >= 0)
      HB_CUDA(cudaFuncSetAttribute(empty_with_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  }
  ~StepPrelude() { cudaEventDestroy(event_); }
  StepPrelude(const StepPrelude&) = delete;
  StepPrelude& operator=(const StepPrelude&) = delete;

  template <typename Plan>
  void enqueue(Plan&& plan, cudaStream_t stream) {
    if (mode_ == "spin0") gpu_spin(0.001, stream);
    else if (mode_ == "spin10") gpu_spin(10.0, stream);
    else if (mode_ == "event") HB_CUDA(cudaEventRecord(event_, stream));
    else if (smem_bytes_ >= 0) empty_with_smem_kernel<<<1, threads_, smem_bytes_, stream>>>();
    else {
      plan();
      if (mode_ == "plan_event") HB_CUDA(cudaEventRecord(event_, stream));
    }
  }

 private:
  std::string mode_;
  int smem_bytes_ = -1, threads_ = 32;
  cudaEvent_t event_{};
};
}  // namespace

// The plan alone (its GPU time), into set 0's workspace: it writes the same schedule again; then the
// same after a write of kL2SweepBytes before each call (outside its events), which leaves nothing of
// the plan's data in the L2, as the layer kernels before it do in an engine. Then what the plan adds
// to a decoding step: calls alternating between set 0's attention alone and the plan followed by
// that attention, in one timed loop (the card's drift lands in both), and the difference of their
// medians. The events' own cost (~1.3 us on an H100) is in plan_us, not in step_us.
void SparseBench::time_extras(const TimingConfig& cfg, cudaStream_t stream) {
  auto plan = [&] {
    sched_[0] = hmla::sparse_decode_plan(params_[0], ws_bytes_ ? ws_.at(0) : nullptr, ws_bytes_, stream);
  };
  plan_time_ = summarize(time_calls(cfg, stream, [&](int) { plan(); }));
  {
    constexpr size_t kL2SweepBytes = size_t(256) << 20;
    DeviceBuffer sweep(kL2SweepBytes);
    plan_cold_time_ = summarize(time_calls_after(
        cfg, stream, [&](int i) { HB_CUDA(cudaMemsetAsync(sweep.get(), i & 0xff, kL2SweepBytes, stream)); },
        [&](int) { plan(); }));
  }

  TimingConfig paired = cfg;
  paired.iters = 2 * cfg.iters;
  std::vector<char> with_plan;  // per call number, warm-up calls included
  StepPrelude prelude;
  const std::vector<double> us = time_calls(paired, stream, [&](int i) {
    with_plan.push_back(static_cast<char>(i % 2));
    if (i % 2) prelude.enqueue(plan, stream);
    run(0, stream);
  });
  std::vector<double> alone, planned;
  const size_t first_timed = with_plan.size() - us.size();
  for (size_t k = 0; k < us.size(); ++k) (with_plan[first_timed + k] ? planned : alone).push_back(us[k]);
  step_alone_ = summarize(alone);
  step_planned_ = summarize(planned);
}

void SparseBench::check(const RowOptions& opt, cudaStream_t stream, CheckOutcome& res) {
  const SparseCase& c = c_;
  const size_t out_elems = (size_t)c.b * c.s_q * c.h_q * kDv;
  const size_t lse_elems = (size_t)c.b * c.h_q * c.s_q;

  poison_outputs(out_.at(0), out_elems * kElem, lse_.at<float>(0), lse_elems * 4, stream);
  run(0, stream);
  HB_CUDA(cudaStreamSynchronize(stream));
  HB_CUDA(cudaGetLastError());
  res.nonfinite_out = count_nonfinite_half(out_.at(0), out_elems, hmla::DType::kBF16, stream);

  // the index lists and lengths exactly as the device holds them
  struct HostLists {
    std::vector<int32_t> indices, lengths;
  };
  HostLists lists[2];
  const Scope* scopes[2] = {&main_, &extra_};
  for (int k = 0; k < 2; ++k) {
    const Scope& sc = *scopes[k];
    if (!sc.present) continue;
    lists[k].indices.resize((size_t)c.b * c.s_q * sc.topk);
    lists[k].lengths.resize(c.b);
    copy_sync(lists[k].indices.data(), sc.indices_dev.at(0), lists[k].indices.size() * 4, cudaMemcpyDeviceToHost,
              stream);
    copy_sync(lists[k].lengths.data(), sc.lengths_dev.at(0), (size_t)c.b * 4, cudaMemcpyDeviceToHost, stream);
  }
  std::vector<float> lse_h(lse_elems);
  copy_sync(lse_h.data(), lse_.at(0), lse_elems * 4, cudaMemcpyDeviceToHost, stream);

  // lse over the whole batch: never NaN; +inf exactly where a query has no valid key
  for (int r = 0; r < c.b; ++r)
    for (int i = 0; i < c.s_q; ++i) {
      long long keys = 0;
      for (int k = 0; k < 2; ++k) {
        const Scope& sc = *scopes[k];
        if (!sc.present) continue;
        const int32_t* list = lists[k].indices.data() + ((size_t)r * c.s_q + i) * sc.topk;
        const int counted = c.topk_length != TopkLength::kNone ? lists[k].lengths[r] : sc.topk;
        const long long tokens = (long long)sc.num_blocks * sc.page;
        for (int e = 0; e < counted; ++e) keys += (list[e] >= 0 && list[e] < tokens) ? 1 : 0;
      }
      for (int h = 0; h < c.h_q; ++h) {
        float v = lse_h[((size_t)r * c.h_q + h) * c.s_q + i];
        bool is_pos_inf = std::isinf(v) && v > 0;
        if (std::isnan(v) || (keys == 0) != is_pos_inf) ++res.bad_lse;
      }
    }

  // compact host problem of the checked requests over the host images of the caches
  std::vector<int> ids = pick_check_requests(c.b, opt.check_requests, [&](int r) {
    double keys = main_.lengths[r] + (extra_.present ? extra_.lengths[r] : 0);
    return (double)c.s_q * c.h_q * keys * (d_qk_ + kDv);
  });
  res.request_ids = ids;
  const int n = (int)ids.size();
  const size_t q_row = (size_t)c.s_q * c.h_q * d_qk_;
  const size_t out_row = (size_t)c.s_q * c.h_q * kDv;
  const size_t lse_row = (size_t)c.h_q * c.s_q;
  std::vector<uint16_t> q_h(q_row * n), out_dev_h(out_row * n), out_ref_h(out_row * n);
  std::vector<float> out_ref_f32(out_row * n), lse_ref_h(lse_row * n), lse_dev_h(lse_row * n);
  for (int j = 0; j < n; ++j) {
    const int r = ids[j];
    copy_sync(q_h.data() + j * q_row, q_.at<uint16_t>(0) + (size_t)r * q_row, q_row * kElem, cudaMemcpyDeviceToHost,
              stream);
    copy_sync(out_dev_h.data() + j * out_row, out_.at<uint16_t>(0) + (size_t)r * out_row, out_row * kElem,
              cudaMemcpyDeviceToHost, stream);
    std::copy(lse_h.begin() + (size_t)r * lse_row, lse_h.begin() + (size_t)(r + 1) * lse_row,
              lse_dev_h.begin() + (size_t)j * lse_row);
  }

  // the reference, one request per thread (each a batch-1 problem; the lists stay where they are)
  parallel_for(n, [&](int j) {
    const int r = ids[j];
    hmla::SparseDecodeParams hp = params_[0];
    hp.batch = 1;
    hp.q = q_h.data() + j * q_row;
    hp.cache.data = main_.image->bytes.data();
    hp.indices = lists[0].indices.data() + (size_t)r * c.s_q * c.topk;
    hp.topk_length = hp.topk_length ? lists[0].lengths.data() + r : nullptr;
    if (extra_.present) {
      hp.extra_cache.data = extra_.image->bytes.data();
      hp.extra_indices = lists[1].indices.data() + (size_t)r * c.s_q * c.extra_topk;
      hp.extra_topk_length = hp.extra_topk_length ? lists[1].lengths.data() + r : nullptr;
    }
    hp.attn_sink = c.sink ? sink_.data() : nullptr;
    hp.out = out_ref_h.data() + j * out_row;
    hp.lse = lse_ref_h.data() + j * lse_row;
    hmla::reference::sparse_decode(hp, out_ref_f32.data() + j * out_row);
  });

  compare_outputs(out_dev_h.data(), hmla::DType::kBF16, out_ref_f32.data(), out_row * n, lse_dev_h.data(),
                  lse_ref_h.data(), lse_row * n, res);
}

void SparseBench::release() {
  for (Scope* sc : {&main_, &extra_}) {
    sc->image.reset();
    sc->indices.clear();
    sc->cache_dev.buf.release();
    sc->indices_dev.buf.release();
    sc->lengths_dev.buf.release();
  }
  for (Slab* s : {&q_, &out_, &lse_, &ws_}) s->buf.release();
  sink_dev_.release();
  params_.clear();
  sched_.clear();
}

std::string SparseBench::shape_header() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%-10s %5s %3s %3s %6s %4s %5s %5s %4s %6s %6s %4s %4s", "layout", "b", "s_q", "h_q",
                "s_k", "page", "topk", "x_top", "x_pg", "x_s_k", "len", "sink", "sets");
  return buf;
}

std::string SparseBench::shape_cells() const {
  char buf[160];
  const bool x = c_.extra_topk > 0;
  std::snprintf(buf, sizeof(buf), "%-10s %5d %3d %3d %6d %4d %5d %5d %4d %6d %6s %4d %4d", sparse_layout_name(c_.layout),
                c_.b, c_.s_q, c_.h_q, c_.s_k, c_.page, c_.topk, c_.extra_topk, x ? c_.extra_page : 0,
                x ? c_.extra_s_k : 0, topk_length_name(c_.topk_length), (int)c_.sink, sets_);
  return buf;
}

std::string SparseBench::extra_header() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), " | %7s %7s %7s", "plan_us", "cold_us", "step_us");
  return buf;
}

std::string SparseBench::extra_cells() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), " | %7.2f %7.2f %7.2f", plan_time_.median, plan_cold_time_.median, plan_step_us());
  return buf;
}

void SparseBench::json_shape(Json& row) const {
  const SparseCase& c = c_;
  const bool x = c.extra_topk > 0;
  row["kind"] = "sparse_decode";
  row["layout"] = sparse_layout_name(c.layout);
  row["dtype"] = "bf16";
  row["b"] = c.b;
  row["s_q"] = c.s_q;
  row["h_q"] = c.h_q;
  row["h_kv"] = 1;
  row["s_k"] = c.s_k;
  row["topk"] = c.topk;
  row["extra_topk"] = c.extra_topk;
  row["extra_s_k"] = x ? c.extra_s_k : 0;
  row["extra_page"] = x ? c.extra_page : 0;
  row["d_qk"] = d_qk_;
  row["d_v"] = kDv;
  row["causal"] = false;
  row["varlen"] = false;
  row["page"] = c.page;
  row["attn_sink"] = c.sink;
  row["topk_length"] = topk_length_name(c.topk_length);
  double main_mean = 0, extra_mean = 0;
  for (int32_t l : main_.lengths) main_mean += l;
  for (int32_t l : extra_.lengths) extra_mean += l;
  row["topk_length_mean"] = main_mean / c.b;
  row["extra_topk_length_mean"] = extra_mean / c.b;
  row["attended"] = attended_;
  row["unique_tokens_read"] = unique_tokens_;
  row["softmax_scale"] = (double)softmax_scale_;
  row["cache_copies"] = cache_copies_;
}

void SparseBench::json_schedule(Json& row) const {
  row["num_sm_parts"] = num_sm_parts_;
  row["num_m_blocks"] = num_m_blocks_;
}

void SparseBench::json_extras(Json& row) const {
  row["plan_time_us"] = plan_time_.median;
  row["plan_time_us_min"] = plan_time_.min;
  row["plan_time_us_p90"] = plan_time_.p90;
  row["plan_iters"] = plan_time_.count;
  row["plan_cold_us"] = plan_cold_time_.median;
  row["plan_step_us"] = plan_step_us();
  row["step_attention_us"] = step_alone_.median;
  row["step_planned_us"] = step_planned_.median;
}

}  // namespace hmla_bench
