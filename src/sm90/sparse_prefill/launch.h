// Host side of sparse prefill on sm90: the seesaw kernel of config.h (docs/SPARSE_PREFILL.md) over
// the sparse decode kernel's parameter block; no plan, and a workspace only for the last round's pieces.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "hmla/params.h"
#include "sm90/sparse_decode/launch.h"

namespace hmla::sm90::sparse_prefill {

// How the work items (query token, 64-head tile) are dealt over the persistent grid: whole items
// round-robin (CTA c takes c, c + grid, ...), then the items from tail_first on each cut into
// `pieces` ranges of its pairs of 64-key tiles, one piece per CTA (the kernel handles a cut last round
// after full ones). plan() cuts, with a workspace, when there are fewer items than SMs: every item
// then, so that the only round keeps the SMs busy.
struct ItemRounds {
  static constexpr int kMaxPieces = 32;  // the merger holds one piece's weight per lane
  int grid = 0;
  int units = 0;       // whole items, then tail_items * pieces pieces
  int tail_first = 0;  // the first cut item, and the first piece's unit
  int tail_items = 0;  // 0: nothing is cut
  int pieces = 0;
  // The workspace: per cut item a counter of its finished pieces, then per piece 64 rows of lse,
  // max and normalised bf16 O (512 columns).
  size_t counters = 0, lse = 0, max = 0, o = 0, bytes = 0;

  // `sms`: the device's SMs; `with_workspace`: false deals whole items only.
  static ItemRounds plan(int s_q, int h_q, int topk, int sms, bool with_workspace);
};

// Validated params in; the attention, outputs written directly.
void launch(const SparsePrefillParams& params, cudaStream_t stream);

// The kernel for d_qk 576 or 512 (one instantiation file each) on `grid` CTAs.
template <int kHeadDim>
void launch_kernel(const CUtensorMap& q_map, const sparse_decode::KernelParams& params, int grid, cudaStream_t stream);

}  // namespace hmla::sm90::sparse_prefill
