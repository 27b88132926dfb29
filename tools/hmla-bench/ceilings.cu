// hmla-bench: ceiling measurements (see ceilings.h).
#include "ceilings.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "device_util.h"
#include "timing.h"

namespace hmla_bench {
namespace {

// Load flavours of the streaming kernel.
enum LoadFlavor : int {
  kLdg = 0,           // ld.global.nc.v4 (read-only path)
  kNoAllocL2Pf = 1,   // ld.global.nc.L1::no_allocate.L2::256B.v4: no L1 allocation, 256 B L2 prefetch
};

template <int kFlavor>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (kFlavor == kLdg) {
    return __ldg(p);
  } else {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  }
}

// Each CTA walks tiles of kThreads * kUnroll 16-byte vectors (grid-stride over tiles); every
// thread issues kUnroll independent loads before consuming any, so kUnroll are in flight per
// thread. Everything read is XOR-folded into one word per CTA, written once with atomicXor.
template <int kUnroll, int kFlavor, int kThreads>
__global__ void __launch_bounds__(kThreads)
    read_stream_kernel(const uint4* __restrict__ src, size_t n_vec, unsigned int* __restrict__ sink) {
  uint32_t acc = 0;
  const size_t tile = (size_t)kThreads * kUnroll;
  const size_t n_tiles = n_vec / tile;
  for (size_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const uint4* p = src + t * tile + threadIdx.x;
    uint4 v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = load16<kFlavor>(p + (size_t)k * kThreads);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (size_t i = n_tiles * tile + (size_t)blockIdx.x * kThreads + threadIdx.x; i < n_vec;
       i += (size_t)gridDim.x * kThreads) {
    uint4 v = load16<kFlavor>(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int offset = 16; offset > 0; offset >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  __shared__ uint32_t warp_acc[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_acc[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total ^= warp_acc[w];
    atomicXor(sink, total);
  }
}

template <int kUnroll, int kFlavor, int kThreads>
ReadVariant time_read_variant(const char* name, const uint4* src, size_t n_vec, unsigned int* sink,
                              const CeilingOptions& opt, cudaStream_t stream) {
  auto kernel = read_stream_kernel<kUnroll, kFlavor, kThreads>;
  int dev = 0, sms = 0, per_sm = 0;
  HB_CUDA(cudaGetDevice(&dev));
  HB_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  HB_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  int grid = sms * (per_sm > 0 ? per_sm : 1);
  TimingConfig cfg;
  cfg.warmup = opt.warmup;
  cfg.iters = opt.iters;
  std::vector<double> us = time_calls(cfg, stream, [&](int) {
    kernel<<<grid, kThreads, 0, stream>>>(src, n_vec, sink);
    HB_CUDA_LAUNCH();
  });
  ReadVariant r;
  r.name = name;
  r.time = summarize(us);
  r.gbps = (double)n_vec * 16.0 / (r.time.median * 1e-6) / 1e9;
  return r;
}

struct CublasHandle {
  cublasHandle_t h = nullptr;
  CublasHandle() { HB_CUBLAS(cublasCreate(&h)); }
  ~CublasHandle() {
    if (h) cublasDestroy(h);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
};

}  // namespace

Ceilings measure_ceilings(const CeilingOptions& opt, cudaStream_t stream) {
  Ceilings c;
  TimingConfig cfg;
  cfg.warmup = opt.warmup;
  cfg.iters = opt.iters;

  // ---- read-only streaming and device-to-device copy over the same 4 GiB source
  {
    const size_t bytes = round_up(opt.stream_bytes, 16);
    DeviceBuffer src(bytes);
    DeviceBuffer sink(sizeof(unsigned int));
    fill_random_words(src.get(), bytes, 0x5eed0001ull, stream);
    HB_CUDA(cudaMemsetAsync(sink.get(), 0, sizeof(unsigned int), stream));
    HB_CUDA(cudaStreamSynchronize(stream));
    const uint4* s = src.get<const uint4>();
    const size_t n_vec = bytes / 16;
    unsigned int* k = sink.get<unsigned int>();
    c.read_variants.push_back(time_read_variant<8, kLdg, 512>("ldg.nc.v4 x8, 512 thr", s, n_vec, k, opt, stream));
    c.read_variants.push_back(
        time_read_variant<8, kNoAllocL2Pf, 512>("nc.L1::no_allocate.L2::256B x8, 512 thr", s, n_vec, k, opt, stream));
    c.read_variants.push_back(
        time_read_variant<16, kNoAllocL2Pf, 256>("nc.L1::no_allocate.L2::256B x16, 256 thr", s, n_vec, k, opt, stream));
    c.read_variants.push_back(
        time_read_variant<4, kNoAllocL2Pf, 1024>("nc.L1::no_allocate.L2::256B x4, 1024 thr", s, n_vec, k, opt, stream));
    for (const ReadVariant& v : c.read_variants) {
      if (v.gbps > c.read_gbps) {
        c.read_gbps = v.gbps;
        c.read_best_variant = v.name;
      }
    }
    c.read_bytes = (double)bytes;

    DeviceBuffer dst(bytes);
    std::vector<double> us = time_calls(cfg, stream, [&](int) {
      HB_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    });
    c.copy_time = summarize(us);
    c.copy_bytes_counted = 2.0 * (double)bytes;
    c.copy_gbps = c.copy_bytes_counted / (c.copy_time.median * 1e-6) / 1e9;
  }

  // ---- bf16 matmul through cuBLAS
  {
    const int n = opt.matmul_n;
    const size_t elems = (size_t)n * (size_t)n;
    DeviceBuffer a(elems * 2), b(elems * 2), out(elems * 2);
    DeviceBuffer workspace(64 * kMiB);
    fill_randn_half(a.get(), elems, hmla::DType::kBF16, 0x5eed0002ull, 1.0f, 4.0f, stream);
    fill_randn_half(b.get(), elems, hmla::DType::kBF16, 0x5eed0003ull, 1.0f, 4.0f, stream);
    HB_CUDA(cudaStreamSynchronize(stream));
    CublasHandle handle;
    HB_CUBLAS(cublasSetStream(handle.h, stream));
    HB_CUBLAS(cublasSetWorkspace(handle.h, workspace.get(), workspace.bytes()));
    HB_CUBLAS(cublasGetVersion(handle.h, &c.cublas_version));
    const float alpha = 1.0f, beta = 0.0f;
    std::vector<double> us = time_calls(cfg, stream, [&](int) {
      HB_CUBLAS(cublasGemmEx(handle.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                             b.get(), CUDA_R_16BF, n, &beta, out.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
    });
    c.matmul_time = summarize(us);
    c.matmul_n = n;
    c.matmul_tflops = 2.0 * (double)n * (double)n * (double)n / (c.matmul_time.median * 1e-6) / 1e12;
  }
  c.measured = true;
  return c;
}

}  // namespace hmla_bench
