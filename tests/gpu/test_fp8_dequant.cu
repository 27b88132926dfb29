// The sparse kernels' FP8 dequantisation (src/common/fp8_dequant.cuh, namespace hmla::dev) on the
// device, into the fp16 K tiles of the sparse decode kernel:
//   dequant16_e4m3_to_f16<two>(raw, factors, lo, hi): 16 e4m3 codes times a scale's f16 factors
//     (v32_scale_factors of a float32 scale, ue8m0_factor of a UE8M0 byte) -> 16 f16.
// Checked two ways, for every one of the 256 codes at every one of the 16 byte positions:
//   1. bit for bit against a host model of the arithmetic the header documents (the code's exact
//      f16 value, times a = m * 2^ea rounded to f16, times b = 2^eb, each product rounded to
//      nearest even; a UE8M0 scale one exact product), which pins the rounding and the special
//      values (signed zeros, NaN codes, zero, subnormal, inf and NaN scales, overflow to inf);
//   2. against the exact product code * scale of the reference's decoders: within 2^-10 relative
//      where the product is a normal f16 (at most two roundings of 2^-11), within 2^-24 absolute
//      below, inf above 65504 - what docs/SPARSE_DECODE.md promises (for blocks whose largest value
//      fits fp16; beyond, the model's inf and NaN are what the kernel gives); 0 for every value of a
//      block whose UE8M0 scale is below 2^-24.
// Without the header (it lives beside the kernels) the test reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <cuda_fp16.h>
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

// One thread per (scale, arrangement, group): 16 codes in, 16 f16 out at out[scale][arr][code].
// Scales 0 .. num_v32 - 1 are float32 (V3.2), the rest UE8M0 bytes (MODEL1), one per float slot.
__global__ void dequant16_kernel(const float* scales, int num_v32, int num_scales, uint16_t* out) {
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
  if (si < num_v32) {
    hmla::dev::dequant16_e4m3_to_f16<true>(raw, hmla::dev::v32_scale_factors(__float_as_uint(scales[si])), lo, hi);
  } else {
    hmla::dev::dequant16_e4m3_to_f16<false>(raw, hmla::dev::ue8m0_factor(static_cast<uint32_t>(scales[si])), lo,
                                            hi);
  }
  uint16_t values[16];
  memcpy(values, &lo, 16);
  memcpy(values + 8, &hi, 16);
  uint16_t* dst = out + (static_cast<size_t>(si) * kArrangements + arrangement) * kCodes;
  for (int i = 0; i < 16; ++i) dst[code_at(arrangement, group, i)] = values[i];
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
uint16_t f16_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}
float f16_value(uint16_t b) {
  __half h;
  memcpy(&h, &b, 2);
  return __half2float(h);
}
// f16 x f16 is exact in float32 (11 x 11 significant bits): one rounding to f16, as HMUL2 does.
float f16_mul(float a, float b) { return f16_value(f16_bits(a * b)); }

// The header's arithmetic on the host, written from its comment.
float model_v32(uint8_t code, float scale) {
  const float v = hmla::reference::e4m3_to_float(code);  // exact in f16
  uint32_t bits;
  memcpy(&bits, &scale, 4);
  const int biased = static_cast<int>((bits >> 23) & 0xff);
  if (biased == 0xff) return f16_mul(v, f16_value(f16_bits(scale)));
  if (biased == 0) return f16_mul(f16_mul(v, (bits >> 31) ? -1.f : 1.f), 0.f);
  const int e = biased - 127;
  const int eb = std::max(e - std::min(std::max(e, -5), 7), -24);
  const float a = f16_value(f16_bits(std::ldexp(scale, -eb)));
  const float b = f16_value(f16_bits(std::ldexp(1.f, eb)));
  return f16_mul(f16_mul(v, a), b);
}
float model_ue8m0(uint8_t code, int byte) {
  const float v = hmla::reference::e4m3_to_float(code);
  if (byte == 0xff) return std::nanf("");
  return f16_mul(v, f16_value(f16_bits(byte == 0 ? 0.f : std::ldexp(1.f, byte - 127))));
}

TEST(Fp8Dequant, Dequant16ToF16MatchesModelAndExactProduct) {
  // V3.2 float32 scales: amax / 448 over magnitudes a model's tokens can have and beyond, zeros,
  // a float32 subnormal, scales whose products leave the f16 range, inf and NaN.
  std::vector<float> scales;
  for (float amax : {1e-9f, 3e-7f, 1e-5f, 1e-3f, 0.0123f, 0.37f, 1.0f, 3.3f, 57.1f, 448.0f, 1234.5f, 3e4f, 1e6f})
    scales.push_back(amax / 448.f);
  scales.push_back(0.f);
  scales.push_back(-0.f);
  scales.push_back(1e-40f);  // float32 subnormal
  scales.push_back(1e37f);
  scales.push_back(std::numeric_limits<float>::infinity());
  scales.push_back(std::nanf(""));
  const int num_v32 = static_cast<int>(scales.size());
  // UE8M0 bytes (MODEL1), one per slot as a float holding the byte value
  const std::vector<int> bytes = {0, 1, 90, 100, 103, 104, 112, 113, 118, 120, 126, 127, 128, 131, 140, 141, 142,
                                  143, 200, 254, 255};
  for (int b : bytes) scales.push_back(static_cast<float>(b));
  const int n = static_cast<int>(scales.size());
  hmla_test::DeviceBuffer dev_scales(n * sizeof(float));
  dev_scales.upload(scales.data(), n * sizeof(float));
  const size_t count = static_cast<size_t>(n) * kArrangements * kCodes;
  hmla_test::DeviceBuffer dev_out(count * sizeof(uint16_t));
  HMLA_TEST_CUDA_CHECK(cudaMemset(dev_out.get(), 0xa5, count * sizeof(uint16_t)));
  const int threads = n * kArrangements * kGroups;
  dequant16_kernel<<<(threads + 127) / 128, 128>>>(dev_scales.as<float>(), num_v32, n, dev_out.as<uint16_t>());
  HMLA_TEST_CUDA_CHECK(cudaGetLastError());
  HMLA_TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(count);
  dev_out.download(got.data(), count * sizeof(uint16_t));

  int64_t wrong_bits = 0, inaccurate = 0;
  for (int si = 0; si < n; ++si) {
    const bool v32 = si < num_v32;
    const float scale = v32 ? scales[si] : hmla::reference::ue8m0_to_float(static_cast<uint8_t>(scales[si]));
    for (int arrangement = 0; arrangement < kArrangements; ++arrangement) {
      for (int code = 0; code < kCodes; ++code) {
        const uint8_t c = static_cast<uint8_t>(code);
        const uint16_t have = got[(static_cast<size_t>(si) * kArrangements + arrangement) * kCodes + code];
        const float model = v32 ? model_v32(c, scale) : model_ue8m0(c, static_cast<int>(scales[si]));
        const uint16_t want = f16_bits(model);
        const bool same = f16_is_nan(want) ? f16_is_nan(have) : have == want;
        if (!same && ++wrong_bits <= 20) {
          ADD_FAILURE() << "code 0x" << std::hex << code << std::dec << " times " << (v32 ? "scale " : "UE8M0 ")
                        << scales[si] << ": got f16 0x" << std::hex << have << ", model 0x" << want << std::dec;
        }
        // Accuracy against the exact product, for finite scales and codes, in blocks whose largest
        // value (448 * scale) fits fp16: in a block beyond the range its large values are inf, and
        // its zeros may be NaN (0 * inf), as docs/SPARSE_DECODE.md says (the query is NaN either way).
        const double exact = static_cast<double>(hmla::reference::e4m3_to_float(c)) * scale;
        if (!std::isfinite(exact) || !std::isfinite(scale) || 448.0 * std::fabs(scale) > 65504.0) continue;
        const double value = f16_value(have);
        const double mag = std::fabs(exact);
        // A UE8M0 scale below 2^-24 is 0 as an f16 factor: its whole block (largest value below
        // 448 * 2^-24 ~ 2.7e-5) dequantises to 0, as docs/SPARSE_DECODE.md says.
        const bool flushed_block = !v32 && static_cast<int>(scales[si]) < 127 - 24;
        bool ok;
        if (flushed_block) {
          ok = value == 0.0;
        } else if (std::isinf(value)) {
          ok = mag > 65504.0 * (1 - 1.0 / 1024) && std::signbit(value) == std::signbit(exact);
        } else if (mag >= std::ldexp(1.0, -14)) {
          ok = std::fabs(value - exact) <= std::ldexp(mag, -10);
        } else {
          ok = std::fabs(value - exact) <= std::ldexp(1.0, -24);
        }
        if (!ok && ++inaccurate <= 20) {
          ADD_FAILURE() << "code 0x" << std::hex << code << std::dec << " times " << scale << ": got " << value
                        << ", exact " << exact;
        }
      }
    }
  }
  EXPECT_EQ(wrong_bits, 0) << "of " << count << " dequantised values differ from the model";
  EXPECT_EQ(inaccurate, 0) << "of " << count << " dequantised values are off the exact product";
}

__global__ void bf16_to_f16_kernel(const uint32_t* in, int n, float factor, uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = factor == 1.f ? hmla::dev::bf16x2_to_f16x2(in[i]) : hmla::dev::bf16x2_to_f16x2_scaled(in[i], factor);
}

// RoPE values (bf16 in the cache) and Q (bf16, with a power-of-two prescale) become f16 rounded to
// nearest: every bf16 bit pattern, unscaled and times 2^-20.
TEST(Fp8Dequant, Bf16ToF16RoundsToNearest) {
  std::vector<uint32_t> in(32768);
  for (uint32_t i = 0; i < 32768; ++i) in[i] = (2 * i) | ((2 * i + 1) << 16);
  hmla_test::DeviceBuffer dev_in(in.size() * 4), dev_out(in.size() * 4);
  dev_in.upload(in.data(), in.size() * 4);
  for (const float factor : {1.f, std::ldexp(1.f, -20)}) {
    bf16_to_f16_kernel<<<256, 128>>>(dev_in.as<uint32_t>(), 32768, factor, dev_out.as<uint32_t>());
    HMLA_TEST_CUDA_CHECK(cudaGetLastError());
    std::vector<uint32_t> got(in.size());
    dev_out.download(got.data(), got.size() * 4);
    int64_t wrong = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      for (int half = 0; half < 2; ++half) {
        const uint32_t bf = (in[i] >> (16 * half)) & 0xffffu;
        float f;
        const uint32_t fb = bf << 16;
        memcpy(&f, &fb, 4);
        const uint16_t want = f16_bits(f * factor);
        const uint16_t have = static_cast<uint16_t>(got[i] >> (16 * half));
        const bool same = f16_is_nan(want) ? f16_is_nan(have) : have == want;
        if (!same && ++wrong <= 10)
          ADD_FAILURE() << "bf16 0x" << std::hex << bf << " times " << factor << ": got 0x" << have << ", want 0x"
                        << want << std::dec;
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

#else

TEST(Fp8Dequant, HeaderPresent) {
  GTEST_SKIP() << "src/common/fp8_dequant.cuh is not in this tree: the FP8 dequantisation device "
                  "test is compiled out";
}

#endif

}  // namespace
