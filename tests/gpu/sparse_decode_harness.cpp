// Implementation of the sparse decode test harness (host code only).
#include "sparse_decode_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "hmla/reference.h"

namespace hmla_test {

namespace {

// Reference cost model, in multiply-adds: per valid key of a query, one score (d_qk) and one PV
// row (512) per head, plus dequantising the key once per reference call (unpack_token, about 2000).
constexpr double kKeyLoadMacs = 2000;
constexpr int kFullChunkHeads = 16;          // heads per reference call when every row is compared
constexpr int kSampleChunkHeads = 4;         // heads per reference call when rows are sampled
constexpr int64_t kPageStridePadding = 512;  // strided cases: bytes between pages (keeps alignment)
constexpr int kIndexTokenPadding = 5;        // strided cases: index entries between query tokens
constexpr int kIndexBatchPadding = 7;        // and between requests

bool is_v32(hmla::SparseCacheLayout l) { return l == hmla::SparseCacheLayout::kV32; }
const char* cache_layout_name(hmla::SparseCacheLayout l) { return is_v32(l) ? "V32" : "MODEL1"; }

double invalid_probability(InvalidMode m) {
  switch (m) {
    case InvalidMode::kNone:
      return 0.0;
    case InvalidMode::kSome:
    case InvalidMode::kRowsAllInvalid:
      return 0.05;
    case InvalidMode::kThirtyPercent:
      return 0.3;
    case InvalidMode::kAll:
      return 1.0;
  }
  return 0.0;
}

bool query_all_invalid(const SparseCase& c, int b, int s) {
  if (c.invalid == InvalidMode::kAll) return true;
  return c.invalid == InvalidMode::kRowsAllInvalid && (b * c.s_q + s) % 3 == 1;
}

// An index no kernel may read for a cache of `own_slots` slots, of a kind chosen by `r`; with an
// extra cache, `other_slots` is the other cache's size, so that a kernel checking the wrong bound
// reads a slot.
int32_t invalid_index(uint64_t r, int64_t own_slots, int64_t other_slots) {
  const uint64_t more = splitmix64(r);
  switch (r % 7) {
    case 0:
      return -1;
    case 1:
      return INT32_MIN;
    case 2:
      return -static_cast<int32_t>(1 + more % 0x7ffffffeu);  // [-2^31 + 2, -1]
    case 3:
      return static_cast<int32_t>(own_slots);  // one past the end
    case 4:
      return INT32_MAX;
    case 5:  // far out of range
      return static_cast<int32_t>(own_slots + 1 + more % (uint64_t(INT32_MAX) - own_slots));
    default:
      if (other_slots > own_slots) {
        return static_cast<int32_t>(own_slots + more % uint64_t(other_slots - own_slots));
      }
      return -2;
  }
}

uint64_t case_seed(const SparseCase& c, const char* what) {
  return hash_string(c.name + "/" + what);
}

}  // namespace

std::string describe_case(const SparseCase& c) {
  std::string s =
      fmt("%s [%s b=%d s_q=%d h_q=%d topk=%d page=%d len=%s sink=%s invalid=%s dup=%d "
          "strided=%d scale=%g |q|~%g |kv|~%g num_sms=%d slack=%zu",
          c.name.c_str(), cache_layout_name(c.layout), c.batch, c.s_q, c.h_q, c.topk, c.page_size,
          length_mode_name(c.topk_length), sink_mode_name(c.sink), invalid_mode_name(c.invalid),
          c.duplicates ? 1 : 0, c.strided ? 1 : 0, c.softmax_scale, c.q_amplitude, c.kv_amplitude, c.num_sms,
          c.workspace_slack);
  if (c.extra) {
    s += fmt(" extra: page=%d topk=%d len=%s", c.extra_page_size, c.extra_topk,
             length_mode_name(c.extra_topk_length));
  }
  return s + "]";
}

// ------------------------------------------------------------------------------ caches and lists
struct SparseProblem::Cache {
  int num_blocks = 0, page_size = 0;
  int64_t page_bytes = 0, block_stride = 0;
  std::vector<uint8_t> host;
  DeviceBuffer dev;
  std::vector<int32_t> attendable;      // slots a valid index may name
  std::vector<int32_t> never_attended;  // slots no counted index names: NaN for good
  std::vector<uint8_t> attended;        // per slot: a counted valid entry names it
  std::vector<uint8_t> planted;         // per slot: holds a planted NaN
  float max_abs_v = 0.f;                // over the dequantised V columns of attended slots
  double max_key_norm = 0.0;            // L2 over d_qk, max over attended slots
  int64_t num_slots() const { return static_cast<int64_t>(num_blocks) * page_size; }
};

struct SparseProblem::IndexList {
  int topk = 0;
  int64_t token_stride = 0, batch_stride = 0;
  std::vector<int32_t> host;     // the whole allocation, batch * batch_stride
  std::vector<int32_t> lengths;  // [batch]; empty: no length array
  DeviceBuffer dev, dev_lengths;
  int length_of(int b) const { return lengths.empty() ? topk : lengths[b]; }
  const int32_t* row(int b, int s) const {
    return &host[static_cast<size_t>(b * batch_stride + s * token_stride)];
  }
};

SparseProblem::SparseProblem(SparseCase c) : c_(std::move(c)) {
  if (c_.batch < 1 || c_.s_q < 1 || c_.h_q < 1 || c_.topk < 1 || (c_.extra && c_.extra_topk < 1)) {
    throw std::runtime_error(c_.name + ": batch, s_q, h_q, topk and extra_topk must be >= 1");
  }
  d_qk_ = hmla::reference::sparse_cache_d_qk(c_.layout);
  const uint64_t seed = hash_string(c_.name);

  // Shapes of the caches: enough attendable slots for distinct draws, one spare page at the end.
  auto shape = [&](int page_size, int num_blocks, int topk, uint64_t slot_seed) {
    auto k = std::make_unique<Cache>();
    k->page_size = page_size;
    if (num_blocks > 0) {
      k->num_blocks = num_blocks;
    } else {
      const int64_t attendable = std::max<int64_t>(64, int64_t(topk) * 3 / 2 + 16);
      const int64_t slots = attendable * 8 / 7 + 1;
      k->num_blocks = static_cast<int>((slots + page_size - 1) / page_size + 1);
    }
    if (k->num_blocks < 2) throw std::runtime_error(c_.name + ": a cache needs >= 2 pages");
    k->page_bytes = hmla::reference::sparse_page_bytes(c_.layout, page_size);
    k->block_stride = k->page_bytes + (c_.strided ? kPageStridePadding : 0);
    // One slot in eight (hashed) and the last page are never attended: the entries past a length
    // and the index padding name them, so reading one shows up as NaN.
    const int64_t last_page_start = k->num_slots() - page_size;
    for (int64_t s = 0; s < k->num_slots(); ++s) {
      const bool never = s >= last_page_start || mix_seed(slot_seed, s) % 8 == 0;
      (never ? k->never_attended : k->attendable).push_back(static_cast<int32_t>(s));
    }
    if (k->attendable.empty()) k->attendable.push_back(0);  // tiny explicit caches
    return k;
  };
  main_ = shape(c_.page_size, c_.num_blocks, c_.topk, case_seed(c_, "main-slots"));
  if (c_.extra) {
    extra_ =
        shape(c_.extra_page_size, c_.extra_num_blocks, c_.extra_topk, case_seed(c_, "extra-slots"));
  }

  build_lists();
  build_caches();
  build_sink();

  q_layout_ = make_layout4(c_.strided ? Layout::kPadded : Layout::kDense, c_.batch, c_.s_q, c_.h_q,
                           d_qk_, mix_seed(seed, 11));
  out_layout_ = make_layout4(c_.strided ? Layout::kPadded : Layout::kDense, c_.batch, c_.s_q,
                             c_.h_q, kDv, mix_seed(seed, 12));
  lse_layout_ = make_layout_lse(c_.strided, c_.batch, c_.h_q, c_.s_q);
  fill_half_rows(q_layout_, hmla::DType::kBF16, c_.q_amplitude, mix_seed(seed, 21), &q_host_, &q_row_norm_);
  dev_q_.allocate(q_host_.size() * sizeof(uint16_t));
  dev_q_.upload(q_host_.data(), q_host_.size() * sizeof(uint16_t));
  poison_image_ = make_poison_images(out_layout_, lse_layout_, out_poison_bits(hmla::DType::kBF16));
  dev_out_.allocate(poison_image_.out.size() * sizeof(uint16_t));
  dev_lse_.allocate(poison_image_.lse.size() * sizeof(float));
  nan_query_.assign(static_cast<size_t>(c_.batch) * c_.s_q, 0);
}

SparseProblem::~SparseProblem() = default;

void SparseProblem::build_lists() {
  const int b_count = c_.batch, s_q = c_.s_q;
  n_keys_.assign(static_cast<size_t>(b_count) * s_q, 0);

  auto make = [&](Cache& cache, int topk, LengthMode mode, int64_t other_slots, const char* tag) {
    auto list = std::make_unique<IndexList>();
    list->topk = topk;
    list->token_stride = topk + (c_.strided ? kIndexTokenPadding : 0);
    list->batch_stride = s_q * list->token_stride + (c_.strided ? kIndexBatchPadding : 0);
    const uint64_t seed = case_seed(c_, tag);
    if (mode != LengthMode::kOff) {
      Rng rng(mix_seed(seed, 1));
      list->lengths.resize(b_count);
      for (int b = 0; b < b_count; ++b) {
        int v = topk;
        switch (mode) {
          case LengthMode::kMixed: {
            const int random = b_count == 1 ? rng.uniform_int(1, topk) : rng.uniform_int(0, topk);
            const int pattern[4] = {random, 0, topk, 1};
            v = pattern[b % 4];
            break;
          }
          case LengthMode::kZero:
            v = 0;
            break;
          default:
            break;
        }
        list->lengths[b] = v;
      }
    }
    const int64_t own_slots = cache.num_slots();
    // Everything outside the counted entries (the entries past a length and the padding) names a
    // never-attended slot or is invalid.
    auto filler = [&](uint64_t h) {
      if (h % 2 == 0) return cache.never_attended[(h >> 1) % cache.never_attended.size()];
      return invalid_index(h >> 1, own_slots, other_slots);
    };
    list->host.resize(static_cast<size_t>(b_count) * list->batch_stride);
    const uint64_t filler_seed = mix_seed(seed, 2);
    parallel_for(static_cast<int64_t>(list->host.size() + 4095) / 4096, [&](int64_t chunk) {
      const size_t end = std::min(list->host.size(), static_cast<size_t>(chunk + 1) * 4096);
      for (size_t k = static_cast<size_t>(chunk) * 4096; k < end; ++k)
        list->host[k] = filler(mix_seed(filler_seed, k));
    });
    const double p_invalid = invalid_probability(c_.invalid);
    parallel_for(static_cast<int64_t>(b_count) * s_q, [&](int64_t q) {
      const int b = static_cast<int>(q / s_q), s = static_cast<int>(q % s_q);
      Rng rng(mix_seed(seed, 1000 + q));
      int32_t* row =
          &list->host[static_cast<size_t>(b * list->batch_stride + s * list->token_stride)];
      const int length = list->length_of(b);
      const bool all_invalid = query_all_invalid(c_, b, s);
      // distinct draws: a partial Fisher-Yates shuffle of the attendable slots (repeats only once
      // the list is longer than the cache)
      std::vector<int32_t> pool = cache.attendable;
      size_t drawn = 0;
      std::vector<int32_t> valid_so_far;
      for (int j = 0; j < length; ++j) {
        int32_t v;
        if (all_invalid || rng.uniform() < p_invalid) {
          v = invalid_index(rng.next(), own_slots, other_slots);
        } else if (c_.duplicates && !valid_so_far.empty() && rng.uniform() < 0.1) {
          v = valid_so_far[rng.next() % valid_so_far.size()];
        } else {
          if (drawn == pool.size()) drawn = 0;
          const size_t pick = drawn + rng.next() % (pool.size() - drawn);
          std::swap(pool[drawn], pool[pick]);
          v = pool[drawn++];
        }
        if (v >= 0 && v < own_slots) valid_so_far.push_back(v);
        row[j] = v;
      }
    });
    // Attended slots and key counts.
    cache.attended.assign(own_slots, 0);
    for (int b = 0; b < b_count; ++b) {
      for (int s = 0; s < s_q; ++s) {
        const int32_t* row = list->row(b, s);
        for (int j = 0; j < list->length_of(b); ++j) {
          if (row[j] >= 0 && row[j] < own_slots) {
            cache.attended[row[j]] = 1;
            ++n_keys_[static_cast<size_t>(b) * s_q + s];
          }
        }
      }
    }
    list->dev.allocate(list->host.size() * sizeof(int32_t));
    list->dev.upload(list->host.data(), list->host.size() * sizeof(int32_t));
    if (!list->lengths.empty()) {
      list->dev_lengths.allocate(list->lengths.size() * sizeof(int32_t));
      list->dev_lengths.upload(list->lengths.data(), list->lengths.size() * sizeof(int32_t));
    }
    return list;
  };
  const int64_t extra_slots = extra_ ? extra_->num_slots() : 0;
  main_list_ = make(*main_, c_.topk, c_.topk_length, extra_slots, "main-indices");
  if (extra_) {
    extra_list_ =
        make(*extra_, c_.extra_topk, c_.extra_topk_length, main_->num_slots(), "extra-indices");
  }
}

void SparseProblem::build_caches() {
  const bool v32 = is_v32(c_.layout);
  const int d_nope = hmla::reference::sparse_cache_d_nope(c_.layout);
  const int tile = v32 ? 128 : 64;
  // Tiles of different magnitudes, so that every scale of a token differs.
  static const float kTileFactor[7] = {1.f, 0.25f, 4.f, 0.5f, 2.f, 1.f, 0.125f};
  auto fill = [&](Cache& k, uint64_t seed) {
    k.host.assign(static_cast<size_t>(k.num_blocks) * k.block_stride, 0xff);  // NaN in every field
    k.planted.assign(k.num_slots(), 0);
    std::vector<int32_t> slots;
    for (int64_t s = 0; s < k.num_slots(); ++s)
      if (k.attended[s]) slots.push_back(static_cast<int32_t>(s));
    std::vector<float> slot_max(slots.size(), 0.f);
    std::vector<double> slot_norm(slots.size(), 0.0);
    const uint64_t value_seed = mix_seed(seed, 2);
    parallel_for(static_cast<int64_t>(slots.size()), [&](int64_t i) {
      const int64_t slot = slots[i];
      const float token_factor =
          0.5f + 2.f * static_cast<float>(splitmix64(mix_seed(seed, slot)) >> 40) / 16777216.f;
      std::vector<uint16_t> token(d_qk_);
      for (int d = 0; d < d_qk_; ++d) {
        const float f = d < d_nope ? kTileFactor[(d / tile) % 7] : 1.f;
        token[d] =
            float_to_bf16_bits(c_.kv_amplitude * token_factor * f *
                               normalish(value_seed, static_cast<uint64_t>(slot) * d_qk_ + d));
      }
      uint8_t* page = &k.host[static_cast<size_t>(slot / k.page_size) * k.block_stride];
      const int offset = static_cast<int>(slot % k.page_size);
      hmla::reference::pack_token(c_.layout, token.data(), page, k.page_size, offset);
      std::vector<float> back(d_qk_);
      hmla::reference::unpack_token(c_.layout, page, k.page_size, offset, back.data());
      double norm2 = 0;
      float max_v = 0.f;
      for (int d = 0; d < d_qk_; ++d) {
        norm2 += double(back[d]) * back[d];
        if (d < kDv) max_v = std::max(max_v, std::fabs(back[d]));
      }
      slot_max[i] = max_v;
      slot_norm[i] = std::sqrt(norm2);
    });
    for (size_t i = 0; i < slots.size(); ++i) {
      k.max_abs_v = std::max(k.max_abs_v, slot_max[i]);
      k.max_key_norm = std::max(k.max_key_norm, slot_norm[i]);
    }
    k.dev.allocate(k.host.size());
    k.dev.upload(k.host.data(), k.host.size());
  };
  fill(*main_, case_seed(c_, "main-values"));
  if (extra_) fill(*extra_, case_seed(c_, "extra-values"));
}

void SparseProblem::build_sink() {
  sink_.clear();
  if (c_.sink == SinkMode::kNone) return;
  Rng rng(case_seed(c_, "sink"));
  const double typical_lse =
      std::log(std::max(1.0, 0.5 * (c_.topk + (c_.extra ? c_.extra_topk : 0))));
  const float inf = std::numeric_limits<float>::infinity();
  sink_.resize(c_.h_q);
  for (int h = 0; h < c_.h_q; ++h) {
    const float finite = static_cast<float>(typical_lse + 6.0 * rng.uniform() - 3.0);
    switch (c_.sink) {
      case SinkMode::kFinite:
        sink_[h] = finite;
        break;
      case SinkMode::kNegInf:
        sink_[h] = -inf;
        break;
      case SinkMode::kPosInf:
        sink_[h] = inf;
        break;
      default: {
        const float pattern[4] = {finite, -inf, inf, 1e30f};
        sink_[h] = pattern[h % 4];
        break;
      }
    }
  }
  dev_sink_.allocate(sink_.size() * sizeof(float));
  dev_sink_.upload(sink_.data(), sink_.size() * sizeof(float));
}

// ------------------------------------------------------------------------------ params
hmla::SparseDecodeParams SparseProblem::device_params() const {
  hmla::SparseDecodeParams p = host_params();
  p.q = dev_q_.as<uint16_t>() + q_layout_.guard;
  p.cache.data = main_->dev.as<uint8_t>();
  p.indices = main_list_->dev.as<int32_t>();
  p.topk_length = main_list_->lengths.empty() ? nullptr : main_list_->dev_lengths.as<int32_t>();
  if (extra_) {
    p.extra_cache.data = extra_->dev.as<uint8_t>();
    p.extra_indices = extra_list_->dev.as<int32_t>();
    p.extra_topk_length =
        extra_list_->lengths.empty() ? nullptr : extra_list_->dev_lengths.as<int32_t>();
  }
  p.attn_sink = sink_.empty() ? nullptr : dev_sink_.as<float>();
  p.out = dev_out_.as<uint16_t>() + out_layout_.guard;
  p.lse = dev_lse_.as<float>() + lse_layout_.guard;
  return p;
}

// The same description over the host copies (out and lse are left null: the reference gets its
// own buffers).
hmla::SparseDecodeParams SparseProblem::host_params() const {
  hmla::SparseDecodeParams p;
  p.layout = c_.layout;
  p.batch = c_.batch;
  p.s_q = c_.s_q;
  p.h_q = c_.h_q;
  p.d_qk = d_qk_;
  p.d_v = kDv;
  p.q = q_host_.data() + q_layout_.guard;
  p.q_batch_stride = q_layout_.strides[0];
  p.q_token_stride = q_layout_.strides[1];
  p.q_head_stride = q_layout_.strides[2];
  p.cache = {main_->host.data(), main_->num_blocks, main_->page_size, main_->block_stride};
  p.indices = main_list_->host.data();
  p.topk = c_.topk;
  p.indices_batch_stride = main_list_->batch_stride;
  p.indices_token_stride = main_list_->token_stride;
  p.topk_length = main_list_->lengths.empty() ? nullptr : main_list_->lengths.data();
  if (extra_) {
    p.extra_cache = {extra_->host.data(), extra_->num_blocks, extra_->page_size,
                     extra_->block_stride};
    p.extra_indices = extra_list_->host.data();
    p.extra_topk = c_.extra_topk;
    p.extra_indices_batch_stride = extra_list_->batch_stride;
    p.extra_indices_token_stride = extra_list_->token_stride;
    p.extra_topk_length = extra_list_->lengths.empty() ? nullptr : extra_list_->lengths.data();
  }
  p.attn_sink = sink_.empty() ? nullptr : sink_.data();
  p.softmax_scale = c_.softmax_scale;
  p.out = nullptr;
  p.out_batch_stride = out_layout_.strides[0];
  p.out_token_stride = out_layout_.strides[1];
  p.out_head_stride = out_layout_.strides[2];
  p.lse = nullptr;
  p.lse_batch_stride = lse_layout_.strides[0];
  p.lse_head_stride = lse_layout_.strides[1];
  return p;
}

size_t SparseProblem::workspace_bytes() const {
  return hmla::sparse_decode_workspace_bytes(c_.batch, c_.s_q, c_.h_q, c_.num_sms) +
         c_.workspace_slack;
}

void SparseProblem::poison_outputs() {
  dev_out_.upload(poison_image_.out.data(), poison_image_.out.size() * sizeof(uint16_t));
  dev_lse_.upload(poison_image_.lse.data(), poison_image_.lse.size() * sizeof(float));
}

bool SparseProblem::plan_and_run(cudaStream_t stream, const std::function<void(cudaStream_t)>& after_run) {
  return plan_and_run_repeatedly(stream, 1, after_run);
}

bool SparseProblem::plan_and_run_repeatedly(cudaStream_t stream, int calls,
                                            const std::function<void(cudaStream_t)>& after_run) {
  poison_outputs();
  // The poisoned outputs kept on the device, to restore them on the stream before every later call.
  const size_t out_bytes = dev_out_.bytes(), lse_bytes = dev_lse_.bytes();
  DeviceBuffer out_poison, lse_poison;
  if (calls > 1) {
    out_poison.allocate(out_bytes);
    lse_poison.allocate(lse_bytes);
    HMLA_TEST_CUDA_CHECK(cudaMemcpy(out_poison.get(), dev_out_.get(), out_bytes, cudaMemcpyDeviceToDevice));
    HMLA_TEST_CUDA_CHECK(cudaMemcpy(lse_poison.get(), dev_lse_.get(), lse_bytes, cudaMemcpyDeviceToDevice));
  }
  const size_t bytes = workspace_bytes();
  return run_guarded(describe_case(c_), dev_ws_, bytes, stream, [&] {
    const hmla::SparseDecodeParams p = device_params();
    for (int call = 0; call < calls; ++call) {
      if (call > 0) {
        HMLA_TEST_CUDA_CHECK(cudaMemsetAsync(dev_ws_.get(), 0xff, std::max<size_t>(bytes, 1), stream));
        HMLA_TEST_CUDA_CHECK(
            cudaMemcpyAsync(dev_out_.get(), out_poison.get(), out_bytes, cudaMemcpyDeviceToDevice, stream));
        HMLA_TEST_CUDA_CHECK(
            cudaMemcpyAsync(dev_lse_.get(), lse_poison.get(), lse_bytes, cudaMemcpyDeviceToDevice, stream));
      }
      const hmla::DecodeSchedule sched = hmla::sparse_decode_plan(p, dev_ws_.get(), bytes, stream, c_.num_sms);
      hmla::sparse_decode_run(p, sched, stream);
      if (after_run) after_run(stream);
    }
  });
}

Outputs SparseProblem::download() const {
  Outputs o;
  o.out.resize(out_layout_.total);
  o.lse.resize(lse_layout_.total);
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  dev_out_.download(o.out.data(), o.out.size() * sizeof(uint16_t));
  dev_lse_.download(o.lse.data(), o.lse.size() * sizeof(float));
  return o;
}

// ------------------------------------------------------------------------------ planted NaNs
bool SparseProblem::find_exclusive_slot(int b, int s, bool extra, int64_t* slot) const {
  const Cache& k = extra ? *extra_ : *main_;
  const IndexList& list = extra ? *extra_list_ : *main_list_;
  std::vector<int64_t> owner(k.num_slots(), -1);  // -1 nobody, -2 several queries
  for (int bb = 0; bb < c_.batch; ++bb) {
    for (int ss = 0; ss < c_.s_q; ++ss) {
      const int64_t q = static_cast<int64_t>(bb) * c_.s_q + ss;
      const int32_t* row = list.row(bb, ss);
      for (int j = 0; j < list.length_of(bb); ++j) {
        if (row[j] < 0 || row[j] >= k.num_slots()) continue;
        int64_t& o = owner[row[j]];
        o = (o == -1 || o == q) ? q : -2;
      }
    }
  }
  const int64_t q = static_cast<int64_t>(b) * c_.s_q + s;
  const int32_t* row = list.row(b, s);
  for (int j = 0; j < list.length_of(b); ++j) {
    if (row[j] >= 0 && row[j] < k.num_slots() && owner[row[j]] == q) {
      *slot = row[j];
      return true;
    }
  }
  return false;
}

void SparseProblem::plant_nan(bool extra, int64_t slot, NanSpot spot) {
  Cache& k = extra ? *extra_ : *main_;
  if (slot < 0 || slot >= k.num_slots() || !k.attended[slot]) {
    throw std::runtime_error("plant_nan: the slot is not attended");
  }
  uint8_t* page = &k.host[static_cast<size_t>(slot / k.page_size) * k.block_stride];
  const int64_t t = slot % k.page_size;
  const bool v32 = is_v32(c_.layout);
  const int64_t token_data = t * (v32 ? 656 : 576);
  const uint8_t bf16_nan[2] = {0xc0, 0x7f};  // 0x7fc0, little endian
  switch (spot) {
    case NanSpot::kNopeCode:
      page[token_data + 5] = 0x7f;  // e4m3 NaN
      break;
    case NanSpot::kScale:
      if (v32) {
        std::memset(page + token_data + 512 + 4, 0xff, 4);  // scale 1: a float NaN
      } else {
        page[k.page_size * 576 + t * 8 + 2] = 0xff;  // UE8M0 NaN for tile 2
      }
      break;
    case NanSpot::kRope:
      std::memcpy(page + token_data + (v32 ? 528 : 448) + 2 * 3, bf16_nan, 2);
      break;
  }
  k.planted[slot] = 1;
  k.dev.upload(k.host.data(), k.host.size());
  refresh_nan_queries();
  ref_valid_ = false;
}

void SparseProblem::refresh_nan_queries() {
  nan_query_.assign(static_cast<size_t>(c_.batch) * c_.s_q, 0);
  auto scan = [&](const Cache& k, const IndexList& list) {
    for (int b = 0; b < c_.batch; ++b) {
      for (int s = 0; s < c_.s_q; ++s) {
        const int32_t* row = list.row(b, s);
        for (int j = 0; j < list.length_of(b); ++j) {
          if (row[j] >= 0 && row[j] < k.num_slots() && k.planted[row[j]])
            nan_query_[static_cast<size_t>(b) * c_.s_q + s] = 1;
        }
      }
    }
  };
  scan(*main_, *main_list_);
  if (extra_) scan(*extra_, *extra_list_);
}

// ------------------------------------------------------------------------------ reference
double SparseProblem::budget() const {
  const SuiteConfig& cfg = suite_config();
  if (cfg.full || c_.ref_budget < 0) return std::numeric_limits<double>::infinity();
  if (c_.ref_budget > 0) return c_.ref_budget;
  return c_.grid_case ? cfg.grid_ref_budget : cfg.special_ref_budget;
}

void SparseProblem::compute_reference() {
  const auto t0 = Clock::now();
  const int s_q = c_.s_q, h_q = c_.h_q;
  const int64_t queries = static_cast<int64_t>(c_.batch) * s_q;
  const double macs_per_key_head = d_qk_ + kDv;
  auto cost = [&](int64_t q, int nh) {
    return static_cast<double>(n_keys_[q]) * (nh * macs_per_key_head + kKeyLoadMacs);
  };
  struct Unit {
    int64_t q;  // b * s_q + s
    int h0, nh;
    double macs;
  };
  std::vector<Unit> units;
  double macs = 0;
  const double limit = budget();
  const int full_chunks = (h_q + kFullChunkHeads - 1) / kFullChunkHeads;
  double total = 0;
  for (int64_t q = 0; q < queries; ++q) {
    total +=
        static_cast<double>(n_keys_[q]) * (h_q * macs_per_key_head + kKeyLoadMacs * full_chunks);
  }
  ref_sampled_ = total > limit;
  if (!ref_sampled_) {
    macs = total;
    for (int64_t q = 0; q < queries; ++q) {
      for (int h0 = 0; h0 < h_q; h0 += kFullChunkHeads) {
        const int nh = std::min(kFullChunkHeads, h_q - h0);
        units.push_back({q, h0, nh, cost(q, nh)});
      }
    }
  } else {
    // A unit is one query (b, s) and a chunk of up to 4 heads. First (while they fit; the first
    // always) the chunk with the last head of the last query, the first chunk of the first query
    // and a middle chunk of the query with the most keys; then seeded random chunks while they fit.
    // Queries without keys cost nothing and so are always all compared.
    const int chunk = std::min(h_q, kSampleChunkHeads);
    const int chunks = (h_q + chunk - 1) / chunk;
    const int64_t busiest = std::max_element(n_keys_.begin(), n_keys_.end()) - n_keys_.begin();
    auto unit_of = [&](int64_t id) {
      const int64_t q = id / chunks;
      const int ci = static_cast<int>(id % chunks);
      const int nh = std::min(chunk, h_q - ci * chunk);
      return Unit{q, ci * chunk, nh, cost(q, nh)};
    };
    const std::vector<int64_t> priority = {queries * chunks - 1, 0, busiest * chunks + chunks / 2};
    Rng rng(hash_string("sample/" + c_.name));
    for (int64_t id : sample_units(
             queries * chunks, [&](int64_t id) { return unit_of(id).macs; }, priority, limit, rng,
             &macs)) {
      units.push_back(unit_of(id));
    }
  }

  ref_slot_.assign(static_cast<size_t>(queries) * h_q, -1);
  int32_t slots = 0;
  for (const Unit& u : units)
    for (int i = 0; i < u.nh; ++i) ref_slot_[static_cast<size_t>(u.q) * h_q + u.h0 + i] = slots++;
  ref_out_.assign(static_cast<size_t>(slots) * kDv, std::numeric_limits<float>::quiet_NaN());
  ref_lse_.assign(slots, std::numeric_limits<float>::quiet_NaN());

  // Each unit is a params struct restricted to its query and heads (batch 1, s_q 1, h_q nh), so the
  // reference computes nothing that is not compared.
  const hmla::SparseDecodeParams hp = host_params();
  std::stable_sort(units.begin(), units.end(),
                   [](const Unit& a, const Unit& x) { return a.macs > x.macs; });
  parallel_for(static_cast<int64_t>(units.size()), [&](int64_t i) {
    const Unit& u = units[i];
    const int b = static_cast<int>(u.q / s_q), s = static_cast<int>(u.q % s_q);
    std::vector<uint16_t> out16(static_cast<size_t>(u.nh) * kDv);
    std::vector<float> out32(out16.size());
    std::vector<float> lse(u.nh);
    hmla::SparseDecodeParams p = hp;
    p.batch = 1;
    p.s_q = 1;
    p.h_q = u.nh;
    p.q = hp.q + b * hp.q_batch_stride + s * hp.q_token_stride + u.h0 * hp.q_head_stride;
    p.indices = hp.indices + b * hp.indices_batch_stride + s * hp.indices_token_stride;
    if (hp.topk_length != nullptr) p.topk_length = hp.topk_length + b;
    if (extra_) {
      p.extra_indices =
          hp.extra_indices + b * hp.extra_indices_batch_stride + s * hp.extra_indices_token_stride;
      if (hp.extra_topk_length != nullptr) p.extra_topk_length = hp.extra_topk_length + b;
    }
    if (hp.attn_sink != nullptr) p.attn_sink = hp.attn_sink + u.h0;
    p.out = out16.data();
    p.out_head_stride = kDv;
    p.out_token_stride = static_cast<int64_t>(u.nh) * kDv;
    p.out_batch_stride = p.out_token_stride;
    p.lse = lse.data();
    p.lse_head_stride = 1;
    p.lse_batch_stride = u.nh;
    hmla::reference::sparse_decode(p, out32.data());
    for (int k = 0; k < u.nh; ++k) {
      const int32_t slot = ref_slot_[static_cast<size_t>(u.q) * h_q + u.h0 + k];
      std::copy_n(&out32[static_cast<size_t>(k) * kDv], kDv,
                  &ref_out_[static_cast<size_t>(slot) * kDv]);
      ref_lse_[slot] = lse[k];
    }
  });
  ref_macs_ = macs;
  ref_seconds_ = seconds_since(t0);
  ref_valid_ = true;
}

// ------------------------------------------------------------------------------ check
bool SparseProblem::check(const Outputs& got, const std::string& what, CheckStats* stats_out) {
  const int s_q = c_.s_q, h_q = c_.h_q;
  const int64_t queries = static_cast<int64_t>(c_.batch) * s_q;
  const hmla::DType dt = hmla::DType::kBF16;
  const Tolerance& tol = kSparseTolerance;
  const uint16_t poison = out_poison_bits(dt);
  const double scale =
      c_.softmax_scale != 0.f ? c_.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d_qk_));
  const float max_v = std::max(main_->max_abs_v, extra_ ? extra_->max_abs_v : 0.f);
  const double max_key = std::max(main_->max_key_norm, extra_ ? extra_->max_key_norm : 0.0);
  const double hull = max_v * (1.0 + 1.0 / 64) + 1e-6;
  const std::string label = describe_case(c_) + " (" + what + ")";

  if (got.out.size() != static_cast<size_t>(out_layout_.total) ||
      got.lse.size() != static_cast<size_t>(lse_layout_.total)) {
    ADD_FAILURE() << label << ": output buffers of the wrong size";
    return false;
  }

  // ---- structural checks on every row
  Findings all;
  std::mutex merge_mutex;
  parallel_for(queries, [&](int64_t q) {
    Findings f;
    const int b = static_cast<int>(q / s_q), s = static_cast<int>(q % s_q);
    const int n = n_keys_[q];
    for (int h = 0; h < h_q; ++h) {
      const std::string pos = fmt("(b=%d,s=%d,h=%d)", b, s, h);
      const uint16_t* row = &got.out[out_layout_.offset(b, s, h)];
      const float l = got.lse[lse_layout_.offset(b, h, s)];
      if (nan_query_[q]) {
        int64_t not_nan = 0;
        for (int d = 0; d < kDv; ++d) not_nan += row[d] == poison || !half_is_nan(dt, row[d]);
        if (not_nan)
          f.add("out not NaN (or never written) for a query that attends a NaN",
                pos + fmt(" %lld of %d", (long long)not_nan, kDv));
        if (float_bits(l) == kLsePoisonBits || !std::isnan(l))
          f.add("lse not NaN (or never written) for a query that attends a NaN",
                pos + fmt(" lse=%g", l));
        continue;
      }
      check_out_row(dt, row, kDv, poison, n, hull, pos, f);
      // every score satisfies |score| <= scale * |q| * max|k|, so lse is within log(n) +- that
      const double max_abs_score =
          scale * q_row_norm_[static_cast<size_t>(q) * h_q + h] * max_key * (1 + 1e-3);
      check_lse_value(l, n, max_abs_score, pos, f);
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    all.merge(f);
  });
  check_padding_unchanged(got, out_layout_, lse_layout_, all);

  // ---- reference comparison, relative L2 per (b, s) group of the compared heads
  if (!ref_valid_) compute_reference();
  struct Acc {
    double worst_group_l2 = 0, worst_elem = 0, worst_lse = 0;
    int64_t rows = 0;
    std::string worst_group_at, worst_elem_at, worst_lse_at;
  };
  Acc acc;
  parallel_for(queries, [&](int64_t q) {
    Acc a;
    Findings f;
    const int b = static_cast<int>(q / s_q), s = static_cast<int>(q % s_q);
    double diff2 = 0, ref2 = 0;
    int compared = 0;
    for (int h = 0; h < h_q; ++h) {
      const int32_t slot = ref_slot_[static_cast<size_t>(q) * h_q + h];
      if (slot < 0) continue;
      ++a.rows;
      const float* ref = &ref_out_[static_cast<size_t>(slot) * kDv];
      const float ref_lse = ref_lse_[slot];
      const uint16_t* row = &got.out[out_layout_.offset(b, s, h)];
      const float l = got.lse[lse_layout_.offset(b, h, s)];
      const std::string pos = fmt("(b=%d,s=%d,h=%d)", b, s, h);
      if (nan_query_[q]) {
        if (!std::isnan(ref_lse))
          f.add("the reference is not NaN for a query the test says attends a NaN", pos);
        continue;  // the GPU side is checked above
      }
      if (n_keys_[q] == 0) {
        if (!(std::isinf(ref_lse) && ref_lse > 0))
          f.add(
              "the reference's lse is not +inf where the test counts no keys (harness/reference "
              "disagree)",
              pos + fmt(" ref lse=%g", ref_lse));
        continue;  // checked exactly above
      }
      const RowComparison rc = compare_out_row(dt, row, ref, kDv, tol);
      diff2 += rc.diff2;
      ref2 += rc.ref2;
      ++compared;
      if (rc.worst_ratio > a.worst_elem) {
        a.worst_elem = rc.worst_ratio;
        a.worst_elem_at = pos + fmt(" d=%d got %.7g ref %.7g", rc.worst_d,
                                    bf16_bits_to_float(row[rc.worst_d]), ref[rc.worst_d]);
      }
      report_out_row(dt, row, ref, kDv, rc, pos, f);
      const double lse_ratio = compare_lse(l, ref_lse, tol.lse_rel, pos, f);
      if (lse_ratio > a.worst_lse) {
        a.worst_lse = lse_ratio;
        a.worst_lse_at = pos + fmt(" got %.8g ref %.8g", l, ref_lse);
      }
    }
    if (compared > 0) {
      const double rel = relative_l2(diff2, ref2);
      a.worst_group_l2 = rel;
      a.worst_group_at = fmt("(b=%d,s=%d) over %d heads", b, s, compared);
      if (!(rel <= tol.out_rel_l2)) {
        f.add(fmt("out relative L2 error above %g in a (b, s) group", tol.out_rel_l2),
              fmt("(b=%d,s=%d): %.4g over %d heads, n_keys=%d", b, s, rel, compared, n_keys_[q]));
      }
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    all.merge(f);
    acc.rows += a.rows;
    if (!a.worst_group_at.empty() &&
        (acc.worst_group_at.empty() || a.worst_group_l2 > acc.worst_group_l2)) {
      acc.worst_group_l2 = a.worst_group_l2;
      acc.worst_group_at = a.worst_group_at;
    }
    if (a.worst_elem > acc.worst_elem) {
      acc.worst_elem = a.worst_elem;
      acc.worst_elem_at = a.worst_elem_at;
    }
    if (a.worst_lse > acc.worst_lse) {
      acc.worst_lse = a.worst_lse;
      acc.worst_lse_at = a.worst_lse_at;
    }
  });

  const bool ok = all.empty();
  if (!ok) {
    ADD_FAILURE() << all.report(
        label + fmt(": FAILED checks (rows compared with the reference: %lld of %lld%s)",
                    (long long)acc.rows, (long long)queries * h_q, ref_sampled_ ? ", sampled" : ""),
        fmt("  worst (b, s) group rel L2 %g %s, worst element ratio %g, worst lse ratio %g",
            acc.worst_group_l2, acc.worst_group_at.c_str(), acc.worst_elem, acc.worst_lse));
  }
  CheckStats st;
  st.rows_total = queries * h_q;
  st.rows_compared = acc.rows;
  st.ref_macs = ref_macs_;
  st.ref_seconds = ref_seconds_;
  st.rel_l2 = acc.worst_group_l2;
  st.worst_elem = acc.worst_elem;
  st.worst_lse = acc.worst_lse;
  st.sampled = ref_sampled_;
  if (suite_config().verbose) {
    std::printf(
        "[hmla] %s: rows %lld/%lld%s, ref %.2f GMAC in %.2fs, worst group rel L2 %.3g (%s), elem "
        "%.3g (%s), lse %.3g (%s)\n",
        label.c_str(), (long long)st.rows_compared, (long long)st.rows_total,
        st.sampled ? " sampled" : "", st.ref_macs * 1e-9, st.ref_seconds, st.rel_l2,
        acc.worst_group_at.c_str(), st.worst_elem, acc.worst_elem_at.c_str(), st.worst_lse,
        acc.worst_lse_at.c_str());
  }
  if (stats_out != nullptr) *stats_out = st;
  ref_seconds_ = 0;  // counted by the first check after the reference was computed
  ref_macs_ = 0;
  return ok;
}

// ------------------------------------------------------------------------------ statistics
namespace {
AccuracySummary g_sparse_summary;
}  // namespace

void record_sparse_stats(const SparseCase& c, const CheckStats& s) {
  g_sparse_summary.record(cache_layout_name(c.layout), c.name, s);
}

void print_sparse_summary() {
  g_sparse_summary.print("sparse decode",
                         [](const std::string&) -> const Tolerance& { return kSparseTolerance; });
}

void run_and_check_sparse_case(const SparseCase& c) {
  SparseProblem p(c);
  Stream stream;
  if (!p.plan_and_run(stream.get())) return;
  CheckStats st;
  p.check(p.download(), "plan+run", &st);
  record_sparse_stats(c, st);
}

}  // namespace hmla_test
