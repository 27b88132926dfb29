// The gather floor of sparse decode, measured: how fast the card reads the rows that a sparse decode
// call's indices name, with nothing else to do (no dequantisation, no shared memory, no tensor
// work). The issue's h_q 16 bar (2x FlashMLA's padded time at b 128) is reachable only if this
// floor is well below it, and the narrow kernel's distance to it says how much of its time is the
// gather itself. Same shapes as hmla-bench's rows: V3.2 (656-byte tokens, 64-token pages) and MODEL1
// (576 data bytes per token, 8 scale bytes per token after the page's data, 256-token pages),
// b requests of topk distinct positions among s_k, pages in random order (as compare.py's caches),
// two index sets alternating so that no call finds the previous one's rows in L2.
//
// Each warp takes `U` tokens at a time: lane l loads 16-byte piece l of each token's first 512
// bytes, lanes 0-8 (V3.2) or lane 0 (MODEL1's scale word) the rest, every load of the U tokens
// issued before any is used; the next U tokens' indices load before this group's data is used.
// The grid is persistent (blocks per SM x 8 warps). Variants: U in {2, 4, 8, 16}, blocks per SM in
// {1, 2, 4}; the best is the floor. A plain stream over the same number of bytes is printed beside it.
//   nvcc -O3 -std=c++17 -arch=sm_90a -o gather_floor scripts/profile/gather_floor.cu && ./gather_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

struct Layout {
  const char* name;
  int page;          // tokens per page
  int token_stride;  // bytes between a page's tokens
  int data_bytes;    // bytes of a token's row at its stride
  int scales_apart;  // 1: 8 scale bytes per token after the page's data
  long long page_bytes;
  long long address(long long token) const {  // token = page * page + offset
    return (token / page) * page_bytes + (token % page) * token_stride;
  }
};

constexpr int kWarps = 8;

__device__ __forceinline__ uint4 ld_nc(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_nc_u32(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// rows[i]: the byte offset of the i-th named token's row (-1: invalid, skipped); scale_at[i]: its scale word's.
template <int U, bool kScalesApart>
__global__ void __launch_bounds__(32 * kWarps) gather(const uint8_t* cache, const long long* rows,
                                                      const long long* scale_at, long long count, int tail_pieces,
                                                      uint32_t* sink) {
  const int lane = threadIdx.x % 32;
  const long long warp = (static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32);
  const long long warps = static_cast<long long>(gridDim.x) * kWarps;
  uint32_t acc = 0;
  long long first = warp * U;
  long long my_row = first + lane < count && lane < U ? rows[first + lane] : -1;
  long long my_scale = kScalesApart && first + lane < count && lane < U ? scale_at[first + lane] : -1;
  for (; first < count; first += warps * U) {
    const long long next = first + warps * U;
    const long long next_row = lane < U && next + lane < count ? rows[next + lane] : -1;
    const long long next_scale = kScalesApart && lane < U && next + lane < count ? scale_at[next + lane] : -1;
    uint4 head[U], tail[U];
    uint32_t scale[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long r = __shfl_sync(0xffffffffu, my_row, u);
      head[u] = make_uint4(0, 0, 0, 0);
      tail[u] = make_uint4(0, 0, 0, 0);
      scale[u] = 0;
      if (r >= 0) {
        head[u] = ld_nc(cache + r + 16 * lane);
        if (lane < tail_pieces) tail[u] = ld_nc(cache + r + 512 + 16 * lane);
        if (kScalesApart) {
          const long long s = __shfl_sync(0xffffffffu, my_scale, u);
          if (lane == 0) scale[u] = ld_nc_u32(cache + s);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= head[u].x ^ head[u].y ^ head[u].z ^ head[u].w ^ tail[u].x ^ tail[u].w ^ scale[u];
    my_row = next_row;
    my_scale = next_scale;
  }
  if (acc == 0x9e3779b9u) atomicXor(sink, acc);  // keeps the loads; almost never taken
}

__global__ void stream(const uint4* p, long long n, uint32_t* sink) {
  uint32_t acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) atomicXor(sink, acc);
}

template <typename Launch>
double median_us(Launch&& launch, int sets) {
  std::vector<float> ms;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 4; ++i) launch(i % sets);
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(a));
    launch(i % sets);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const int b = argc > 1 ? std::atoi(argv[1]) : 128;
  const int topk = argc > 2 ? std::atoi(argv[2]) : 2048;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; b %d topk %d\n", prop.name, sms, b, topk);
  const Layout layouts[] = {
      {"V3.2", 64, 656, 656, 0, 64LL * 656},
      // 256 x (576 + 8) bytes rounded up to a multiple of 576
      {"MODEL1", 256, 576, 576, 1, ((256LL * 584 + 575) / 576) * 576},
  };
  const int s_ks[] = {32768, 16384};
  uint32_t* sink;
  CHECK(cudaMalloc(&sink, 4));
  std::mt19937_64 rng(7);
  for (int li = 0; li < 2; ++li) {
    const Layout& L = layouts[li];
    const int s_k = s_ks[li];
    const int pages_per_req = s_k / L.page;
    const long long pages = static_cast<long long>(b) * pages_per_req;
    const long long cache_bytes = pages * L.page_bytes;
    uint8_t* cache;
    CHECK(cudaMalloc(&cache, cache_bytes));
    CHECK(cudaMemset(cache, 0x3c, cache_bytes));
    std::vector<long long> perm(pages);
    std::iota(perm.begin(), perm.end(), 0LL);
    std::shuffle(perm.begin(), perm.end(), rng);
    constexpr int kSets = 2;
    long long* rows_d[kSets];
    long long* scales_d[kSets];
    const long long count = static_cast<long long>(b) * topk;
    for (int set = 0; set < kSets; ++set) {
      std::vector<long long> rows(count), scales(count);
      std::vector<int> pos(s_k);
      for (int r = 0; r < b; ++r) {
        std::iota(pos.begin(), pos.end(), 0);
        for (int i = 0; i < topk; ++i) std::swap(pos[i], pos[i + rng() % (s_k - i)]);
        std::sort(pos.begin(), pos.begin() + topk);  // sorted, as compare.py's topk lists are
        for (int i = 0; i < topk; ++i) {
          const long long page = perm[static_cast<long long>(r) * pages_per_req + pos[i] / L.page];
          const long long off = pos[i] % L.page;
          rows[static_cast<long long>(r) * topk + i] = page * L.page_bytes + off * L.token_stride;
          scales[static_cast<long long>(r) * topk + i] = page * L.page_bytes + L.page * L.token_stride + off * 8;
        }
      }
      CHECK(cudaMalloc(&rows_d[set], count * 8));
      CHECK(cudaMalloc(&scales_d[set], count * 8));
      CHECK(cudaMemcpy(rows_d[set], rows.data(), count * 8, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(scales_d[set], scales.data(), count * 8, cudaMemcpyHostToDevice));
    }
    const int tail_pieces = (L.data_bytes - 512) / 16;  // V3.2: 9 (128 RoPE + 16 scale bytes); MODEL1: 4
    const double bytes = static_cast<double>(count) * (L.data_bytes + (L.scales_apart ? 8 : 0));
    std::printf("%s s_k %d: %lld tokens, %.1f MB named, cache %.2f GB\n", L.name, s_k, count, bytes / 1e6,
                cache_bytes / 1e9);
    double best = 1e30;
    auto run = [&](auto kernel, int u, int per_sm) {
      const double us = median_us(
          [&](int set) {
            kernel<<<sms * per_sm, 32 * kWarps>>>(cache, rows_d[set], scales_d[set], count, tail_pieces, sink);
          },
          kSets);
      CHECK(cudaGetLastError());
      best = std::min(best, us);
      std::printf("  gather U %2d, %d blocks/SM (%2d warps): %8.2f us  %7.1f GB/s\n", u, per_sm, per_sm * kWarps, us,
                  bytes / us / 1e3);
    };
    auto run_all = [&](auto scales_apart) {
      constexpr bool kApart = decltype(scales_apart)::value;
      for (int per_sm : {1, 2, 4}) {
        run(gather<2, kApart>, 2, per_sm);
        run(gather<4, kApart>, 4, per_sm);
        run(gather<8, kApart>, 8, per_sm);
        run(gather<16, kApart>, 16, per_sm);
      }
    };
    if (L.scales_apart) run_all(std::true_type{});
    else run_all(std::false_type{});
    // A stream over as many bytes, from the cache's start (sequential): the read ceiling's shape.
    const long long n16 = static_cast<long long>(bytes) / 16;
    const double stream_us = median_us(
        [&](int) { stream<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(cache), n16, sink); }, 1);
    std::printf("  floor %.2f us (%.1f GB/s); a stream of the same bytes %.2f us (%.1f GB/s)\n", best,
                bytes / best / 1e3, stream_us, bytes / stream_us / 1e3);
    for (int set = 0; set < kSets; ++set) {
      CHECK(cudaFree(rows_d[set]));
      CHECK(cudaFree(scales_d[set]));
    }
    CHECK(cudaFree(cache));
  }
  return 0;
}
