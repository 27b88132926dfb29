// hmla._torch_fast: the eager PyTorch call of flash_mla_with_kvcache without DLPack and without
// PyTorch's Python binding for the outputs.
//
// Built only where PyTorch is installed at build time (python/CMakeLists.txt), against that
// PyTorch; the package falls back to the DLPack path when this module is missing or does not load
// (another PyTorch at run time). It reads each tensor's pointer, shape, strides, dtype and device
// in C++, allocates out and lse with ATen on q's device (PyTorch's caching allocator, as
// q.new_empty would), and calls hmla._C through its C function table (fast_call.h), which runs the
// same checks and the same library call as the DLPack path. A plain CPython module with vectorcall
// functions: the Python layer calls it once per attention call.
#include <ATen/ATen.h>
#include <Python.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fast_call.h"

namespace {

using hmla_python::RawArray;

const hmla_python::FastCall* g_fast_call = nullptr;

// DLPack's type codes (dlpack.h): int 0, uint 1, float 2, bfloat 4, float8_e4m3fn 10. A dtype
// hmla never takes keeps code 255 and is rejected by _C's checks with its bit width.
void set_dtype(const at::Tensor& t, RawArray& r) {
  r.dtype_bits = static_cast<uint8_t>(t.element_size() * 8);
  switch (t.scalar_type()) {
    case at::kBFloat16: r.dtype_code = 4; break;
    case at::kHalf:
    case at::kFloat:
    case at::kDouble: r.dtype_code = 2; break;
    case at::kInt:
    case at::kLong:
    case at::kChar:
    case at::kShort: r.dtype_code = 0; break;
    case at::kByte: r.dtype_code = 1; break;
    case at::kFloat8_e4m3fn: r.dtype_code = 10; break;
    default: r.dtype_code = 255; break;
  }
}

// Describes argument `name` (a torch.Tensor, or None when optional). Returns false with a
// TypeError set for anything else.
bool describe(PyObject* obj, const char* name, bool optional, RawArray& r, const RawArray*& ptr) {
  if (obj == Py_None && optional) {
    ptr = nullptr;
    return true;
  }
  if (!THPVariable_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "hmla.flash_mla_with_kvcache: argument '%s' has type %s, expected a torch.Tensor",
                 name, Py_TYPE(obj)->tp_name);
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.dim() > hmla_python::kMaxRawDims) {
    PyErr_Format(PyExc_ValueError, "hmla.flash_mla_with_kvcache: argument '%s' has %d dimensions", name,
                 static_cast<int>(t.dim()));
    return false;
  }
  r.data = t.data_ptr();
  r.ndim = static_cast<int32_t>(t.dim());
  for (int i = 0; i < r.ndim; ++i) {
    r.shape[i] = t.size(i);
    r.strides[i] = t.stride(i);
  }
  set_dtype(t, r);
  // DLPack: kDLCPU 1, kDLCUDA 2.
  r.device_type = t.is_cuda() ? 2 : 1;
  r.device_id = t.is_cuda() ? t.get_device() : 0;
  ptr = &r;
  return true;
}

bool to_stream(PyObject* obj, uintptr_t& stream) {
  stream = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(obj));
  return !(stream == static_cast<uintptr_t>(-1) && PyErr_Occurred());
}

// out [batch, s_q, h_q, 512] in `dtype` and lse [batch, h_q, s_q] float32 on q's device, described
// into the last two slots; returns the (out, lse) tuple to hand back, or null with an error set.
PyObject* allocate_outputs(const at::Tensor& q, at::ScalarType dtype, RawArray* out_raw, RawArray* lse_raw,
                           const RawArray** slots) {
  if (q.dim() != 4) {
    PyErr_Format(PyExc_ValueError,
                 "hmla.flash_mla_with_kvcache: argument 'q' has %d dimensions, expected 4 [batch, s_q, h_q, head_dim]",
                 static_cast<int>(q.dim()));
    return nullptr;
  }
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  at::Tensor out = at::empty({b, s_q, h_q, 512}, q.options().dtype(dtype));
  at::Tensor lse = at::empty({b, h_q, s_q}, q.options().dtype(at::kFloat));
  PyObject* out_obj = THPVariable_Wrap(out);
  PyObject* lse_obj = THPVariable_Wrap(lse);
  if (out_obj == nullptr || lse_obj == nullptr) {
    Py_XDECREF(out_obj);
    Py_XDECREF(lse_obj);
    return nullptr;
  }
  PyObject* result = PyTuple_Pack(2, out_obj, lse_obj);
  Py_DECREF(out_obj);
  Py_DECREF(lse_obj);
  if (result == nullptr) return nullptr;
  const RawArray* unused = nullptr;
  describe(PyTuple_GET_ITEM(result, 0), "out", false, *out_raw, unused);
  describe(PyTuple_GET_ITEM(result, 1), "lse", false, *lse_raw, unused);
  slots[0] = out_raw;
  slots[1] = lse_raw;
  return result;
}

// The dense run of both entry points: inputs = (q, k_cache, block_table, cache_seqlens); returns
// (out, lse) or null with an error set.
PyObject* run_dense(PyObject* const* inputs, PyObject* schedule, double scale, int causal, uintptr_t stream) {
  static const char* const names[] = {"q", "k_cache", "block_table", "cache_seqlens"};
  RawArray raw[6];
  const RawArray* slots[6] = {};
  for (int i = 0; i < 4; ++i)
    if (!describe(inputs[i], names[i], false, raw[i], slots[i])) return nullptr;
  const at::Tensor& q = THPVariable_Unpack(inputs[0]);
  PyObject* result = allocate_outputs(q, q.scalar_type(), &raw[4], &raw[5], &slots[4]);
  if (result == nullptr) return nullptr;
  if (g_fast_call->dense_decode_run(slots, schedule, scale, causal, stream) != 0) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

// dense_decode(q, k_cache, block_table, cache_seqlens, schedule, softmax_scale, causal, stream)
PyObject* dense_decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "hmla._torch_fast.dense_decode takes 8 arguments");
    return nullptr;
  }
  const double scale = PyFloat_AsDouble(args[5]);
  if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  const int causal = PyObject_IsTrue(args[6]);
  if (causal < 0) return nullptr;
  uintptr_t stream = 0;
  if (!to_stream(args[7], stream)) return nullptr;
  return run_dense(args, args[4], scale, causal, stream);
}

bool key_int_is(PyObject* key, Py_ssize_t i, int64_t value) {
  const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(key, i));
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return v == value;
}

// dense_decode_planned(q, k_cache, block_table, cache_seqlens, schedule, key, softmax_scale, causal,
//                      head_dim_v) -> (out, lse), or None when this call is not one the metadata object
// was set up for: an argument that is not exactly a torch.Tensor, another shape, causal or
// head_dim_v than `key` records, which is hmla._interface's dense key (b, s_q, h_q, page_block_size,
// h_kv, causal, head_dim_v). The Python layer then takes its checked path (it plans, or names the
// mismatch). What this compares is what that path compares before it runs a planned call; the
// stream is q's device's current one, the default scale d_qk ** -0.5 as Python computes it.
PyObject* dense_decode_planned(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "hmla._torch_fast.dense_decode_planned takes 9 arguments");
    return nullptr;
  }
  PyObject* key = args[5];
  for (int i = 0; i < 4; ++i)
    if (!THPVariable_CheckExact(args[i])) Py_RETURN_NONE;
  if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 7) Py_RETURN_NONE;
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  const at::Tensor& k = THPVariable_Unpack(args[1]);
  if (q.dim() != 4 || k.dim() != 4 || !q.is_cuda()) Py_RETURN_NONE;
  const int causal = PyObject_IsTrue(args[7]);
  if (causal < 0) return nullptr;
  const int planned_causal = PyObject_IsTrue(PyTuple_GET_ITEM(key, 5));
  if (planned_causal < 0) return nullptr;
  const int same_head_dim_v = PyObject_RichCompareBool(PyTuple_GET_ITEM(key, 6), args[8], Py_EQ);
  if (same_head_dim_v < 0) return nullptr;
  if (!key_int_is(key, 0, q.size(0)) || !key_int_is(key, 1, q.size(1)) || !key_int_is(key, 2, q.size(2)) ||
      !key_int_is(key, 3, k.size(1)) || !key_int_is(key, 4, k.size(2)) || causal != planned_causal ||
      same_head_dim_v != 1)
    Py_RETURN_NONE;
  double scale = 0.0;
  if (args[6] == Py_None) {
    scale = std::pow(static_cast<double>(q.size(3)), -0.5);
  } else {
    scale = PyFloat_AsDouble(args[6]);
    if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  }
  const uintptr_t stream = reinterpret_cast<uintptr_t>(c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  return run_dense(args, args[4], scale, causal, stream);
}

// sparse_decode(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache,
//               extra_topk_length, schedule, softmax_scale, stream)
PyObject* sparse_decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 11) {
    PyErr_SetString(PyExc_TypeError, "hmla._torch_fast.sparse_decode takes 11 arguments");
    return nullptr;
  }
  static const char* const names[] = {"q",         "k_cache",       "indices",
                                      "topk_length", "attn_sink",   "extra_k_cache",
                                      "extra_indices_in_kvcache", "extra_topk_length"};
  RawArray raw[10];
  const RawArray* slots[10] = {};
  for (int i = 0; i < 8; ++i)
    if (!describe(args[i], names[i], i >= 3, raw[i], slots[i])) return nullptr;
  const double scale = PyFloat_AsDouble(args[9]);
  if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  uintptr_t stream = 0;
  if (!to_stream(args[10], stream)) return nullptr;
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  PyObject* result = allocate_outputs(q, at::kBFloat16, &raw[8], &raw[9], &slots[8]);
  if (result == nullptr) return nullptr;
  if (g_fast_call->sparse_decode_run(slots, args[8], scale, stream) != 0) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

// _host_timings(q, n) -> dict: host microseconds per call of the pieces of a fast call on this
// machine (median-free: the mean over n calls), for python/tests/bench_overhead.py.
PyObject* host_timings(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !THPVariable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "hmla._torch_fast._host_timings(q: torch.Tensor, n: int)");
    return nullptr;
  }
  const at::Tensor& q = THPVariable_Unpack(args[0]);
  const long n = PyLong_AsLong(args[1]);
  if (n <= 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "n must be >= 1");
    return nullptr;
  }
  auto time_us = [n](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) f();
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(n);
  };
  const at::Tensor out = at::empty({1, 1, 16, 512}, q.options());
  PyObject* dict = PyDict_New();
  if (dict == nullptr) return nullptr;
  auto put = [&](const char* key, double us) {
    PyObject* v = PyFloat_FromDouble(us);
    if (v == nullptr) return false;
    const int rc = PyDict_SetItemString(dict, key, v);
    Py_DECREF(v);
    return rc == 0;
  };
  RawArray raw;
  const RawArray* ptr = nullptr;
  const bool ok =
      put("at_empty_out", time_us([&] { at::empty({1, 1, 16, 512}, q.options()); })) &&
      put("at_empty_lse_f32", time_us([&] { at::empty({1, 16, 1}, q.options().dtype(at::kFloat)); })) &&
      put("wrap_tensor", time_us([&] { Py_DECREF(THPVariable_Wrap(out)); })) &&
      put("describe_tensor", time_us([&] { describe(args[0], "q", false, raw, ptr); }));
  if (!ok) {
    Py_DECREF(dict);
    return nullptr;
  }
  return dict;
}

PyMethodDef methods[] = {
    {"dense_decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&dense_decode)), METH_FASTCALL,
     "dense_decode(q, k_cache, block_table, cache_seqlens, schedule, softmax_scale, causal, stream) -> (out, lse)"},
    {"dense_decode_planned", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&dense_decode_planned)),
     METH_FASTCALL,
     "dense_decode_planned(q, k_cache, block_table, cache_seqlens, schedule, key, softmax_scale, causal, head_dim_v) "
     "-> (out, lse) or None"},
    {"sparse_decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&sparse_decode)), METH_FASTCALL,
     "sparse_decode(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache, "
     "extra_topk_length, schedule, softmax_scale, stream) -> (out, lse)"},
    {"_host_timings", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&host_timings)), METH_FASTCALL,
     "_host_timings(q, n) -> dict of host microseconds per piece of a fast call (bench_overhead.py)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_fast",
                      "hmla's eager PyTorch path (C++: tensor metadata, ATen outputs, hmla._C's checks and run).", -1,
                      methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast() {
  PyObject* c_module = PyImport_ImportModule("hmla._C");
  if (c_module == nullptr) return nullptr;
  PyObject* capsule = PyObject_GetAttrString(c_module, "_fast_call");
  Py_DECREF(c_module);
  if (capsule == nullptr) return nullptr;
  g_fast_call = static_cast<const hmla_python::FastCall*>(PyCapsule_GetPointer(capsule, hmla_python::kFastCallCapsule));
  Py_DECREF(capsule);
  if (g_fast_call == nullptr) return nullptr;
  if (g_fast_call->version != hmla_python::kFastCallVersion) {
    PyErr_Format(PyExc_ImportError, "hmla._torch_fast: hmla._C offers fast-call version %u, this module needs %u",
                 g_fast_call->version, hmla_python::kFastCallVersion);
    return nullptr;
  }
  return PyModule_Create(&module);
}
