// A decode call's kernels are launched with programmatic dependent launch (PDL), and engines launch
// the kernels after an attention call (an output projection, the next layer's kernels) the same way:
// such a kernel may start while the call still runs, and once it has waited for its prerequisites
// (griddepcontrol.wait) it must see the call's finished out and lse. That wait covers the grid just
// before it only, the combine, so the combine's grid must not complete before the attention kernel's.
// The cases split no request: the combine has nothing to merge there. When all of its CTAs retired
// at once, its grid completed before the attention kernel's, and in hmla-bench's loop of calls the
// next call's attention kernel passed its wait 109-124 us before the previous one ended (H100;
// docs/PERF.md, "The combine's grid and the kernel after it").
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "common/launch.h"
#include "scheduler/decode_scheduler.h"
#include "dense_decode_cases.h"
#include "dense_decode_harness.h"
#include "gpu_test_util.h"
#include "sparse_decode_cases.h"
#include "sparse_decode_harness.h"

namespace hmla_test {
namespace {

__global__ void copy_after_prerequisites(const uint8_t* out, uint8_t* out_copy, size_t out_bytes, const uint8_t* lse,
                                         uint8_t* lse_copy, size_t lse_bytes) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < out_bytes; i += stride)
    out_copy[i] = out[i];
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < lse_bytes; i += stride)
    lse_copy[i] = lse[i];
}

__device__ void spin_for(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Holds the stream for `ns` of the global timer, so that everything enqueued behind it is queued
// before the GPU reaches it, as in a decoding step that the host enqueues ahead of the GPU.
__global__ void hold_stream(unsigned long long ns) { spin_for(ns); }

// Stands in for an attention kernel of a call: lets its dependents launch at its start (as the
// attention kernels do), runs `ns` of the global timer after its own wait, then writes 1 into
// every lse value.
__global__ void attention_stand_in(float* lse, size_t lse_values, unsigned long long ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  spin_for(ns);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < lse_values; i += stride)
    lse[i] = 1.f;
}

// Spare out and lse allocations holding what the problem's hold after poison_outputs(), and a copy
// of each that a kernel launched with programmatic dependent launch takes, as an engine's next kernel.
struct SpareOutputs {
  DeviceBuffer out, lse, out_copy, lse_copy;
  SpareOutputs(const DeviceBuffer& poisoned_out, const DeviceBuffer& poisoned_lse)
      : out(poisoned_out.bytes()), lse(poisoned_lse.bytes()), out_copy(poisoned_out.bytes()),
        lse_copy(poisoned_lse.bytes()) {
    HMLA_TEST_CUDA_CHECK(cudaMemcpy(out.get(), poisoned_out.get(), out.bytes(), cudaMemcpyDeviceToDevice));
    HMLA_TEST_CUDA_CHECK(cudaMemcpy(lse.get(), poisoned_lse.get(), lse.bytes(), cudaMemcpyDeviceToDevice));
  }
  // The spare allocations' pointer at the offset `at` has in `of`.
  template <typename T>
  static T* same_offset(const DeviceBuffer& spare, const DeviceBuffer& of, const void* at) {
    return reinterpret_cast<T*>(spare.as<uint8_t>() + (static_cast<const uint8_t*>(at) - of.as<const uint8_t>()));
  }

  // Launched as hmla launches its own kernels after their prerequisites (common/launch.h).
  void launch_copy(cudaStream_t stream) const {
    hmla::detail::runtime_launch_after_prerequisites(copy_after_prerequisites, dim3(264), dim3(256), 0, stream,
                                                     out.as<const uint8_t>(), out_copy.as<uint8_t>(), out.bytes(),
                                                     lse.as<const uint8_t>(), lse_copy.as<uint8_t>(), lse.bytes());
  }
  Outputs download_copies() const {
    HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
    Outputs o;
    o.out.resize(out_copy.bytes() / sizeof(uint16_t));
    o.lse.resize(lse_copy.bytes() / sizeof(float));
    out_copy.download(o.out.data(), o.out.size() * sizeof(uint16_t));
    lse_copy.download(o.lse.data(), o.lse.size() * sizeof(float));
    return o;
  }
};

int split_requests(const hmla::DecodeSchedule& schedule) {
  int count = -1;
  HMLA_TEST_CUDA_CHECK(cudaMemcpy(&count, schedule.split_list, sizeof count, cudaMemcpyDeviceToHost));
  return count;
}

// Plans and runs the problem, then, behind a kernel that holds the stream for 2 ms (so that the rest
// is queued before the GPU reaches it), runs its plan `kChained` more times back to back (engines run
// one plan for every layer), the last into spare outputs, then the copy kernel, with no host
// synchronisation; the copies must equal the first run's outputs. A queued chain, not one call: in
// the timelines measured, a call's kernels overlapped the call before it only when they were queued
// ahead and that call's attention kernel did not directly follow an ordinary launch (a plan).
template <typename Problem, typename Schedule, typename Run>
void expect_copy_after_chained_runs_sees_outputs(Problem& p, const Schedule& schedule_of, const Run& run) {
  constexpr int kChained = 4;
  Stream s;
  ASSERT_TRUE(p.plan_and_run(s.get()));
  const Outputs expected = p.download();
  ASSERT_EQ(split_requests(schedule_of()), 0) << "the case must split no request";
  p.poison_outputs();
  SpareOutputs spare(p.out_buffer(), p.lse_buffer());
  ASSERT_TRUE(p.plan_and_run(s.get(), [&](cudaStream_t stream) {
    const hmla::DecodeSchedule schedule = schedule_of();
    hold_stream<<<1, 1, 0, stream>>>(2000000ull);
    for (int i = 0; i < kChained; ++i) run(schedule, i + 1 < kChained ? nullptr : &spare, stream);
    spare.launch_copy(stream);
  }));
  std::string where;
  EXPECT_TRUE(outputs_bitwise_equal(expected, spare.download_copies(), &where))
      << "a kernel launched with programmatic dependent launch after the runs saw out/lse differ at " << where;
}

TEST(SparseDecodeStreamOrder, KernelLaunchedAfterRunsSeesTheirOutputs) {
  // 128 requests of 32 tiles on 132 parts: one part each, nothing split.
  SparseCase c = sparse_case("Order_V32_b128_sq1_hq64_topk2048", hmla::SparseCacheLayout::kV32, 128, 1, 64, 2048);
  c.num_sms = 132;
  SparseProblem p(c);
  expect_copy_after_chained_runs_sees_outputs(
      p,
      [&] {
        return hmla::sparse_decode_schedule(c.batch, c.s_q, c.h_q, p.device_workspace(), p.workspace_bytes(),
                                            c.num_sms);
      },
      [&](const hmla::DecodeSchedule& schedule, const SpareOutputs* into, cudaStream_t stream) {
        hmla::SparseDecodeParams params = p.device_params();
        if (into != nullptr) {
          params.out = SpareOutputs::same_offset<uint16_t>(into->out, p.out_buffer(), params.out);
          params.lse = SpareOutputs::same_offset<float>(into->lse, p.lse_buffer(), params.lse);
        }
        hmla::sparse_decode_run(params, schedule, stream);
      });
}

TEST(DenseDecodeStreamOrder, KernelLaunchedAfterRunsSeesTheirOutputs) {
  DecodeCase c = make_case("Order_b128_sk8192_sq1_hq64", hmla::DType::kBF16, 128, 1, 64, 1,
                           std::vector<int>(128, 8192), false);
  c.num_sms = 132;
  DecodeProblem p(c);
  expect_copy_after_chained_runs_sees_outputs(
      p,
      [&] {
        return hmla::dense_decode_schedule(c.batch, c.s_q, c.h_q, c.h_kv, p.device_workspace(), p.workspace_bytes(),
                                           c.num_sms);
      },
      [&](const hmla::DecodeSchedule& schedule, const SpareOutputs* into, cudaStream_t stream) {
        hmla::DenseDecodeParams params = p.device_params();
        if (into != nullptr) {
          params.out = SpareOutputs::same_offset<void>(into->out, p.out_buffer(), params.out);
          params.lse = SpareOutputs::same_offset<float>(into->lse, p.lse_buffer(), params.lse);
        }
        hmla::dense_decode_run(params, schedule, stream);
      });
}

// The combine alone, with nothing to merge, behind a kernel that writes lse 1 ms into its run and a
// copy kernel behind the combine, all launched with programmatic dependent launch on a stream held
// by a 2 ms kernel (so that all three are queued before the GPU reaches them): the copy's wait
// covers the combine's grid alone, so that grid must not complete before the kernel it follows.
// The stand-in takes one SM, so the combine's CTAs and the copy's have the others to run on at once.
TEST(CombineStreamOrder, GridCompletesAfterTheKernelItFollows) {
  constexpr int kRequests = 128, kHeads = 64, kParts = 132, kDv = 512;  // the combine's d_v
  constexpr size_t kLseValues = static_cast<size_t>(kRequests) * kHeads;
  const std::vector<int32_t> one_piece(kRequests, 1), no_slot(kRequests, -1), no_split(1 + kRequests, 0);
  DeviceBuffer num_splits(kRequests * sizeof(int32_t)), split_base(kRequests * sizeof(int32_t)),
      split_list((1 + kRequests) * sizeof(int32_t)), accum(256);
  num_splits.upload(one_piece.data(), num_splits.bytes());
  split_base.upload(no_slot.data(), split_base.bytes());
  split_list.upload(no_split.data(), split_list.bytes());
  DeviceBuffer out(kLseValues * kDv * sizeof(uint16_t)), lse(kLseValues * sizeof(float));
  HMLA_TEST_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));  // NaN in bf16 and float
  HMLA_TEST_CUDA_CHECK(cudaMemset(lse.get(), 0xff, lse.bytes()));
  DeviceBuffer out_copy(out.bytes()), lse_copy(lse.bytes());

  hmla::detail::CombineParams cp{};
  cp.batch = kRequests;
  cp.tokens_per_batch = 1;
  cp.h_kv = 1;
  cp.d_v = kDv;
  cp.num_sm_parts = kParts;
  cp.tiling = hmla::detail::RowTiling::make(1, kHeads);
  cp.req_num_splits = num_splits.as<int32_t>();
  cp.req_split_base = split_base.as<int32_t>();
  cp.split_list = split_list.as<int32_t>();
  cp.lse_accum = accum.as<float>();
  cp.o_accum = accum.get();
  cp.out = out.get();
  cp.out_batch_stride = cp.out_token_stride = static_cast<int64_t>(kHeads) * kDv;
  cp.out_head_stride = kDv;
  cp.lse = lse.as<float>();
  cp.lse_batch_stride = kHeads;
  cp.lse_head_stride = 1;

  Stream s;
  hold_stream<<<1, 1, 0, s.get()>>>(2000000ull);
  hmla::detail::runtime_launch_after_prerequisites(attention_stand_in, dim3(1), dim3(256), 0, s.get(), lse.as<float>(),
                                                   kLseValues, 1000000ull);
  hmla::detail::launch_combine<__nv_bfloat16>(cp, s.get());
  hmla::detail::runtime_launch_after_prerequisites(copy_after_prerequisites, dim3(264), dim3(256), 0, s.get(),
                                                   out.as<const uint8_t>(), out_copy.as<uint8_t>(), out.bytes(),
                                                   lse.as<const uint8_t>(), lse_copy.as<uint8_t>(), lse.bytes());
  HMLA_TEST_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  std::vector<float> seen(kLseValues);
  lse_copy.download(seen.data(), seen.size() * sizeof(float));
  size_t unwritten = 0;
  for (float v : seen) unwritten += v == 1.f ? 0 : 1;
  EXPECT_EQ(unwritten, 0u) << "a kernel launched after the combine with programmatic dependent launch read lse "
                              "before the kernel the combine follows had written it";
}

}  // namespace
}  // namespace hmla_test
