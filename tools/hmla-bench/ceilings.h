// hmla-bench: the card's ceilings, measured in the same run as the kernels they judge.
//   read   read-only streaming bandwidth: a grid-stride kernel of 16-byte loads, several in flight
//          per thread, over a 4 GiB buffer, XOR-reduced to one word written once per CTA
//          (best of a few load flavours / unroll depths)
//   copy   cudaMemcpyAsync device-to-device of 4 GiB, counting bytes read + bytes written
//   matmul cublasGemmEx bf16 x bf16 -> bf16, fp32 accumulation, 8192^3, random inputs
// Each: warm-up, then the median of >= 10 timed calls with CUDA events.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "common.h"

namespace hmla_bench {

struct CeilingOptions {
  size_t stream_bytes = 4 * kGiB;  // buffer the read kernel streams through, and the copy size
  int matmul_n = 8192;
  int warmup = 5;
  int iters = 20;
};

struct ReadVariant {
  std::string name;
  double gbps = 0;
  TimeStats time;
};

struct Ceilings {
  bool measured = false;
  // read-only streaming
  double read_gbps = 0;
  std::string read_best_variant;
  double read_bytes = 0;
  std::vector<ReadVariant> read_variants;
  // device-to-device copy, read + write counted
  double copy_gbps = 0;
  double copy_bytes_counted = 0;
  TimeStats copy_time;
  // bf16 matmul
  double matmul_tflops = 0;
  int matmul_n = 0;
  int cublas_version = 0;
  TimeStats matmul_time;
};

Ceilings measure_ceilings(const CeilingOptions& opt, cudaStream_t stream);

}  // namespace hmla_bench
