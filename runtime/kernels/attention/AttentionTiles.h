// The bodies of the CUDA attention kernels (attention/cuda.cu): what one block does for one task, as
// __host__ __device__ templates over the block. On the device `Block` is the CUDA block (thread
// index, block size, __syncthreads); the CPU unit test (test/unit/kernels/AttentionMathTest.cpp)
// runs the same code on the host with a block of one thread, for which every phase loop covers all
// its items in order and the barriers are no-ops: a legal schedule of the kernel, so the test checks
// its indexing, shared-memory layout and arithmetic against the CPU kernel without a GPU.
//
// Every phase is a loop `for (item = thread; item < count; item += threads)` between barriers, in
// which a thread writes only its own items' shared or global elements.
#pragma once

#include <cstdint>

#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/attention/AttentionMath.h"

namespace dgemma::attention {

DGEMMA_HOST_DEVICE inline float dot(const float* a, const float* b, int64_t length) {
  float sum = 0.0f;
  for (int64_t c = 0; c < length; ++c) sum += a[c] * b[c];
  return sum;
}

// Copies `rows` vectors of `width` elements into shared rows of `stride` floats; `globalRow(r)` is
// row r's index in `source` (whose vectors start at index · width).
template <typename Block, typename T, typename GlobalRow>
DGEMMA_HOST_DEVICE void loadRows(const Block& block, float* shared, int64_t stride, const T* source, int64_t sourceRows,
                                 int64_t width, int64_t rows, const GlobalRow& globalRow) {
  for (int64_t e = block.thread(); e < rows * width; e += block.threads()) {
    const int64_t r = e / width, c = e % width;
    const int64_t row = globalRow(r);
    DGEMMA_CUDA_BOUNDS(row, sourceRows);
    shared[r * stride + c] = kernels::loadFloat(source, row * width + c);
  }
}

// key_valid[b, key] != 0, the index checked against key_valid's [B, Tk].
DGEMMA_HOST_DEVICE inline bool keyValidAt(const AttentionContract& g, const uint8_t* keyValid, int64_t b, int64_t key) {
  DGEMMA_CUDA_BOUNDS(b * g.keys + key, g.batch * g.keys);
  return keyValid[b * g.keys + key] != 0;
}

template <typename Block>
DGEMMA_HOST_DEVICE void fill(const Block& block, float* shared, int64_t count, float value) {
  for (int64_t e = block.thread(); e < count; e += block.threads()) shared[e] = value;
}

// Tasks: forward and backward query kernel one per (b, head, query tile), key kernel one per
// (b, KV head, key tile); task t's coordinates are decoded with the tile index fastest.
DGEMMA_HOST_DEVICE inline int64_t queryTileTasks(const AttentionContract& g, TileShape tiles) {
  return g.batch * g.queryHeads * ((g.queries + tiles.queryTile - 1) / tiles.queryTile);
}
DGEMMA_HOST_DEVICE inline int64_t keyTileTasks(const AttentionContract& g, TileShape tiles) {
  return g.batch * g.kvHeads * ((g.keys + tiles.keyTile - 1) / tiles.keyTile);
}

// The tensors of one call (the forward leaves the gradients null).
template <typename T>
struct AttentionBuffers {
  const T* q;
  const T* k;
  const T* v;
  const uint8_t* keyValid;
  const int64_t* segmentIds;   // null: no image overlay
  const int64_t* documentIds;  // null: one document
  const T* dOut;
  T* out;  // o in the forward, dq in the backward
  T* dk;
  T* dv;
  float* statistics;  // backward: (maximum, sum, delta) per query row
};

// Per query row of the backward: (maximum, sum, delta), written by the query kernel, read by the key kernel.
constexpr int kStatistics = 3;

// The forward for one (b, head, query tile), in `shared` of forwardSharedFloats(tiles, D, Dv) floats.
template <typename Block, typename T>
DGEMMA_HOST_DEVICE void forwardTask(const Block& block, float* shared, const AttentionContract& g, TileShape tiles,
                                    const AttentionBuffers<T>& t, int64_t task) {
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const int64_t qStride = d + 1, pStride = bc + 1;
  float* qs = shared;              // [br][d + 1] the query tile
  float* ks = qs + br * qStride;   // [bc][d + 1] the key tile
  float* vs = ks + bc * qStride;   // [bc][dv]    the value tile
  float* ps = vs + bc * dv;        // [br][bc + 1] scores, then weights
  float* acc = ps + br * pStride;  // [br][dv]    output accumulators
  float* rowMax = acc + br * dv;   // [br]
  float* rowSum = rowMax + br;     // [br]
  float* rowFactor = rowSum + br;  // [br]

  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads, keyRows = g.batch * g.keys * g.kvHeads;
  const int64_t queryTiles = (g.queries + br - 1) / br;
  const int64_t tile = task % queryTiles, head = (task / queryTiles) % g.queryHeads;
  const int64_t b = task / (queryTiles * g.queryHeads);
  const int64_t q0 = tile * br;
  const int rows = static_cast<int>(kernels::smaller(br, g.queries - q0));
  const int64_t kvHead = kvHeadOf(g, head);
  const MaskRows maskRows = maskRowsOf(g, t.segmentIds, t.documentIds, b);

  loadRows(block, qs, qStride, t.q, queryRows, d, rows, [&](int64_t r) { return queryRowOf(g, b, q0 + r, head); });
  fill(block, acc, br * dv, 0.0f);
  fill(block, rowMax, br, -INFINITY);
  fill(block, rowSum, br, 0.0f);
  block.sync();

  const KeyRange range = candidateKeysOfQueries(g, q0, q0 + rows - 1);
  for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
    const int keysHere = static_cast<int>(kernels::smaller(bc, range.end - k0));
    auto keyRow = [&](int64_t r) { return keyRowOf(g, b, k0 + r, kvHead); };
    loadRows(block, ks, qStride, t.k, keyRows, d, keysHere, keyRow);
    loadRows(block, vs, dv, t.v, keyRows, dv, keysHere, keyRow);
    block.sync();
    for (int pair = block.thread(); pair < br * bc; pair += block.threads()) {
      const int i = pair / bc, j = pair % bc;
      float score = -INFINITY;
      if (i < rows && j < keysHere && keyVisible(g, keyValidAt(g, t.keyValid, b, k0 + j), maskRows, q0 + i, k0 + j))
        score = scale * dot(qs + i * qStride, ks + j * qStride, d);
      ps[i * pStride + j] = score;
    }
    block.sync();
    for (int i = block.thread(); i < rows; i += block.threads()) {
      OnlineSoftmax row{rowMax[i], rowSum[i]};
      rowFactor[i] = takeInTile(row, ps + i * pStride, keysHere);
      rowMax[i] = row.maximum;
      rowSum[i] = row.sum;
    }
    block.sync();
    for (int64_t e = block.thread(); e < rows * dv; e += block.threads()) {
      const int64_t i = e / dv, c = e % dv;
      float value = acc[e] * rowFactor[i];
      for (int j = 0; j < keysHere; ++j) value += ps[i * pStride + j] * vs[j * dv + c];
      acc[e] = value;
    }
    block.sync();  // the next tile overwrites ks, vs and ps
  }
  for (int64_t e = block.thread(); e < rows * dv; e += block.threads()) {
    const int64_t i = e / dv, c = e % dv;
    DGEMMA_CUDA_BOUNDS(queryRowOf(g, b, q0 + i, head), queryRows);
    kernels::storeFloat(t.out, queryRowOf(g, b, q0 + i, head) * dv + c, normalizedOutput(acc[e], rowSum[i]));
  }
  block.sync();  // the next task reloads the shared tiles
}

// The backward's query kernel for one (b, head, query tile), in backwardQuerySharedFloats floats:
// pass 0 the row statistics and delta (written to t.statistics), pass 1 dq.
template <typename Block, typename T>
DGEMMA_HOST_DEVICE void backwardQueryTask(const Block& block, float* shared, const AttentionContract& g,
                                          TileShape tiles, const AttentionBuffers<T>& t, int64_t task) {
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const int64_t qStride = d + 1, vStride = dv + 1, pStride = bc + 1;
  float* qs = shared;                 // [br][d + 1]
  float* dos = qs + br * qStride;     // [br][dv + 1]
  float* ks = dos + br * vStride;     // [bc][d + 1]
  float* vs = ks + bc * qStride;      // [bc][dv + 1]
  float* ss = vs + bc * vStride;      // [br][bc + 1] scores, then weights (pass 0) or ds (pass 1)
  float* dps = ss + br * pStride;     // [br][bc + 1] dp = do · v
  float* dqAcc = dps + br * pStride;  // [br][d]
  float* rowMax = dqAcc + br * d;     // [br]
  float* rowSum = rowMax + br;        // [br]
  float* rowDelta = rowSum + br;      // [br] Σ weight · dp, then delta

  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads, keyRows = g.batch * g.keys * g.kvHeads;
  const int64_t queryTiles = (g.queries + br - 1) / br;
  const int64_t tile = task % queryTiles, head = (task / queryTiles) % g.queryHeads;
  const int64_t b = task / (queryTiles * g.queryHeads);
  const int64_t q0 = tile * br;
  const int rows = static_cast<int>(kernels::smaller(br, g.queries - q0));
  const int64_t kvHead = kvHeadOf(g, head);
  const MaskRows maskRows = maskRowsOf(g, t.segmentIds, t.documentIds, b);
  auto queryRow = [&](int64_t r) { return queryRowOf(g, b, q0 + r, head); };

  loadRows(block, qs, qStride, t.q, queryRows, d, rows, queryRow);
  loadRows(block, dos, vStride, t.dOut, queryRows, dv, rows, queryRow);
  fill(block, dqAcc, br * d, 0.0f);
  fill(block, rowMax, br, -INFINITY);
  fill(block, rowSum, br, 0.0f);
  fill(block, rowDelta, br, 0.0f);
  block.sync();

  const KeyRange range = candidateKeysOfQueries(g, q0, q0 + rows - 1);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
      const int keysHere = static_cast<int>(kernels::smaller(bc, range.end - k0));
      auto keyRow = [&](int64_t r) { return keyRowOf(g, b, k0 + r, kvHead); };
      loadRows(block, ks, qStride, t.k, keyRows, d, keysHere, keyRow);
      loadRows(block, vs, vStride, t.v, keyRows, dv, keysHere, keyRow);
      block.sync();
      for (int pair = block.thread(); pair < br * bc; pair += block.threads()) {
        const int i = pair / bc, j = pair % bc;
        const bool visible =
            i < rows && j < keysHere && keyVisible(g, keyValidAt(g, t.keyValid, b, k0 + j), maskRows, q0 + i, k0 + j);
        const float score = visible ? scale * dot(qs + i * qStride, ks + j * qStride, d) : -INFINITY;
        const float dp = visible ? dot(dos + i * vStride, vs + j * vStride, dv) : 0.0f;
        if (pass == 0) {
          ss[i * pStride + j] = score;
          dps[i * pStride + j] = dp;
        } else {
          ss[i * pStride + j] =
              visible ? scoreGradient(scale, probability(score, rowMax[i], rowSum[i]), dp, rowDelta[i]) : 0.0f;
        }
      }
      block.sync();
      if (pass == 0) {
        for (int i = block.thread(); i < rows; i += block.threads()) {
          OnlineSoftmax row{rowMax[i], rowSum[i]};
          takeInTileWithDp(row, rowDelta[i], ss + i * pStride, dps + i * pStride, keysHere);
          rowMax[i] = row.maximum;
          rowSum[i] = row.sum;
        }
      } else {
        for (int64_t e = block.thread(); e < rows * d; e += block.threads()) {
          const int64_t i = e / d, c = e % d;
          float value = dqAcc[e];
          for (int j = 0; j < keysHere; ++j) value += ss[i * pStride + j] * ks[j * qStride + c];
          dqAcc[e] = value;
        }
      }
      block.sync();
    }
    if (pass == 0) {
      for (int i = block.thread(); i < rows; i += block.threads()) {
        rowDelta[i] = normalizedOutput(rowDelta[i], rowSum[i]);
        const int64_t row = queryRow(i);
        DGEMMA_CUDA_BOUNDS(row, queryRows);
        t.statistics[row * kStatistics + 0] = rowMax[i];
        t.statistics[row * kStatistics + 1] = rowSum[i];
        t.statistics[row * kStatistics + 2] = rowDelta[i];
      }
      block.sync();
    }
  }
  for (int64_t e = block.thread(); e < rows * d; e += block.threads()) {
    const int64_t i = e / d, c = e % d;
    DGEMMA_CUDA_BOUNDS(queryRow(i), queryRows);
    kernels::storeFloat(t.out, queryRow(i) * d + c, dqAcc[e]);
  }
  block.sync();
}

// The backward's key kernel for one (b, KV head, key tile), in backwardKeySharedFloats floats: dk
// and dv over the query tiles of every query head of the group, from the query kernel's statistics.
template <typename Block, typename T>
DGEMMA_HOST_DEVICE void backwardKeyTask(const Block& block, float* shared, const AttentionContract& g, TileShape tiles,
                                        const AttentionBuffers<T>& t, int64_t task) {
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const int64_t qStride = d + 1, vStride = dv + 1, pStride = bc + 1;
  float* ks = shared;                    // [bc][d + 1]
  float* vs = ks + bc * qStride;         // [bc][dv + 1]
  float* dkAcc = vs + bc * vStride;      // [bc][d]
  float* dvAcc = dkAcc + bc * d;         // [bc][dv]
  float* qs = dvAcc + bc * dv;           // [br][d + 1]
  float* dos = qs + br * qStride;        // [br][dv + 1]
  float* ps = dos + br * vStride;        // [br][bc + 1] p
  float* dss = ps + br * pStride;        // [br][bc + 1] ds
  float* rowStats = dss + br * pStride;  // [br][3] maximum, sum, delta

  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads, keyRows = g.batch * g.keys * g.kvHeads;
  const int64_t keyTiles = (g.keys + bc - 1) / bc;
  const int64_t queryTiles = (g.queries + br - 1) / br;
  const int64_t headsPerKv = g.queryHeads / g.kvHeads;
  const int64_t tile = task % keyTiles, kvHead = (task / keyTiles) % g.kvHeads;
  const int64_t b = task / (keyTiles * g.kvHeads);
  const int64_t k0 = tile * bc;
  const int keysHere = static_cast<int>(kernels::smaller(bc, g.keys - k0));
  const MaskRows maskRows = maskRowsOf(g, t.segmentIds, t.documentIds, b);
  auto keyRow = [&](int64_t r) { return keyRowOf(g, b, k0 + r, kvHead); };

  loadRows(block, ks, qStride, t.k, keyRows, d, keysHere, keyRow);
  loadRows(block, vs, vStride, t.v, keyRows, dv, keysHere, keyRow);
  fill(block, dkAcc, bc * d, 0.0f);
  fill(block, dvAcc, bc * dv, 0.0f);
  block.sync();

  for (int64_t head = kvHead * headsPerKv; head < (kvHead + 1) * headsPerKv; ++head) {
    for (int64_t queryTile = 0; queryTile < queryTiles; ++queryTile) {
      const int64_t q0 = queryTile * br;
      const int rows = static_cast<int>(kernels::smaller(br, g.queries - q0));
      const KeyRange range = candidateKeysOfQueries(g, q0, q0 + rows - 1);
      if (range.end <= k0 || range.begin >= k0 + keysHere) continue;  // the same for the whole block
      auto queryRow = [&](int64_t r) { return queryRowOf(g, b, q0 + r, head); };
      loadRows(block, qs, qStride, t.q, queryRows, d, rows, queryRow);
      loadRows(block, dos, vStride, t.dOut, queryRows, dv, rows, queryRow);
      for (int e = block.thread(); e < rows * kStatistics; e += block.threads()) {
        DGEMMA_CUDA_BOUNDS(queryRow(e / kStatistics), queryRows);
        rowStats[e] = t.statistics[queryRow(e / kStatistics) * kStatistics + e % kStatistics];
      }
      block.sync();
      for (int pair = block.thread(); pair < br * bc; pair += block.threads()) {
        const int i = pair / bc, j = pair % bc;
        float p = 0.0f, ds = 0.0f;
        if (i < rows && j < keysHere && keyVisible(g, keyValidAt(g, t.keyValid, b, k0 + j), maskRows, q0 + i, k0 + j)) {
          const float* stats = rowStats + i * kStatistics;
          const float score = scale * dot(qs + i * qStride, ks + j * qStride, d);
          p = probability(score, stats[0], stats[1]);
          ds = scoreGradient(scale, p, dot(dos + i * vStride, vs + j * vStride, dv), stats[2]);
        }
        ps[i * pStride + j] = p;
        dss[i * pStride + j] = ds;
      }
      block.sync();
      for (int64_t e = block.thread(); e < keysHere * dv; e += block.threads()) {
        const int64_t j = e / dv, c = e % dv;
        float value = dvAcc[e];
        for (int i = 0; i < rows; ++i) value += ps[i * pStride + j] * dos[i * vStride + c];
        dvAcc[e] = value;
      }
      for (int64_t e = block.thread(); e < keysHere * d; e += block.threads()) {
        const int64_t j = e / d, c = e % d;
        float value = dkAcc[e];
        for (int i = 0; i < rows; ++i) value += dss[i * pStride + j] * qs[i * qStride + c];
        dkAcc[e] = value;
      }
      block.sync();
    }
  }
  for (int64_t e = block.thread(); e < keysHere * d; e += block.threads()) {
    DGEMMA_CUDA_BOUNDS(keyRow(e / d), keyRows);
    kernels::storeFloat(t.dk, keyRow(e / d) * d + e % d, dkAcc[e]);
  }
  for (int64_t e = block.thread(); e < keysHere * dv; e += block.threads()) {
    DGEMMA_CUDA_BOUNDS(keyRow(e / dv), keyRows);
    kernels::storeFloat(t.dv, keyRow(e / dv) * dv + e % dv, dvAcc[e]);
  }
  block.sync();
}

}  // namespace dgemma::attention
