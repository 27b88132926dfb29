// Host side of sparse prefill on sm90: the seesaw kernel of config.h (docs/SPARSE_PREFILL.md) over
// the sparse decode kernel's parameter block, no plan and no workspace.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "hmla/params.h"
#include "sm90/sparse_decode/launch.h"

namespace hmla::sm90::sparse_prefill {

// Validated params in; the attention, outputs written directly.
void launch(const SparsePrefillParams& params, cudaStream_t stream);

// The kernel for d_qk 576 or 512 (one instantiation file each): a persistent grid over the
// (query token, 64-head tile) items.
template <int kHeadDim>
void launch_kernel(const CUtensorMap& q_map, const sparse_decode::KernelParams& params, cudaStream_t stream);

}  // namespace hmla::sm90::sparse_prefill
