// One dense MLA decode step through an installed hmla, checked against hmla's CPU reference.
// Exits 0 when the result matches, or when there is no Hopper GPU to run it on (said on stdout).
#include <hmla/dense_decode.h>
#include <hmla/reference.h>
#include <hmla/version.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw hmla::CudaError(std::string(what) + ": " + cudaGetErrorString(err));
}

template <class T>
T* to_device(const std::vector<T>& host) {
  void* device = nullptr;
  check_cuda(cudaMalloc(&device, host.size() * sizeof(T)), "cudaMalloc");
  check_cuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return static_cast<T*>(device);
}

// Contiguous bf16 tensors as in docs/API.md; data pointers are filled in by the caller.
hmla::DenseDecodeParams contiguous_params(int batch, int s_q, int h_q, int num_blocks, int max_blocks) {
  hmla::DenseDecodeParams p;
  p.batch = batch;  p.s_q = s_q;  p.h_q = h_q;  p.h_kv = 1;  p.causal = s_q > 1;
  p.q_head_stride = p.d_qk;  p.q_token_stride = int64_t(h_q) * p.d_qk;  p.q_batch_stride = s_q * p.q_token_stride;
  p.num_blocks = num_blocks;  p.page_size = 64;
  p.k_head_stride = p.d_qk;  p.k_token_stride = p.d_qk;  p.k_block_stride = int64_t(p.page_size) * p.d_qk;
  p.max_blocks_per_seq = max_blocks;  p.block_table_batch_stride = max_blocks;
  p.out_head_stride = p.d_v;  p.out_token_stride = int64_t(h_q) * p.d_v;  p.out_batch_stride = s_q * p.out_token_stride;
  p.lse_head_stride = s_q;  p.lse_batch_stride = int64_t(h_q) * s_q;
  return p;
}

}  // namespace

int main() try {
  std::printf("hmla %s\n", hmla::version());
  const int batch = 2, s_q = 2, h_q = 16, num_blocks = 4, max_blocks = 2;

  // Arguments are checked on the host before anything touches a GPU: h_kv must divide h_q.
  try {
    hmla::dense_decode_workspace_bytes(batch, s_q, h_q, /*h_kv=*/3);
    std::printf("FAIL: h_kv = 3 with h_q = 16 was accepted\n");
    return 1;
  } catch (const hmla::InvalidArgument& e) {
    std::printf("rejected as expected: %s\n", e.what());
  }

  int devices = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the decode step is skipped (hmla's kernels need a Hopper GPU)\n");
    return 0;
  }
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major != 9) {
    std::printf("%s is sm_%d%d: the decode step is skipped (kernels are built for sm_90a)\n", prop.name,
                prop.major, prop.minor);
    return 0;
  }

  hmla::DenseDecodeParams p = contiguous_params(batch, s_q, h_q, num_blocks, max_blocks);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  auto random_bf16 = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = hmla::reference::float_to_bf16(uniform(rng));
    return v;
  };
  const std::vector<uint16_t> q = random_bf16(size_t(batch) * s_q * h_q * p.d_qk);
  const std::vector<uint16_t> k_cache = random_bf16(size_t(num_blocks) * p.page_size * p.d_qk);
  const std::vector<int32_t> block_table = {3, 1, 0, 2};  // request 0: pages 3, 1; request 1: 0, 2
  const std::vector<int32_t> seqlens = {100, 37};

  hmla::DenseDecodeParams device = p;
  device.q = to_device(q);
  device.k_cache = to_device(k_cache);
  device.block_table = to_device(block_table);
  device.cache_seqlens = to_device(seqlens);
  std::vector<uint16_t> out(size_t(batch) * s_q * h_q * p.d_v);
  std::vector<float> lse(size_t(batch) * h_q * s_q);
  device.out = to_device(out);
  device.lse = to_device(lse);

  const size_t ws_bytes = hmla::dense_decode_workspace_bytes(batch, s_q, h_q, p.h_kv);
  void* ws = nullptr;
  check_cuda(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
  const hmla::DecodeSchedule schedule =
      hmla::dense_decode_plan(device.cache_seqlens, batch, s_q, h_q, p.h_kv, ws, ws_bytes, nullptr);
  hmla::dense_decode_run(device, schedule, nullptr);
  check_cuda(cudaMemcpy(out.data(), device.out, out.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check_cuda(cudaMemcpy(lse.data(), device.lse, lse.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");

  hmla::DenseDecodeParams host = p;
  host.q = q.data();  host.k_cache = k_cache.data();
  host.block_table = block_table.data();  host.cache_seqlens = seqlens.data();
  std::vector<float> ref_out(out.size()), ref_lse(lse.size());
  host.out = nullptr;  host.lse = ref_lse.data();
  hmla::reference::dense_decode(host, ref_out.data());

  // bf16 output: a relative L2 error of 1e-2 is what hmla's own GPU tests allow.
  double err2 = 0, ref2 = 0, lse_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = hmla::reference::bf16_to_float(out[i]) - ref_out[i];
    err2 += d * d;  ref2 += double(ref_out[i]) * ref_out[i];
  }
  for (size_t i = 0; i < lse.size(); ++i)
    lse_err = std::fmax(lse_err, std::fabs(lse[i] - ref_lse[i]) / std::fmax(1.0, std::fabs(ref_lse[i])));
  const double rel_l2 = std::sqrt(err2 / ref2);
  const bool ok = rel_l2 <= 1e-2 && lse_err <= 1e-5;
  std::printf("%s on %s: out relative L2 error %.3g (<= 1e-2), lse relative error %.3g (<= 1e-5)\n",
              ok ? "PASS" : "FAIL", prop.name, rel_l2, lse_err);
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::printf("FAIL: %s\n", e.what());
  return 1;
}
