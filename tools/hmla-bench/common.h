// hmla-bench: error checking, statistics and small helpers shared by every source of the tool.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hmla_bench {

// A CUDA or cuBLAS failure inside the tool itself (the library reports its own as hmla::CudaError).
class BenchError : public std::runtime_error {
 public:
  explicit BenchError(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void throw_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  throw BenchError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                   cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_(unknown)";
  }
}

[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  throw BenchError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                   cublas_status_name(s));
}

#define HB_CUDA(expr)                                                         \
  do {                                                                        \
    cudaError_t hb_err_ = (expr);                                             \
    if (hb_err_ != cudaSuccess) ::hmla_bench::throw_cuda(hb_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define HB_CUBLAS(expr)                                                       \
  do {                                                                        \
    cublasStatus_t hb_st_ = (expr);                                           \
    if (hb_st_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::hmla_bench::throw_cublas(hb_st_, #expr, __FILE__, __LINE__);          \
  } while (0)

// Checks for an error from the last kernel launch.
#define HB_CUDA_LAUNCH() HB_CUDA(cudaGetLastError())

// ---- owning wrappers (no exceptions escape the destructors) ----
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { allocate(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  void allocate(size_t bytes) {
    release();
    if (bytes == 0) return;
    cudaError_t err = cudaMalloc(&ptr_, bytes);
    if (err != cudaSuccess) {
      ptr_ = nullptr;
      throw BenchError("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " +
                       cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
    bytes_ = bytes;
  }
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class EventPool {
 public:
  explicit EventPool(size_t n) {
    events_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      cudaEvent_t e;
      HB_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
  }
  ~EventPool() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }
  size_t size() const { return events_.size(); }

 private:
  std::vector<cudaEvent_t> events_;
};

class Stream {
 public:
  Stream() { HB_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// ---- statistics over per-call times (microseconds) ----
struct TimeStats {
  double median = 0, mean = 0, min = 0, max = 0, p10 = 0, p90 = 0;
  int count = 0;
};

inline double percentile_sorted(const std::vector<double>& v, double p) {
  if (v.empty()) return NAN;
  double pos = p * (double)(v.size() - 1);
  size_t lo = (size_t)std::floor(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  double f = pos - (double)lo;
  return v[lo] * (1.0 - f) + v[hi] * f;
}

inline TimeStats summarize(std::vector<double> v) {
  TimeStats s;
  s.count = (int)v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = percentile_sorted(v, 0.5);  // the mean of the two middle values for an even count
  s.p10 = percentile_sorted(v, 0.1);
  s.p90 = percentile_sorted(v, 0.9);
  s.min = v.front();
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / (double)v.size();
  return s;
}

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
inline size_t round_up(size_t a, size_t b) { return ceil_div(a, b) * b; }

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kGiB = size_t(1) << 30;

}  // namespace hmla_bench
