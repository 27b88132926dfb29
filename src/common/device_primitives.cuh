// The few Hopper primitives the kernels are built from: mbarriers, TMA tile loads, named barriers,
// proxy fences, register reallocation and programmatic dependent launch. Thin PTX wrappers so the
// kernels read as a schedule rather than as inline assembly.
#pragma once

#include <cuda.h>
#include <cstdint>

namespace hmla::dev {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Declares `name`, a reference to the kernel's shared storage of type `Storage` placed at the first
// 1024-byte boundary of its dynamic shared memory (the 128-byte swizzle of TMA boxes and wgmma
// operands repeats every 1024 bytes; the launch asks for sizeof(Storage) + 1024). The array itself is
// offset: a pointer rebuilt from an integer loses its address space, and every access through it
// becomes a generic load or store. A macro, not a function: behind a force-inlined function the same
// lines made nvcc 13.0 emit ~8 KB more machine code for each sparse decode and prefill kernel, whose
// producers already stall on instruction fetch; as a macro the kernels' code is byte-identical.
#define HMLA_ALIGNED_SHARED_STORAGE(Storage, name)                       \
  extern __shared__ char name##_raw[];                                   \
  const uint32_t name##_misalign = ::hmla::dev::smem_addr(name##_raw) & 1023u; \
  auto& name = *reinterpret_cast<Storage*>(name##_raw + ((1024u - name##_misalign) & 1023u))

// ---- mbarrier: phase-tracked arrival counters in shared memory ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals));
}
// Makes mbarrier.init visible to the async (TMA) proxy before any copy signals the barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(smem_addr(bar))
               : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// Blocks until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// The barrier counts this thread's arrival once all of its earlier cp.async copies have landed (the
// barrier's expected count includes it: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// ---- TMA: tiled tensor loads into shared memory, completing on an mbarrier ----
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                            int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4)
      : "memory");
}

// ---- ordering ----
// Generic-proxy writes to shared memory (st.shared) made visible to wgmma / TMA reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Barrier among `threads` threads (multiple of 32) of the CTA, id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Signals a named barrier without waiting: the producing side of a bar.arrive / bar.sync pair.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- register reallocation between warpgroups (sm_90a) ----
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- programmatic dependent launch ----
// Lets the next kernel in the stream start its prologue while this one finishes.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the grids this one depends on have completed and their writes are visible.
__device__ __forceinline__ void pdl_wait_for_prerequisites() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// ---- math and shared-memory stores on the softmax path ----
// 2^x on the MUFU unit with denormal results flushed to zero: exp2f without fast-math adds a
// range check and two multiplies per call to keep denormals, which a probability never needs.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// A 32-bit store to a shared-memory address (from smem_addr), for addresses computed by hand
// (swizzles): a pointer rebuilt from an integer would compile to a generic 64-bit store.
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(value) : "memory");
}


// Four 8 x 8 matrices of 16-bit values to shared memory: lane L gives the address of row L % 8 of
// matrix L / 8, and register j holds the lane's pair (row lane / 4, columns 2 (lane % 4) + {0, 1})
// of matrix j (the layout of a wgmma accumulator's 8 x 8 pieces).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// A 16-byte load from a shared-memory address (from smem_addr).
__device__ __forceinline__ uint4 ld_shared_u128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// A 32-bit load from a shared-memory address (from smem_addr).
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ bool elect_one_in_warp() { return (threadIdx.x & 31) == 0; }

}  // namespace hmla::dev
