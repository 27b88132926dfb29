// The C interface between hmla._C and hmla._torch_fast (python/src/torch_fast_path.cpp).
//
// An eager PyTorch call spends most of its host time outside the kernels: a DLPack capsule per
// tensor, each output allocated through PyTorch's Python binding (docs/PYTHON.md, "Measured
// overhead"). hmla._torch_fast, built only where PyTorch is installed at build time, reads tensor
// metadata in C++, allocates the outputs with ATen and hands everything to hmla._C through the
// function table below (a PyCapsule named kFastCallCapsule, attribute `_fast_call` of hmla._C).
// hmla._C runs the same checks and the same library call as for DLPack arguments, so both paths
// accept and reject the same inputs with the same messages. The library is linked once, into _C.
#pragma once

#include <Python.h>

#include <cstdint>

namespace hmla_python {

// An array's metadata as DLPack describes it (element strides, DLPack type and device codes).
struct RawArray {
  void* data = nullptr;
  int32_t ndim = 0;
  int64_t shape[8] = {};
  int64_t strides[8] = {};
  uint8_t dtype_code = 0;
  uint8_t dtype_bits = 0;
  int32_t device_type = 0;
  int32_t device_id = 0;
};

constexpr int kMaxRawDims = 8;
constexpr uint32_t kFastCallVersion = 1;
constexpr const char* kFastCallCapsule = "hmla._C._fast_call";

// Each function returns 0, or -1 with a Python exception set (TypeError / ValueError naming the
// argument, RuntimeError for CUDA errors). `schedule` is the hmla._C.Schedule of the metadata
// object; `stream` a cudaStream_t. A null RawArray pointer is an argument that is None.
struct FastCall {
  uint32_t version;
  // arrays: q, k_cache, block_table, cache_seqlens, out, lse
  int (*dense_decode_run)(const RawArray* const* arrays, PyObject* schedule, double softmax_scale, int causal,
                          uintptr_t stream);
  // arrays: q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices_in_kvcache,
  // extra_topk_length, out, lse
  int (*sparse_decode_run)(const RawArray* const* arrays, PyObject* schedule, double softmax_scale,
                           uintptr_t stream);
};

}  // namespace hmla_python
