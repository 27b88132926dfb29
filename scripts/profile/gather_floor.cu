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
// Four load paths, each alone, and two together (the kernel's forms of nc256 and of row prefetches into L2 measured
// slower, docs/PERF.md, with the kernel's other work around them), since the narrow kernel takes the
// same time on an H100 as on an H200 (84 and 82.6 us at b 128 h_q 16): the SM sets its pace, either
// its path for the requests or the producers' work around them, and the paths differ in what inside
// the SM each request passes through:
//   nc      ld.global.nc, as the kernel loads (the L1's miss handling tracks every sector);
//   nc256   the same with .L1::no_allocate.L2::256B (no L1 line; the L2 asked for 256-byte blocks,
//           fewer DRAM requests per 656-byte row);
//   l2pf    nc, with the rows of the batch two on asked into L2 first (cp.async.bulk.prefetch.L2,
//           one per row: the TMA unit, not the L1), so that the loads find them there;
//   bulk    one cp.async.bulk per row into a per-warp double buffer in shared memory, completing on an
//           mbarrier (the TMA unit instead of the L1: whether rows issued from many warps this way pass
//           the load path's cap; the kernel's earlier bulk form issued them from one warp);
//   nc + bulk  part of each warp's rows loaded, part copied, at once: whether the two caps add up.
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

// One warp's batch of U rows into registers: lane l loads 16-byte piece l of each row's first 512
// bytes, lanes below tail_pieces the rest, lane 0 MODEL1's scale word; row u's offsets are in lane u
// (my_row < 0: no row). Every load is issued before any is used; fold() uses them.
template <int U, bool kScalesApart, Path kPath>
struct RowBatch {
  uint4 head[U > 0 ? U : 1], tail[U > 0 ? U : 1];
  uint32_t scale[U > 0 ? U : 1];
  __device__ __forceinline__ void load(const uint8_t* cache, long long my_row, long long my_scale, int tail_pieces,
                                       int lane) {
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
          const long long sc = __shfl_sync(0xffffffffu, my_scale, u);
          if (lane == 0) scale[u] = ld_nc_u32(cache + sc);
        }
      }
    }
  }
  __device__ __forceinline__ uint32_t fold() const {
    uint32_t acc = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= head[u].x ^ head[u].y ^ head[u].z ^ head[u].w ^ tail[u].x ^ tail[u].w ^ scale[u];
    return acc;
  }
};

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
    RowBatch<U, kScalesApart, kPath> batch;
    batch.load(cache, my_row, my_scale, tail_pieces, lane);
    acc ^= batch.fold();
    my_row = next_row;
    my_scale = next_scale;
  }
  if (acc == 0x9e3779b9u) atomicXor(sink, acc);  // keeps the loads; almost never taken
}

// The bulk path, alone or beside the loads: each warp's batch is U rows loaded as `nc` does (into
// registers, used at the batch's end) and V rows copied by the TMA unit: lane v < V copies row U + v
// (its data bytes: a multiple of 16 at a 16-byte-aligned address) with one cp.async.bulk into buffer
// k % 2 of the warp's two, completing on that buffer's mbarrier, whose expected bytes lane 0 sets
// first. A batch's copies are issued a batch before it is consumed (two batches' copies per warp in
// flight) and every row's offset loads a batch before it is used. MODEL1's scale word is loaded
// (ld.global.nc) by the lane that handles its row. U 0: the bulk path alone; U > 0: whether the two
// paths' caps add up.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int U, int V, bool kScalesApart>
__global__ void __launch_bounds__(32 * kWarps) gather_mixed(const uint8_t* cache, const long long* rows,
                                                            const long long* scale_at, long long count,
                                                            int tail_pieces, uint32_t* sink) {
  static_assert(U + V <= 32 && V >= 1, "a lane per row of a batch; at least one copied row");
  extern __shared__ __align__(128) uint8_t buffers[];
  __shared__ __align__(8) uint64_t bars[kWarps][2];
  const int lane = threadIdx.x % 32;
  const int w = threadIdx.x / 32;
  const int row_bytes = 512 + 16 * tail_pieces;  // V3.2 656, MODEL1 576
  uint8_t* mine = buffers + static_cast<size_t>(w) * 2 * V * row_bytes;
  if (lane < 2) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[w][lane])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  constexpr int B = U + V;
  const long long step = static_cast<long long>(gridDim.x) * kWarps * B;
  // Lane l's offsets in the batch at `at`: the loaded row U > l's, the copied row l < V's.
  auto load_row = [&](long long at) { return lane < U && at + lane < count ? rows[at + lane] : -1LL; };
  auto load_scale = [&](long long at) {
    return kScalesApart && lane < U && at + lane < count ? scale_at[at + lane] : -1LL;
  };
  auto copy_row = [&](long long at) { return lane < V && at + U + lane < count ? rows[at + U + lane] : -1LL; };
  auto copy_scale = [&](long long at) {
    return kScalesApart && lane < V && at + U + lane < count ? scale_at[at + U + lane] : -1LL;
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
      const uint32_t dst = smem_u32(mine + static_cast<size_t>((k & 1) * V + lane) * row_bytes);
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                   "l"(cache + row), "r"(row_bytes), "r"(bar)
                   : "memory");
    }
    return kScalesApart && scale >= 0 ? ld_nc_u32(cache + scale) : 0u;
  };
  uint32_t acc = 0;
  long long first = (static_cast<long long>(blockIdx.x) * kWarps + w) * B;
  uint32_t copied_scale = issue(copy_row(first), copy_scale(first), 0);
  long long next_copy = copy_row(first + step), next_copy_scale = copy_scale(first + step);
  long long my_row = load_row(first), my_scale = load_scale(first);
  for (int k = 0; first < count; ++k, first += step) {
    uint32_t next_copied_scale = 0;
    if (first + step < count) next_copied_scale = issue(next_copy, next_copy_scale, k + 1);
    next_copy = copy_row(first + 2 * step);
    next_copy_scale = copy_scale(first + 2 * step);
    const long long next_row = load_row(first + step), next_scale = load_scale(first + step);
    RowBatch<U, kScalesApart, Path::kNc> batch;
    batch.load(cache, my_row, my_scale, tail_pieces, lane);
    const uint32_t bar = smem_u32(&bars[w][k & 1]);
    const uint32_t parity = (k >> 1) & 1;
    asm volatile(
        "{\n .reg .pred done;\n wait_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait_%=;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
    if (lane < V) acc ^= *reinterpret_cast<const uint32_t*>(mine + static_cast<size_t>((k & 1) * V + lane) * row_bytes);
    acc ^= copied_scale;
    copied_scale = next_copied_scale;
    acc ^= batch.fold();
    my_row = next_row;
    my_scale = next_scale;
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
    char best_at[96] = "";
    // One variant's time; `rows_in` says which path each row takes and how many per warp and batch.
    auto report = [&](double us, const char* rows_in, int per_sm) {
      char label[96];
      std::snprintf(label, sizeof(label), "%s, %d blocks/SM (%2d warps)", rows_in, per_sm, per_sm * kWarps);
      if (us < best) {
        best = us;
        std::snprintf(best_at, sizeof(best_at), "%s", label);
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
      char rows_in[48];
      std::snprintf(rows_in, sizeof(rows_in), "%-5s U %2d", path_name(path), u);
      report(us, rows_in, per_sm);
    };
    // U rows per warp loaded, V copied (bulk: V3.2's whole 656-byte token, MODEL1's 576 data bytes).
    auto run_mixed = [&](auto kernel, int u, int v, int per_sm) {
      const size_t smem = static_cast<size_t>(kWarps) * 2 * v * L.data_bytes;
      if (smem * per_sm > 220 * 1024) return;  // that many blocks would not be resident together
      CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      const double us = median_us(
          [&](int set) {
            kernel<<<sms * per_sm, 32 * kWarps, smem>>>(cache, rows_d[set], scales_d[set], count, tail_pieces, sink);
          },
          kSets);
      CHECK(cudaGetLastError());
      char rows_in[48];
      if (u == 0) std::snprintf(rows_in, sizeof(rows_in), "%-5s U %2d", path_name(Path::kBulk), v);
      else std::snprintf(rows_in, sizeof(rows_in), "nc U %d + bulk V %d", u, v);
      report(us, rows_in, per_sm);
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
        run_mixed(gather_mixed<0, 2, kApart>, 0, 2, per_sm);
        run_mixed(gather_mixed<0, 4, kApart>, 0, 4, per_sm);
        run_mixed(gather_mixed<0, 8, kApart>, 0, 8, per_sm);
        run_mixed(gather_mixed<0, 16, kApart>, 0, 16, per_sm);
      }
      // Both paths at once, at the narrow kernel's shape (8 warps, 8-16 rows per warp in registers)
      // and with 16 warps per SM.
      for (int per_sm : {1, 2}) {
        run_mixed(gather_mixed<8, 4, kApart>, 8, 4, per_sm);
        run_mixed(gather_mixed<8, 8, kApart>, 8, 8, per_sm);
        run_mixed(gather_mixed<16, 4, kApart>, 16, 4, per_sm);
        run_mixed(gather_mixed<16, 8, kApart>, 16, 8, per_sm);
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
