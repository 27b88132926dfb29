// Small host-side utilities shared by the GPU tests: CUDA error checks, owned device buffers,
// deterministic counter-based random numbers, bf16/fp16 bit conversions, a parallel-for over the
// host's cores and the environment knobs of the suite.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hmla/types.h"

namespace hmla_test {

// ------------------------------------------------------------------------------------ CUDA errors
inline void cuda_check(cudaError_t err, const char* expr, const char* file, int line) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                             " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                             ")");
  }
}

#define HMLA_TEST_CUDA_CHECK(expr) ::hmla_test::cuda_check((expr), #expr, __FILE__, __LINE__)

// If the CUDA context is broken (a sticky error such as an illegal address), every later test
// would fail with the same error; print what broke it and stop the binary instead.
inline void abort_if_context_broken(const std::string& where) {
  cudaError_t first = cudaDeviceSynchronize();
  if (first == cudaSuccess) return;
  cudaGetLastError();  // clears a non-sticky error
  cudaError_t again = cudaDeviceSynchronize();
  void* probe = nullptr;
  cudaError_t alloc = cudaMalloc(&probe, 256);
  if (alloc == cudaSuccess) cudaFree(probe);
  if (again != cudaSuccess || alloc != cudaSuccess) {
    std::fprintf(stderr,
                 "\nFATAL: the CUDA context is broken after %s: %s (%s). The remaining tests "
                 "cannot run; stopping.\n",
                 where.c_str(), cudaGetErrorName(first), cudaGetErrorString(first));
    std::fflush(stderr);
    std::exit(1);
  }
}

// ----------------------------------------------------------------------------- device buffers
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { allocate(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = other.ptr_;
      bytes_ = other.bytes_;
      other.ptr_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }

  void allocate(size_t bytes) {
    release();
    // Never allocate 0 bytes: a null pointer would make argument checks fire for the wrong reason.
    HMLA_TEST_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)));
    bytes_ = bytes;
  }
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);  // errors ignored: may run during teardown
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  // Synchronous copies (cudaMemcpy on the legacy stream, followed by a device sync so that work on
  // any other stream sees the data).
  void upload(const void* host, size_t bytes) {
    if (bytes > bytes_) throw std::runtime_error("DeviceBuffer::upload: too many bytes");
    HMLA_TEST_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
    HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void download(void* host, size_t bytes) const {
    if (bytes > bytes_) throw std::runtime_error("DeviceBuffer::download: too many bytes");
    HMLA_TEST_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owned stream; created blocking so that the legacy-stream copies above are ordered with it.
class Stream {
 public:
  explicit Stream(unsigned flags = cudaStreamDefault) {
    HMLA_TEST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, flags));
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// ------------------------------------------------------------------------------------- random
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t mix_seed(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

inline uint64_t hash_string(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return splitmix64(h);
}

// Approximately N(0, 1), from a counter (so any element can be generated independently, in
// parallel, in any order): the Irwin-Hall sum of four 16-bit uniforms rescaled to unit variance.
// Bounded by +-2*sqrt(3) = +-3.46; never exactly zero.
inline float normalish(uint64_t seed, uint64_t index) {
  const uint64_t r = splitmix64(seed ^ (index * 0xd1b54a32d192ed03ULL));
  const float s = static_cast<float>(r & 0xffff) + static_cast<float>((r >> 16) & 0xffff) +
                  static_cast<float>((r >> 32) & 0xffff) + static_cast<float>(r >> 48);
  // each uniform is (u + 0.5) / 65536 in (0, 1): the sum has mean 2 and variance 1/3
  float x = ((s + 2.0f) * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  if (x == 0.0f) x = 0.25f;
  return x;
}
constexpr float kNormalishBound = 3.4641016f;

// Sequential generator for lengths, permutations and choices.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return splitmix64(state_);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // inclusive range
  int uniform_int(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double normal() {
    double u1 = uniform();
    const double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(next() % i);
      std::swap(v[i - 1], v[j]);
    }
  }

 private:
  uint64_t state_;
};

// ----------------------------------------------------------------------- 16-bit float formats
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // nearest even
}
inline float bf16_bits_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_fp16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to infinity
  if (a <= 0x33000000u) return sign;           // <= 2^-25 rounds to zero
  const uint32_t e = a >> 23;
  if (e < 113) {  // half subnormal: value / 2^-24 = m * 2^(e - 126)
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((e - 112) << 10) | ((a >> 13) & 0x3ffu);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry moves into the exponent
  return sign | static_cast<uint16_t>(r);
}
inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t to_half_bits(hmla::DType t, float f) {
  return t == hmla::DType::kBF16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f);
}
inline float half_bits_to_float(hmla::DType t, uint16_t h) {
  return t == hmla::DType::kBF16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}
inline bool half_is_nan(hmla::DType t, uint16_t h) {
  return t == hmla::DType::kBF16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0)
                                 : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
}
inline bool half_is_inf(hmla::DType t, uint16_t h) {
  return t == hmla::DType::kBF16 ? ((h & 0x7fffu) == 0x7f80u) : ((h & 0x7fffu) == 0x7c00u);
}

// Bit patterns the tests plant. The output poison is a NaN with a payload a kernel never produces
// (converting a NaN to bf16/fp16 on the GPU gives 0x7fff / 0x7fff-like canonical patterns), so an
// element still holding it was never written.
inline uint16_t out_poison_bits(hmla::DType t) { return t == hmla::DType::kBF16 ? 0xffa5 : 0xfda5; }
// Finite sentinel in the padding of strided outputs (~1.0e7 as bf16, ~14.2 as fp16): no attention
// output (a convex combination of values bounded by 0.35) can equal it.
constexpr uint16_t kOutSentinelBits = 0x4b1d;
// NaNs planted in inputs (cache slots nobody may read, q padding).
inline uint16_t input_nan_bits(hmla::DType t) { return t == hmla::DType::kBF16 ? 0x7fc1 : 0x7e01; }
constexpr uint32_t kLsePoisonBits = 0xffbadbadu;    // a NaN
constexpr uint32_t kLseSentinelBits = 0x4640e400u;  // 12345.0f

// ------------------------------------------------------------------------------ environment
inline double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  return (end != v) ? d : fallback;
}

struct SuiteConfig {
  // Reference cost (multiply-adds, see the cost model in dense_decode_harness.cpp) allowed per grid
  // case before its rows are sampled.
  double grid_ref_budget = 3e8;
  // Default reference cost per non-grid case (each such case may set its own).
  double special_ref_budget = 2e9;
  bool full = false;  // HMLA_TEST_FULL=1: every row of every case is checked against the reference
  bool verbose = false;
  int threads = 1;
};

inline const SuiteConfig& suite_config() {
  static const SuiteConfig cfg = [] {
    SuiteConfig c;
    c.grid_ref_budget = env_double("HMLA_TEST_REF_BUDGET", c.grid_ref_budget);
    c.special_ref_budget = env_double("HMLA_TEST_SPECIAL_REF_BUDGET", c.special_ref_budget);
    c.full = env_double("HMLA_TEST_FULL", 0) != 0;
    c.verbose = env_double("HMLA_TEST_VERBOSE", 0) != 0;
    const unsigned hw = std::thread::hardware_concurrency();
    c.threads = static_cast<int>(env_double("HMLA_TEST_THREADS", hw == 0 ? 4 : hw));
    if (c.threads < 1) c.threads = 1;
    return c;
  }();
  return cfg;
}

// ------------------------------------------------------------------------------ parallel for
// Calls fn(i) for i in [0, n) on up to suite_config().threads threads (dynamic scheduling). The
// first exception thrown by any call is rethrown here after all threads stop.
inline void parallel_for(int64_t n, const std::function<void(int64_t)>& fn, int max_threads = 0) {
  if (n <= 0) return;
  int threads = max_threads > 0 ? max_threads : suite_config().threads;
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace hmla_test
