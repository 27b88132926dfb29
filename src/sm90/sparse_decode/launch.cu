// Host side of the sm90 sparse decode kernel: the Q tensor map, the kernel's parameters, the
// launch for the layout, then the combine of split requests (with the attention sink).
#include <cuda_bf16.h>

#include <cmath>

#include "common/cuda_check.h"
#include "common/device_attributes.h"
#include "common/tensor_map.h"
#include "scheduler/decode_scheduler.h"
#include "sm90/sparse_decode/launch.h"

namespace hmla::sm90::sparse_decode {
namespace {

constexpr int kBlockM = 64;

SparseCacheView view_of(const SparseKVCache& c) {
  SparseCacheView v{};
  v.data = c.data;
  v.num_slots = static_cast<int64_t>(c.num_blocks) * c.page_size;
  v.page_size = c.page_size > 0 ? c.page_size : 1;
  v.page_shift = (v.page_size & (v.page_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(v.page_size)) : -1;
  v.block_stride_bytes = c.block_stride_bytes;
  return v;
}

}  // namespace

CUtensorMap q_map_and_fields(const void* q, int d_qk, int h_q, int s_q, int batch, int64_t head_stride,
                             int64_t token_stride, int64_t batch_stride, float softmax_scale, KernelParams& kp) {
  const int box_rows = h_q < kBlockM ? h_q : kBlockM;
  // Q as [batch][s_q][h_q][d_qk]: one box is 64 columns of one tile of heads of one query token.
  const uint64_t q_dims[4] = {static_cast<uint64_t>(d_qk), static_cast<uint64_t>(h_q), static_cast<uint64_t>(s_q),
                              static_cast<uint64_t>(batch)};
  const uint64_t q_strides[3] = {static_cast<uint64_t>(head_stride) * 2, static_cast<uint64_t>(token_stride) * 2,
                                 static_cast<uint64_t>(batch_stride) * 2};
  const uint32_t q_box[4] = {64, static_cast<uint32_t>(box_rows), 1, 1};
  kp.h_q = h_q;
  const float scale = softmax_scale > 0.f ? softmax_scale : 1.f / std::sqrt(static_cast<float>(d_qk));
  kp.scale_log2 = scale * 1.4426950408889634f;
  kp.q_box_rows = box_rows;
  kp.q_tile_bytes = static_cast<uint32_t>((d_qk / 64) * 64 * box_rows * 2);
  return detail::make_tensor_map_16bit_sw128(q, 4, q_dims, q_strides, q_box, "q");
}

void launch(const SparseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  const bool has_extra = params.extra_cache.data != nullptr;
  KernelParams kp{};
  kp.requests = params.batch * params.s_q;
  kp.s_q = params.s_q;
  const CUtensorMap q_map =
      q_map_and_fields(params.q, params.d_qk, params.h_q, params.s_q, params.batch, params.q_head_stride,
                       params.q_token_stride, params.q_batch_stride, params.softmax_scale, kp);
  kp.work.tokens_per_batch = params.s_q;
  kp.work.topk = params.topk;
  kp.work.topk_length = params.topk_length;
  kp.work.extra_topk = has_extra ? params.extra_topk : 0;
  kp.work.extra_topk_length = has_extra ? params.extra_topk_length : nullptr;
  kp.cache = view_of(params.cache);
  kp.indices = params.indices;
  kp.indices_batch_stride = params.indices_batch_stride;
  kp.indices_token_stride = params.indices_token_stride;
  kp.extra_cache = has_extra ? view_of(params.extra_cache) : SparseCacheView{};
  kp.extra_indices = has_extra ? params.extra_indices : nullptr;
  kp.extra_indices_batch_stride = params.extra_indices_batch_stride;
  kp.extra_indices_token_stride = params.extra_indices_token_stride;
  kp.attn_sink = params.attn_sink;
  detail::set_schedule_and_outputs(kp, schedule, params);
  kp.rows_per_slot = static_cast<size_t>(schedule.num_m_blocks) * kBlockM;

  // Up to 32 heads take the narrow form (heads as wgmma's N, two producer warpgroups): at those
  // head counts the gather sets the pace, and the 64-row form computes 2-64x the FLOPs it needs.
  const bool v32 = params.layout == SparseCacheLayout::kV32;
  const int parts = schedule.num_sm_parts;
  if (params.h_q <= 16) {
    if (v32) launch_narrow_kernel<SparseCacheLayout::kV32, 16>(q_map, kp, parts, stream);
    else launch_narrow_kernel<SparseCacheLayout::kModel1, 16>(q_map, kp, parts, stream);
  } else if (params.h_q <= 32) {
    if (v32) launch_narrow_kernel<SparseCacheLayout::kV32, 32>(q_map, kp, parts, stream);
    else launch_narrow_kernel<SparseCacheLayout::kModel1, 32>(q_map, kp, parts, stream);
  } else if (v32) {
    launch_kernel<SparseCacheLayout::kV32>(q_map, kp, schedule.num_m_blocks, parts, stream);
  } else {
    launch_kernel<SparseCacheLayout::kModel1>(q_map, kp, schedule.num_m_blocks, parts, stream);
  }
  HMLA_CUDA_CHECK(cudaGetLastError());

  const detail::OutputView output{params.out, params.out_batch_stride, params.out_token_stride, params.out_head_stride,
                                  params.lse, params.lse_batch_stride, params.lse_head_stride};
  const detail::CombineParams cp = detail::combine_params(schedule, kp.requests, params.s_q, 1,
                                                          detail::RowTiling::make(1, params.h_q), output, params.attn_sink);
  detail::launch_combine<__nv_bfloat16>(cp, stream);
}

}  // namespace hmla::sm90::sparse_decode
