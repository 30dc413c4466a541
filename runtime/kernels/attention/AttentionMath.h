// The per-element and per-tile arithmetic of the CUDA attention kernels (attention/cuda.cu), written
// once for the device and the host: the visibility rules of docs/kernels.md as a predicate (which the
// CPU kernel, attention/cpu.cpp, applies too), the index maps of q, k, v and o, the tile geometry, and
// the online softmax (running max, running sum, rescale) that the tiled forward and backward kernels
// apply per tile. The CPU unit test (test/unit/kernels/AttentionMathTest.cpp) runs these same
// functions in a host emulation of the tiled kernels and checks it against the CPU kernel, so the math
// is verified without a GPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/attention/Contract.h"

#include "runtime/kernels/HostDevice.h"
#include "runtime/kernels/KernelElements.h"

namespace dgemma::attention {

// ---- visibility ------------------------------------------------------------------------------------

// The key position of query `query`: the queries are the last Tq of the Tk positions, save the
// trailing keys after them (a context-parallel chunk's keys past its end).
DGEMMA_HOST_DEVICE inline int64_t diagonalKey(const AttentionContract& g, int64_t query) {
  return query + g.keys - g.queries - g.trailingKeys;
}

// One batch row of the optional key inputs ([B, Tk] i64 each): the image overlay's segment_ids and
// the packed documents' document_ids. A null row reads as 0 at every position: segment 0 is no
// overlay, and one document everywhere keeps nothing apart.
struct MaskRows {
  const int64_t* segments = nullptr;
  const int64_t* documents = nullptr;
  int64_t keys = 0;  // Tk, the rows' length
  DGEMMA_HOST_DEVICE int64_t segmentAt(int64_t position) const {
    if (segments == nullptr) return 0;
    DGEMMA_CUDA_BOUNDS(position, keys);
    return segments[position];
  }
  DGEMMA_HOST_DEVICE int64_t documentAt(int64_t position) const {
    if (documents == nullptr) return 0;
    DGEMMA_CUDA_BOUNDS(position, keys);
    return documents[position];
  }
};

// Batch row `b` of `segmentIds` and `documentIds` (each null when the call has none).
DGEMMA_HOST_DEVICE inline MaskRows maskRowsOf(const AttentionContract& g, const int64_t* segmentIds,
                                              const int64_t* documentIds, int64_t b) {
  return {segmentIds == nullptr ? nullptr : segmentIds + b * g.keys,
          documentIds == nullptr ? nullptr : documentIds + b * g.keys, g.keys};
}

// The overlay: a query whose own position is in segment s > 0 sees every key of segment s, past or
// future, inside the window or not.
DGEMMA_HOST_DEVICE inline bool inQuerySegment(const AttentionContract& g, MaskRows rows, int64_t query, int64_t key) {
  const int64_t own = rows.segmentAt(diagonalKey(g, query));
  return own > 0 && rows.segmentAt(key) == own;
}

// The mask's own rule (docs/kernels.md) for key `key` and query `query`, before the documents.
DGEMMA_HOST_DEVICE inline bool maskAdmits(const AttentionContract& g, bool valid, MaskRows rows, int64_t query,
                                          int64_t key) {
  switch (g.mask) {
    case AttentionMask::Causal: {
      const int64_t self = diagonalKey(g, query);
      if (key == self) return true;  // a pad query keeps its diagonal
      if (!valid) return false;
      return (key < self && (g.window == 0 || self - key < g.window)) || inQuerySegment(g, rows, query, key);
    }
    case AttentionMask::Bidirectional: {
      if (!valid) return false;
      const int64_t self = diagonalKey(g, query);
      return g.window == 0 || (key > self ? key - self : self - key) < g.window;  // the symmetric window
    }
    case AttentionMask::Prefix:
      return key >= g.prefixLen || (valid && (g.window == 0 || key >= g.prefixLen - g.window));
  }
  return false;
}

// docs/kernels.md's visibility of key `key` for query `query`; `valid` is key_valid[b, key] != 0 and
// `rows` the batch row's segment and document ids: the mask's rule, within the query's document.
DGEMMA_HOST_DEVICE inline bool keyVisible(const AttentionContract& g, bool valid, MaskRows rows, int64_t query,
                                          int64_t key) {
  return maskAdmits(g, valid, rows, query, key) && rows.documentAt(key) == rows.documentAt(diagonalKey(g, query));
}

// Keys [begin, end): every key outside is invisible to the queries it was computed for.
struct KeyRange {
  int64_t begin;
  int64_t end;
};

// The candidate keys of one query (a superset of its visible keys): its window's keys. With segment
// ids a query may see any key of its segment, so every key is a candidate. Documents only remove keys.
DGEMMA_HOST_DEVICE inline KeyRange candidateKeys(const AttentionContract& g, int64_t query) {
  switch (g.mask) {
    case AttentionMask::Causal: {
      if (g.segmented) return {0, g.keys};
      const int64_t self = diagonalKey(g, query);
      const int64_t first = g.window == 0 || self - g.window + 1 < 0 ? 0 : self - g.window + 1;
      return {first, self + 1};
    }
    case AttentionMask::Bidirectional: {
      if (g.window == 0) return {0, g.keys};
      const int64_t self = diagonalKey(g, query);
      const int64_t first = self - g.window + 1 < 0 ? 0 : self - g.window + 1;
      const int64_t end = self + g.window > g.keys ? g.keys : self + g.window;
      return {first, end};
    }
    case AttentionMask::Prefix: {
      const int64_t first = g.window == 0 || g.prefixLen - g.window < 0 ? 0 : g.prefixLen - g.window;
      return {first, g.keys};
    }
  }
  return {0, g.keys};
}

// The candidate keys of the queries [first, last]: both ends of candidateKeys never decrease with the
// query, so the union is [begin of `first`, end of `last`).
DGEMMA_HOST_DEVICE inline KeyRange candidateKeysOfQueries(const AttentionContract& g, int64_t first, int64_t last) {
  return {candidateKeys(g, first).begin, candidateKeys(g, last).end};
}

// ---- index maps ------------------------------------------------------------------------------------

// Query head `head` reads KV head head / (Hq / Hkv).
DGEMMA_HOST_DEVICE inline int64_t kvHeadOf(const AttentionContract& g, int64_t head) {
  return head / (g.queryHeads / g.kvHeads);
}

// The row of q, o, do and dq ([B, Tq, Hq, ·]) of (b, query, head); its vector starts at row · D (Dv).
DGEMMA_HOST_DEVICE inline int64_t queryRowOf(const AttentionContract& g, int64_t b, int64_t query, int64_t head) {
  return (b * g.queries + query) * g.queryHeads + head;
}

// The row of k, v, dk and dv ([B, Tk, Hkv, ·]) of (b, key, kvHead).
DGEMMA_HOST_DEVICE inline int64_t keyRowOf(const AttentionContract& g, int64_t b, int64_t key, int64_t kvHead) {
  return (b * g.keys + key) * g.kvHeads + kvHead;
}

// ---- tile geometry ---------------------------------------------------------------------------------

// A block works on `queryTile` queries of one (b, head) against `keyTile` keys at a time (the backward
// key kernel: `keyTile` keys of one (b, KV head) against `queryTile` queries at a time). Rows of
// shared tiles that the pair phase reads across threads are padded by one float, so that threads
// reading the same column of consecutive rows hit different banks.
struct TileShape {
  int queryTile;
  int keyTile;
};

// Floats of shared memory each kernel needs for a tile shape (the layouts are in attention/cuda.cu).
DGEMMA_HOST_DEVICE inline int64_t forwardSharedFloats(TileShape t, int64_t d, int64_t dv) {
  return t.queryTile * (d + 1) + t.keyTile * (d + 1) + t.keyTile * dv + t.queryTile * (t.keyTile + 1) +
         t.queryTile * dv + 3 * t.queryTile;
}
DGEMMA_HOST_DEVICE inline int64_t backwardQuerySharedFloats(TileShape t, int64_t d, int64_t dv) {
  return t.queryTile * (d + 1) + t.queryTile * (dv + 1) + t.keyTile * (d + 1) + t.keyTile * (dv + 1) +
         2 * t.queryTile * (t.keyTile + 1) + t.queryTile * d + 4 * t.queryTile;
}
DGEMMA_HOST_DEVICE inline int64_t backwardKeySharedFloats(TileShape t, int64_t d, int64_t dv) {
  return t.keyTile * (d + 1) + t.keyTile * (dv + 1) + t.keyTile * d + t.keyTile * dv + t.queryTile * (d + 1) +
         t.queryTile * (dv + 1) + 2 * t.queryTile * (t.keyTile + 1) + 3 * t.queryTile;
}

// The largest tiles, from 16 queries × 32 keys down by halving the key tile then the query tile,
// whose shared memory fits `budgetBytes`; {0, 0} when not even 1 × 1 fits (the factory rejects it).
template <typename SharedFloats>
inline TileShape chooseTiles(int64_t d, int64_t dv, int64_t budgetBytes, SharedFloats sharedFloats) {
  TileShape t{16, 32};
  while (sharedFloats(t, d, dv) * 4 > budgetBytes) {
    if (t.keyTile > 1)
      t.keyTile /= 2;
    else if (t.queryTile > 1)
      t.queryTile /= 2;
    else
      return {0, 0};
  }
  return t;
}

// ---- online softmax ----------------------------------------------------------------------------------

// One query row's softmax statistics over the keys seen so far: `maximum` of their scores and
// sum = Σ exp(score − maximum), in f32 as the contract's f32 accumulation. A row that has seen no
// visible key has maximum −inf and sum 0.
struct OnlineSoftmax {
  float maximum = -INFINITY;
  float sum = 0.0f;

  // Takes in a tile whose largest visible score is `tileMaximum` (−inf: none visible): raises the
  // running max and returns the factor by which everything accumulated against the old max (the sum,
  // which this rescales, and the caller's output accumulators) is multiplied. 1 while nothing is
  // visible, 0 at the first visible key (nothing was accumulated), exp(old − new) otherwise.
  DGEMMA_HOST_DEVICE float raiseMaximum(float tileMaximum) {
    const float raised = fmaxf(maximum, tileMaximum);
    if (raised == -INFINITY) return 1.0f;
    const float factor = maximum == -INFINITY ? 0.0f : expf(maximum - raised);
    maximum = raised;
    sum *= factor;
    return factor;
  }

  // The unnormalised weight exp(score − maximum) of a visible score (after raiseMaximum).
  DGEMMA_HOST_DEVICE float weight(float score) const { return expf(score - maximum); }
};

// The row step of the tiled forward: takes in `count` scores (−inf for an invisible key), replaces
// each by its weight exp(score − maximum) (0 for an invisible key), adds the weights to the sum and
// returns the rescale factor of raiseMaximum. The CUDA forward runs it per row and tile.
DGEMMA_HOST_DEVICE inline float takeInTile(OnlineSoftmax& row, float* scores, int count) {
  float tileMaximum = -INFINITY;
  for (int j = 0; j < count; ++j) tileMaximum = fmaxf(tileMaximum, scores[j]);
  const float factor = row.raiseMaximum(tileMaximum);
  float tileSum = 0.0f;
  for (int j = 0; j < count; ++j) {
    scores[j] = scores[j] == -INFINITY ? 0.0f : row.weight(scores[j]);
    tileSum += scores[j];
  }
  row.sum += tileSum;
  return factor;
}

// The backward's first pass also needs delta = Σ p · dp (p the probabilities, dp = do · v), which it
// accumulates as Σ weight · dp against the running max: like takeInTile, then
// delta = weightedDp · factor + Σ weight · dp over the tile. `dps` holds the tile's dp values.
DGEMMA_HOST_DEVICE inline void takeInTileWithDp(OnlineSoftmax& row, float& weightedDp, float* scores,
                                                const float* dps, int count) {
  const float factor = takeInTile(row, scores, count);
  float tileDp = 0.0f;
  for (int j = 0; j < count; ++j) tileDp += scores[j] * dps[j];
  weightedDp = weightedDp * factor + tileDp;
}

// A visible key's probability from the row's final statistics (the backward recomputes p per tile).
DGEMMA_HOST_DEVICE inline float probability(float score, float maximum, float sum) {
  return expf(score - maximum) / sum;
}

// The score gradient of the contract: ds = scale · p · (dp − delta), in the CPU kernel's order.
DGEMMA_HOST_DEVICE inline float scoreGradient(float scale, float p, float dp, float delta) {
  return scale * p * (dp - delta);
}

// The output of a row from its accumulator: acc / sum, or 0 when no key was visible.
DGEMMA_HOST_DEVICE inline float normalizedOutput(float accumulator, float sum) {
  return sum > 0.0f ? accumulator / sum : 0.0f;
}

}  // namespace dgemma::attention
