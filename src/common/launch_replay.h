// The scope of one run entry point's launches with a hmla::LaunchReplay (hmla/launch_replay.h): the
// kernels the run launches on this thread are held (common/launch.h, RecordedLaunches) and, at
// submit(), set into the stream's instantiated graph and replayed, or launched directly when the
// stream is being captured or the replay fails.
#pragma once

#include <cuda_runtime_api.h>

#include "common/launch.h"
#include "hmla/launch_replay.h"

namespace hmla::detail {

class ReplayedRun {
 public:
  ReplayedRun(LaunchReplay& replay, cudaStream_t stream);
  // Stops recording; launches held and not submitted are dropped (the run threw before submit).
  ~ReplayedRun();
  ReplayedRun(const ReplayedRun&) = delete;
  ReplayedRun& operator=(const ReplayedRun&) = delete;

  void submit();

 private:
  LaunchReplay::Graphs* graphs_;
  RecordedLaunches launches_;
  RecordedLaunches* previous_;
};

}  // namespace hmla::detail
