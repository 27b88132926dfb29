// Host side of dense decode: workspace sizing, the plan (scheduler launch) and the run (validation,
// then dispatch to the kernel for the element type).
#include <cuda_runtime_api.h>

#include <string>

#include "api/validate.h"
#include "common/cuda_check.h"
#include "common/device_attributes.h"
#include "common/launch_replay.h"
#include "hmla/dense_decode.h"
#include "scheduler/decode_schedule.h"
#include "scheduler/decode_scheduler.h"
#include "sm90/dense_decode/launch.h"

namespace hmla {
namespace {

struct ScheduleShape {
  detail::RowTiling tiling;
  int num_sm_parts;
  detail::WorkspaceLayout layout;
};

ScheduleShape schedule_shape(int batch, int s_q, int h_q, int h_kv, int num_sms) {
  ScheduleShape shape{};
  shape.tiling = detail::RowTiling::make(s_q, h_q / h_kv);
  shape.num_sm_parts = detail::num_sm_parts_for(num_sms, h_kv, shape.tiling.num_m_blocks);
  shape.layout = detail::WorkspaceLayout::make(batch, shape.num_sm_parts, h_kv, shape.tiling.num_m_blocks, 512);
  return shape;
}


}  // namespace

size_t dense_decode_workspace_bytes(int batch, int s_q, int h_q, int h_kv, int num_sms) {
  const char* where = "hmla::dense_decode_workspace_bytes";
  detail::validate_plan_shape(where, batch, s_q, h_q, h_kv);
  return schedule_shape(batch, s_q, h_q, h_kv, detail::resolve_num_sms(where, num_sms)).layout.total;
}

DecodeSchedule dense_decode_schedule(int batch, int s_q, int h_q, int h_kv, void* workspace, size_t workspace_bytes,
                                     int num_sms) {
  const char* where = "hmla::dense_decode_schedule";
  detail::validate_plan_shape(where, batch, s_q, h_q, h_kv);
  const ScheduleShape shape = schedule_shape(batch, s_q, h_q, h_kv, detail::resolve_num_sms(where, num_sms));
  detail::validate_workspace(where, workspace, workspace_bytes, shape.layout.total,
                             "dense_decode_workspace_bytes for batch " + std::to_string(batch) + ", s_q " +
                                 std::to_string(s_q) + ", h_q " + std::to_string(h_q) + ", h_kv " +
                                 std::to_string(h_kv));
  return detail::schedule_in_workspace(batch, s_q, h_q, h_kv, shape.num_sm_parts, shape.tiling.num_m_blocks,
                                       workspace, workspace_bytes, shape.layout);
}

DecodeSchedule dense_decode_plan(const int32_t* cache_seqlens, int batch, int s_q, int h_q, int h_kv,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream, int num_sms) {
  detail::validate_plan_shape("hmla::dense_decode_plan", batch, s_q, h_q, h_kv);
  num_sms = detail::resolve_num_sms("hmla::dense_decode_plan", num_sms);
  const ScheduleShape shape = schedule_shape(batch, s_q, h_q, h_kv, num_sms);
  detail::validate_plan_args(cache_seqlens, batch, s_q, h_q, h_kv, workspace, workspace_bytes,
                             shape.layout.total);
  const DecodeSchedule s = dense_decode_schedule(batch, s_q, h_q, h_kv, workspace, workspace_bytes, num_sms);
  detail::DecodeWork work{};
  work.seqlens = cache_seqlens;
  detail::launch_decode_scheduler(work, batch, shape.num_sm_parts, workspace, shape.layout, stream);
  return s;
}

void dense_decode_run(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  validate(params);
  detail::check_schedule_matches("hmla::dense_decode_run", "hmla::dense_decode_plan", schedule, params.batch,
                                 params.s_q, params.h_q, params.h_kv);
  switch (params.dtype) {
    case DType::kBF16: sm90::dense_decode::launch_bf16(params, schedule, stream); break;
    case DType::kFP16: sm90::dense_decode::launch_fp16(params, schedule, stream); break;
  }
}

void dense_decode_run(const DenseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream,
                      LaunchReplay& replay) {
  detail::ReplayedRun run(replay, stream);
  dense_decode_run(params, schedule, stream);
  run.submit();
}

}  // namespace hmla
