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
// Four load paths, each alone (the kernel's forms of nc256 and of row prefetches into L2 measured
// slower, docs/PERF.md, with the kernel's other work around them), since the narrow kernel takes the
// same time on an H100 as on an H200 (84 and 82.6 us at b 128 h_q 16): its gather looks capped inside
// the SM, not by HBM, and the paths differ in what inside the SM each request passes through:
//   nc      ld.global.nc, as the kernel loads (the L1's miss handling tracks every sector);
//   nc256   the same with .L1::no_allocate.L2::256B (no L1 line; the L2 asked for 256-byte blocks,
//           fewer DRAM requests per 656-byte row);
//   l2pf    nc, with the rows of the batch two on asked into L2 first (cp.async.bulk.prefetch.L2,
//           one per row: the TMA unit, not the L1), so that the loads find them there;
//   bulk    one cp.async.bulk per row into a per-warp double buffer in shared memory, completing on an
//           mbarrier (the TMA unit instead of the L1: whether rows issued from many warps this way pass
//           the load path's cap; the kernel's earlier bulk form issued them from one warp).
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
__device__ __forceinline__ uint4 ld_nc_wide(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_nc_u32(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// rows[i]: the byte offset of the i-th named token's row (-1: invalid, skipped); scale_at[i]: its scale word's.
enum class Path { kNc, kNc256, kL2Prefetch, kBulk };
const char* path_name(Path p) {
  return p == Path::kNc ? "nc" : p == Path::kNc256 ? "nc256" : p == Path::kL2Prefetch ? "l2pf" : "bulk";
}

template <int U, bool kScalesApart, Path kPath>
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
  // l2pf: the rows of the batch two on, asked into L2 by the TMA unit (one bulk prefetch per row)
  // before this batch's loads, from offsets loaded a batch earlier.
  const int row_bytes = 512 + 16 * tail_pieces;
  auto row_at = [&](long long at) { return lane < U && at + lane < count ? rows[at + lane] : -1LL; };
  long long far_row = kPath == Path::kL2Prefetch ? row_at(first + 2 * warps * U) : -1;
  for (; first < count; first += warps * U) {
    const long long next = first + warps * U;
    if constexpr (kPath == Path::kL2Prefetch) {
      if (far_row >= 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(cache + far_row), "r"(row_bytes) : "memory");
      far_row = row_at(next + 2 * warps * U);
    }
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
        if constexpr (kPath == Path::kNc256) {
          head[u] = ld_nc_wide(cache + r + 16 * lane);
          if (lane < tail_pieces) tail[u] = ld_nc_wide(cache + r + 512 + 16 * lane);
        } else {
          head[u] = ld_nc(cache + r + 16 * lane);
          if (lane < tail_pieces) tail[u] = ld_nc(cache + r + 512 + 16 * lane);
        }
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

// The bulk path: lane u < U of a warp copies row u of the warp's batch (its data bytes: a multiple
// of 16 at a 16-byte-aligned address) with one cp.async.bulk into buffer k % 2 of the warp's two,
// completing on that buffer's mbarrier, whose expected bytes lane 0 sets first. Batch k + 1 is issued
// before batch k is waited for (two batches per warp in flight) and the rows' offsets load a batch
// ahead, as in the load paths. MODEL1's scale word is loaded (ld.global.nc) by the row's lane.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int U, bool kScalesApart>
__global__ void __launch_bounds__(32 * kWarps) gather_bulk(const uint8_t* cache, const long long* rows,
                                                           const long long* scale_at, long long count,
                                                           int row_bytes, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t buffers[];
  __shared__ __align__(8) uint64_t bars[kWarps][2];
  const int lane = threadIdx.x % 32;
  const int w = threadIdx.x / 32;
  uint8_t* mine = buffers + static_cast<size_t>(w) * 2 * U * row_bytes;
  if (lane < 2) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[w][lane])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  const long long warp = static_cast<long long>(blockIdx.x) * kWarps + w;
  const long long step = static_cast<long long>(gridDim.x) * kWarps * U;
  auto row_of = [&](long long first) { return lane < U && first + lane < count ? rows[first + lane] : -1LL; };
  auto scale_of = [&](long long first) {
    return kScalesApart && lane < U && first + lane < count ? scale_at[first + lane] : -1LL;
  };
  // Batch k's copies; returns this lane's scale word (loaded now, used when the batch is consumed).
  auto issue = [&](long long row, long long scale, int k) {
    const uint32_t bar = smem_u32(&bars[w][k & 1]);
    const unsigned valid = __ballot_sync(0xffffffffu, row >= 0);
    if (lane == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                   "r"(__popc(valid) * row_bytes)
                   : "memory");
    __syncwarp();
    if (row >= 0) {
      const uint32_t dst = smem_u32(mine + static_cast<size_t>((k & 1) * U + lane) * row_bytes);
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                   "l"(cache + row), "r"(row_bytes), "r"(bar)
                   : "memory");
    }
    return kScalesApart && scale >= 0 ? ld_nc_u32(cache + scale) : 0u;
  };
  uint32_t acc = 0;
  long long first = warp * U;
  uint32_t scale_word = issue(row_of(first), scale_of(first), 0);
  long long next_row = row_of(first + step), next_scale = scale_of(first + step);
  for (int k = 0; first < count; ++k, first += step) {
    uint32_t next_word = 0;
    if (first + step < count) next_word = issue(next_row, next_scale, k + 1);
    next_row = row_of(first + 2 * step);
    next_scale = scale_of(first + 2 * step);
    const uint32_t bar = smem_u32(&bars[w][k & 1]);
    const uint32_t parity = (k >> 1) & 1;
    asm volatile(
        "{\n .reg .pred done;\n wait_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait_%=;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
    if (lane < U) acc ^= *reinterpret_cast<const uint32_t*>(mine + static_cast<size_t>((k & 1) * U + lane) * row_bytes);
    acc ^= scale_word;
    scale_word = next_word;
    // The buffer's next copy (batch k + 2, an async-proxy write) after this generic read.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
  }
  if (acc == 0x9e3779b9u) atomicXor(sink, acc);
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
    const char* best_at = "";
    char label[96];
    auto report = [&](double us, Path path, int u, int per_sm) {
      std::snprintf(label, sizeof(label), "%-5s U %2d, %d blocks/SM (%2d warps)", path_name(path), u, per_sm,
                    per_sm * kWarps);
      if (us < best) {
        best = us;
        static char best_label[96];
        std::snprintf(best_label, sizeof(best_label), "%s", label);
        best_at = best_label;
      }
      std::printf("  gather %s: %8.2f us  %7.1f GB/s\n", label, us, bytes / us / 1e3);
    };
    auto run = [&](auto kernel, Path path, int u, int per_sm) {
      const double us = median_us(
          [&](int set) {
            kernel<<<sms * per_sm, 32 * kWarps>>>(cache, rows_d[set], scales_d[set], count, tail_pieces, sink);
          },
          kSets);
      CHECK(cudaGetLastError());
      report(us, path, u, per_sm);
    };
    // The bulk path's rows: V3.2's whole 656-byte token, MODEL1's 576 data bytes (its scale word apart).
    const int bulk_row_bytes = L.data_bytes;
    auto run_bulk = [&](auto kernel, int u, int per_sm) {
      const size_t smem = static_cast<size_t>(kWarps) * 2 * u * bulk_row_bytes;
      if (smem * per_sm > 220 * 1024) return;  // that many blocks would not be resident together
      CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      const double us = median_us(
          [&](int set) {
            kernel<<<sms * per_sm, 32 * kWarps, smem>>>(cache, rows_d[set], scales_d[set], count, bulk_row_bytes,
                                                         sink);
          },
          kSets);
      CHECK(cudaGetLastError());
      report(us, Path::kBulk, u, per_sm);
    };
    auto run_all = [&](auto scales_apart) {
      constexpr bool kApart = decltype(scales_apart)::value;
      for (int per_sm : {1, 2, 4}) {
        run(gather<2, kApart, Path::kNc>, Path::kNc, 2, per_sm);
        run(gather<4, kApart, Path::kNc>, Path::kNc, 4, per_sm);
        run(gather<8, kApart, Path::kNc>, Path::kNc, 8, per_sm);
        run(gather<16, kApart, Path::kNc>, Path::kNc, 16, per_sm);
      }
      for (int per_sm : {1, 2, 4}) {
        run(gather<4, kApart, Path::kNc256>, Path::kNc256, 4, per_sm);
        run(gather<8, kApart, Path::kNc256>, Path::kNc256, 8, per_sm);
        run(gather<16, kApart, Path::kNc256>, Path::kNc256, 16, per_sm);
      }
      for (int per_sm : {1, 2, 4}) {
        run(gather<4, kApart, Path::kL2Prefetch>, Path::kL2Prefetch, 4, per_sm);
        run(gather<8, kApart, Path::kL2Prefetch>, Path::kL2Prefetch, 8, per_sm);
        run(gather<16, kApart, Path::kL2Prefetch>, Path::kL2Prefetch, 16, per_sm);
      }
      for (int per_sm : {1, 2, 4}) {
        run_bulk(gather_bulk<2, kApart>, 2, per_sm);
        run_bulk(gather_bulk<4, kApart>, 4, per_sm);
        run_bulk(gather_bulk<8, kApart>, 8, per_sm);
        run_bulk(gather_bulk<16, kApart>, 16, per_sm);
      }
    };
    if (L.scales_apart) run_all(std::true_type{});
    else run_all(std::false_type{});
    // A stream over as many bytes, from the cache's start (sequential): the read ceiling's shape.
    const long long n16 = static_cast<long long>(bytes) / 16;
    const double stream_us = median_us(
        [&](int) { stream<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(cache), n16, sink); }, 1);
    std::printf("  floor %.2f us (%.1f GB/s, %s); a stream of the same bytes %.2f us (%.1f GB/s)\n", best,
                bytes / best / 1e3, best_at, stream_us, bytes / stream_us / 1e3);
    for (int set = 0; set < kSets; ++set) {
      CHECK(cudaFree(rows_d[set]));
      CHECK(cudaFree(scales_d[set]));
    }
    CHECK(cudaFree(cache));
  }
  return 0;
}
