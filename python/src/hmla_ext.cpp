// hmla._C: the nanobind extension behind the `hmla` Python package.
//
// Every array arrives as an nb::ndarray imported over DLPack (the Python layer hands over DLPack
// capsules it made on the caller's stream, see hmla/_frameworks.py), so one build serves PyTorch,
// CuPy, JAX and NumPy. This file owns the argument checks on the DLPack metadata (dtype, device,
// rank, shape, contiguous last dimension) so that every bad input becomes a TypeError/ValueError
// that names the argument, then builds hmla's parameter structs and calls the C++ library on the
// stream it was given. Nothing here allocates device memory: outputs and the workspace are
// allocated by the caller's framework in Python.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "fast_call.h"
#include "hmla/dense_decode.h"
#include "hmla/launch_replay.h"
#include "hmla/merge.h"
#include "hmla/params.h"
#include "hmla/reference.h"
#include "hmla/sparse_decode.h"
#include "hmla/sparse_prefill.h"
#include "hmla/types.h"

namespace nb = nanobind;

namespace {

// ---------------------------------------------------------------------------------------------
// DLPack constants (numeric, so that older nanobind releases whose enums lack some names work).
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;
constexpr int32_t kDLCUDAManaged = 13;

constexpr uint8_t kCodeInt = 0;
constexpr uint8_t kCodeUInt = 1;
constexpr uint8_t kCodeFloat = 2;
constexpr uint8_t kCodeBfloat = 4;
constexpr uint8_t kCodeFloat8E4M3FN = 10;

using InArray = nb::ndarray<nb::ro>;  // read-only view: accepts read-only producers too
using OutArray = nb::ndarray<>;       // writable

std::string where(const char* fn) { return std::string("hmla.") + fn; }

// The decode runs replay their two kernels as the stream's graph (hmla/launch_replay.h): an eager
// call is bound by host time, and a replay costs about half the two launches. One replay per
// Python thread (it must not be shared between threads); a stream being captured (CUDA graphs,
// torch.compile's cudagraph trees) gets the kernels launched into the capture as before.
// HMLA_LAUNCH_REPLAY=0 in the environment turns it off; hmla._C._set_launch_replay switches it
// (python/tests/bench_overhead.py measures both in one process).
std::atomic<bool>& launch_replay_enabled() {
  static std::atomic<bool> enabled{[] {
    const char* v = std::getenv("HMLA_LAUNCH_REPLAY");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }()};
  return enabled;
}

template <typename Params>
void decode_run(void (*direct)(const Params&, const hmla::DecodeSchedule&, cudaStream_t),
                void (*replayed)(const Params&, const hmla::DecodeSchedule&, cudaStream_t, hmla::LaunchReplay&),
                const Params& p, const hmla::DecodeSchedule& schedule, uintptr_t stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (!launch_replay_enabled().load(std::memory_order_relaxed)) return direct(p, schedule, s);
  thread_local hmla::LaunchReplay replay;
  replayed(p, schedule, s, replay);
}

[[noreturn]] void raise_type(const char* fn, const char* arg, const std::string& msg) {
  throw nb::type_error((where(fn) + ": argument '" + arg + "' " + msg).c_str());
}

[[noreturn]] void raise_value(const char* fn, const char* arg, const std::string& msg) {
  throw nb::value_error((where(fn) + ": argument '" + arg + "' " + msg).c_str());
}

std::string dtype_name(nb::dlpack::dtype dt) {
  std::string base;
  switch (dt.code) {
    case kCodeInt: base = "int"; break;
    case kCodeUInt: base = "uint"; break;
    case kCodeFloat: base = "float"; break;
    case kCodeBfloat: base = "bfloat"; break;
    case kCodeFloat8E4M3FN: return "float8_e4m3fn";
    case 6: return "bool";
    default: base = "dtype(code=" + std::to_string(dt.code) + ")"; break;
  }
  std::string name = base + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

bool is(nb::dlpack::dtype dt, uint8_t code, uint8_t bits) {
  return dt.code == code && dt.bits == bits && dt.lanes == 1;
}

template <typename A>
std::string shape_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

std::string device_str(int32_t type, int32_t id) {
  switch (type) {
    case kDLCPU: return "the CPU (host memory)";
    case kDLCUDAHost: return "pinned host memory";
    case kDLCUDA: return "cuda:" + std::to_string(id);
    case kDLCUDAManaged: return "CUDA managed memory (cuda:" + std::to_string(id) + ")";
    default: return "DLPack device type " + std::to_string(type);
  }
}

// Imports one argument. `arr` is whatever the Python layer passed (normally a DLPack capsule).
template <typename A>
A import_array(nb::handle obj, const char* fn, const char* arg) {
  A out;
  if (obj.is_none()) raise_type(fn, arg, "is None, expected an array");
  if (!nb::try_cast<A>(obj, out, /*convert=*/false)) {
    nb::str tname = nb::str(nb::handle((PyObject*)Py_TYPE(obj.ptr())).attr("__name__"));
    raise_type(fn, arg,
               std::string("could not be imported over DLPack (got an object of type '") +
                   tname.c_str() + "'; expected a PyTorch, CuPy, JAX or NumPy array)");
  }
  return out;
}

// An array the PyTorch fast path described (python/src/fast_call.h), read through the part of
// nb::ndarray's interface that the checks use: no DLPack capsule and no ndarray handle per call.
class RawView {
 public:
  RawView() = default;
  explicit RawView(const hmla_python::RawArray* raw) : raw_(raw) {}
  nb::dlpack::dtype dtype() const {
    nb::dlpack::dtype d;
    d.code = raw_->dtype_code;
    d.bits = raw_->dtype_bits;
    d.lanes = 1;
    return d;
  }
  size_t ndim() const { return static_cast<size_t>(raw_->ndim); }
  size_t shape(size_t i) const { return static_cast<size_t>(raw_->shape[i]); }
  int64_t stride(size_t i) const { return raw_->strides[i]; }
  void* data() const { return raw_->data; }
  int32_t device_type() const { return raw_->device_type; }
  int32_t device_id() const { return raw_->device_id; }
  size_t size() const {
    size_t n = 1;
    for (int i = 0; i < raw_->ndim; ++i) n *= static_cast<size_t>(raw_->shape[i]);
    return n;
  }

 private:
  const hmla_python::RawArray* raw_ = nullptr;
};

// The array types an entry point works with, by how its arguments arrive: Python objects imported
// over DLPack, or arrays the fast path described.
template <typename Arg>
struct ArraysOf {
  using In = InArray;
  using Out = OutArray;
};
template <>
struct ArraysOf<const hmla_python::RawArray*> {
  using In = RawView;
  using Out = RawView;
};

template <typename A>
A import_array(const hmla_python::RawArray* raw, const char* fn, const char* arg) {
  if (raw == nullptr) raise_type(fn, arg, "is None, expected an array");
  if (raw->ndim < 0 || raw->ndim > hmla_python::kMaxRawDims)
    raise_value(fn, arg, "has " + std::to_string(raw->ndim) + " dimensions, more than hmla reads");
  return A(raw);
}

template <typename A>
void check_dtype(const char* fn, const char* arg, const A& a, std::initializer_list<nb::dlpack::dtype> ok,
                 const char* expected) {
  for (const auto& dt : ok)
    if (a.dtype() == dt) return;
  raise_type(fn, arg, "has dtype " + dtype_name(a.dtype()) + ", expected " + expected);
}

nb::dlpack::dtype dt(uint8_t code, uint8_t bits) {
  nb::dlpack::dtype d;
  d.code = code;
  d.bits = bits;
  d.lanes = 1;
  return d;
}

template <typename A>
void check_device(const char* fn, const char* arg, const A& a, bool require_cuda, int* device) {
  const int32_t type = a.device_type();
  const int32_t id = a.device_id();
  if (require_cuda) {
    if (type != kDLCUDA && type != kDLCUDAManaged)
      raise_value(fn, arg, "is on " + device_str(type, id) + ", expected a CUDA device array");
  }
  if (*device < 0) {
    *device = id;
  } else if (id != *device) {
    raise_value(fn, arg, "is on " + device_str(type, id) + ", but the other arrays are on device " +
                             std::to_string(*device));
  }
}

template <typename A>
void check_ndim(const char* fn, const char* arg, const A& a, size_t ndim, const char* layout) {
  if (a.ndim() != ndim)
    raise_value(fn, arg, "has shape " + shape_str(a) + " (" + std::to_string(a.ndim()) +
                             " dimensions), expected " + std::to_string(ndim) + " dimensions " + layout);
}

template <typename A>
void check_last_dim_contiguous(const char* fn, const char* arg, const A& a) {
  if (a.ndim() == 0 || a.size() == 0) return;  // empty arrays are caught by the shape checks
  const size_t last = a.ndim() - 1;
  if (a.shape(last) > 1 && a.stride(last) != 1)
    raise_value(fn, arg, "must have a contiguous last dimension (stride 1), got stride " +
                             std::to_string(a.stride(last)));
}

template <typename A>
void check_contiguous_1d(const char* fn, const char* arg, const A& a) {
  if (a.ndim() == 1 && a.shape(0) > 1 && a.stride(0) != 1)
    raise_value(fn, arg, "must be contiguous, got stride " + std::to_string(a.stride(0)));
}

// expected: -1 = any extent.
template <typename A>
void check_shape(const char* fn, const char* arg, const A& a, std::initializer_list<int64_t> expected,
                 const char* layout) {
  bool ok = a.ndim() == expected.size();
  size_t i = 0;
  for (int64_t e : expected) {
    if (ok && e >= 0 && static_cast<int64_t>(a.shape(i)) != e) ok = false;
    ++i;
  }
  if (ok) return;
  std::string exp = "(";
  i = 0;
  for (int64_t e : expected) {
    if (i++) exp += ", ";
    exp += e >= 0 ? std::to_string(e) : std::string("*");
  }
  if (expected.size() == 1) exp += ",";
  exp += ")";
  raise_value(fn, arg, "has shape " + shape_str(a) + ", expected " + exp + " " + layout);
}

int to_int(const char* fn, const char* arg, size_t v, const char* what) {
  if (v > static_cast<size_t>(INT_MAX))
    raise_value(fn, arg, std::string("has ") + what + " = " + std::to_string(v) + ", larger than INT_MAX");
  return static_cast<int>(v);
}

// Sets the current CUDA device for the scope of a call and restores it afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      current = -1;
    }
    if (current != device) {
      cudaError_t err = cudaSetDevice(device);
      if (err != cudaSuccess) {
        cudaGetLastError();
        throw std::runtime_error(std::string("hmla: cudaSetDevice(") + std::to_string(device) +
                                 ") failed: " + cudaGetErrorString(err));
      }
      previous_ = current;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Runs f, turning hmla's exceptions into Python ones whose message starts with the Python name.
template <typename F>
auto translate(const char* fn, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const hmla::InvalidArgument& e) {
    throw nb::value_error((where(fn) + ": " + e.what()).c_str());
  } catch (const hmla::CudaError& e) {
    throw std::runtime_error(where(fn) + ": " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Dense decode (flash_mla_with_kvcache without indices)

struct DenseShape {
  int batch = 0, s_q = 0, h_q = 0, d_qk = 0, h_kv = 0, page_size = 0, num_blocks = 0;
  int max_blocks = 0;
  int device = -1;
  hmla::DType dtype = hmla::DType::kBF16;
};

constexpr int kDenseDQK = 576;
constexpr int kDV = 512;

// FlashMLA's checks of dense_decode_fwd, in its order (dtypes, devices, layout, shapes), plus the
// limits of hmla's dense decode kernel. require_cuda = false skips only the device-type check (the
// CPU test suite uses it to exercise every other check with host arrays).
template <typename A>
DenseShape check_dense(const char* fn, const A& q, const A& k, const A& bt, const A& sl, int64_t head_dim_v,
                       bool require_cuda) {
  DenseShape s;
  // ---- dtypes
  check_dtype(fn, "q", q, {dt(kCodeBfloat, 16), dt(kCodeFloat, 16)}, "bfloat16 or float16");
  if (!(k.dtype() == q.dtype()))
    raise_type(fn, "k_cache", "has dtype " + dtype_name(k.dtype()) + ", but q has dtype " +
                                  dtype_name(q.dtype()) + " (query and key must have the same dtype)");
  check_dtype(fn, "cache_seqlens", sl, {dt(kCodeInt, 32)}, "int32");
  check_dtype(fn, "block_table", bt, {dt(kCodeInt, 32)}, "int32");
  s.dtype = is(q.dtype(), kCodeBfloat, 16) ? hmla::DType::kBF16 : hmla::DType::kFP16;

  // ---- devices
  check_device(fn, "q", q, require_cuda, &s.device);
  check_device(fn, "k_cache", k, require_cuda, &s.device);
  check_device(fn, "cache_seqlens", sl, require_cuda, &s.device);
  check_device(fn, "block_table", bt, require_cuda, &s.device);

  // ---- ranks and layout
  check_ndim(fn, "q", q, 4, "[batch, s_q, h_q, head_dim]");
  check_ndim(fn, "k_cache", k, 4, "[num_blocks, page_block_size, h_kv, head_dim]");
  check_ndim(fn, "block_table", bt, 2, "[batch, max_num_blocks_per_seq]");
  check_ndim(fn, "cache_seqlens", sl, 1, "[batch]");
  check_last_dim_contiguous(fn, "q", q);
  check_last_dim_contiguous(fn, "k_cache", k);
  check_contiguous_1d(fn, "cache_seqlens", sl);
  check_last_dim_contiguous(fn, "block_table", bt);

  // ---- shapes
  s.batch = to_int(fn, "q", q.shape(0), "batch");
  s.s_q = to_int(fn, "q", q.shape(1), "s_q");
  s.h_q = to_int(fn, "q", q.shape(2), "h_q");
  s.d_qk = to_int(fn, "q", q.shape(3), "head_dim");
  s.num_blocks = to_int(fn, "k_cache", k.shape(0), "num_blocks");
  s.page_size = to_int(fn, "k_cache", k.shape(1), "page_block_size");
  s.h_kv = to_int(fn, "k_cache", k.shape(2), "h_kv");
  s.max_blocks = to_int(fn, "block_table", bt.ndim() == 2 ? bt.shape(1) : 0, "max_num_blocks_per_seq");

  if (s.d_qk != kDenseDQK)
    raise_value(fn, "q", "has head_dim " + std::to_string(s.d_qk) +
                             ", expected 576 (512 NoPE + 64 RoPE; hmla's dense decode supports 576 only)");
  if (head_dim_v != kDV)
    raise_value(fn, "head_dim_v", "is " + std::to_string(head_dim_v) + ", expected 512");
  if (s.batch < 1) raise_value(fn, "q", "has batch " + std::to_string(s.batch) + ", expected >= 1");
  if (s.s_q < 1 || s.s_q > 16)
    raise_value(fn, "q", "has s_q (seq_len_q) " + std::to_string(s.s_q) +
                             ", expected 1..16 (1 + speculative tokens)");
  if (s.h_q < 1 || s.h_q > 128)
    raise_value(fn, "q", "has h_q " + std::to_string(s.h_q) + ", expected 1..128");
  if (s.h_kv < 1)
    raise_value(fn, "k_cache", "has h_kv " + std::to_string(s.h_kv) + ", expected >= 1");
  if (s.h_q % s.h_kv != 0)
    raise_value(fn, "k_cache", "has h_kv = " + std::to_string(s.h_kv) +
                                   " heads, which does not divide q's h_q = " + std::to_string(s.h_q) +
                                   " (h_q % h_kv must be 0)");
  check_shape(fn, "k_cache", k, {-1, -1, -1, s.d_qk}, "[num_blocks, page_block_size, h_kv, head_dim of q]");
  if (s.num_blocks < 1) raise_value(fn, "k_cache", "has no blocks (num_blocks = 0)");
  if (s.page_size != 16 && s.page_size != 32 && s.page_size != 64 && s.page_size != 128 &&
      s.page_size != 256)
    raise_value(fn, "k_cache", "has page_block_size " + std::to_string(s.page_size) +
                                   ", expected one of 16, 32, 64, 128, 256");
  check_shape(fn, "block_table", bt, {s.batch, -1}, "[batch, max_num_blocks_per_seq]");
  if (s.max_blocks < 1) raise_value(fn, "block_table", "has no columns (max_num_blocks_per_seq = 0)");
  check_shape(fn, "cache_seqlens", sl, {s.batch}, "[batch]");
  return s;
}

// out [batch, s_q, h_q, 512] and lse [batch, h_q, s_q] of either decode family's params.
template <typename Params, typename Out, typename Lse>
void set_outputs(Params& p, const Out& out, const Lse& lse) {
  p.out = static_cast<decltype(p.out)>(out.data());
  p.out_batch_stride = out.stride(0);
  p.out_token_stride = out.stride(1);
  p.out_head_stride = out.stride(2);
  p.lse = static_cast<float*>(lse.data());
  p.lse_batch_stride = lse.stride(0);
  p.lse_head_stride = lse.stride(1);
}

template <typename A>
hmla::DenseDecodeParams dense_params(const DenseShape& s, const A& q, const A& k, const A& bt, const A& sl) {
  hmla::DenseDecodeParams p;
  p.dtype = s.dtype;
  p.batch = s.batch;
  p.s_q = s.s_q;
  p.h_q = s.h_q;
  p.h_kv = s.h_kv;
  p.d_qk = s.d_qk;
  p.d_v = kDV;
  p.q = q.data();
  p.q_batch_stride = q.stride(0);
  p.q_token_stride = q.stride(1);
  p.q_head_stride = q.stride(2);
  p.k_cache = k.data();
  p.num_blocks = s.num_blocks;
  p.page_size = s.page_size;
  p.k_block_stride = k.stride(0);
  p.k_token_stride = k.stride(1);
  p.k_head_stride = k.stride(2);
  p.block_table = static_cast<const int32_t*>(bt.data());
  p.max_blocks_per_seq = s.max_blocks;
  p.block_table_batch_stride = bt.stride(0);
  p.cache_seqlens = static_cast<const int32_t*>(sl.data());
  return p;
}

// What a sparse schedule was planned for, beyond DecodeSchedule's shape: runs must match it.
struct SparsePlanKey {
  int topk = 0;
  int extra_topk = 0;
  bool extra = false;
  bool topk_length = false;
  bool extra_topk_length = false;
};

struct Schedule {
  hmla::DecodeSchedule s;
  int device = -1;
  bool sparse = false;
  SparsePlanKey sparse_key;
};

// A plan's workspace: a contiguous 1-D CUDA byte array; sets *device to its device.
OutArray import_workspace(nb::handle workspace_obj, const char* fn, int* device) {
  OutArray ws = import_array<OutArray>(workspace_obj, fn, "workspace");
  check_device(fn, "workspace", ws, true, device);
  check_ndim(fn, "workspace", ws, 1, "[bytes]");
  check_contiguous_1d(fn, "workspace", ws);
  return ws;
}

size_t workspace_bytes(int batch, int s_q, int h_q, int h_kv, int device, const char* fn) {
  DeviceGuard guard(device);
  return translate(fn, [&] { return hmla::dense_decode_workspace_bytes(batch, s_q, h_q, h_kv); });
}

Schedule plan(nb::handle seqlens_obj, int s_q, int h_q, int h_kv, nb::handle workspace_obj,
              uintptr_t stream, const char* fn) {
  InArray sl = import_array<InArray>(seqlens_obj, fn, "cache_seqlens");
  int device = -1;
  check_dtype(fn, "cache_seqlens", sl, {dt(kCodeInt, 32)}, "int32");
  check_device(fn, "cache_seqlens", sl, true, &device);
  check_ndim(fn, "cache_seqlens", sl, 1, "[batch]");
  check_contiguous_1d(fn, "cache_seqlens", sl);
  OutArray ws = import_workspace(workspace_obj, fn, &device);
  const int batch = to_int(fn, "cache_seqlens", sl.shape(0), "batch");
  if (batch < 1) raise_value(fn, "cache_seqlens", "is empty (batch = 0), expected batch >= 1");
  DeviceGuard guard(device);
  Schedule out;
  out.device = device;
  out.s = translate(fn, [&] {
    return hmla::dense_decode_plan(static_cast<const int32_t*>(sl.data()), batch, s_q, h_q, h_kv,
                                   ws.data(), ws.nbytes(), reinterpret_cast<cudaStream_t>(stream));
  });
  return out;
}

// The schedule a dense plan wrote into workspace, without planning again (a compiled graph's run
// node, whose plan is another node).
Schedule schedule_of(nb::handle workspace_obj, int batch, int s_q, int h_q, int h_kv, const char* fn) {
  int device = -1;
  OutArray ws = import_workspace(workspace_obj, fn, &device);
  DeviceGuard guard(device);
  Schedule out;
  out.device = device;
  out.s = translate(fn, [&] { return hmla::dense_decode_schedule(batch, s_q, h_q, h_kv, ws.data(), ws.nbytes()); });
  return out;
}

// Arg: a Python object (nb::handle) or a RawArray of the PyTorch fast path.
template <typename Arg>
void dense_run(Arg q_obj, Arg k_obj, Arg bt_obj, Arg sl_obj, Arg out_obj, Arg lse_obj, const Schedule& sched,
               double softmax_scale, bool causal, uintptr_t stream) {
  const char* fn = "flash_mla_with_kvcache";
  using In = typename ArraysOf<Arg>::In;
  using Out = typename ArraysOf<Arg>::Out;
  In q = import_array<In>(q_obj, fn, "q");
  In k = import_array<In>(k_obj, fn, "k_cache");
  In bt = import_array<In>(bt_obj, fn, "block_table");
  In sl = import_array<In>(sl_obj, fn, "cache_seqlens");
  Out out = import_array<Out>(out_obj, fn, "out");
  Out lse = import_array<Out>(lse_obj, fn, "lse");
  DenseShape s = check_dense(fn, q, k, bt, sl, kDV, true);

  if (!(out.dtype() == q.dtype())) raise_type(fn, "out", "has dtype " + dtype_name(out.dtype()) + ", expected q's");
  check_dtype(fn, "lse", lse, {dt(kCodeFloat, 32)}, "float32");
  check_device(fn, "out", out, true, &s.device);
  check_device(fn, "lse", lse, true, &s.device);
  check_shape(fn, "out", out, {s.batch, s.s_q, s.h_q, kDV}, "[batch, s_q, h_q, head_dim_v]");
  check_shape(fn, "lse", lse, {s.batch, s.h_q, s.s_q}, "[batch, h_q, s_q]");
  check_last_dim_contiguous(fn, "out", out);
  check_last_dim_contiguous(fn, "lse", lse);
  if (sched.sparse)
    raise_value(fn, "tile_scheduler_metadata", "holds a sparse decode schedule, but this call is dense (no indices)");
  if (sched.device != s.device)
    raise_value(fn, "tile_scheduler_metadata", "was planned on device " + std::to_string(sched.device) +
                                                   ", but q is on device " + std::to_string(s.device));

  hmla::DenseDecodeParams p = dense_params(s, q, k, bt, sl);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = causal;
  set_outputs(p, out, lse);

  DeviceGuard guard(s.device);
  translate(fn, [&] {
    decode_run<hmla::DenseDecodeParams>(hmla::dense_decode_run, hmla::dense_decode_run, p, sched.s, stream);
  });
}

// The argument checks alone, for tests and for callers that want to validate up front. With
// require_cuda = false host arrays pass the device check (every other check still runs).
nb::dict check_dense_args(nb::handle q_obj, nb::handle k_obj, nb::handle bt_obj, nb::handle sl_obj,
                          int64_t head_dim_v, bool require_cuda) {
  const char* fn = "flash_mla_with_kvcache";
  InArray q = import_array<InArray>(q_obj, fn, "q");
  InArray k = import_array<InArray>(k_obj, fn, "k_cache");
  InArray bt = import_array<InArray>(bt_obj, fn, "block_table");
  InArray sl = import_array<InArray>(sl_obj, fn, "cache_seqlens");
  DenseShape s = check_dense(fn, q, k, bt, sl, head_dim_v, require_cuda);
  // hmla's own stride and alignment checks (they never dereference a pointer).
  hmla::DenseDecodeParams p = dense_params(s, q, k, bt, sl);
  p.out = reinterpret_cast<void*>(uintptr_t{256});
  p.out_head_stride = kDV;
  p.out_token_stride = int64_t{s.h_q} * kDV;
  p.out_batch_stride = int64_t{s.s_q} * s.h_q * kDV;
  p.lse = reinterpret_cast<float*>(uintptr_t{256});
  p.lse_head_stride = s.s_q;
  p.lse_batch_stride = int64_t{s.h_q} * s.s_q;
  translate(fn, [&] { hmla::validate(p); });
  nb::dict d;
  d["batch"] = s.batch;
  d["s_q"] = s.s_q;
  d["h_q"] = s.h_q;
  d["h_kv"] = s.h_kv;
  d["head_dim"] = s.d_qk;
  d["page_block_size"] = s.page_size;
  d["num_blocks"] = s.num_blocks;
  d["dtype"] = s.dtype == hmla::DType::kBF16 ? "bfloat16" : "float16";
  d["device"] = s.device;
  return d;
}

// ---------------------------------------------------------------------------------------------
// Token-sparse decode (flash_mla_with_kvcache with indices). The extension checks the DLPack
// metadata (dtype, device, rank, shapes that must agree, contiguity hmla's structs cannot express)
// and fills hmla::SparseDecodeParams; everything deeper (shape limits, page strides, alignment,
// overlapping rows, the extra cache's consistency) is hmla::validate's, whose field names
// translate_sparse maps back to the Python argument.

bool present(nb::handle h) { return h.is_valid() && !h.is_none(); }
bool present(const hmla_python::RawArray* raw) { return raw != nullptr; }

nb::object int_or_none(bool given, int value) { return given ? nb::object(nb::int_(value)) : nb::none(); }

hmla::SparseCacheLayout sparse_layout_for(int64_t d_qk) {
  return d_qk == 512 ? hmla::SparseCacheLayout::kModel1 : hmla::SparseCacheLayout::kV32;
}

// The Python argument behind a field of hmla::SparseDecodeParams.
std::string sparse_python_argument(const std::string& field) {
  auto starts = [&](const char* prefix) { return field.rfind(prefix, 0) == 0; };
  if (field == "topk_length" || field == "extra_topk_length" || field == "attn_sink" ||
      field == "softmax_scale" || starts("workspace"))
    return field;
  if (starts("extra_cache.")) return "extra_k_cache";
  if (starts("cache.")) return "k_cache";
  if (starts("extra_indices") || field == "extra_topk") return "extra_indices_in_kvcache";
  if (starts("indices") || field == "topk") return "indices";
  if (starts("out")) return "out";
  if (starts("lse")) return "lse";
  if (field == "d_v") return "head_dim_v";
  return "q";  // q and its strides, and the shape it carries: layout, d_qk, batch, s_q, h_q
}

// translate() for the sparse entry points: the message names the Python argument first, then
// hmla's own message with the struct field.
template <typename F>
auto translate_sparse(const char* fn, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const hmla::InvalidArgument& e) {
    throw nb::value_error(
        (where(fn) + ": argument '" + sparse_python_argument(e.argument()) + "': " + e.what()).c_str());
  } catch (const hmla::CudaError& e) {
    throw std::runtime_error(where(fn) + ": " + e.what());
  }
}

// An FP8 cache as FlashMLA hands it over: [num_blocks, page_block_size, 1, bytes_per_token] bytes
// whose block stride is the page stride (any: FlashMLA's quantiser pads V3.2 pages by a token and
// MODEL1 pages to a multiple of 576). Tokens inside a page must be back to back.
template <typename A>
hmla::SparseKVCache import_fp8_cache(const char* fn, const char* arg, const A& c,
                                     hmla::SparseCacheLayout layout, bool require_cuda, int* device) {
  check_dtype(fn, arg, c, {dt(kCodeFloat8E4M3FN, 8), dt(kCodeInt, 8), dt(kCodeUInt, 8)},
              "float8_e4m3fn, int8 or uint8 (the packed FP8 cache bytes)");
  check_device(fn, arg, c, require_cuda, device);
  check_ndim(fn, arg, c, 4, "[num_blocks, page_block_size, 1, bytes_per_token]");
  check_last_dim_contiguous(fn, arg, c);
  const int64_t bpt = hmla::reference::sparse_token_bytes(layout);
  if (c.shape(2) != 1)
    raise_value(fn, arg, "has h_kv = " + std::to_string(c.shape(2)) +
                             ", expected 1 (the sparse FP8 caches are MQA: one KV head)");
  if (static_cast<int64_t>(c.shape(3)) != bpt)
    raise_value(fn, arg, "has " + std::to_string(c.shape(3)) + " bytes per token, expected " +
                             std::to_string(bpt) + " for head_dim " +
                             std::to_string(hmla::reference::sparse_cache_d_qk(layout)) +
                             (layout == hmla::SparseCacheLayout::kV32 ? " (DeepSeek-V3.2 layout)"
                                                                      : " (DeepSeek-V4 MODEL1 layout)"));
  if (c.shape(1) > 1 && c.stride(1) != bpt)
    raise_value(fn, arg, "has token stride " + std::to_string(c.stride(1)) + " bytes, expected " +
                             std::to_string(bpt) + " (the tokens of a page are back to back)");
  hmla::SparseKVCache cache;
  cache.data = static_cast<const uint8_t*>(c.data());
  cache.num_blocks = to_int(fn, arg, c.shape(0), "num_blocks");
  cache.page_size = to_int(fn, arg, c.shape(1), "page_block_size");
  cache.block_stride_bytes = c.stride(0);
  return cache;
}

// A [batch, s_q, topk] int32 index list.
template <typename Arg>
typename ArraysOf<Arg>::In import_index_list(const char* fn, const char* name, Arg obj, int64_t batch, int64_t s_q,
                          const char* layout, bool require_cuda, int* device) {
  auto idx = import_array<typename ArraysOf<Arg>::In>(obj, fn, name);
  check_dtype(fn, name, idx, {dt(kCodeInt, 32)}, "int32");
  check_device(fn, name, idx, require_cuda, device);
  check_ndim(fn, name, idx, 3, layout);
  check_last_dim_contiguous(fn, name, idx);
  check_shape(fn, name, idx, {batch, s_q, -1}, layout);
  return idx;
}

// An optional 1-D per-request / per-head / per-token vector (topk_length, attn_sink, ...): dtype,
// device, length and contiguity, each failure naming the argument. Returns its data or null.
template <typename Arg>
const void* import_optional_vector(const char* fn, const char* name, Arg obj, nb::dlpack::dtype dtype,
                                   const char* dtype_name, int64_t length, const char* shape_text,
                                   bool require_cuda, int* device) {
  if (!present(obj)) return nullptr;
  auto t = import_array<typename ArraysOf<Arg>::In>(obj, fn, name);
  check_dtype(fn, name, t, {dtype}, dtype_name);
  check_device(fn, name, t, require_cuda, device);
  check_shape(fn, name, t, {length}, shape_text);
  check_contiguous_1d(fn, name, t);
  return t.data();
}

// The inputs of one sparse decode call: the imported arrays (kept alive for the call) and the
// parameters built from them, outputs not set.
template <typename In = InArray>
struct SparseInputs {
  In q, k, indices, extra_k, extra_indices;
  hmla::SparseDecodeParams p;
  int device = -1;
};

template <typename Arg>
SparseInputs<typename ArraysOf<Arg>::In> import_sparse(const char* fn, Arg q_obj, Arg k_obj, Arg idx_obj, Arg topk_len_obj, Arg sink_obj,
                           Arg extra_k_obj, Arg extra_idx_obj, Arg extra_len_obj, int64_t head_dim_v,
                           bool require_cuda) {
  using In = typename ArraysOf<Arg>::In;
  SparseInputs<In> in;
  hmla::SparseDecodeParams& p = in.p;
  in.q = import_array<In>(q_obj, fn, "q");
  const In& q = in.q;
  check_dtype(fn, "q", q, {dt(kCodeBfloat, 16)}, "bfloat16 (sparse decode)");
  check_device(fn, "q", q, require_cuda, &in.device);
  check_ndim(fn, "q", q, 4, "[batch, s_q, h_q, head_dim]");
  check_last_dim_contiguous(fn, "q", q);
  const int64_t d_qk = q.shape(3);
  // The layout follows from head_dim, so a head_dim of neither layout is reported here, before
  // the cache is read with the wrong one.
  if (d_qk != 576 && d_qk != 512)
    raise_value(fn, "q", "has head_dim " + std::to_string(d_qk) +
                             ", expected 576 (DeepSeek-V3.2) or 512 (DeepSeek-V4 MODEL1) for sparse decode");
  p.layout = sparse_layout_for(d_qk);
  p.batch = to_int(fn, "q", q.shape(0), "batch");
  p.s_q = to_int(fn, "q", q.shape(1), "s_q");
  p.h_q = to_int(fn, "q", q.shape(2), "h_q");
  p.d_qk = static_cast<int>(d_qk);
  p.d_v = head_dim_v > INT_MAX || head_dim_v < INT_MIN ? -1 : static_cast<int>(head_dim_v);
  p.q = static_cast<const uint16_t*>(q.data());
  p.q_batch_stride = q.stride(0);
  p.q_token_stride = q.stride(1);
  p.q_head_stride = q.stride(2);

  in.k = import_array<In>(k_obj, fn, "k_cache");
  p.cache = import_fp8_cache(fn, "k_cache", in.k, p.layout, require_cuda, &in.device);
  in.indices = import_index_list(fn, "indices", idx_obj, p.batch, p.s_q, "[batch, s_q, topk]", require_cuda,
                                 &in.device);
  p.indices = static_cast<const int32_t*>(in.indices.data());
  p.topk = to_int(fn, "indices", in.indices.shape(2), "topk");
  p.indices_batch_stride = in.indices.stride(0);
  p.indices_token_stride = in.indices.stride(1);
  p.topk_length = static_cast<const int32_t*>(import_optional_vector(
      fn, "topk_length", topk_len_obj, dt(kCodeInt, 32), "int32", p.batch, "[batch]", require_cuda, &in.device));
  p.attn_sink = static_cast<const float*>(import_optional_vector(
      fn, "attn_sink", sink_obj, dt(kCodeFloat, 32), "float32", p.h_q, "[h_q]", require_cuda, &in.device));

  if (present(extra_k_obj)) {
    in.extra_k = import_array<In>(extra_k_obj, fn, "extra_k_cache");
    p.extra_cache = import_fp8_cache(fn, "extra_k_cache", in.extra_k, p.layout, require_cuda, &in.device);
  }
  if (present(extra_idx_obj)) {
    in.extra_indices = import_index_list(fn, "extra_indices_in_kvcache", extra_idx_obj, p.batch, p.s_q,
                                         "[batch, s_q, extra_topk]", require_cuda, &in.device);
    p.extra_indices = static_cast<const int32_t*>(in.extra_indices.data());
    p.extra_topk = to_int(fn, "extra_indices_in_kvcache", in.extra_indices.shape(2), "extra_topk");
    p.extra_indices_batch_stride = in.extra_indices.stride(0);
    p.extra_indices_token_stride = in.extra_indices.stride(1);
  }
  p.extra_topk_length = static_cast<const int32_t*>(
      import_optional_vector(fn, "extra_topk_length", extra_len_obj, dt(kCodeInt, 32), "int32", p.batch,
                             "[batch]", require_cuda, &in.device));
  return in;
}

// Dense [batch, s_q, h_q, 512] / [batch, h_q, s_q] outputs at a fake aligned address, for the checks
// that run before the outputs exist (validate never dereferences them).
void set_placeholder_outputs(hmla::SparseDecodeParams& p) {
  p.out = reinterpret_cast<uint16_t*>(uintptr_t{256});
  p.out_head_stride = kDV;
  p.out_token_stride = int64_t{p.h_q} * kDV;
  p.out_batch_stride = int64_t{p.s_q} * p.h_q * kDV;
  p.lse = reinterpret_cast<float*>(uintptr_t{256});
  p.lse_head_stride = p.s_q;
  p.lse_batch_stride = int64_t{p.h_q} * p.s_q;
}

// Every check of a sparse flash_mla_with_kvcache call (FlashMLA's and hmla::validate's) without
// launching anything. With require_cuda = false host arrays pass the device check.
nb::dict check_sparse_decode_args(nb::handle q_obj, nb::handle k_obj, nb::handle idx_obj, nb::handle topk_len_obj,
                                  nb::handle sink_obj, nb::handle extra_k_obj, nb::handle extra_idx_obj,
                                  nb::handle extra_len_obj, int64_t head_dim_v, double softmax_scale,
                                  bool require_cuda) {
  const char* fn = "flash_mla_with_kvcache";
  auto in = import_sparse(fn, q_obj, k_obj, idx_obj, topk_len_obj, sink_obj, extra_k_obj, extra_idx_obj,
                          extra_len_obj, head_dim_v, require_cuda);
  in.p.softmax_scale = static_cast<float>(softmax_scale);
  set_placeholder_outputs(in.p);
  translate_sparse(fn, [&] { hmla::validate(in.p); });
  const hmla::SparseDecodeParams& p = in.p;
  nb::dict d;
  d["batch"] = p.batch;
  d["s_q"] = p.s_q;
  d["h_q"] = p.h_q;
  d["head_dim"] = p.d_qk;
  d["layout"] = p.layout == hmla::SparseCacheLayout::kV32 ? "v32" : "model1";
  d["topk"] = p.topk;
  d["page_block_size"] = p.cache.page_size;
  d["num_blocks"] = p.cache.num_blocks;
  d["block_stride_bytes"] = p.cache.block_stride_bytes;
  const bool extra = p.extra_cache.data != nullptr;
  d["extra_topk"] = int_or_none(extra, p.extra_topk);
  d["extra_page_block_size"] = int_or_none(extra, p.extra_cache.page_size);
  d["device"] = in.device;
  return d;
}

size_t sparse_workspace_bytes(int batch, int s_q, int h_q, int device, const char* fn) {
  DeviceGuard guard(device);
  return translate_sparse(fn, [&] { return hmla::sparse_decode_workspace_bytes(batch, s_q, h_q); });
}

SparsePlanKey sparse_plan_key(const hmla::SparseDecodeParams& p) {
  SparsePlanKey key;
  key.topk = p.topk;
  key.extra = p.extra_cache.data != nullptr;
  key.extra_topk = key.extra ? p.extra_topk : 0;
  key.topk_length = p.topk_length != nullptr;
  key.extra_topk_length = p.extra_topk_length != nullptr;
  return key;
}

std::string describe_sparse_plan(int batch, int s_q, int h_q, const SparsePlanKey& k) {
  return "batch " + std::to_string(batch) + ", s_q " + std::to_string(s_q) + ", h_q " + std::to_string(h_q) +
         ", topk " + std::to_string(k.topk) + (k.topk_length ? " with topk_length" : " without topk_length") +
         (k.extra ? ", extra_topk " + std::to_string(k.extra_topk) +
                        (k.extra_topk_length ? " with extra_topk_length" : " without extra_topk_length")
                  : ", no extra cache");
}

// The plan reads only whether an extra cache is present, never its memory: this stands for it.
const uint8_t* const kExtraCachePresent = reinterpret_cast<const uint8_t*>(uintptr_t{256});

Schedule sparse_plan(int batch, int s_q, int h_q, int topk, nb::handle topk_len_obj, bool extra, int extra_topk,
                     nb::handle extra_len_obj, nb::handle workspace_obj, uintptr_t stream, const char* fn) {
  int device = -1;
  OutArray ws = import_workspace(workspace_obj, fn, &device);
  hmla::SparseDecodeParams p;
  p.batch = batch;
  p.s_q = s_q;
  p.h_q = h_q;
  p.topk = topk;
  p.topk_length = static_cast<const int32_t*>(import_optional_vector(
      fn, "topk_length", topk_len_obj, dt(kCodeInt, 32), "int32", batch, "[batch]", true, &device));
  if (extra) {
    p.extra_cache.data = kExtraCachePresent;
    p.extra_topk = extra_topk;
  }
  p.extra_topk_length = static_cast<const int32_t*>(import_optional_vector(
      fn, "extra_topk_length", extra_len_obj, dt(kCodeInt, 32), "int32", batch, "[batch]", true, &device));
  DeviceGuard guard(device);
  Schedule out;
  out.device = device;
  out.sparse = true;
  out.sparse_key = sparse_plan_key(p);
  out.s = translate_sparse(fn, [&] {
    return hmla::sparse_decode_plan(p, ws.data(), ws.nbytes(), reinterpret_cast<cudaStream_t>(stream));
  });
  return out;
}

// The schedule a sparse plan with these options wrote into workspace, without planning again.
Schedule sparse_schedule_of(nb::handle workspace_obj, int batch, int s_q, int h_q, int topk, bool topk_length,
                            bool extra, int extra_topk, bool extra_topk_length, const char* fn) {
  int device = -1;
  OutArray ws = import_workspace(workspace_obj, fn, &device);
  DeviceGuard guard(device);
  Schedule out;
  out.device = device;
  out.sparse = true;
  out.sparse_key.topk = topk;
  out.sparse_key.extra = extra;
  out.sparse_key.extra_topk = extra ? extra_topk : 0;
  out.sparse_key.topk_length = topk_length;
  out.sparse_key.extra_topk_length = extra_topk_length;
  out.s = translate_sparse(fn, [&] { return hmla::sparse_decode_schedule(batch, s_q, h_q, ws.data(), ws.nbytes()); });
  return out;
}

template <typename Arg>
void sparse_run(Arg q_obj, Arg k_obj, Arg idx_obj, Arg topk_len_obj, Arg sink_obj, Arg extra_k_obj, Arg extra_idx_obj,
                Arg extra_len_obj, Arg out_obj, Arg lse_obj, const Schedule& sched, double softmax_scale,
                uintptr_t stream) {
  const char* fn = "flash_mla_with_kvcache";
  auto in = import_sparse(fn, q_obj, k_obj, idx_obj, topk_len_obj, sink_obj, extra_k_obj, extra_idx_obj,
                          extra_len_obj, kDV, true);
  hmla::SparseDecodeParams& p = in.p;
  using Out = typename ArraysOf<Arg>::Out;
  Out out = import_array<Out>(out_obj, fn, "out");
  Out lse = import_array<Out>(lse_obj, fn, "lse");
  check_dtype(fn, "out", out, {dt(kCodeBfloat, 16)}, "bfloat16");
  check_dtype(fn, "lse", lse, {dt(kCodeFloat, 32)}, "float32");
  check_device(fn, "out", out, true, &in.device);
  check_device(fn, "lse", lse, true, &in.device);
  check_shape(fn, "out", out, {p.batch, p.s_q, p.h_q, kDV}, "[batch, s_q, h_q, head_dim_v]");
  check_shape(fn, "lse", lse, {p.batch, p.h_q, p.s_q}, "[batch, h_q, s_q]");
  check_last_dim_contiguous(fn, "out", out);
  check_last_dim_contiguous(fn, "lse", lse);

  if (!sched.sparse)
    raise_value(fn, "tile_scheduler_metadata", "holds a dense decode schedule, but this call is sparse (indices given)");
  if (sched.device != in.device)
    raise_value(fn, "tile_scheduler_metadata", "was planned on device " + std::to_string(sched.device) +
                                                   ", but q is on device " + std::to_string(in.device));
  const SparsePlanKey key = sparse_plan_key(p);
  const SparsePlanKey& planned = sched.sparse_key;
  if (sched.s.batch != p.batch || sched.s.s_q != p.s_q || sched.s.h_q != p.h_q || planned.topk != key.topk ||
      planned.extra != key.extra || planned.extra_topk != key.extra_topk ||
      planned.topk_length != key.topk_length || planned.extra_topk_length != key.extra_topk_length)
    raise_value(fn, "tile_scheduler_metadata",
                "was planned for " + describe_sparse_plan(sched.s.batch, sched.s.s_q, sched.s.h_q, planned) +
                    ", but this call has " + describe_sparse_plan(p.batch, p.s_q, p.h_q, key));

  p.softmax_scale = static_cast<float>(softmax_scale);
  set_outputs(p, out, lse);

  DeviceGuard guard(in.device);
  translate_sparse(fn, [&] {
    decode_run<hmla::SparseDecodeParams>(hmla::sparse_decode_run, hmla::sparse_decode_run, p, sched.s, stream);
  });
}

// ---------------------------------------------------------------------------------------------
// Sparse prefill (flash_mla_sparse_fwd)

// hmla's batched form of flash_mla_sparse_fwd: cu_seqlens_q [num_seqs + 1], seq_kv_offset and
// seq_kv_len [num_seqs], int32, all three or none. Only their metadata is checked here; their
// values are device data (the kernel clamps them, docs/API.md contract 3).
void import_prefill_sequences(const char* fn, nb::handle cu_obj, nb::handle offset_obj, nb::handle kv_len_obj,
                              int64_t s_q, bool require_cuda, int* device, hmla::SparsePrefillParams& p) {
  const struct {
    const char* name;
    nb::handle obj;
  } arrays[] = {{"cu_seqlens_q", cu_obj}, {"seq_kv_offset", offset_obj}, {"seq_kv_len", kv_len_obj}};
  int given = 0;
  for (const auto& a : arrays) given += present(a.obj) ? 1 : 0;
  if (given == 0) return;
  if (given < 3)
    for (const auto& a : arrays)
      if (!present(a.obj))
        raise_value(fn, a.name, "is None, but the batched form takes all of cu_seqlens_q, seq_kv_offset and "
                                "seq_kv_len (or none of them)");
  InArray cu = import_array<InArray>(cu_obj, fn, "cu_seqlens_q");
  check_dtype(fn, "cu_seqlens_q", cu, {dt(kCodeInt, 32)}, "int32");
  check_device(fn, "cu_seqlens_q", cu, require_cuda, device);
  check_ndim(fn, "cu_seqlens_q", cu, 1, "[num_seqs + 1]");
  check_contiguous_1d(fn, "cu_seqlens_q", cu);
  const int64_t entries = static_cast<int64_t>(cu.shape(0));
  if (entries < 2 || entries > s_q + 1)
    raise_value(fn, "cu_seqlens_q",
                "has shape " + shape_str(cu) + ", expected (num_seqs + 1,) with num_seqs in [1, s_q = " +
                    std::to_string(s_q) + "]");
  const int64_t num_seqs = entries - 1;
  const char* layout = "[num_seqs], num_seqs = len(cu_seqlens_q) - 1";
  p.num_seqs = static_cast<int>(num_seqs);
  p.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
  p.seq_kv_offset = static_cast<const int32_t*>(import_optional_vector(
      fn, "seq_kv_offset", offset_obj, dt(kCodeInt, 32), "int32", num_seqs, layout, require_cuda, device));
  p.seq_kv_len = static_cast<const int32_t*>(import_optional_vector(
      fn, "seq_kv_len", kv_len_obj, dt(kCodeInt, 32), "int32", num_seqs, layout, require_cuda, device));
}

// FlashMLA's checks of the call, then its arrays as hmla's prefill parameters (outputs unset).
hmla::SparsePrefillParams import_sparse_prefill(nb::handle q_obj, nb::handle kv_obj, nb::handle idx_obj,
                                                int64_t d_v, nb::handle sink_obj, nb::handle topk_len_obj,
                                                int64_t indexer_topk, nb::handle cu_obj, nb::handle offset_obj,
                                                nb::handle kv_len_obj, bool require_cuda, int* device) {
  const char* fn = "flash_mla_sparse_fwd";
  InArray q = import_array<InArray>(q_obj, fn, "q");
  InArray kv = import_array<InArray>(kv_obj, fn, "kv");
  InArray idx = import_array<InArray>(idx_obj, fn, "indices");
  check_dtype(fn, "q", q, {dt(kCodeBfloat, 16)}, "bfloat16");
  check_dtype(fn, "kv", kv, {dt(kCodeBfloat, 16)}, "bfloat16");
  check_dtype(fn, "indices", idx, {dt(kCodeInt, 32)}, "int32");
  check_device(fn, "q", q, require_cuda, device);
  check_device(fn, "kv", kv, require_cuda, device);
  check_device(fn, "indices", idx, require_cuda, device);
  check_ndim(fn, "q", q, 3, "[s_q, h_q, head_dim]");
  check_ndim(fn, "kv", kv, 3, "[s_kv, h_kv, head_dim]");
  check_ndim(fn, "indices", idx, 3, "[s_q, h_kv, topk]");
  check_last_dim_contiguous(fn, "q", q);
  check_last_dim_contiguous(fn, "kv", kv);
  check_last_dim_contiguous(fn, "indices", idx);
  const int64_t s_q = q.shape(0), h_q = q.shape(1), d_qk = q.shape(2);
  if (d_qk != 576 && d_qk != 512)
    raise_value(fn, "q", "has head_dim " + std::to_string(d_qk) + ", expected 576 or 512");
  if (d_v != kDV) raise_value(fn, "d_v", "is " + std::to_string(d_v) + ", expected 512");
  if (indexer_topk != 0 && indexer_topk != 512 && indexer_topk != 2048)
    raise_value(fn, "indexer_topk", "is " + std::to_string(indexer_topk) + ", expected 0, 512 or 2048");
  if (h_q < 1) raise_value(fn, "q", "has h_q 0, expected >= 1");
  check_shape(fn, "kv", kv, {-1, 1, d_qk}, "[s_kv, h_kv = 1, head_dim of q]");
  check_shape(fn, "indices", idx, {s_q, 1, -1}, "[s_q, h_kv = 1, topk]");
  hmla::SparsePrefillParams p;
  p.attn_sink = static_cast<const float*>(import_optional_vector(
      fn, "attn_sink", sink_obj, dt(kCodeFloat, 32), "float32", h_q, "[h_q]", require_cuda, device));
  p.topk_length = static_cast<const int32_t*>(import_optional_vector(
      fn, "topk_length", topk_len_obj, dt(kCodeInt, 32), "int32", s_q, "[s_q]", require_cuda, device));
  p.s_q = to_int(fn, "q", s_q, "s_q");
  p.s_kv = to_int(fn, "kv", kv.shape(0), "s_kv");
  p.h_q = static_cast<int>(h_q);
  p.d_qk = static_cast<int>(d_qk);
  p.d_v = kDV;
  p.q = static_cast<const uint16_t*>(q.data());
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.kv = static_cast<const uint16_t*>(kv.data());
  p.kv_token_stride = kv.stride(0);
  p.indices = static_cast<const int32_t*>(idx.data());
  p.topk = to_int(fn, "indices", idx.shape(2), "topk");
  p.indices_token_stride = idx.stride(0);
  import_prefill_sequences(fn, cu_obj, offset_obj, kv_len_obj, s_q, require_cuda, device, p);
  return p;
}

void check_sparse_prefill_args(nb::handle q_obj, nb::handle kv_obj, nb::handle idx_obj, int64_t d_v,
                               nb::handle sink_obj, nb::handle topk_len_obj, int64_t indexer_topk, nb::handle cu_obj,
                               nb::handle offset_obj, nb::handle kv_len_obj, bool require_cuda) {
  int device = -1;
  import_sparse_prefill(q_obj, kv_obj, idx_obj, d_v, sink_obj, topk_len_obj, indexer_topk, cu_obj, offset_obj,
                        kv_len_obj, require_cuda, &device);
}

// out [s_q, h_q, 512] bf16, max_logits and lse [s_q, h_q] float32 contiguous, allocated by the caller.
// The workspace a sparse prefill of this shape needs on `device` to cut its last round of items
// (0: none to cut; hmla::sparse_prefill_workspace_bytes).
size_t sparse_prefill_workspace_bytes(int s_q, int h_q, int topk, int device) {
  hmla::SparsePrefillParams p;
  p.s_q = s_q;
  p.h_q = h_q;
  p.topk = topk;
  DeviceGuard guard(device);
  return translate("flash_mla_sparse_fwd", [&] { return hmla::sparse_prefill_workspace_bytes(p); });
}

void sparse_prefill_run(nb::handle q_obj, nb::handle kv_obj, nb::handle idx_obj, double sm_scale, int64_t d_v,
                        nb::handle sink_obj, nb::handle topk_len_obj, int64_t indexer_topk, nb::handle cu_obj,
                        nb::handle offset_obj, nb::handle kv_len_obj, nb::handle out_obj, nb::handle max_logits_obj,
                        nb::handle lse_obj, nb::handle workspace_obj, uintptr_t stream) {
  const char* fn = "flash_mla_sparse_fwd";
  int device = -1;
  hmla::SparsePrefillParams p = import_sparse_prefill(q_obj, kv_obj, idx_obj, d_v, sink_obj, topk_len_obj,
                                                      indexer_topk, cu_obj, offset_obj, kv_len_obj, true, &device);
  OutArray out = import_array<OutArray>(out_obj, fn, "out");
  OutArray max_logits = import_array<OutArray>(max_logits_obj, fn, "max_logits");
  OutArray lse = import_array<OutArray>(lse_obj, fn, "lse");
  check_device(fn, "out", out, true, &device);
  check_device(fn, "max_logits", max_logits, true, &device);
  check_device(fn, "lse", lse, true, &device);
  check_last_dim_contiguous(fn, "out", out);
  p.softmax_scale = static_cast<float>(sm_scale);
  p.out = static_cast<uint16_t*>(out.data());
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.max_logits = static_cast<float*>(max_logits.data());
  p.lse = static_cast<float*>(lse.data());
  if (!workspace_obj.is_none()) {
    OutArray ws = import_workspace(workspace_obj, fn, &device);
    p.workspace = ws.data();
    p.workspace_bytes = ws.nbytes();
  }
  DeviceGuard guard(device);
  translate(fn, [&] { hmla::sparse_prefill_run(p, reinterpret_cast<cudaStream_t>(stream)); });
}

// ---------------------------------------------------------------------------------------------
// merge_attention_states: n partial results (out [batch, s_q, h, d_v] bf16/fp16 with a contiguous
// last dimension, lse [batch, h, s_q] float32, any other strides) into out / lse (lse may be None).

void merge_states(nb::sequence out_objs, nb::sequence lse_objs, nb::handle out_obj, nb::handle lse_obj,
                  uintptr_t stream) {
  const char* fn = "merge_attention_states";
  const size_t n = nb::len(out_objs);
  if (nb::len(lse_objs) != n)
    raise_value(fn, "lses", "holds " + std::to_string(nb::len(lse_objs)) + " arrays, but outs holds " +
                                std::to_string(n) + " (one lse per out)");
  if (n < 1 || n > static_cast<size_t>(hmla::kMaxMergeStates))
    raise_value(fn, "outs", "holds " + std::to_string(n) + " arrays, expected 1.." +
                                std::to_string(hmla::kMaxMergeStates));
  int device = -1;
  std::vector<InArray> outs, lses;
  std::vector<int64_t> shape;
  for (size_t i = 0; i < n; ++i) {
    const std::string out_name = "outs[" + std::to_string(i) + "]";
    const std::string lse_name = "lses[" + std::to_string(i) + "]";
    const nb::object out_item = out_objs[i], lse_item = lse_objs[i];
    InArray o = import_array<InArray>(out_item, fn, out_name.c_str());
    InArray l = import_array<InArray>(lse_item, fn, lse_name.c_str());
    check_dtype(fn, out_name.c_str(), o, {dt(kCodeBfloat, 16), dt(kCodeFloat, 16)}, "bfloat16 or float16");
    if (i > 0 && !(o.dtype() == outs[0].dtype()))
      raise_type(fn, out_name.c_str(), "has dtype " + dtype_name(o.dtype()) + ", but outs[0] has dtype " +
                                           dtype_name(outs[0].dtype()));
    check_dtype(fn, lse_name.c_str(), l, {dt(kCodeFloat, 32)}, "float32");
    check_device(fn, out_name.c_str(), o, true, &device);
    check_device(fn, lse_name.c_str(), l, true, &device);
    check_ndim(fn, out_name.c_str(), o, 4, "[batch, s_q, h, d_v]");
    if (i == 0) shape = {static_cast<int64_t>(o.shape(0)), static_cast<int64_t>(o.shape(1)),
                         static_cast<int64_t>(o.shape(2)), static_cast<int64_t>(o.shape(3))};
    check_shape(fn, out_name.c_str(), o, {shape[0], shape[1], shape[2], shape[3]}, "[batch, s_q, h, d_v] of outs[0]");
    check_shape(fn, lse_name.c_str(), l, {shape[0], shape[2], shape[1]}, "[batch, h, s_q]");
    check_last_dim_contiguous(fn, out_name.c_str(), o);
    outs.push_back(o);
    lses.push_back(l);
  }
  OutArray out = import_array<OutArray>(out_obj, fn, "out");
  if (!(out.dtype() == outs[0].dtype()))
    raise_type(fn, "out", "has dtype " + dtype_name(out.dtype()) + ", expected outs[0]'s " + dtype_name(outs[0].dtype()));
  check_device(fn, "out", out, true, &device);
  check_shape(fn, "out", out, {shape[0], shape[1], shape[2], shape[3]}, "[batch, s_q, h, d_v] of outs[0]");
  check_last_dim_contiguous(fn, "out", out);

  hmla::MergeAttentionParams p;
  p.dtype = is(outs[0].dtype(), kCodeBfloat, 16) ? hmla::DType::kBF16 : hmla::DType::kFP16;
  p.batch = to_int(fn, "outs[0]", outs[0].shape(0), "batch");
  p.s_q = to_int(fn, "outs[0]", outs[0].shape(1), "s_q");
  p.h = to_int(fn, "outs[0]", outs[0].shape(2), "h");
  p.d_v = to_int(fn, "outs[0]", outs[0].shape(3), "d_v");
  std::vector<hmla::AttentionState> states(n);
  for (size_t i = 0; i < n; ++i) {
    hmla::AttentionState& st = states[i];
    st.out = outs[i].data();
    st.out_batch_stride = outs[i].stride(0);
    st.out_token_stride = outs[i].stride(1);
    st.out_head_stride = outs[i].stride(2);
    st.lse = static_cast<const float*>(lses[i].data());
    st.lse_batch_stride = lses[i].stride(0);
    st.lse_head_stride = lses[i].stride(1);
    st.lse_token_stride = lses[i].stride(2);
  }
  p.num_states = static_cast<int>(n);
  p.states = states.data();
  p.output.out = out.data();
  p.output.out_batch_stride = out.stride(0);
  p.output.out_token_stride = out.stride(1);
  p.output.out_head_stride = out.stride(2);
  OutArray lse;
  if (!lse_obj.is_none()) {
    lse = import_array<OutArray>(lse_obj, fn, "lse");
    check_dtype(fn, "lse", lse, {dt(kCodeFloat, 32)}, "float32");
    check_device(fn, "lse", lse, true, &device);
    check_shape(fn, "lse", lse, {shape[0], shape[2], shape[1]}, "[batch, h, s_q]");
    p.output.lse = static_cast<float*>(lse.data());
    p.output.lse_batch_stride = lse.stride(0);
    p.output.lse_head_stride = lse.stride(1);
    p.output.lse_token_stride = lse.stride(2);
  }
  DeviceGuard guard(device);
  translate(fn, [&] { hmla::merge_attention_states(p, reinterpret_cast<cudaStream_t>(stream)); });
}

// ---------------------------------------------------------------------------------------------
// Host helpers over the CPU reference: FP8 cache pack/unpack, float32 -> bf16.

hmla::SparseCacheLayout layout_of(int layout) {
  if (layout != 0 && layout != 1)
    throw nb::value_error(("hmla: layout " + std::to_string(layout) + " is not 0 (v32) or 1 (model1)").c_str());
  return static_cast<hmla::SparseCacheLayout>(layout);
}

using HostU16In = nb::ndarray<const uint16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using HostU8Out2 = nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using HostU8In3 = nb::ndarray<const uint8_t, nb::ndim<3>, nb::device::cpu>;
using HostF32Out3 = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

// tokens [num_blocks, page_size, d_qk] bf16 bits -> pages [num_blocks, page_bytes]
void pack_pages(HostU16In tokens, HostU8Out2 pages, int layout_id) {
  const auto layout = layout_of(layout_id);
  const size_t nb_ = tokens.shape(0), ps = tokens.shape(1), d = tokens.shape(2);
  const int d_qk = hmla::reference::sparse_cache_d_qk(layout);
  if (d != static_cast<size_t>(d_qk))
    throw nb::value_error(("hmla.pack_fp8_cache: the cache has head_dim " + std::to_string(d) +
                           ", the layout needs " + std::to_string(d_qk)).c_str());
  const int64_t page_bytes = hmla::reference::sparse_page_bytes(layout, static_cast<int>(ps));
  if (pages.shape(0) != nb_ || static_cast<int64_t>(pages.shape(1)) != page_bytes)
    throw nb::value_error("hmla.pack_fp8_cache: internal error: output buffer has the wrong shape");
  std::memset(pages.data(), 0, pages.nbytes());
  nb::gil_scoped_release release;
  for (size_t b = 0; b < nb_; ++b) {
    uint8_t* page = pages.data() + b * page_bytes;
    for (size_t t = 0; t < ps; ++t)
      hmla::reference::pack_token(layout, tokens.data() + (b * ps + t) * d, page, static_cast<int>(ps),
                                  static_cast<int>(t));
  }
}

// pages viewed as [num_blocks, page_size, bytes_per_token] (token stride == bytes_per_token, any
// block stride) -> tokens [num_blocks, page_size, d_qk] float32
void unpack_pages(HostU8In3 pages, HostF32Out3 tokens, int layout_id) {
  const auto layout = layout_of(layout_id);
  const size_t nb_ = pages.shape(0), ps = pages.shape(1);
  const int64_t bpt = hmla::reference::sparse_token_bytes(layout);
  const int d_qk = hmla::reference::sparse_cache_d_qk(layout);
  if (static_cast<int64_t>(pages.shape(2)) != bpt)
    throw nb::value_error(("hmla.unpack_fp8_cache: the cache has " + std::to_string(pages.shape(2)) +
                           " bytes per token, the layout has " + std::to_string(bpt)).c_str());
  if (pages.stride(2) != 1 || (ps > 1 && pages.stride(1) != bpt))
    throw nb::value_error("hmla.unpack_fp8_cache: the bytes of a block must be contiguous "
                          "(token stride == bytes per token, byte stride 1)");
  if (tokens.shape(0) != nb_ || tokens.shape(1) != ps || tokens.shape(2) != static_cast<size_t>(d_qk))
    throw nb::value_error("hmla.unpack_fp8_cache: internal error: output buffer has the wrong shape");
  const int64_t block_stride = pages.stride(0);
  nb::gil_scoped_release release;
  for (size_t b = 0; b < nb_; ++b) {
    const uint8_t* page = pages.data() + static_cast<int64_t>(b) * block_stride;
    for (size_t t = 0; t < ps; ++t)
      hmla::reference::unpack_token(layout, page, static_cast<int>(ps), static_cast<int>(t),
                                    tokens.data() + (b * ps + t) * d_qk);
  }
}

void float32_to_bf16(nb::ndarray<const float, nb::c_contig, nb::device::cpu> src,
                     nb::ndarray<uint16_t, nb::c_contig, nb::device::cpu> dst) {
  if (src.size() != dst.size()) throw nb::value_error("hmla: float32_to_bf16: size mismatch");
  const float* s = src.data();
  uint16_t* d = dst.data();
  const size_t n = src.size();
  nb::gil_scoped_release release;
  for (size_t i = 0; i < n; ++i) d[i] = hmla::reference::float_to_bf16(s[i]);
}

// ---------------------------------------------------------------------------------------------
// The PyTorch fast path's entry points (python/src/fast_call.h): the same runs as dense_decode_run
// and sparse_decode_run, with the arrays described instead of exported over DLPack. Exceptions
// become a set Python error and -1, since the caller is plain C++ on the other side of a capsule.

template <typename F>
int with_python_error(F&& f) noexcept {
  try {
    f();
    return 0;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const nb::builtin_exception& e) {
    PyErr_SetString(e.type() == nb::exception_type::type_error ? PyExc_TypeError : PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "hmla: unknown C++ exception");
  }
  return -1;
}

const Schedule& schedule_argument(PyObject* obj, const char* fn) {
  Schedule* sched = nullptr;
  if (!nb::try_cast<Schedule*>(nb::handle(obj), sched) || sched == nullptr)
    raise_type(fn, "tile_scheduler_metadata", "holds no hmla schedule (plan it first)");
  return *sched;
}

int fast_dense_decode_run(const hmla_python::RawArray* const* a, PyObject* schedule, double softmax_scale, int causal,
                          uintptr_t stream) {
  return with_python_error([&] {
    dense_run(a[0], a[1], a[2], a[3], a[4], a[5], schedule_argument(schedule, "flash_mla_with_kvcache"),
              softmax_scale, causal != 0, stream);
  });
}

int fast_sparse_decode_run(const hmla_python::RawArray* const* a, PyObject* schedule, double softmax_scale,
                           uintptr_t stream) {
  return with_python_error([&] {
    sparse_run(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
               schedule_argument(schedule, "flash_mla_with_kvcache"), softmax_scale, stream);
  });
}

const hmla_python::FastCall kFastCall = {hmla_python::kFastCallVersion, &fast_dense_decode_run,
                                         &fast_sparse_decode_run};

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "hmla C++ extension (nanobind, DLPack). Use the `hmla` package, not this module.";

  nb::class_<Schedule>(m, "Schedule",
                       "The result of hmla's decode plan (dense or sparse): the split of the batch over "
                       "the SMs, kept in the metadata object's workspace.")
      .def_prop_ro("batch", [](const Schedule& s) { return s.s.batch; })
      .def_prop_ro("s_q", [](const Schedule& s) { return s.s.s_q; })
      .def_prop_ro("h_q", [](const Schedule& s) { return s.s.h_q; })
      .def_prop_ro("h_kv", [](const Schedule& s) { return s.s.h_kv; })
      .def_prop_ro("num_sm_parts", [](const Schedule& s) { return s.s.num_sm_parts; })
      .def_prop_ro("num_m_blocks", [](const Schedule& s) { return s.s.num_m_blocks; })
      .def_prop_ro("workspace_ptr", [](const Schedule& s) { return reinterpret_cast<uintptr_t>(s.s.workspace); })
      .def_prop_ro("workspace_bytes", [](const Schedule& s) { return s.s.workspace_bytes; })
      .def_prop_ro("device", [](const Schedule& s) { return s.device; })
      .def_prop_ro("sparse", [](const Schedule& s) { return s.sparse; })
      .def_prop_ro("topk", [](const Schedule& s) { return int_or_none(s.sparse, s.sparse_key.topk); })
      .def_prop_ro("extra_topk", [](const Schedule& s) {
        return int_or_none(s.sparse && s.sparse_key.extra, s.sparse_key.extra_topk);
      })
      .def("__repr__", [](const Schedule& s) {
        if (s.sparse)
          return "hmla.Schedule(sparse, " + describe_sparse_plan(s.s.batch, s.s.s_q, s.s.h_q, s.sparse_key) +
                 ", num_sm_parts=" + std::to_string(s.s.num_sm_parts) + ", device=" + std::to_string(s.device) + ")";
        return "hmla.Schedule(batch=" + std::to_string(s.s.batch) + ", s_q=" + std::to_string(s.s.s_q) +
               ", h_q=" + std::to_string(s.s.h_q) + ", h_kv=" + std::to_string(s.s.h_kv) +
               ", num_sm_parts=" + std::to_string(s.s.num_sm_parts) + ", device=" + std::to_string(s.device) + ")";
      });

  m.attr("_fast_call") = nb::capsule(&kFastCall, hmla_python::kFastCallCapsule);

  m.def("dense_decode_workspace_bytes", &workspace_bytes, nb::arg("batch"), nb::arg("s_q"), nb::arg("h_q"),
        nb::arg("h_kv"), nb::arg("device"), nb::arg("fn"));
  m.def("dense_decode_plan", &plan, nb::arg("cache_seqlens"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("h_kv"),
        nb::arg("workspace"), nb::arg("stream"), nb::arg("fn"));
  m.def("dense_decode_schedule", &schedule_of, nb::arg("workspace"), nb::arg("batch"), nb::arg("s_q"), nb::arg("h_q"),
        nb::arg("h_kv"), nb::arg("fn"));
  m.def(
      "_set_launch_replay", [](bool on) { return launch_replay_enabled().exchange(on); }, nb::arg("enabled"),
      "Turns the decode runs' graph replay (hmla/launch_replay.h) on or off; returns the previous setting.");
  m.def("dense_decode_run", &dense_run<nb::handle>, nb::arg("q"), nb::arg("k_cache"), nb::arg("block_table"),
        nb::arg("cache_seqlens"), nb::arg("out"), nb::arg("lse"), nb::arg("schedule"), nb::arg("softmax_scale"),
        nb::arg("causal"), nb::arg("stream"));
  m.def("check_dense_decode_args", &check_dense_args, nb::arg("q"), nb::arg("k_cache"), nb::arg("block_table"),
        nb::arg("cache_seqlens"), nb::arg("head_dim_v"), nb::arg("require_cuda"));
  m.def("check_sparse_decode_args", &check_sparse_decode_args, nb::arg("q"), nb::arg("k_cache"),
        nb::arg("indices"), nb::arg("topk_length").none(), nb::arg("attn_sink").none(),
        nb::arg("extra_k_cache").none(), nb::arg("extra_indices_in_kvcache").none(),
        nb::arg("extra_topk_length").none(), nb::arg("head_dim_v"), nb::arg("softmax_scale"),
        nb::arg("require_cuda"));
  m.def("sparse_decode_workspace_bytes", &sparse_workspace_bytes, nb::arg("batch"), nb::arg("s_q"), nb::arg("h_q"),
        nb::arg("device"), nb::arg("fn"));
  m.def("sparse_decode_plan", &sparse_plan, nb::arg("batch"), nb::arg("s_q"), nb::arg("h_q"), nb::arg("topk"),
        nb::arg("topk_length").none(), nb::arg("extra"), nb::arg("extra_topk"), nb::arg("extra_topk_length").none(),
        nb::arg("workspace"), nb::arg("stream"), nb::arg("fn"));
  m.def("sparse_decode_schedule", &sparse_schedule_of, nb::arg("workspace"), nb::arg("batch"), nb::arg("s_q"),
        nb::arg("h_q"), nb::arg("topk"), nb::arg("topk_length"), nb::arg("extra"), nb::arg("extra_topk"),
        nb::arg("extra_topk_length"), nb::arg("fn"));
  m.def("sparse_decode_run", &sparse_run<nb::handle>, nb::arg("q"), nb::arg("k_cache"), nb::arg("indices"),
        nb::arg("topk_length").none(), nb::arg("attn_sink").none(), nb::arg("extra_k_cache").none(),
        nb::arg("extra_indices_in_kvcache").none(), nb::arg("extra_topk_length").none(), nb::arg("out"),
        nb::arg("lse"), nb::arg("schedule"), nb::arg("softmax_scale"), nb::arg("stream"));
  m.def("check_sparse_prefill_args", &check_sparse_prefill_args, nb::arg("q"), nb::arg("kv"), nb::arg("indices"),
        nb::arg("d_v"), nb::arg("attn_sink").none(), nb::arg("topk_length").none(), nb::arg("indexer_topk"),
        nb::arg("cu_seqlens_q").none(), nb::arg("seq_kv_offset").none(), nb::arg("seq_kv_len").none(),
        nb::arg("require_cuda"));

  m.def("sparse_prefill_run", &sparse_prefill_run, nb::arg("q"), nb::arg("kv"), nb::arg("indices"),
        nb::arg("sm_scale"), nb::arg("d_v"), nb::arg("attn_sink").none(), nb::arg("topk_length").none(),
        nb::arg("indexer_topk"), nb::arg("cu_seqlens_q").none(), nb::arg("seq_kv_offset").none(),
        nb::arg("seq_kv_len").none(), nb::arg("out"), nb::arg("max_logits"), nb::arg("lse"),
        nb::arg("workspace").none(), nb::arg("stream"));
  m.def("sparse_prefill_workspace_bytes", &sparse_prefill_workspace_bytes, nb::arg("s_q"), nb::arg("h_q"),
        nb::arg("topk"), nb::arg("device"));

  m.def("merge_attention_states", &merge_states, nb::arg("outs"), nb::arg("lses"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("stream"));
  m.attr("MAX_MERGE_STATES") = hmla::kMaxMergeStates;

  m.def("pack_pages", &pack_pages, nb::arg("tokens"), nb::arg("pages"), nb::arg("layout"));
  m.def("unpack_pages", &unpack_pages, nb::arg("pages"), nb::arg("tokens"), nb::arg("layout"));
  m.def("float32_to_bf16", &float32_to_bf16, nb::arg("src"), nb::arg("dst"));
  m.def("sparse_token_bytes", [](int layout) { return hmla::reference::sparse_token_bytes(layout_of(layout)); });
  m.def("sparse_page_bytes", [](int layout, int page_size) {
    if (page_size < 1) throw nb::value_error("hmla: page_size must be >= 1");
    return hmla::reference::sparse_page_bytes(layout_of(layout), page_size);
  });
  m.def("sparse_cache_d_qk", [](int layout) { return hmla::reference::sparse_cache_d_qk(layout_of(layout)); });
  m.def("stream_synchronize", [](uintptr_t stream, int device) {
    DeviceGuard guard(device);
    cudaError_t err;
    {
      nb::gil_scoped_release release;
      err = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("hmla: cudaStreamSynchronize failed: ") + cudaGetErrorString(err));
    }
  }, nb::arg("stream"), nb::arg("device") = -1);
  m.def("cuda_device_count", []() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  });
  m.attr("DLPACK_CUDA") = kDLCUDA;
}
