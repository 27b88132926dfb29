// CPU reference of every hmla contract, straight from the definitions with float64 accumulation,
// plus the number formats and FP8 cache layouts the kernels read. Host-only; no CUDA needed.
//
// The attention functions take the same parameter structs as the kernels, with every pointer
// pointing to host memory. They write the outputs the contract names (rounded to the output type)
// and, when out_f32 is given, the unrounded output too, densely packed in the output's logical
// shape ([batch, s_q, h_q, d_v] for decode, [s_q, h_q, d_v] for prefill).
// Only cache rows the contract lets a query read are touched: NaN anywhere else never reaches an
// output, and out-of-range block-table entries or indices are never dereferenced.
// All arithmetic is float64 (softmax_scale 0 means 1/sqrt(d_qk) in float64). Invalid arguments, and
// the device-data caller guarantees (cache_seqlens range, page ids of the needed block-table
// entries, topk_length range), throw hmla::InvalidArgument before any output is written. A null
// out / lse / max_logits pointer skips that output.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hmla/merge.h"
#include "hmla/params.h"

namespace hmla::reference {

// ---- scalar number formats (round to nearest even; NaN stays NaN) ----
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);
float e4m3_to_float(uint8_t bits);   // OCP float8_e4m3fn: no infinities, 0x7f/0xff are NaN
uint8_t float_to_e4m3(float value);  // saturates to +-448
float ue8m0_to_float(uint8_t bits);  // 2^(bits - 127); 0xff is NaN
uint8_t float_to_ue8m0_ceil(float positive_scale);  // smallest power of two >= the value

// element of a bf16 or fp16 buffer as float
float load_half(DType dtype, const void* base, int64_t index);
void store_half(DType dtype, void* base, int64_t index, float value);

// ---- FP8 cache layouts ----
int sparse_cache_d_qk(SparseCacheLayout layout);          // 576 or 512
int sparse_cache_d_nope(SparseCacheLayout layout);        // 512 or 448
int64_t sparse_token_bytes(SparseCacheLayout layout);     // 656 or 584
int64_t sparse_page_bytes(SparseCacheLayout layout, int page_size);  // smallest legal page stride

// Quantises one token (d_qk bf16 values: NoPE then RoPE) into its slot of a page.
void pack_token(SparseCacheLayout layout, const uint16_t* token_bf16, uint8_t* page, int page_size,
                int offset_in_page);
// Dequantises one token's slot back to d_qk floats (NoPE values times their scale, RoPE as bf16).
void unpack_token(SparseCacheLayout layout, const uint8_t* page, int page_size, int offset_in_page,
                  float* token_out);

// ---- the three contracts ----
void dense_decode(const DenseDecodeParams& params, float* out_f32 = nullptr);
void sparse_decode(const SparseDecodeParams& params, float* out_f32 = nullptr);
void sparse_prefill(const SparsePrefillParams& params, float* out_f32 = nullptr);

// Merging partial attention results (hmla/merge.h), every pointer to host memory: per row, the
// states with a finite lse (a NaN one makes the row NaN), lse = log(sum_s exp(lse_s)) and
// out = sum_s exp(lse_s - lse) * out_s in float64; no such state: out 0, lse +inf. The output may be
// a state's own buffers (in place). out_f32 is [batch, s_q, h, d_v], densely packed.
void merge_attention_states(const MergeAttentionParams& params, float* out_f32 = nullptr);

// The float64 results before any rounding, for tests that check the reference itself. Every
// pointer is optional and densely packed: out in out_f32's shape, lse [batch, h_q, s_q] for the
// decodes and [s_q, h_q] for prefill, max_logits [s_q, h_q] (prefill only). The rounded outputs are
// these values rounded to float (out_f32, lse, max_logits) and then to the output type (out).
struct Float64Outputs {
  double* out = nullptr;
  double* lse = nullptr;
  double* max_logits = nullptr;
};
void dense_decode(const DenseDecodeParams& params, float* out_f32, const Float64Outputs& f64);
void sparse_decode(const SparseDecodeParams& params, float* out_f32, const Float64Outputs& f64);
void sparse_prefill(const SparsePrefillParams& params, float* out_f32, const Float64Outputs& f64);

}  // namespace hmla::reference
