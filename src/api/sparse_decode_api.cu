// Host side of sparse decode: workspace sizing, the plan (scheduler launch over the per-request
// work of both index lists) and the run (validation, then the kernel for the layout).
#include <cuda_runtime_api.h>

#include <string>

#include "api/validate.h"
#include "common/device_attributes.h"
#include "common/launch_replay.h"
#include "hmla/sparse_decode.h"
#include "scheduler/decode_schedule.h"
#include "scheduler/decode_scheduler.h"
#include "sm90/sparse_decode/launch.h"

namespace hmla {
namespace {

// Every query token is a request of its own (its index lists are its own); its heads are cut into
// tiles of 64 rows, each with its own persistent CTAs.
struct SparseScheduleShape {
  int requests;
  int num_m_blocks;
  int num_sm_parts;
  detail::WorkspaceLayout layout;
};

SparseScheduleShape sparse_schedule_shape(int batch, int s_q, int h_q, int num_sms) {
  SparseScheduleShape shape{};
  shape.requests = batch * s_q;
  shape.num_m_blocks = (h_q + detail::kTileRows - 1) / detail::kTileRows;
  shape.num_sm_parts = detail::num_sm_parts_for(num_sms, 1, shape.num_m_blocks);
  shape.layout = detail::WorkspaceLayout::make(shape.requests, shape.num_sm_parts, 1, shape.num_m_blocks, 512);
  return shape;
}

detail::DecodeWork work_of(const SparseDecodeParams& p) {
  detail::DecodeWork work{};
  work.tokens_per_batch = p.s_q;
  work.topk = p.topk;
  work.topk_length = p.topk_length;
  const bool has_extra = p.extra_cache.data != nullptr;
  work.extra_topk = has_extra ? p.extra_topk : 0;
  work.extra_topk_length = has_extra ? p.extra_topk_length : nullptr;
  return work;
}


}  // namespace

size_t sparse_decode_workspace_bytes(int batch, int s_q, int h_q, int num_sms) {
  const char* where = "hmla::sparse_decode_workspace_bytes";
  detail::validate_sparse_plan_shape(where, batch, s_q, h_q);
  return sparse_schedule_shape(batch, s_q, h_q, detail::resolve_num_sms(where, num_sms)).layout.total;
}

DecodeSchedule sparse_decode_schedule(int batch, int s_q, int h_q, void* workspace, size_t workspace_bytes,
                                      int num_sms) {
  const char* where = "hmla::sparse_decode_schedule";
  detail::validate_sparse_plan_shape(where, batch, s_q, h_q);
  const SparseScheduleShape shape = sparse_schedule_shape(batch, s_q, h_q, detail::resolve_num_sms(where, num_sms));
  detail::validate_workspace(where, workspace, workspace_bytes, shape.layout.total,
                             "sparse_decode_workspace_bytes for batch " + std::to_string(batch) + ", s_q " +
                                 std::to_string(s_q) + ", h_q " + std::to_string(h_q));
  return detail::schedule_in_workspace(batch, s_q, h_q, 1, shape.num_sm_parts, shape.num_m_blocks, workspace,
                                       workspace_bytes, shape.layout);
}

DecodeSchedule sparse_decode_plan(const SparseDecodeParams& params, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream, int num_sms) {
  const char* where = "hmla::sparse_decode_plan";
  detail::validate_sparse_plan_shape(where, params.batch, params.s_q, params.h_q);
  num_sms = detail::resolve_num_sms(where, num_sms);
  const SparseScheduleShape shape = sparse_schedule_shape(params.batch, params.s_q, params.h_q, num_sms);
  detail::validate_sparse_plan_args(params, workspace, workspace_bytes, shape.layout.total);
  const DecodeSchedule s =
      sparse_decode_schedule(params.batch, params.s_q, params.h_q, workspace, workspace_bytes, num_sms);
  detail::launch_decode_scheduler(work_of(params), shape.requests, shape.num_sm_parts, workspace, shape.layout,
                                  stream);
  return s;
}

void sparse_decode_run(const SparseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream) {
  validate(params);
  detail::check_schedule_matches("hmla::sparse_decode_run", "hmla::sparse_decode_plan", schedule, params.batch,
                                 params.s_q, params.h_q, 1);
  sm90::sparse_decode::launch(params, schedule, stream);
}

void sparse_decode_run(const SparseDecodeParams& params, const DecodeSchedule& schedule, cudaStream_t stream,
                       LaunchReplay& replay) {
  detail::ReplayedRun run(replay, stream);
  sparse_decode_run(params, schedule, stream);
  run.submit();
}

}  // namespace hmla
