// The split-KV schedule shared by every decode family (dense and token-sparse): what a plan call
// wrote into the caller's workspace, and where. A plain value that can be copied and kept with the
// workspace; the views' layout is internal to hmla.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hmla {

struct DecodeSchedule {
  int batch = 0;
  int s_q = 0;
  int h_q = 0;
  int h_kv = 0;
  int num_sm_parts = 0;  // persistent CTAs per (kv head, query tile)
  int num_m_blocks = 0;  // query tiles of 64 rows per kv head
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Views into the workspace (device pointers).
  int32_t* tile_metadata = nullptr;  // [num_sm_parts, 8]: each persistent CTA's work range
  int32_t* num_splits = nullptr;     // [requests]: pieces each request was cut into (1: not split)
  int32_t* split_base = nullptr;     // [requests]: first partial-result slot of a split request
  int32_t* split_list = nullptr;     // [1 + num_sm_parts]: count, then the split requests
  float* lse_accum = nullptr;        // partial LSEs of split requests
  void* o_accum = nullptr;           // partial outputs of split requests, in the output dtype
};

}  // namespace hmla
