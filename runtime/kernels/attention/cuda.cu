// attention and attention_backward on CUDA (docs/kernels.md), f32 or bf16 buffers with f32
// arithmetic; runtime/kernels/attention/cpu.cpp is the CPU twin. The visibility rules, index maps,
// tile geometry and the online softmax are attention/AttentionMath.h, which the CPU unit test runs
// in a host emulation of these kernels.
//
// Forward (flash-style): a block takes a tile of queries of one (b, head) and streams over the key
// tiles their candidate keys span, keeping K, V, the scores and the output accumulators in shared
// memory: per key tile, (1) every (query, key) pair's score, −inf when invisible, (2) per query row
// takeInTile (raise the running max, rescale the running sum, weights exp(s − max)), (3) per output
// element acc = acc · factor + Σ weight · v. At the end o = acc / sum, 0 for a row without visible keys.
//
// Backward: the query kernel (a block per query tile) recomputes each row's max, sum and
// delta = Σ p · (do·v) in a first pass over the key tiles, then in a second pass
// ds = scale · p · (dp − delta) and dq = Σ ds · k; it leaves (max, sum, delta) per row in a stream-ordered
// scratch buffer. The key kernel (a block per tile of keys of one (b, KV head)) then walks the query
// tiles of every query head of the group, recomputes p and ds from those statistics, and sums
// dv = Σ p · do and dk = Σ ds · q. Each block owns the rows it writes, so nothing needs atomics and
// the result does not depend on scheduling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/DeviceFloats.cuh"
#include "runtime/kernels/attention/AttentionMath.h"
#include "runtime/kernels/attention/Contract.h"

namespace dgemma {
namespace {

using attention::KeyRange;
using attention::OnlineSoftmax;
using attention::TileShape;
using cuda::loadFloat;
using cuda::storeFloat;

constexpr unsigned kThreads = 128;
// Shared memory per block: H200 allows 227 KiB; 96 KiB keeps two blocks per multiprocessor.
constexpr int64_t kSharedBudgetBytes = 96 * 1024;

__device__ float dot(const float* a, const float* b, int64_t length) {
  float sum = 0.0f;
  for (int64_t c = 0; c < length; ++c) sum += a[c] * b[c];
  return sum;
}

// Copies `rows` vectors of `width` elements into shared rows of `stride` floats; `globalRow(r)` is
// row r's index in `source` (whose vectors start at index · width).
template <typename T, typename GlobalRow>
__device__ void loadRows(float* shared, int stride, const T* source, int64_t sourceRows, int64_t width, int rows,
                         const GlobalRow& globalRow) {
  for (int64_t e = threadIdx.x; e < rows * width; e += blockDim.x) {
    const int64_t r = e / width, c = e % width;
    const int64_t row = globalRow(r);
    DGEMMA_CUDA_BOUNDS(row, sourceRows);
    shared[r * stride + c] = loadFloat(source, row * width + c);
  }
}

__device__ void fill(float* shared, int64_t count, float value) {
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) shared[e] = value;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attentionForwardKernel(AttentionContract g, TileShape tiles, const T* q, const T* k, const T* v,
                           const uint8_t* keyValid, T* o) {
  extern __shared__ float shared[];
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const int qStride = static_cast<int>(d) + 1, kStride = static_cast<int>(d) + 1, pStride = bc + 1;
  float* qs = shared;                  // [br][d + 1] the query tile
  float* ks = qs + br * qStride;       // [bc][d + 1] the key tile
  float* vs = ks + bc * kStride;       // [bc][dv]    the value tile
  float* ps = vs + bc * dv;            // [br][bc + 1] scores, then weights
  float* acc = ps + br * pStride;      // [br][dv]    output accumulators
  float* rowMax = acc + br * dv;       // [br]
  float* rowSum = rowMax + br;         // [br]
  float* rowFactor = rowSum + br;      // [br]

  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads, keyRows = g.batch * g.keys * g.kvHeads;
  const int64_t queryTiles = (g.queries + br - 1) / br;
  const int64_t tasks = g.batch * g.queryHeads * queryTiles;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t tile = task % queryTiles, head = (task / queryTiles) % g.queryHeads;
    const int64_t b = task / (queryTiles * g.queryHeads);
    const int64_t q0 = tile * br;
    const int rows = static_cast<int>(min(static_cast<int64_t>(br), g.queries - q0));
    const int64_t kvHead = attention::kvHeadOf(g, head);
    const uint8_t* valid = keyValid + b * g.keys;

    loadRows(qs, qStride, q, queryRows, d, rows, [&](int64_t r) { return attention::queryRowOf(g, b, q0 + r, head); });
    fill(acc, br * dv, 0.0f);
    fill(rowMax, br, -INFINITY);
    fill(rowSum, br, 0.0f);
    __syncthreads();

    const KeyRange range = attention::candidateKeysOfQueries(g, q0, q0 + rows - 1);
    for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
      const int keysHere = static_cast<int>(min(static_cast<int64_t>(bc), range.end - k0));
      auto keyRow = [&](int64_t r) { return attention::keyRowOf(g, b, k0 + r, kvHead); };
      loadRows(ks, kStride, k, keyRows, d, keysHere, keyRow);
      loadRows(vs, static_cast<int>(dv), v, keyRows, dv, keysHere, keyRow);
      __syncthreads();
      for (int pair = threadIdx.x; pair < br * bc; pair += blockDim.x) {
        const int i = pair / bc, j = pair % bc;
        float score = -INFINITY;
        if (i < rows && j < keysHere && attention::keyVisible(g, valid[k0 + j] != 0, q0 + i, k0 + j))
          score = scale * dot(qs + i * qStride, ks + j * kStride, d);
        ps[i * pStride + j] = score;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        OnlineSoftmax row{rowMax[i], rowSum[i]};
        rowFactor[i] = attention::takeInTile(row, ps + i * pStride, keysHere);
        rowMax[i] = row.maximum;
        rowSum[i] = row.sum;
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < rows * dv; e += blockDim.x) {
        const int64_t i = e / dv, c = e % dv;
        float value = acc[e] * rowFactor[i];
        for (int j = 0; j < keysHere; ++j) value += ps[i * pStride + j] * vs[j * dv + c];
        acc[e] = value;
      }
      __syncthreads();  // the next tile overwrites ks, vs and ps
    }
    for (int64_t e = threadIdx.x; e < rows * dv; e += blockDim.x) {
      const int64_t i = e / dv, c = e % dv;
      storeFloat(o, attention::queryRowOf(g, b, q0 + i, head) * dv + c, attention::normalizedOutput(acc[e], rowSum[i]));
    }
    __syncthreads();  // the next task reloads the shared tiles
  }
}

// Per query row of the backward: (maximum, sum, delta), written by the query kernel, read by the key kernel.
constexpr int kStatistics = 3;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attentionBackwardQueryKernel(AttentionContract g, TileShape tiles, const T* q, const T* k, const T* v,
                                 const uint8_t* keyValid, const T* dOut, T* dq, float* statistics) {
  extern __shared__ float shared[];
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const int qStride = static_cast<int>(d) + 1, vStride = static_cast<int>(dv) + 1, pStride = bc + 1;
  float* qs = shared;                // [br][d + 1]
  float* dos = qs + br * qStride;    // [br][dv + 1]
  float* ks = dos + br * vStride;    // [bc][d + 1]
  float* vs = ks + bc * qStride;     // [bc][dv + 1]
  float* ss = vs + bc * vStride;     // [br][bc + 1] scores, then weights (pass 1) or ds (pass 2)
  float* dps = ss + br * pStride;    // [br][bc + 1] dp = do · v
  float* dqAcc = dps + br * pStride; // [br][d]
  float* rowMax = dqAcc + br * d;    // [br]
  float* rowSum = rowMax + br;       // [br]
  float* rowDelta = rowSum + br;     // [br] Σ weight · dp, then delta

  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads, keyRows = g.batch * g.keys * g.kvHeads;
  const int64_t queryTiles = (g.queries + br - 1) / br;
  const int64_t tasks = g.batch * g.queryHeads * queryTiles;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t tile = task % queryTiles, head = (task / queryTiles) % g.queryHeads;
    const int64_t b = task / (queryTiles * g.queryHeads);
    const int64_t q0 = tile * br;
    const int rows = static_cast<int>(min(static_cast<int64_t>(br), g.queries - q0));
    const int64_t kvHead = attention::kvHeadOf(g, head);
    const uint8_t* valid = keyValid + b * g.keys;
    auto queryRow = [&](int64_t r) { return attention::queryRowOf(g, b, q0 + r, head); };

    loadRows(qs, qStride, q, queryRows, d, rows, queryRow);
    loadRows(dos, vStride, dOut, queryRows, dv, rows, queryRow);
    fill(dqAcc, br * d, 0.0f);
    fill(rowMax, br, -INFINITY);
    fill(rowSum, br, 0.0f);
    fill(rowDelta, br, 0.0f);
    __syncthreads();

    const KeyRange range = attention::candidateKeysOfQueries(g, q0, q0 + rows - 1);
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
        const int keysHere = static_cast<int>(min(static_cast<int64_t>(bc), range.end - k0));
        auto keyRow = [&](int64_t r) { return attention::keyRowOf(g, b, k0 + r, kvHead); };
        loadRows(ks, qStride, k, keyRows, d, keysHere, keyRow);
        loadRows(vs, vStride, v, keyRows, dv, keysHere, keyRow);
        __syncthreads();
        for (int pair = threadIdx.x; pair < br * bc; pair += blockDim.x) {
          const int i = pair / bc, j = pair % bc;
          const bool visible =
              i < rows && j < keysHere && attention::keyVisible(g, valid[k0 + j] != 0, q0 + i, k0 + j);
          const float score = visible ? scale * dot(qs + i * qStride, ks + j * qStride, d) : -INFINITY;
          const float dp = visible ? dot(dos + i * vStride, vs + j * vStride, dv) : 0.0f;
          if (pass == 0) {
            ss[i * pStride + j] = score;
            dps[i * pStride + j] = dp;
          } else {
            ss[i * pStride + j] =
                visible ? attention::scoreGradient(scale, attention::probability(score, rowMax[i], rowSum[i]), dp,
                                                   rowDelta[i])
                        : 0.0f;
          }
        }
        __syncthreads();
        if (pass == 0) {
          for (int i = threadIdx.x; i < rows; i += blockDim.x) {
            OnlineSoftmax row{rowMax[i], rowSum[i]};
            attention::takeInTileWithDp(row, rowDelta[i], ss + i * pStride, dps + i * pStride, keysHere);
            rowMax[i] = row.maximum;
            rowSum[i] = row.sum;
          }
        } else {
          for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
            const int64_t i = e / d, c = e % d;
            float value = dqAcc[e];
            for (int j = 0; j < keysHere; ++j) value += ss[i * pStride + j] * ks[j * qStride + c];
            dqAcc[e] = value;
          }
        }
        __syncthreads();
      }
      if (pass == 0) {
        for (int i = threadIdx.x; i < rows; i += blockDim.x) {
          rowDelta[i] = attention::normalizedOutput(rowDelta[i], rowSum[i]);
          const int64_t row = queryRow(i);
          DGEMMA_CUDA_BOUNDS(row, queryRows);
          statistics[row * kStatistics + 0] = rowMax[i];
          statistics[row * kStatistics + 1] = rowSum[i];
          statistics[row * kStatistics + 2] = rowDelta[i];
        }
        __syncthreads();
      }
    }
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
      const int64_t i = e / d, c = e % d;
      storeFloat(dq, queryRow(i) * d + c, dqAcc[e]);
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attentionBackwardKeyKernel(AttentionContract g, TileShape tiles, const T* q, const T* k, const T* v,
                               const uint8_t* keyValid, const T* dOut, const float* statistics, T* dk, T* dvOut) {
  extern __shared__ float shared[];
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const int qStride = static_cast<int>(d) + 1, vStride = static_cast<int>(dv) + 1, pStride = bc + 1;
  float* ks = shared;                // [bc][d + 1]
  float* vs = ks + bc * qStride;     // [bc][dv + 1]
  float* dkAcc = vs + bc * vStride;  // [bc][d]
  float* dvAcc = dkAcc + bc * d;     // [bc][dv]
  float* qs = dvAcc + bc * dv;       // [br][d + 1]
  float* dos = qs + br * qStride;    // [br][dv + 1]
  float* ps = dos + br * vStride;    // [br][bc + 1] p
  float* dss = ps + br * pStride;    // [br][bc + 1] ds
  float* rowStats = dss + br * pStride;  // [br][3] maximum, sum, delta

  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads, keyRows = g.batch * g.keys * g.kvHeads;
  const int64_t keyTiles = (g.keys + bc - 1) / bc;
  const int64_t queryTiles = (g.queries + br - 1) / br;
  const int64_t headsPerKv = g.queryHeads / g.kvHeads;
  const int64_t tasks = g.batch * g.kvHeads * keyTiles;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t tile = task % keyTiles, kvHead = (task / keyTiles) % g.kvHeads;
    const int64_t b = task / (keyTiles * g.kvHeads);
    const int64_t k0 = tile * bc;
    const int keysHere = static_cast<int>(min(static_cast<int64_t>(bc), g.keys - k0));
    const uint8_t* valid = keyValid + b * g.keys;
    auto keyRow = [&](int64_t r) { return attention::keyRowOf(g, b, k0 + r, kvHead); };

    loadRows(ks, qStride, k, keyRows, d, keysHere, keyRow);
    loadRows(vs, vStride, v, keyRows, dv, keysHere, keyRow);
    fill(dkAcc, bc * d, 0.0f);
    fill(dvAcc, bc * dv, 0.0f);
    __syncthreads();

    for (int64_t head = kvHead * headsPerKv; head < (kvHead + 1) * headsPerKv; ++head) {
      for (int64_t queryTile = 0; queryTile < queryTiles; ++queryTile) {
        const int64_t q0 = queryTile * br;
        const int rows = static_cast<int>(min(static_cast<int64_t>(br), g.queries - q0));
        const KeyRange range = attention::candidateKeysOfQueries(g, q0, q0 + rows - 1);
        if (range.end <= k0 || range.begin >= k0 + keysHere) continue;  // the same for the whole block
        auto queryRow = [&](int64_t r) { return attention::queryRowOf(g, b, q0 + r, head); };
        loadRows(qs, qStride, q, queryRows, d, rows, queryRow);
        loadRows(dos, vStride, dOut, queryRows, dv, rows, queryRow);
        for (int e = threadIdx.x; e < rows * kStatistics; e += blockDim.x)
          rowStats[e] = statistics[queryRow(e / kStatistics) * kStatistics + e % kStatistics];
        __syncthreads();
        for (int pair = threadIdx.x; pair < br * bc; pair += blockDim.x) {
          const int i = pair / bc, j = pair % bc;
          float p = 0.0f, ds = 0.0f;
          if (i < rows && j < keysHere && attention::keyVisible(g, valid[k0 + j] != 0, q0 + i, k0 + j)) {
            const float* stats = rowStats + i * kStatistics;
            const float score = scale * dot(qs + i * qStride, ks + j * qStride, d);
            p = attention::probability(score, stats[0], stats[1]);
            ds = attention::scoreGradient(scale, p, dot(dos + i * vStride, vs + j * vStride, dv), stats[2]);
          }
          ps[i * pStride + j] = p;
          dss[i * pStride + j] = ds;
        }
        __syncthreads();
        for (int64_t e = threadIdx.x; e < keysHere * dv; e += blockDim.x) {
          const int64_t j = e / dv, c = e % dv;
          float value = dvAcc[e];
          for (int i = 0; i < rows; ++i) value += ps[i * pStride + j] * dos[i * vStride + c];
          dvAcc[e] = value;
        }
        for (int64_t e = threadIdx.x; e < keysHere * d; e += blockDim.x) {
          const int64_t j = e / d, c = e % d;
          float value = dkAcc[e];
          for (int i = 0; i < rows; ++i) value += dss[i * pStride + j] * qs[i * qStride + c];
          dkAcc[e] = value;
        }
        __syncthreads();
      }
    }
    for (int64_t e = threadIdx.x; e < keysHere * d; e += blockDim.x) storeFloat(dk, keyRow(e / d) * d + e % d, dkAcc[e]);
    for (int64_t e = threadIdx.x; e < keysHere * dv; e += blockDim.x)
      storeFloat(dvOut, keyRow(e / dv) * dv + e % dv, dvAcc[e]);
    __syncthreads();
  }
}

// Raises the kernel's dynamic shared memory limit past the default 48 KiB when the tiles need it.
template <typename KernelFunction>
void allowSharedMemory(KernelFunction kernel, int64_t bytes) {
  if (bytes > 48 * 1024)
    DGEMMA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

int64_t forwardShared(TileShape t, int64_t d, int64_t dv) { return attention::forwardSharedFloats(t, d, dv); }
int64_t backwardQueryShared(TileShape t, int64_t d, int64_t dv) { return attention::backwardQuerySharedFloats(t, d, dv); }
int64_t backwardKeyShared(TileShape t, int64_t d, int64_t dv) { return attention::backwardKeySharedFloats(t, d, dv); }

// The tiles for a kernel, or a plan error when the head dims are too large for its shared memory.
TileShape tilesFor(const KernelSignature& signature, const AttentionContract& g,
                   int64_t (*sharedFloats)(TileShape, int64_t, int64_t)) {
  const TileShape tiles = attention::chooseTiles(g.headDim, g.valueDim, kSharedBudgetBytes, sharedFloats);
  if (tiles.queryTile == 0)
    failSignature(signature, "head dims D=" + std::to_string(g.headDim) + ", Dv=" + std::to_string(g.valueDim) +
                                 " are too large for the cuda kernel's shared memory (" +
                                 std::to_string(kSharedBudgetBytes) + " bytes)");
  return tiles;
}

template <typename T>
class AttentionCudaKernel final : public Kernel {
 public:
  AttentionCudaKernel(AttentionContract g, TileShape tiles) : g_(g), tiles_(tiles) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t tasks = g_.batch * g_.queryHeads * ((g_.queries + tiles_.queryTile - 1) / tiles_.queryTile);
    if (tasks == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const int64_t bytes = forwardShared(tiles_, g_.headDim, g_.valueDim) * 4;
    allowSharedMemory(attentionForwardKernel<T>, bytes);
    attentionForwardKernel<T><<<cuda::gridFor(static_cast<uint64_t>(tasks), 1), kThreads, bytes, stream>>>(
        g_, tiles_, inputs[0].as<const T>(), inputs[1].as<const T>(), inputs[2].as<const T>(),
        inputs[3].as<const uint8_t>(), outputs[0].as<T>());
    DGEMMA_CUDA_CHECK_LAUNCH("attentionForwardKernel");
  }

 private:
  AttentionContract g_;
  TileShape tiles_;
};

template <typename T>
class AttentionBackwardCudaKernel final : public Kernel {
 public:
  AttentionBackwardCudaKernel(AttentionContract g, TileShape queryTiles, TileShape keyTiles)
      : g_(g), queryTiles_(queryTiles), keyTiles_(keyTiles) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t queryTasks =
        g_.batch * g_.queryHeads * ((g_.queries + queryTiles_.queryTile - 1) / queryTiles_.queryTile);
    const int64_t keyTasks = g_.batch * g_.kvHeads * ((g_.keys + keyTiles_.keyTile - 1) / keyTiles_.keyTile);
    if (queryTasks == 0 && keyTasks == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const T* q = inputs[0].as<const T>();
    const T* k = inputs[1].as<const T>();
    const T* v = inputs[2].as<const T>();
    const uint8_t* keyValid = inputs[3].as<const uint8_t>();
    const T* dOut = inputs[4].as<const T>();
    // The per-row statistics live in stream-ordered scratch memory: the key kernel, later on the same
    // stream, reads them, and the free is ordered after it.
    const int64_t rows = g_.batch * g_.queries * g_.queryHeads;
    float* statistics = nullptr;
    DGEMMA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&statistics),
                                      static_cast<size_t>(std::max<int64_t>(rows, 1) * kStatistics) * sizeof(float),
                                      stream));
    if (queryTasks > 0) {
      const int64_t bytes = backwardQueryShared(queryTiles_, g_.headDim, g_.valueDim) * 4;
      allowSharedMemory(attentionBackwardQueryKernel<T>, bytes);
      attentionBackwardQueryKernel<T><<<cuda::gridFor(static_cast<uint64_t>(queryTasks), 1), kThreads, bytes, stream>>>(
          g_, queryTiles_, q, k, v, keyValid, dOut, outputs[0].as<T>(), statistics);
      DGEMMA_CUDA_CHECK_LAUNCH("attentionBackwardQueryKernel");
    }
    if (keyTasks > 0) {
      const int64_t bytes = backwardKeyShared(keyTiles_, g_.headDim, g_.valueDim) * 4;
      allowSharedMemory(attentionBackwardKeyKernel<T>, bytes);
      attentionBackwardKeyKernel<T><<<cuda::gridFor(static_cast<uint64_t>(keyTasks), 1), kThreads, bytes, stream>>>(
          g_, keyTiles_, q, k, v, keyValid, dOut, statistics, outputs[1].as<T>(), outputs[2].as<T>());
      DGEMMA_CUDA_CHECK_LAUNCH("attentionBackwardKeyKernel");
    }
    DGEMMA_CUDA_CHECK(cudaFreeAsync(statistics, stream));
  }

 private:
  AttentionContract g_;
  TileShape queryTiles_, keyTiles_;
};

std::unique_ptr<Kernel> createAttentionCudaKernel(const KernelSignature& signature) {
  const AttentionContract g = parseAttentionContract(signature, {DType::F32, DType::BF16});
  const TileShape tiles = tilesFor(signature, g, forwardShared);
  if (g.dtype == DType::BF16) return std::make_unique<AttentionCudaKernel<uint16_t>>(g, tiles);
  return std::make_unique<AttentionCudaKernel<float>>(g, tiles);
}

std::unique_ptr<Kernel> createAttentionBackwardCudaKernel(const KernelSignature& signature) {
  const AttentionContract g = parseAttentionBackwardContract(signature, {DType::F32, DType::BF16});
  const TileShape queryTiles = tilesFor(signature, g, backwardQueryShared);
  const TileShape keyTiles = tilesFor(signature, g, backwardKeyShared);
  if (g.dtype == DType::BF16)
    return std::make_unique<AttentionBackwardCudaKernel<uint16_t>>(g, queryTiles, keyTiles);
  return std::make_unique<AttentionBackwardCudaKernel<float>>(g, queryTiles, keyTiles);
}

}  // namespace

void registerAttentionCudaKernels(KernelRegistry& registry) {
  // bf16 buffers are read and written as they are, each result rounded once.
  registry.add("attention", createAttentionCudaKernel, KernelTraits{.handlesReducedFloats = true});
  registry.add("attention_backward", createAttentionBackwardCudaKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
