// How sparse prefill deals its work items over the persistent grid (ItemRounds in
// src/sm90/sparse_prefill/launch.h): whole items round-robin, and with a workspace and fewer items
// than SMs, every item cut into pieces of its pairs of 64-key tiles. Host arithmetic; the kernel's results with
// and without the cut are checked on the GPU (tests/gpu/test_sparse_prefill.cu).
#include <gtest/gtest.h>

#include <algorithm>

#include "sm90/sparse_prefill/launch.h"

namespace {

using hmla::sm90::sparse_prefill::ItemRounds;

// Every unit is dealt once: the grid covers the units, each CTA takes at most one piece (the pieces
// fill part of one round after the whole ones), and the workspace regions do not overlap.
void expect_consistent(const ItemRounds& r, int items, int sms) {
  EXPECT_GE(r.grid, 1);
  EXPECT_LE(r.grid, sms);
  EXPECT_LE(r.grid, r.units);
  if (r.tail_items == 0) {
    EXPECT_EQ(r.units, items);
    EXPECT_EQ(r.bytes, 0u);
    return;
  }
  EXPECT_GE(r.pieces, 2);
  EXPECT_LE(r.pieces, ItemRounds::kMaxPieces);
  EXPECT_EQ(r.tail_first % r.grid, 0) << "the pieces start a round";
  EXPECT_EQ(r.tail_first + r.tail_items, items);
  EXPECT_EQ(r.units, r.tail_first + r.tail_items * r.pieces);
  EXPECT_LE(r.tail_items * r.pieces, r.grid) << "one piece per CTA at most";
  const size_t rows = static_cast<size_t>(r.tail_items) * r.pieces * 64;
  EXPECT_GE(r.lse, r.counters + sizeof(int) * r.tail_items);
  EXPECT_GE(r.max, r.lse + sizeof(float) * rows);
  EXPECT_GE(r.o, r.max + sizeof(float) * rows);
  EXPECT_GE(r.bytes, r.o + 2 * 512 * rows);
  EXPECT_EQ(r.lse % 256, 0u);
  EXPECT_EQ(r.max % 256, 0u);
  EXPECT_EQ(r.o % 256, 0u);
}

TEST(SparsePrefillRounds, FullRoundsStayWhole) {
  // s_q 4096, topk 2048 on 132 SMs: h_q 64 is 31 rounds and 4 items, h_q 128 62 and 8; the merge cost
  // about what cutting those saved (docs/PERF.md, "The last round cut"), so nothing is cut.
  for (const int h_q : {64, 128}) {
    const ItemRounds r = ItemRounds::plan(4096, h_q, 2048, 132, true);
    expect_consistent(r, 4096 * h_q / 64, 132);
    EXPECT_EQ(r.tail_items, 0);
    EXPECT_EQ(r.grid, 132);
  }
}

TEST(SparsePrefillRounds, FewerItemsThanSmsAreAllCut) {
  const ItemRounds r = ItemRounds::plan(3, 64, 32768, 132, true);  // 3 items, 256 pairs each
  expect_consistent(r, 3, 132);
  EXPECT_EQ(r.tail_first, 0);
  EXPECT_EQ(r.tail_items, 3);
  EXPECT_EQ(r.pieces, 32);
  EXPECT_EQ(r.grid, 96);
}

TEST(SparsePrefillRounds, NothingToCut) {
  // Whole rounds; one pair per item; as many items as SMs or more; no workspace.
  for (const ItemRounds& r : {ItemRounds::plan(132, 64, 2048, 132, true), ItemRounds::plan(7, 128, 128, 132, true),
                              ItemRounds::plan(200, 64, 2048, 132, true), ItemRounds::plan(5, 64, 2048, 132, false)}) {
    EXPECT_EQ(r.tail_items, 0);
    EXPECT_EQ(r.bytes, 0u);
  }
  expect_consistent(ItemRounds::plan(200, 64, 2048, 132, true), 200, 132);
  const ItemRounds whole = ItemRounds::plan(5, 64, 2048, 132, false);
  EXPECT_EQ(whole.grid, 5);
  EXPECT_EQ(whole.units, 5);
}

TEST(SparsePrefillRounds, EveryShapeDealsEachUnitOnce) {
  for (int sms : {1, 2, 78, 132}) {
    for (int s_q : {1, 2, 3, 63, 64, 65, 131, 132, 133, 268, 1000}) {
      for (int h_q : {1, 64, 65, 128}) {
        for (int topk : {1, 128, 129, 1000, 2048, 32768}) {
          const ItemRounds r = ItemRounds::plan(s_q, h_q, topk, sms, true);
          SCOPED_TRACE(testing::Message() << "sms " << sms << " s_q " << s_q << " h_q " << h_q << " topk " << topk);
          expect_consistent(r, s_q * ((h_q + 63) / 64), sms);
          EXPECT_LE(r.pieces, (topk + 127) / 128);
        }
      }
    }
  }
}

}  // namespace
