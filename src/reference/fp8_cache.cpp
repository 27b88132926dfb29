// The FP8 cache layouts of the token-sparse kernels: sizes, quantisation (pack_token) and
// dequantisation (unpack_token).
//
// kV32 (DeepSeek-V3.2, d_qk 576), 656 bytes per token, token t of a page at page + t * 656:
//   [0, 512)    512 e4m3 NoPE values
//   [512, 528)  4 float32 scales (little endian), scale k for NoPE values [128k, 128k + 128)
//   [528, 656)  64 bf16 RoPE values, copied bit for bit
//   Quantisation per tile of 128: scale = amax / 448 (float32 division), code = e4m3(x / scale)
//   (float32 division, then round to nearest even, saturating). Dequantised value = e4m3 * scale,
//   one float32 multiplication.
//
// kModel1 (DeepSeek-V4, d_qk 512):
//   token t's 576 data bytes at page + t * 576: 448 e4m3 NoPE values, then 64 bf16 RoPE values;
//   token t's 8 scale bytes at page + page_size * 576 + t * 8: 7 UE8M0 exponents (one per tile of
//   64 NoPE values), the 8th byte 0. Page bytes = page_size * 584 rounded up to a multiple of 576.
//   Quantisation per tile of 64: scale = the smallest power of two >= amax / 448 (amax / 448 in
//   float32), code = e4m3(x / scale) (exact: the scale is a power of two).
//
// Decision for both layouts: a tile whose amax is 0 gets scale 1 (kModel1 byte 127), so its codes
// are all 0 and dequantise to 0 instead of 0/0 = NaN. amax ignores NaN inputs; a NaN input value
// is stored as an e4m3 NaN code. The host is little endian (x86-64, aarch64), as the GPU is.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "hmla/reference.h"

namespace hmla::reference {
namespace {

constexpr int kV32NopeDim = 512;
constexpr int kV32TileSize = 128;
constexpr int kV32NumTiles = kV32NopeDim / kV32TileSize;  // 4
constexpr int64_t kV32TokenBytes = 656;
constexpr int64_t kV32ScaleOffset = 512;
constexpr int64_t kV32RopeOffset = 528;

constexpr int kModel1NopeDim = 448;
constexpr int kModel1TileSize = 64;
constexpr int kModel1NumTiles = kModel1NopeDim / kModel1TileSize;  // 7
constexpr int64_t kModel1DataBytes = 576;
constexpr int64_t kModel1ScaleBytes = 8;
constexpr int64_t kModel1RopeOffset = 448;

constexpr int kRopeDim = 64;

void check_layout(const char* where, SparseCacheLayout layout) {
  if (layout != SparseCacheLayout::kV32 && layout != SparseCacheLayout::kModel1) {
    throw InvalidArgument(where, "layout", std::to_string(static_cast<int>(layout)),
                          "kV32 (0) or kModel1 (1)");
  }
}

void check_slot(const char* where, int page_size, int offset_in_page) {
  if (page_size <= 0) {
    throw InvalidArgument(where, "page_size", std::to_string(page_size), "> 0");
  }
  if (offset_in_page < 0 || offset_in_page >= page_size) {
    throw InvalidArgument(where, "offset_in_page", std::to_string(offset_in_page),
                          "in [0, " + std::to_string(page_size) + ")");
  }
}

// Largest |x| of a tile of bf16 values; NaN values are ignored.
float tile_amax(const uint16_t* values, int count) {
  float amax = 0.f;
  for (int i = 0; i < count; ++i) {
    const float a = std::fabs(bf16_to_float(values[i]));
    if (a > amax) amax = a;
  }
  return amax;
}

void quantise_tile(const uint16_t* values, int count, float scale, uint8_t* codes) {
  for (int i = 0; i < count; ++i) codes[i] = float_to_e4m3(bf16_to_float(values[i]) / scale);
}

void dequantise_tile(const uint8_t* codes, int count, float scale, float* out) {
  for (int i = 0; i < count; ++i) out[i] = e4m3_to_float(codes[i]) * scale;
}

}  // namespace

int sparse_cache_d_qk(SparseCacheLayout layout) {
  check_layout("hmla::reference::sparse_cache_d_qk", layout);
  return layout == SparseCacheLayout::kV32 ? 576 : 512;
}

int sparse_cache_d_nope(SparseCacheLayout layout) {
  check_layout("hmla::reference::sparse_cache_d_nope", layout);
  return layout == SparseCacheLayout::kV32 ? kV32NopeDim : kModel1NopeDim;
}

int64_t sparse_token_bytes(SparseCacheLayout layout) {
  check_layout("hmla::reference::sparse_token_bytes", layout);
  return layout == SparseCacheLayout::kV32 ? kV32TokenBytes : kModel1DataBytes + kModel1ScaleBytes;
}

int64_t sparse_page_bytes(SparseCacheLayout layout, int page_size) {
  const char* where = "hmla::reference::sparse_page_bytes";
  check_layout(where, layout);
  if (page_size <= 0) throw InvalidArgument(where, "page_size", std::to_string(page_size), "> 0");
  const int64_t raw = static_cast<int64_t>(page_size) * sparse_token_bytes(layout);
  if (layout == SparseCacheLayout::kV32) return raw;
  return (raw + kModel1DataBytes - 1) / kModel1DataBytes * kModel1DataBytes;
}

void pack_token(SparseCacheLayout layout, const uint16_t* token_bf16, uint8_t* page, int page_size,
                int offset_in_page) {
  const char* where = "hmla::reference::pack_token";
  check_layout(where, layout);
  check_slot(where, page_size, offset_in_page);
  if (layout == SparseCacheLayout::kV32) {
    uint8_t* token = page + static_cast<int64_t>(offset_in_page) * kV32TokenBytes;
    for (int tile = 0; tile < kV32NumTiles; ++tile) {
      const uint16_t* values = token_bf16 + tile * kV32TileSize;
      const float amax = tile_amax(values, kV32TileSize);
      const float scale = amax == 0.f ? 1.f : amax / 448.f;
      quantise_tile(values, kV32TileSize, scale, token + tile * kV32TileSize);
      std::memcpy(token + kV32ScaleOffset + tile * sizeof(float), &scale, sizeof(float));
    }
    std::memcpy(token + kV32RopeOffset, token_bf16 + kV32NopeDim, kRopeDim * sizeof(uint16_t));
  } else {
    uint8_t* token = page + static_cast<int64_t>(offset_in_page) * kModel1DataBytes;
    uint8_t* scales = page + static_cast<int64_t>(page_size) * kModel1DataBytes +
                      static_cast<int64_t>(offset_in_page) * kModel1ScaleBytes;
    for (int tile = 0; tile < kModel1NumTiles; ++tile) {
      const uint16_t* values = token_bf16 + tile * kModel1TileSize;
      const float amax = tile_amax(values, kModel1TileSize);
      const uint8_t exponent = amax == 0.f ? uint8_t{127} : float_to_ue8m0_ceil(amax / 448.f);
      quantise_tile(values, kModel1TileSize, ue8m0_to_float(exponent),
                    token + tile * kModel1TileSize);
      scales[tile] = exponent;
    }
    scales[kModel1NumTiles] = 0;
    std::memcpy(token + kModel1RopeOffset, token_bf16 + kModel1NopeDim,
                kRopeDim * sizeof(uint16_t));
  }
}

void unpack_token(SparseCacheLayout layout, const uint8_t* page, int page_size, int offset_in_page,
                  float* token_out) {
  const char* where = "hmla::reference::unpack_token";
  check_layout(where, layout);
  check_slot(where, page_size, offset_in_page);
  const uint8_t* rope = nullptr;
  int nope_dim = 0;
  if (layout == SparseCacheLayout::kV32) {
    const uint8_t* token = page + static_cast<int64_t>(offset_in_page) * kV32TokenBytes;
    for (int tile = 0; tile < kV32NumTiles; ++tile) {
      float scale;
      std::memcpy(&scale, token + kV32ScaleOffset + tile * sizeof(float), sizeof(float));
      dequantise_tile(token + tile * kV32TileSize, kV32TileSize, scale,
                      token_out + tile * kV32TileSize);
    }
    rope = token + kV32RopeOffset;
    nope_dim = kV32NopeDim;
  } else {
    const uint8_t* token = page + static_cast<int64_t>(offset_in_page) * kModel1DataBytes;
    const uint8_t* scales = page + static_cast<int64_t>(page_size) * kModel1DataBytes +
                            static_cast<int64_t>(offset_in_page) * kModel1ScaleBytes;
    for (int tile = 0; tile < kModel1NumTiles; ++tile) {
      dequantise_tile(token + tile * kModel1TileSize, kModel1TileSize, ue8m0_to_float(scales[tile]),
                      token_out + tile * kModel1TileSize);
    }
    rope = token + kModel1RopeOffset;
    nope_dim = kModel1NopeDim;
  }
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, rope + i * sizeof(uint16_t), sizeof(bits));
    token_out[nope_dim + i] = bf16_to_float(bits);
  }
}

}  // namespace hmla::reference
