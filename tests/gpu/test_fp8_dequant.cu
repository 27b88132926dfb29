// The sparse kernels' FP8 dequantisation (src/common/fp8_dequant.cuh, namespace hmla::dev) on the
// device against the CPU reference's number formats, bit for bit:
//   dequant16_e4m3_to_bf16(raw, scale, lo, hi): 16 e4m3 codes times a float scale -> 16 bf16, each
//     the float product rounded once to bf16 = reference::float_to_bf16(e4m3_to_float(code) *
//     scale)
//   ue8m0_to_float(byte) = reference::ue8m0_to_float(byte) (2^(byte - 127), NaN for 0xff)
// Every one of the 256 codes at every one of the 16 byte positions, times UE8M0 powers of two,
// V3.2-style float32 scales amax / 448, scale 0 (signed zeros must survive) and a scale whose
// products overflow to infinity. NaN compares as "both NaN" (payloads may differ).
// Without the header (it lives beside the kernels) the test reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "hmla/reference.h"

#if __has_include("common/fp8_dequant.cuh")
#include "common/fp8_dequant.cuh"
#define HMLA_TEST_HAVE_FP8_DEQUANT 1
#endif

namespace {

#if defined(HMLA_TEST_HAVE_FP8_DEQUANT)

constexpr int kCodes = 256;
constexpr int kArrangements =
    16;  // arrangement k puts code 16g + (i + k) % 16 at byte i of group g
constexpr int kGroups = kCodes / 16;

__device__ __host__ inline int code_at(int arrangement, int group, int byte) {
  return 16 * group + (byte + arrangement) % 16;
}

// One thread per (scale, arrangement, group): 16 codes in, 16 bf16 out at out[scale][arr][code].
__global__ void dequant16_kernel(const float* scales, int num_scales, uint16_t* out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= num_scales * kArrangements * kGroups) return;
  const int group = t % kGroups;
  const int arrangement = (t / kGroups) % kArrangements;
  const int si = t / (kGroups * kArrangements);
  uint8_t bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<uint8_t>(code_at(arrangement, group, i));
  uint4 raw;
  memcpy(&raw, bytes, 16);
  uint4 lo, hi;
  hmla::dev::dequant16_e4m3_to_bf16(raw, scales[si], lo, hi);
  uint16_t values[16];
  memcpy(values, &lo, 16);
  memcpy(values + 8, &hi, 16);
  uint16_t* dst = out + (static_cast<size_t>(si) * kArrangements + arrangement) * kCodes;
  for (int i = 0; i < 16; ++i) dst[code_at(arrangement, group, i)] = values[i];
}

__global__ void ue8m0_kernel(float* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < 256) out[b] = hmla::dev::ue8m0_to_float(static_cast<uint32_t>(b));
}

bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

TEST(Fp8Dequant, Dequant16MatchesReferenceBitForBit) {
  std::vector<float> scales;
  // UE8M0 scales (kModel1): powers of two, through the reference's decoder
  for (int byte : {100, 118, 120, 126, 127, 128, 131, 140}) {
    scales.push_back(hmla::reference::ue8m0_to_float(static_cast<uint8_t>(byte)));
  }
  // V3.2 scales: amax / 448 in float32, as pack_token computes them
  for (float amax : {1e-3f, 0.0123f, 0.37f, 1.0f, 3.3f, 57.1f, 448.0f, 1234.5f}) {
    scales.push_back(amax / 448.f);
  }
  scales.push_back(0.f);    // +-0 from +-codes, NaN from NaN codes
  scales.push_back(1e37f);  // 448 * 1e37 overflows float: +-inf
  const int n = static_cast<int>(scales.size());
  hmla_test::DeviceBuffer dev_scales(n * sizeof(float));
  dev_scales.upload(scales.data(), n * sizeof(float));
  const size_t count = static_cast<size_t>(n) * kArrangements * kCodes;
  hmla_test::DeviceBuffer dev_out(count * sizeof(uint16_t));
  HMLA_TEST_CUDA_CHECK(cudaMemset(dev_out.get(), 0xa5, count * sizeof(uint16_t)));
  const int threads = n * kArrangements * kGroups;
  dequant16_kernel<<<(threads + 127) / 128, 128>>>(dev_scales.as<float>(), n,
                                                   dev_out.as<uint16_t>());
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(count);
  dev_out.download(got.data(), count * sizeof(uint16_t));

  int64_t wrong = 0;
  for (int si = 0; si < n; ++si) {
    for (int arrangement = 0; arrangement < kArrangements; ++arrangement) {
      for (int code = 0; code < kCodes; ++code) {
        const float product =
            hmla::reference::e4m3_to_float(static_cast<uint8_t>(code)) * scales[si];
        const uint16_t want = hmla::reference::float_to_bf16(product);
        const uint16_t have =
            got[(static_cast<size_t>(si) * kArrangements + arrangement) * kCodes + code];
        const bool same = bf16_is_nan(want) ? bf16_is_nan(have) : have == want;
        if (!same && ++wrong <= 20) {
          const int position = (code % 16 - arrangement + 16) % 16;
          ADD_FAILURE() << "code 0x" << std::hex << code << std::dec << " at byte " << position
                        << " times scale " << scales[si] << ": got bf16 0x" << std::hex << have
                        << ", expected 0x" << want << std::dec << " (" << product << ")";
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << count << " dequantised values";
}

TEST(Fp8Dequant, Ue8m0MatchesReference) {
  hmla_test::DeviceBuffer dev_out(256 * sizeof(float));
  HMLA_TEST_CUDA_CHECK(cudaMemset(dev_out.get(), 0xa5, 256 * sizeof(float)));
  ue8m0_kernel<<<2, 128>>>(dev_out.as<float>());
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(256);
  dev_out.download(got.data(), 256 * sizeof(float));
  for (int b = 0; b < 256; ++b) {
    const float want = hmla::reference::ue8m0_to_float(static_cast<uint8_t>(b));
    if (b == 255) {
      EXPECT_TRUE(std::isnan(got[b])) << "byte 0xff must decode to NaN, got " << got[b];
    } else if (b == 0) {
      // 2^-127 is a float subnormal, and building the float from the exponent field gives 0.
      // pack_token writes byte 0 only for a tile whose largest |value| is <= 448 * 2^-127, which
      // no model's bf16 tokens hold, so either answer is accepted.
      EXPECT_TRUE(hmla_test::float_bits(got[b]) == hmla_test::float_bits(want) || got[b] == 0.f)
          << "byte 0: got " << got[b];
    } else {
      EXPECT_EQ(hmla_test::float_bits(got[b]), hmla_test::float_bits(want))
          << "byte " << b << ": got " << got[b] << ", expected " << want;
    }
  }
}

#else

TEST(Fp8Dequant, HeaderPresent) {
  GTEST_SKIP() << "src/common/fp8_dequant.cuh is not in this tree: the FP8 dequantisation device "
                  "test is compiled out";
}

#endif

}  // namespace
