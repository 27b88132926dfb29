// Implementation of the dense decode test harness (host code only).
#include "dense_decode_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>

#include "hmla/reference.h"

namespace hmla_test {

namespace {

// Reference cost model, in multiply-adds: per key and query token, one score (576) and one PV row
// (512) per head, plus converting the key to double once per call and kv head (576 load_half calls,
// measured at about the cost of 2000 multiply-adds).
constexpr double kMacsPerKeyRow = kDqk + kDv;
constexpr double kKeyLoadMacs = 2000;
constexpr double kWholeBatchReferenceMacs = 2e7;  // below this, one reference call for the batch
constexpr int kFullChunkHeads = 16;   // heads per reference call when every row is compared
constexpr int kSampleChunkHeads = 4;  // heads per reference call when rows are sampled

std::string describe_case(const DecodeCase& c) {
  return fmt("%s [%s b=%d s_q=%d h_q=%d h_kv=%d page=%d causal=%d num_sms=%d]", c.name.c_str(),
             hmla::dtype_name(c.dtype), c.batch, c.s_q, c.h_q, c.h_kv, c.page_size,
             c.causal ? 1 : 0, c.num_sms);
}

// Values in block-table slots past a request's pages: none of them may ever be dereferenced.
int32_t bad_block_id(int num_blocks, int64_t k) {
  static const int64_t kBad[] = {int64_t{1} << 30, -7, INT32_MAX, -1,
                                 INT32_MIN,        0,  1 << 20,   -1000000};
  const int64_t v = kBad[k % 8];
  if (v == 0) return num_blocks;  // exactly one past the last page
  return static_cast<int32_t>(v);
}

std::string cache_key_of(const DecodeCase& c, const std::vector<int>& capacity, uint64_t seed) {
  uint64_t h = hash_string("cap");
  for (int v : capacity) h = mix_seed(h, static_cast<uint64_t>(v) + 1);
  return fmt("%s/hkv%d/page%d/padc%d/padbt%d/b%zu/cap%016" PRIx64 "/seed%016" PRIx64,
             hmla::dtype_name(c.dtype), c.h_kv, c.page_size, c.pad_cache ? 1 : 0,
             c.pad_block_table ? 1 : 0, capacity.size(), h, seed);
}

std::shared_ptr<PagedCache> build_cache(const DecodeCase& c, const std::vector<int>& capacity,
                                        uint64_t seed, const std::string& key) {
  auto pc = std::make_shared<PagedCache>();
  PagedCache& k = *pc;
  k.key = key;
  k.dtype = c.dtype;
  k.batch = c.batch;
  k.h_kv = c.h_kv;
  k.page_size = c.page_size;
  k.capacity = capacity;
  k.pages.resize(c.batch);
  int64_t total_pages = 0;
  int max_pages = 0;
  for (int r = 0; r < c.batch; ++r) {
    k.pages[r] = (capacity[r] + c.page_size - 1) / c.page_size;
    total_pages += k.pages[r];
    max_pages = std::max(max_pages, k.pages[r]);
  }
  const int64_t spare = 3 + total_pages / 8;  // unused pages, all NaN
  k.num_blocks = static_cast<int>(total_pages + spare);
  k.max_blocks_per_seq = max_pages + 3;  // every request has >= 3 out-of-range tail entries
  k.bt_stride = k.max_blocks_per_seq + (c.pad_block_table ? 5 : 0);
  k.head_stride = kDqk + (c.pad_cache ? 64 : 0);
  k.token_stride = c.h_kv * k.head_stride + (c.pad_cache ? 8 : 0);
  k.block_stride = c.page_size * k.token_stride + (c.pad_cache ? 128 : 0);

  // Pages: a random permutation of all blocks; the first total_pages go to the requests in order.
  std::vector<int32_t> perm(k.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(mix_seed(seed, 1));
  rng.shuffle(perm);
  k.block_table.assign(static_cast<size_t>(c.batch) * k.bt_stride, 0);
  std::vector<std::pair<int, int>> page_list;  // (request, page index)
  page_list.reserve(total_pages);
  int64_t next = 0;
  for (int r = 0; r < c.batch; ++r) {
    int32_t* row = &k.block_table[static_cast<size_t>(r) * k.bt_stride];
    for (int p = 0; p < k.pages[r]; ++p) {
      row[p] = perm[next++];
      page_list.emplace_back(r, p);
    }
    for (int p = k.pages[r]; p < k.bt_stride; ++p) {
      row[p] = bad_block_id(k.num_blocks, static_cast<int64_t>(r) * 3 + p);
    }
  }

  // Everything NaN, then the real rows. Element (request r, token t, kv head j, column d) gets
  // 0.1 * normalish(seed, global index), independent of the physical layout.
  const uint16_t nan_bits = input_nan_bits(c.dtype);
  k.host.assign(static_cast<size_t>(k.num_blocks) * k.block_stride, nan_bits);
  std::vector<int64_t> token_base(c.batch + 1, 0);
  for (int r = 0; r < c.batch; ++r) token_base[r + 1] = token_base[r] + capacity[r];
  std::vector<float> page_max_abs(page_list.size(), 0.f);
  std::vector<double> page_max_norm(page_list.size(), 0.0);
  const uint64_t value_seed = mix_seed(seed, 2);
  parallel_for(static_cast<int64_t>(page_list.size()), [&](int64_t i) {
    const int r = page_list[i].first;
    const int p = page_list[i].second;
    const int64_t block = k.block_table[static_cast<size_t>(r) * k.bt_stride + p];
    float max_abs = 0.f;
    double max_norm = 0.0;
    for (int slot = 0; slot < c.page_size; ++slot) {
      const int64_t t = static_cast<int64_t>(p) * c.page_size + slot;
      if (t >= capacity[r]) break;
      for (int j = 0; j < c.h_kv; ++j) {
        uint16_t* dst = &k.host[block * k.block_stride + slot * k.token_stride + j * k.head_stride];
        const uint64_t base = static_cast<uint64_t>((token_base[r] + t) * c.h_kv + j) * kDqk;
        double norm2 = 0.0;
        for (int d = 0; d < kDqk; ++d) {
          const uint16_t bits = to_half_bits(c.dtype, 0.1f * normalish(value_seed, base + d));
          dst[d] = bits;
          const float v = half_bits_to_float(c.dtype, bits);
          norm2 += static_cast<double>(v) * v;
          if (d < kDv) max_abs = std::max(max_abs, std::fabs(v));
        }
        max_norm = std::max(max_norm, std::sqrt(norm2));
      }
    }
    page_max_abs[i] = max_abs;
    page_max_norm[i] = max_norm;
  });
  for (size_t i = 0; i < page_list.size(); ++i) {
    k.max_abs_value = std::max(k.max_abs_value, page_max_abs[i]);
    k.max_key_norm = std::max(k.max_key_norm, page_max_norm[i]);
  }

  k.dev.allocate(k.host.size() * sizeof(uint16_t));
  k.dev.upload(k.host.data(), k.host.size() * sizeof(uint16_t));
  k.dev_block_table.allocate(k.block_table.size() * sizeof(int32_t));
  k.dev_block_table.upload(k.block_table.data(), k.block_table.size() * sizeof(int32_t));
  return pc;
}

std::mutex g_cache_mutex;
std::shared_ptr<PagedCache> g_last_cache;  // one cache kept between cases (the grid's order
                                           // puts cases sharing a cache next to each other)

AccuracySummary g_summary;

}  // namespace

std::shared_ptr<const PagedCache> get_paged_cache(const DecodeCase& c) {
  const std::vector<int>& capacity = c.capacity.empty() ? c.lengths : c.capacity;
  const uint64_t seed = c.cache_seed != 0 ? c.cache_seed : hash_string("cache/" + c.name);
  const std::string key = cache_key_of(c, capacity, seed);
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (g_last_cache && g_last_cache->key == key) return g_last_cache;
  g_last_cache.reset();  // free the previous one first (the grid's largest are 2.4 GB)
  g_last_cache = build_cache(c, capacity, seed, key);
  return g_last_cache;
}

void release_cached_caches() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_last_cache.reset();
}

// ------------------------------------------------------------------------------ DecodeProblem
DecodeProblem::DecodeProblem(DecodeCase c) : c_(std::move(c)) {
  if (static_cast<int>(c_.lengths.size()) != c_.batch) {
    throw std::runtime_error(c_.name + ": lengths.size() != batch");
  }
  if (!c_.capacity.empty()) {
    if (static_cast<int>(c_.capacity.size()) != c_.batch) {
      throw std::runtime_error(c_.name + ": capacity.size() != batch");
    }
    for (int r = 0; r < c_.batch; ++r) {
      if (c_.lengths[r] > c_.capacity[r]) throw std::runtime_error(c_.name + ": length > capacity");
    }
  }
  cache_ = get_paged_cache(c_);
  lengths_ = c_.lengths;

  const uint64_t seed = hash_string(c_.name);
  q_layout_ = make_layout4(c_.q_layout, c_.batch, c_.s_q, c_.h_q, kDqk, mix_seed(seed, 11));
  out_layout_ = make_layout4(c_.out_layout, c_.batch, c_.s_q, c_.h_q, kDv, mix_seed(seed, 12));
  lse_layout_ = make_layout_lse(c_.pad_lse, c_.batch, c_.h_q, c_.s_q);

  poison_image_ = make_poison_images(out_layout_, lse_layout_, out_poison_bits(c_.dtype));
  dev_out_.allocate(poison_image_.out.size() * sizeof(uint16_t));
  dev_lse_.allocate(poison_image_.lse.size() * sizeof(float));
  dev_seqlens_.allocate(static_cast<size_t>(c_.batch) * sizeof(int32_t));
  upload_lengths();
  build_q(seed);
  refresh_nan_rows();
}

DecodeProblem::~DecodeProblem() = default;

void DecodeProblem::build_q(uint64_t seed) {
  fill_half_rows(q_layout_, c_.dtype, 0.1f, mix_seed(seed, 21), &q_host_, &q_row_norm_);
  // Keep the device buffer (and so its address) when refilling: captured graphs point at it.
  if (dev_q_.get() == nullptr || dev_q_.bytes() != q_host_.size() * sizeof(uint16_t)) {
    dev_q_.allocate(q_host_.size() * sizeof(uint16_t));
  }
  dev_q_.upload(q_host_.data(), q_host_.size() * sizeof(uint16_t));
}

void DecodeProblem::refill_q(uint64_t seed) {
  build_q(seed);
  q_nans_.clear();
  refresh_nan_rows();
  ref_valid_ = false;
}

void DecodeProblem::upload_lengths() {
  std::vector<int32_t> l(lengths_.begin(), lengths_.end());
  dev_seqlens_.upload(l.data(), l.size() * sizeof(int32_t));
}

void DecodeProblem::set_lengths(const std::vector<int>& lengths) {
  if (static_cast<int>(lengths.size()) != c_.batch) {
    throw std::runtime_error("set_lengths: wrong size");
  }
  for (int r = 0; r < c_.batch; ++r) {
    if (lengths[r] < 0 || lengths[r] > cache_->capacity[r]) {
      throw std::runtime_error("set_lengths: length beyond the request's cache capacity");
    }
  }
  lengths_ = lengths;
  upload_lengths();
  refresh_nan_rows();
  refresh_reference_block_table();
  ref_valid_ = false;
}

// ------------------------------------------------------------------------------ planted NaNs
void DecodeProblem::make_cache_private() {
  if (private_cache_) return;
  auto k = std::make_shared<PagedCache>();
  const PagedCache& from = *cache_;
  k->key = from.key + "/private";
  k->dtype = from.dtype;
  k->batch = from.batch;
  k->h_kv = from.h_kv;
  k->page_size = from.page_size;
  k->num_blocks = from.num_blocks;
  k->max_blocks_per_seq = from.max_blocks_per_seq;
  k->block_stride = from.block_stride;
  k->token_stride = from.token_stride;
  k->head_stride = from.head_stride;
  k->bt_stride = from.bt_stride;
  k->capacity = from.capacity;
  k->pages = from.pages;
  k->host = from.host;
  k->block_table = from.block_table;
  k->max_abs_value = from.max_abs_value;
  k->max_key_norm = from.max_key_norm;
  k->dev.allocate(k->host.size() * sizeof(uint16_t));
  k->dev.upload(k->host.data(), k->host.size() * sizeof(uint16_t));
  k->dev_block_table.allocate(k->block_table.size() * sizeof(int32_t));
  k->dev_block_table.upload(k->block_table.data(), k->block_table.size() * sizeof(int32_t));
  private_cache_ = k;
  cache_ = k;
}

void DecodeProblem::plant_nan_in_q(int b, int t, int h, int d) {
  if (b < 0 || b >= c_.batch || t < 0 || t >= c_.s_q || h < 0 || h >= c_.h_q || d < 0 || d >= kDqk)
    throw std::runtime_error("plant_nan_in_q: position outside q");
  q_host_[q_layout_.offset(b, t, h) + d] = input_nan_bits(c_.dtype);
  dev_q_.upload(q_host_.data(), q_host_.size() * sizeof(uint16_t));
  q_nans_.push_back({b, t, h, d});
  refresh_nan_rows();
  ref_valid_ = false;
}

void DecodeProblem::plant_nan_in_cache(int b, int key, int kv, int d) {
  if (b < 0 || b >= c_.batch || key < 0 || key >= cache_->capacity[b] || kv < 0 || kv >= c_.h_kv || d < 0 ||
      d >= kDqk)
    throw std::runtime_error("plant_nan_in_cache: position outside the request's cache");
  if (d < kDv && key < lengths_[b] && key >= keys_for(lengths_[b], c_.s_q, 0, c_.causal))
    throw std::runtime_error("plant_nan_in_cache: a V column of a key hidden from some causal query");
  make_cache_private();
  PagedCache& k = *private_cache_;
  const int64_t page = k.block_table[static_cast<size_t>(b) * k.bt_stride + key / c_.page_size];
  const int64_t at = page * k.block_stride + (key % c_.page_size) * k.token_stride + kv * k.head_stride + d;
  k.host[at] = input_nan_bits(c_.dtype);
  k.dev.upload(k.host.data(), k.host.size() * sizeof(uint16_t));
  cache_nans_.push_back({b, key, kv, d});
  refresh_nan_rows();
  ref_valid_ = false;
}

void DecodeProblem::refresh_nan_rows() {
  const int group = c_.h_q / c_.h_kv;
  nan_row_.assign(static_cast<size_t>(c_.batch) * c_.s_q * c_.h_q, 0);
  auto mark = [&](int b, int t, int h) { nan_row_[(static_cast<size_t>(b) * c_.s_q + t) * c_.h_q + h] = 1; };
  for (const auto& n : q_nans_) mark(n[0], n[1], n[2]);
  for (const auto& n : cache_nans_) {
    for (int t = 0; t < c_.s_q; ++t) {
      if (n[1] >= keys_for(lengths_[n[0]], c_.s_q, t, c_.causal)) continue;
      for (int g = 0; g < group; ++g) mark(n[0], t, n[2] * group + g);
    }
  }
}

// ------------------------------------------------------------------------------ device-side values
void DecodeProblem::set_device_lengths_unchecked(const std::vector<int32_t>& raw) {
  if (static_cast<int>(raw.size()) != c_.batch) throw std::runtime_error("set_device_lengths_unchecked: wrong size");
  const int64_t max_keys = static_cast<int64_t>(cache_->max_blocks_per_seq) * c_.page_size;
  for (int r = 0; r < c_.batch; ++r) {
    lengths_[r] = static_cast<int>(std::min<int64_t>(std::max<int32_t>(raw[r], 0), max_keys));
    // The slots past a request's data in its last page are NaN; a length past the data would
    // attend them.
    if (lengths_[r] > cache_->capacity[r] && cache_->capacity[r] % c_.page_size != 0)
      throw std::runtime_error("set_device_lengths_unchecked: a length past a capacity that is not whole pages");
  }
  dev_seqlens_.upload(raw.data(), raw.size() * sizeof(int32_t));
  refresh_nan_rows();
  refresh_reference_block_table();
  ref_valid_ = false;
}

void DecodeProblem::set_block_table_entry(int b, int page_index, int32_t value) {
  if (b < 0 || b >= c_.batch || page_index < 0 || page_index >= cache_->max_blocks_per_seq)
    throw std::runtime_error("set_block_table_entry: outside the block table");
  make_cache_private();
  if (device_block_table_.empty()) device_block_table_ = cache_->block_table;
  device_block_table_[static_cast<size_t>(b) * cache_->bt_stride + page_index] = value;
  private_cache_->dev_block_table.upload(device_block_table_.data(), device_block_table_.size() * sizeof(int32_t));
  refresh_reference_block_table();
  ref_valid_ = false;
}

void DecodeProblem::refresh_reference_block_table() {
  const std::vector<int32_t>& device = device_block_table_.empty() ? cache_->block_table : device_block_table_;
  bool needs_zero_page = false;
  for (int b = 0; b < c_.batch && !needs_zero_page; ++b) {
    for (int n = 0; n * c_.page_size < lengths_[b]; ++n) {
      const int32_t id = device[static_cast<size_t>(b) * cache_->bt_stride + n];
      if (id < 0 || id >= cache_->num_blocks) needs_zero_page = true;
    }
  }
  if (!needs_zero_page) {
    ref_block_table_.clear();
    return;
  }
  if (zero_page_ < 0) {
    // A page no request owns (the cache has at least 3): zeros in every row, on the host only,
    // which the reference reads where the kernel gets TMA's zero fill.
    make_cache_private();
    std::vector<uint8_t> owned(cache_->num_blocks, 0);
    for (int b = 0; b < c_.batch; ++b)
      for (int n = 0; n < cache_->pages[b]; ++n) owned[cache_->block_table[static_cast<size_t>(b) * cache_->bt_stride + n]] = 1;
    zero_page_ = static_cast<int>(std::find(owned.begin(), owned.end(), 0) - owned.begin());
    if (zero_page_ >= cache_->num_blocks) throw std::runtime_error("no spare page for the zero page");
    std::fill_n(&private_cache_->host[static_cast<size_t>(zero_page_) * cache_->block_stride], cache_->block_stride,
                uint16_t{0});
  }
  ref_block_table_ = device;
  for (int b = 0; b < c_.batch; ++b) {
    for (int n = 0; n * c_.page_size < lengths_[b]; ++n) {
      int32_t& id = ref_block_table_[static_cast<size_t>(b) * cache_->bt_stride + n];
      if (id < 0 || id >= cache_->num_blocks) id = zero_page_;
    }
  }
}

void DecodeProblem::poison_outputs() {
  dev_out_.upload(poison_image_.out.data(), poison_image_.out.size() * sizeof(uint16_t));
  dev_lse_.upload(poison_image_.lse.data(), poison_image_.lse.size() * sizeof(float));
}

hmla::DenseDecodeParams DecodeProblem::device_params() const {
  hmla::DenseDecodeParams p;
  p.dtype = c_.dtype;
  p.batch = c_.batch;
  p.s_q = c_.s_q;
  p.h_q = c_.h_q;
  p.h_kv = c_.h_kv;
  p.d_qk = kDqk;
  p.d_v = kDv;
  p.q = dev_q_.as<uint16_t>() + q_layout_.guard;
  p.q_batch_stride = q_layout_.strides[0];
  p.q_token_stride = q_layout_.strides[1];
  p.q_head_stride = q_layout_.strides[2];
  p.k_cache = cache_->dev.get();
  p.num_blocks = cache_->num_blocks;
  p.page_size = c_.page_size;
  p.k_block_stride = cache_->block_stride;
  p.k_token_stride = cache_->token_stride;
  p.k_head_stride = cache_->head_stride;
  p.block_table = cache_->dev_block_table.as<int32_t>();
  p.max_blocks_per_seq = cache_->max_blocks_per_seq;
  p.block_table_batch_stride = cache_->bt_stride;
  p.cache_seqlens = dev_seqlens_.as<int32_t>();
  p.softmax_scale = c_.softmax_scale;
  p.causal = c_.causal;
  p.out = dev_out_.as<uint16_t>() + out_layout_.guard;
  p.out_batch_stride = out_layout_.strides[0];
  p.out_token_stride = out_layout_.strides[1];
  p.out_head_stride = out_layout_.strides[2];
  p.lse = dev_lse_.as<float>() + lse_layout_.guard;
  p.lse_batch_stride = lse_layout_.strides[0];
  p.lse_head_stride = lse_layout_.strides[1];
  return p;
}

size_t DecodeProblem::workspace_bytes() const {
  return hmla::dense_decode_workspace_bytes(c_.batch, c_.s_q, c_.h_q, c_.h_kv, c_.num_sms);
}

bool DecodeProblem::plan_and_run(cudaStream_t stream, const std::function<void(cudaStream_t)>& after_run) {
  poison_outputs();
  const size_t bytes = workspace_bytes();
  return run_guarded(describe_case(c_), dev_ws_, bytes, stream, [&] {
    const hmla::DecodeSchedule sched =
        hmla::dense_decode_plan(dev_seqlens_.as<int32_t>(), c_.batch, c_.s_q, c_.h_q, c_.h_kv,
                                dev_ws_.get(), bytes, stream, c_.num_sms);
    hmla::dense_decode_run(device_params(), sched, stream);
    if (after_run) after_run(stream);
  });
}

Outputs DecodeProblem::download() const {
  Outputs o;
  o.out.resize(out_layout_.total);
  o.lse.resize(lse_layout_.total);
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  dev_out_.download(o.out.data(), o.out.size() * sizeof(uint16_t));
  dev_lse_.download(o.lse.data(), o.lse.size() * sizeof(float));
  return o;
}

double DecodeProblem::budget() const {
  const SuiteConfig& cfg = suite_config();
  if (cfg.full || c_.ref_budget < 0) return std::numeric_limits<double>::infinity();
  if (c_.ref_budget > 0) return c_.ref_budget;
  return c_.grid_case ? cfg.grid_ref_budget : cfg.special_ref_budget;
}

void DecodeProblem::compute_reference() {
  const auto t0 = Clock::now();
  const int b = c_.batch, s_q = c_.s_q, h_q = c_.h_q, h_kv = c_.h_kv;
  const int group = h_q / h_kv;

  // Host view of the problem, the same struct the kernel gets.
  hmla::DenseDecodeParams hp = device_params();
  hp.q = q_host_.data() + q_layout_.guard;
  hp.k_cache = cache_->host.data();
  hp.block_table = ref_block_table_.empty() ? cache_->block_table.data() : ref_block_table_.data();
  std::vector<int32_t> lengths32(lengths_.begin(), lengths_.end());
  hp.cache_seqlens = lengths32.data();

  auto request_keys = [&](int r) {
    int64_t n = 0;
    for (int t = 0; t < s_q; ++t) n += keys_for(lengths_[r], s_q, t, c_.causal);
    return n;
  };
  std::vector<int64_t> keys(b);  // sum over the query tokens of the keys each attends to
  for (int r = 0; r < b; ++r) keys[r] = request_keys(r);
  auto unit_cost = [&](int r, int nh) {
    return static_cast<double>(keys[r]) * (nh * kMacsPerKeyRow + kKeyLoadMacs);
  };
  const int full_chunks = (group + kFullChunkHeads - 1) / kFullChunkHeads;
  double total_macs = 0;
  for (int r = 0; r < b; ++r) {
    total_macs +=
        static_cast<double>(keys[r]) * (h_q * kMacsPerKeyRow + kKeyLoadMacs * h_kv * full_chunks);
  }
  const double limit = budget();

  ref_slot_.assign(static_cast<size_t>(b) * h_q, -1);
  struct Unit {
    int r, kvh, h0, nh;
    double macs;
  };
  std::vector<Unit> units;
  double macs = 0;
  bool whole_batch = false;
  ref_sampled_ = false;

  if (total_macs <= limit) {
    macs = total_macs;
    if (total_macs <= kWholeBatchReferenceMacs) {
      whole_batch = true;
    } else {
      for (int r = 0; r < b; ++r) {
        for (int j = 0; j < h_kv; ++j) {
          for (int h0 = 0; h0 < group; h0 += kFullChunkHeads) {
            const int nh = std::min(kFullChunkHeads, group - h0);
            units.push_back({r, j, j * group + h0, nh, unit_cost(r, nh)});
          }
        }
      }
    }
  } else {
    // Deterministic sample within the budget. A unit is one request and a chunk of up to 4
    // consecutive heads of one kv-head group (all s_q tokens). First, in this order and while they
    // fit the budget (the first one always): the chunk holding the last head of the last request,
    // the one with the first head of the first request, a middle chunk of the longest request, the
    // last chunk of group 0 of the middle request, and one chunk of every kv-head group (of a
    // seeded request); then a seeded shuffle of all other chunks, each taken if it still fits.
    ref_sampled_ = true;
    Rng rng(hash_string("sample/" + c_.name));
    const int chunk = std::min(group, kSampleChunkHeads);
    const int chunks = (group + chunk - 1) / chunk;  // per kv head
    const int per_request = h_kv * chunks;
    const int longest =
        static_cast<int>(std::max_element(lengths_.begin(), lengths_.end()) - lengths_.begin());
    // unit id = (r * h_kv + kvh) * chunks + ci
    auto id_of = [&](int r, int kvh, int ci) {
      return (static_cast<int64_t>(r) * h_kv + kvh) * chunks + ci;
    };
    std::vector<int64_t> priority = {id_of(b - 1, h_kv - 1, chunks - 1), id_of(0, 0, 0),
                                     id_of(longest, h_kv / 2, chunks / 2),
                                     id_of(b / 2, 0, chunks - 1)};
    for (int j = 0; j < h_kv; ++j)
      priority.push_back(id_of(rng.uniform_int(0, b - 1), j, rng.uniform_int(0, chunks - 1)));
    const int64_t num_units = static_cast<int64_t>(b) * per_request;
    auto unit_of = [&](int64_t id) {
      const int r = static_cast<int>(id / per_request);
      const int kvh = static_cast<int>((id / chunks) % h_kv);
      const int ci = static_cast<int>(id % chunks);
      const int nh = std::min(chunk, group - ci * chunk);
      return Unit{r, kvh, kvh * group + ci * chunk, nh, unit_cost(r, nh)};
    };
    auto cost_of = [&](int64_t id) { return unit_of(id).macs; };
    for (int64_t id : sample_units(num_units, cost_of, priority, limit, rng, &macs)) {
      units.push_back(unit_of(id));
    }
  }

  // Slots for the compared rows.
  int32_t slots = 0;
  if (whole_batch) {
    for (auto& s : ref_slot_) s = slots++;
  } else {
    for (const Unit& u : units) {
      for (int i = 0; i < u.nh; ++i) ref_slot_[static_cast<size_t>(u.r) * h_q + u.h0 + i] = slots++;
    }
  }
  ref_out_.assign(static_cast<size_t>(slots) * s_q * kDv, std::numeric_limits<float>::quiet_NaN());
  ref_lse_.assign(static_cast<size_t>(slots) * s_q, std::numeric_limits<float>::quiet_NaN());

  if (whole_batch) {
    std::vector<uint16_t> out16(static_cast<size_t>(b) * s_q * h_q * kDv);
    std::vector<float> out32(out16.size());
    std::vector<float> lse(static_cast<size_t>(b) * h_q * s_q);
    hmla::DenseDecodeParams p = hp;
    p.out = out16.data();
    p.out_head_stride = kDv;
    p.out_token_stride = static_cast<int64_t>(h_q) * kDv;
    p.out_batch_stride = static_cast<int64_t>(s_q) * h_q * kDv;
    p.lse = lse.data();
    p.lse_head_stride = s_q;
    p.lse_batch_stride = static_cast<int64_t>(h_q) * s_q;
    hmla::reference::dense_decode(p, out32.data());
    for (int r = 0; r < b; ++r) {
      for (int h = 0; h < h_q; ++h) {
        const int32_t slot = ref_slot_[static_cast<size_t>(r) * h_q + h];
        for (int t = 0; t < s_q; ++t) {
          std::copy_n(&out32[((static_cast<size_t>(r) * s_q + t) * h_q + h) * kDv], kDv,
                      &ref_out_[(static_cast<size_t>(slot) * s_q + t) * kDv]);
          ref_lse_[static_cast<size_t>(slot) * s_q + t] =
              lse[(static_cast<size_t>(r) * h_q + h) * s_q + t];
        }
      }
    }
  } else {
    // Longest units first for balance.
    std::stable_sort(units.begin(), units.end(),
                     [](const Unit& a, const Unit& x) { return a.macs > x.macs; });
    parallel_for(static_cast<int64_t>(units.size()), [&](int64_t i) {
      const Unit& u = units[i];
      std::vector<uint16_t> out16(static_cast<size_t>(s_q) * u.nh * kDv);
      std::vector<float> out32(out16.size());
      std::vector<float> lse(static_cast<size_t>(u.nh) * s_q);
      hmla::DenseDecodeParams p = hp;
      p.batch = 1;
      p.h_q = u.nh;
      p.h_kv = 1;
      p.q = static_cast<const uint16_t*>(hp.q) + u.r * hp.q_batch_stride + u.h0 * hp.q_head_stride;
      p.k_cache = static_cast<const uint16_t*>(hp.k_cache) + u.kvh * hp.k_head_stride;
      p.block_table = hp.block_table + u.r * hp.block_table_batch_stride;
      p.cache_seqlens = hp.cache_seqlens + u.r;
      p.out = out16.data();
      p.out_head_stride = kDv;
      p.out_token_stride = static_cast<int64_t>(u.nh) * kDv;
      p.out_batch_stride = static_cast<int64_t>(s_q) * u.nh * kDv;
      p.lse = lse.data();
      p.lse_head_stride = s_q;
      p.lse_batch_stride = static_cast<int64_t>(u.nh) * s_q;
      hmla::reference::dense_decode(p, out32.data());
      for (int k = 0; k < u.nh; ++k) {
        const int32_t slot = ref_slot_[static_cast<size_t>(u.r) * h_q + u.h0 + k];
        for (int t = 0; t < s_q; ++t) {
          std::copy_n(&out32[(static_cast<size_t>(t) * u.nh + k) * kDv], kDv,
                      &ref_out_[(static_cast<size_t>(slot) * s_q + t) * kDv]);
          ref_lse_[static_cast<size_t>(slot) * s_q + t] = lse[static_cast<size_t>(k) * s_q + t];
        }
      }
    });
  }
  ref_macs_ = macs;
  ref_seconds_ = seconds_since(t0);
  ref_valid_ = true;
}

bool DecodeProblem::check(const Outputs& got, const std::string& what, CheckStats* stats_out) {
  const int b = c_.batch, s_q = c_.s_q, h_q = c_.h_q;
  const hmla::DType dt = c_.dtype;
  const Tolerance& tol = tolerance_for(dt);
  const uint16_t poison = out_poison_bits(dt);
  const double scale = c_.softmax_scale != 0.f ? c_.softmax_scale : 1.0 / std::sqrt(double(kDqk));
  const double hull = cache_->max_abs_value * (1.0 + 1.0 / 64) + 1e-6;
  const std::string label = describe_case(c_) + " (" + what + ")";
  bool ok = true;

  if (got.out.size() != static_cast<size_t>(out_layout_.total) ||
      got.lse.size() != static_cast<size_t>(lse_layout_.total)) {
    ADD_FAILURE() << label << ": output buffers of the wrong size";
    return false;
  }

  // ---- structural checks on every row
  Findings all;
  std::mutex merge_mutex;
  parallel_for(b, [&](int64_t r) {
    Findings f;
    for (int t = 0; t < s_q; ++t) {
      const int n = keys_for(lengths_[r], s_q, t, c_.causal);
      for (int h = 0; h < h_q; ++h) {
        const std::string pos = fmt("(b=%d,t=%d,h=%d)", int(r), t, h);
        if (expects_nan(int(r), t, h)) {
          const uint16_t* row = &got.out[out_layout_.offset(r, t, h)];
          int64_t not_nan = 0;
          for (int d = 0; d < kDv; ++d) not_nan += row[d] == poison || !half_is_nan(dt, row[d]);
          if (not_nan)
            f.add("out not NaN (or never written) for a query that attends a NaN",
                  pos + fmt(" %lld of %d", (long long)not_nan, kDv));
          const float l = got.lse[lse_layout_.offset(r, h, t)];
          if (float_bits(l) == kLsePoisonBits || !std::isnan(l))
            f.add("lse not NaN (or never written) for a query that attends a NaN", pos + fmt(" lse=%g", l));
          continue;
        }
        check_out_row(dt, &got.out[out_layout_.offset(r, t, h)], kDv, poison, n, hull, pos, f);
        // every score s satisfies |s| <= scale * |q| * max|k|, so lse is within log(n) +- that
        const double max_abs_score = scale *
                                     q_row_norm_[(static_cast<size_t>(r) * s_q + t) * h_q + h] *
                                     cache_->max_key_norm * (1 + 1e-3);
        check_lse_value(got.lse[lse_layout_.offset(r, h, t)], n, max_abs_score, pos, f);
      }
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    all.merge(f);
  });

  // ---- writes outside the logical elements: the sentinels must be unchanged
  check_padding_unchanged(got, out_layout_, lse_layout_, all);

  // ---- reference comparison
  if (!ref_valid_) compute_reference();
  struct Acc {
    double diff2 = 0, ref2 = 0, worst_elem = 0, worst_lse = 0;
    int64_t rows = 0;
    std::string worst_elem_at, worst_lse_at;
  };
  Acc acc;
  parallel_for(b, [&](int64_t r) {
    Acc a;
    Findings f;
    for (int h = 0; h < h_q; ++h) {
      const int32_t slot = ref_slot_[static_cast<size_t>(r) * h_q + h];
      if (slot < 0) continue;
      for (int t = 0; t < s_q; ++t) {
        ++a.rows;
        const int n = keys_for(lengths_[r], s_q, t, c_.causal);
        const float* ref = &ref_out_[(static_cast<size_t>(slot) * s_q + t) * kDv];
        const float ref_lse = ref_lse_[static_cast<size_t>(slot) * s_q + t];
        const uint16_t* row = &got.out[out_layout_.offset(r, t, h)];
        const float l = got.lse[lse_layout_.offset(r, h, t)];
        const std::string pos = fmt("(b=%d,t=%d,h=%d)", int(r), t, h);
        if (expects_nan(int(r), t, h)) {
          if (!std::isnan(ref_lse))
            f.add("the reference is not NaN for a query the test says attends a NaN (harness/reference disagree)",
                  pos);
          continue;  // the GPU side of these rows is checked above
        }
        if (n == 0) {
          if (!(std::isinf(ref_lse) && ref_lse > 0)) {
            f.add(
                "the reference's lse is not +inf where the test counts no keys (harness/reference "
                "disagree)",
                pos + fmt(" ref lse=%g", ref_lse));
          }
          continue;  // the GPU side of these rows is checked exactly above
        }
        const RowComparison rc = compare_out_row(dt, row, ref, kDv, tol);
        a.diff2 += rc.diff2;
        a.ref2 += rc.ref2;
        if (rc.worst_ratio > a.worst_elem) {
          a.worst_elem = rc.worst_ratio;
          a.worst_elem_at = pos + fmt(" d=%d got %.7g ref %.7g", rc.worst_d,
                                      half_bits_to_float(dt, row[rc.worst_d]), ref[rc.worst_d]);
        }
        report_out_row(dt, row, ref, kDv, rc, pos, f);
        const double lse_ratio = compare_lse(l, ref_lse, tol.lse_rel, pos, f);
        if (lse_ratio > a.worst_lse) {
          a.worst_lse = lse_ratio;
          a.worst_lse_at = pos + fmt(" got %.8g ref %.8g", l, ref_lse);
        }
      }
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    all.merge(f);
    acc.diff2 += a.diff2;
    acc.ref2 += a.ref2;
    acc.rows += a.rows;
    if (a.worst_elem > acc.worst_elem) {
      acc.worst_elem = a.worst_elem;
      acc.worst_elem_at = a.worst_elem_at;
    }
    if (a.worst_lse > acc.worst_lse) {
      acc.worst_lse = a.worst_lse;
      acc.worst_lse_at = a.worst_lse_at;
    }
  });
  const double rel_l2 = relative_l2(acc.diff2, acc.ref2);
  if (!(rel_l2 <= tol.out_rel_l2)) {
    all.add(fmt("out relative L2 error above %g", tol.out_rel_l2),
            fmt("%.4g over %lld compared rows; worst element %s", rel_l2, (long long)acc.rows,
                acc.worst_elem_at.c_str()));
  }

  if (!all.empty()) {
    ok = false;
    ADD_FAILURE() << all.report(
        label + fmt(": FAILED checks (rows compared with the reference: %lld of %lld%s)",
                    (long long)acc.rows, (long long)b * s_q * h_q, ref_sampled_ ? ", sampled" : ""),
        fmt("  out relative L2 %g, worst element ratio %g, worst lse ratio %g", rel_l2,
            acc.worst_elem, acc.worst_lse));
  }

  CheckStats st;
  st.rows_total = int64_t(b) * s_q * h_q;
  st.rows_compared = acc.rows;
  st.ref_macs = ref_macs_;
  st.ref_seconds = ref_seconds_;
  st.rel_l2 = rel_l2;
  st.worst_elem = acc.worst_elem;
  st.worst_lse = acc.worst_lse;
  st.sampled = ref_sampled_;
  if (suite_config().verbose) {
    std::printf(
        "[hmla] %s: rows %lld/%lld%s, ref %.2f GMAC in %.2fs, rel L2 %.3g, elem %.3g (%s), lse "
        "%.3g (%s)\n",
        label.c_str(), (long long)st.rows_compared, (long long)st.rows_total,
        st.sampled ? " sampled" : "", st.ref_macs * 1e-9, st.ref_seconds, st.rel_l2, st.worst_elem,
        acc.worst_elem_at.c_str(), st.worst_lse, acc.worst_lse_at.c_str());
  }
  if (stats_out != nullptr) *stats_out = st;
  // The reference time is only counted by the first check after it was computed.
  ref_seconds_ = 0;
  ref_macs_ = 0;
  return ok;
}

bool DecodeProblem::bitwise_equal(const Outputs& a, const Outputs& b, std::string* where) {
  return outputs_bitwise_equal(a, b, where);
}

// ------------------------------------------------------------------------------ statistics
void record_stats(const DecodeCase& c, const CheckStats& s) {
  g_summary.record(hmla::dtype_name(c.dtype), c.name, s);
}

void print_summary() {
  g_summary.print("dense decode", [](const std::string& dtype) -> const Tolerance& {
    return dtype == "bf16" ? kBf16Tolerance : kFp16Tolerance;
  });
}

void run_and_check_case(const DecodeCase& c) {
  DecodeProblem p(c);
  Stream stream;
  if (!p.plan_and_run(stream.get())) return;
  const Outputs o = p.download();
  CheckStats st;
  p.check(o, "plan+run", &st);
  record_stats(c, st);
}

}  // namespace hmla_test
