// Host side of the sm90 dense decode kernel: the Q and K tensor maps, the kernel's parameters, the
// launch for the element type, then the combine of split requests.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/tensor_map.h"
#include "scheduler/decode_scheduler.h"
#include "sm90/dense_decode/config.h"
#include "sm90/dense_decode/launch.h"

namespace hmla::sm90::dense_decode {
namespace {

template <typename Element>
void launch_for(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  using Cfg = Config<Element>;
  using Native = typename NativeOf<Element>::type;
  const int heads_per_kv = params.h_q / params.h_kv;
  const detail::RowTiling tiling = detail::RowTiling::make(params.s_q, heads_per_kv);

  // Q as [batch][s_q][h_kv][heads_per_kv][576] so that one box is a tile of query rows.
  const uint64_t q_dims[5] = {static_cast<uint64_t>(Cfg::kHeadDim), static_cast<uint64_t>(heads_per_kv),
                              static_cast<uint64_t>(params.h_kv), static_cast<uint64_t>(params.s_q),
                              static_cast<uint64_t>(params.batch)};
  const uint64_t q_strides[4] = {static_cast<uint64_t>(params.q_head_stride) * 2,
                                 static_cast<uint64_t>(params.q_head_stride) * heads_per_kv * 2,
                                 static_cast<uint64_t>(params.q_token_stride) * 2,
                                 static_cast<uint64_t>(params.q_batch_stride) * 2};
  const uint32_t q_box[5] = {static_cast<uint32_t>(Cfg::kChunkCols), static_cast<uint32_t>(tiling.heads_per_tile), 1,
                             static_cast<uint32_t>(tiling.tokens_per_tile), 1};
  const CUtensorMap q_map = detail::make_tensor_map_16bit_sw128(params.q, 5, q_dims, q_strides, q_box, "q");

  // K cache as [num_blocks][page_size][h_kv][576].
  const uint64_t k_dims[4] = {static_cast<uint64_t>(Cfg::kHeadDim), static_cast<uint64_t>(params.h_kv),
                              static_cast<uint64_t>(params.page_size), static_cast<uint64_t>(params.num_blocks)};
  const uint64_t k_strides[3] = {static_cast<uint64_t>(params.k_head_stride) * 2,
                                 static_cast<uint64_t>(params.k_token_stride) * 2,
                                 static_cast<uint64_t>(params.k_block_stride) * 2};
  const uint32_t k_box[4] = {static_cast<uint32_t>(Cfg::kChunkCols), 1,
                             static_cast<uint32_t>(params.page_size < Cfg::kBlockN ? params.page_size : Cfg::kBlockN), 1};
  const CUtensorMap k_map = detail::make_tensor_map_16bit_sw128(params.k_cache, 4, k_dims, k_strides, k_box, "k_cache");

  KernelParams kp{};
  kp.batch = params.batch;
  kp.s_q = params.s_q;
  kp.h_kv = params.h_kv;
  kp.page_size = params.page_size;
  kp.max_keys = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(params.max_blocks_per_seq) * params.page_size,
                                                   std::numeric_limits<int32_t>::max()));
  kp.causal = params.causal && params.s_q > 1;
  const float scale = params.softmax_scale > 0.f ? params.softmax_scale : 1.f / std::sqrt(static_cast<float>(params.d_qk));
  kp.scale_log2 = scale * 1.4426950408889634f;
  kp.tiling = tiling;
  kp.seqlens = params.cache_seqlens;
  kp.block_table = params.block_table;
  kp.block_table_batch_stride = params.block_table_batch_stride;
  detail::set_schedule_and_outputs(kp, schedule, params);

  launch_kernel<Element>(q_map, k_map, kp, dim3(tiling.num_m_blocks, params.h_kv, schedule.num_sm_parts), stream);

  const detail::OutputView output{params.out, params.out_batch_stride, params.out_token_stride, params.out_head_stride,
                                  params.lse, params.lse_batch_stride, params.lse_head_stride};
  const detail::CombineParams cp =
      detail::combine_params(schedule, params.batch, 1, params.h_kv, tiling, output, nullptr);
  detail::launch_combine<Native>(cp, stream);
}

}  // namespace

void launch_bf16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  launch_for<cute::bfloat16_t>(params, schedule, stream);
}

void launch_fp16(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  launch_for<cute::half_t>(params, schedule, stream);
}

}  // namespace hmla::sm90::dense_decode
