// runtime/kernels/attention/AttentionMath.h, the arithmetic of the CUDA attention kernels, against
// the CPU kernel without a GPU: the visibility predicate equals the CPU kernel's key sets for every
// (query, key) in every mask mode (the causal one with and without segment ids, every mode with and
// without document ids, the bidirectional one with a symmetric window), the candidate key
// ranges cover them, and the CUDA kernels' task
// bodies (attention/AttentionTiles.h) run on the host with a block of one thread give the CPU
// kernel's outputs for several tile shapes.
// The bodies' bounds assertions (KernelElements.h) are compiled in: a bad index aborts the test.
#define DGEMMA_CUDA_DEBUG_BOUNDS 1

#include <barrier>
#include <cmath>
#include <thread>

#include "KernelTestSupport.h"
#include "support/DType.h"
#include "runtime/kernels/attention/AttentionMath.h"
#include "runtime/kernels/attention/AttentionTiles.h"

namespace dgemma::test {
namespace {

using attention::KeyRange;
using attention::OnlineSoftmax;
using attention::TileShape;

struct Case {
  AttentionContract g;
  std::vector<uint8_t> keyValid;    // [B, Tk]
  std::vector<int64_t> segmentIds;   // [B, Tk] when g.segmented, else empty
  std::vector<int64_t> documentIds;  // [B, Tk] when g.documented, else empty

  const int64_t* segments() const { return g.segmented ? segmentIds.data() : nullptr; }
  const int64_t* documents() const { return g.documented ? documentIds.data() : nullptr; }
};

AttentionContract geometry(int64_t batch, int64_t queries, int64_t keys, int64_t queryHeads, int64_t kvHeads,
                           int64_t headDim, int64_t valueDim, AttentionMask mask, int64_t window, int64_t prefixLen,
                           double scale) {
  AttentionContract g;
  g.batch = batch;
  g.queries = queries;
  g.keys = keys;
  g.queryHeads = queryHeads;
  g.kvHeads = kvHeads;
  g.headDim = headDim;
  g.valueDim = valueDim;
  g.mask = mask;
  g.window = window;
  g.prefixLen = prefixLen;
  g.scale = scale;
  return g;
}

const char* maskName(AttentionMask mask) {
  return mask == AttentionMask::Causal ? "causal" : mask == AttentionMask::Bidirectional ? "bidirectional" : "prefix";
}

std::string describe(const AttentionContract& g) {
  return std::string(maskName(g.mask)) + (g.segmented ? " segmented" : "") + (g.documented ? " documented" : "") +
         " trailing=" + std::to_string(g.trailingKeys) + " Tq=" + std::to_string(g.queries) +
         " Tk=" + std::to_string(g.keys) + " window=" + std::to_string(g.window) +
         " prefix=" + std::to_string(g.prefixLen) + " Hq=" + std::to_string(g.queryHeads) +
         " Hkv=" + std::to_string(g.kvHeads);
}

// Random key_valid with some padded keys, and one batch row entirely padded.
std::vector<uint8_t> randomKeyValid(const AttentionContract& g, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<uint8_t> valid(g.batch * g.keys);
  for (uint8_t& v : valid) v = generator() % 4 != 0;
  if (g.batch > 1)
    for (int64_t key = 0; key < g.keys; ++key) valid[(g.batch - 1) * g.keys + key] = 0;
  return valid;
}

// Segment ids as the encoder's image overlay has them: per batch row, runs of 1 to 6 positions that
// alternate between segment 0 (text) and the next image segment 1, 2, ...
std::vector<int64_t> randomSegmentIds(const AttentionContract& g, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<int64_t> segments(g.batch * g.keys);
  for (int64_t b = 0; b < g.batch; ++b) {
    int64_t next = 1;
    bool image = generator() % 2 == 0;
    for (int64_t key = 0; key < g.keys;) {
      const int64_t run = 1 + generator() % 6;
      for (int64_t n = 0; n < run && key < g.keys; ++n, ++key) segments[b * g.keys + key] = image ? next : 0;
      if (image) ++next;
      image = !image;
    }
  }
  return segments;
}

// Document ids as packing writes them: per batch row, documents of 1 to 8 positions numbered 0, 1, ...
std::vector<int64_t> randomDocumentIds(const AttentionContract& g, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<int64_t> documents(g.batch * g.keys);
  for (int64_t b = 0; b < g.batch; ++b) {
    int64_t document = 0;
    for (int64_t key = 0; key < g.keys; ++document) {
      const int64_t length = 1 + generator() % 8;
      for (int64_t n = 0; n < length && key < g.keys; ++n, ++key) documents[b * g.keys + key] = document;
    }
  }
  return documents;
}

// Every mask mode with and without windows (the bidirectional one's symmetric), padded keys, GQA,
// Tq < Tk, each also with document ids; the causal mask also with segment ids.
std::vector<Case> cases() {
  std::vector<Case> all;
  uint32_t seed = 11;
  auto add = [&](AttentionContract g) {
    all.push_back({g, randomKeyValid(g, seed), g.segmented ? randomSegmentIds(g, seed + 1000) : std::vector<int64_t>(),
                   g.documented ? randomDocumentIds(g, seed + 2000) : std::vector<int64_t>()});
    ++seed;
  };
  auto segmented = [](AttentionContract g) {
    g.segmented = true;
    return g;
  };
  auto documented = [](AttentionContract g) {
    g.documented = true;
    return g;
  };
  for (int64_t window : {0, 1, 3, 7})
    for (auto [queries, keys] : {std::pair<int64_t, int64_t>{9, 9}, {5, 13}, {1, 40}}) {
      add(geometry(3, queries, keys, 4, 2, 8, 6, AttentionMask::Causal, window, 0, 0.35));
      add(segmented(geometry(3, queries, keys, 4, 2, 8, 6, AttentionMask::Causal, window, 0, 0.35)));
      add(geometry(2, queries, keys, 2, 2, 5, 7, AttentionMask::Prefix, window, std::min<int64_t>(keys, 6), 0.5));
      add(geometry(2, queries, keys, 3, 1, 4, 4, AttentionMask::Prefix, window, 0, 0.5));
      add(documented(geometry(3, queries, keys, 4, 2, 8, 6, AttentionMask::Causal, window, 0, 0.35)));
      add(documented(segmented(geometry(3, queries, keys, 4, 2, 8, 6, AttentionMask::Causal, window, 0, 0.35))));
      add(documented(
          geometry(2, queries, keys, 2, 2, 5, 7, AttentionMask::Prefix, window, std::min<int64_t>(keys, 6), 0.5)));
      add(geometry(3, queries, keys, 4, 1, 8, 8, AttentionMask::Bidirectional, window, 0, 0.25));
      add(documented(geometry(3, queries, keys, 4, 1, 8, 8, AttentionMask::Bidirectional, window, 0, 0.25)));
    }
  for (auto [queries, keys] : {std::pair<int64_t, int64_t>{9, 9}, {5, 13}, {12, 4}})
    add(geometry(3, queries, keys, 4, 1, 8, 8, AttentionMask::Bidirectional, 0, 0, 0.25));
  add(geometry(2, 37, 70, 8, 2, 16, 12, AttentionMask::Causal, 20, 0, 0.25));
  add(segmented(geometry(2, 37, 70, 8, 2, 16, 12, AttentionMask::Causal, 20, 0, 0.25)));
  add(geometry(2, 33, 70, 4, 4, 16, 16, AttentionMask::Prefix, 10, 40, 0.25));
  add(documented(geometry(2, 37, 70, 8, 2, 16, 12, AttentionMask::Causal, 20, 0, 0.25)));
  add(documented(geometry(2, 70, 70, 4, 2, 16, 12, AttentionMask::Bidirectional, 20, 0, 0.25)));
  // A context-parallel query chunk placed by trailing keys (the image overlay reaches past it).
  for (int64_t trailing : {int64_t{1}, int64_t{24}}) {
    AttentionContract chunk = segmented(geometry(2, 21, 70, 8, 2, 16, 12, AttentionMask::Causal, 20, 0, 0.25));
    chunk.trailingKeys = trailing;
    add(chunk);
    add(documented(chunk));
  }
  return all;
}

std::vector<float> runCpuAttention(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v) {
  const AttentionContract& g = c.g;
  KernelCall call("attention", {{"mask", maskName(g.mask)},
                                {"window", g.window},
                                {"prefix_len", g.prefixLen},
                                {"scale", g.scale},
                                {"has_document_ids", g.documented},
                                {"trailing_keys", g.trailingKeys}});
  call.input(DType::F32, {g.batch, g.queries, g.queryHeads, g.headDim}, q);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.headDim}, k);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.valueDim}, v);
  call.input(DType::U8, {g.batch, g.keys}, c.keyValid);
  if (g.segmented) call.input(DType::I64, {g.batch, g.keys}, c.segmentIds);
  if (g.documented) call.input(DType::I64, {g.batch, g.keys}, c.documentIds);
  call.output(DType::F32, {g.batch, g.queries, g.queryHeads, g.valueDim});
  call.run();
  return call.result<float>();
}

struct Gradients {
  std::vector<float> dq, dk, dv;
};

Gradients runCpuAttentionBackward(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<float>& dOut) {
  const AttentionContract& g = c.g;
  KernelCall call("attention_backward", {{"mask", maskName(g.mask)},
                                         {"window", g.window},
                                         {"prefix_len", g.prefixLen},
                                         {"scale", g.scale},
                                         {"has_document_ids", g.documented},
                                         {"trailing_keys", g.trailingKeys}});
  call.input(DType::F32, {g.batch, g.queries, g.queryHeads, g.headDim}, q);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.headDim}, k);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.valueDim}, v);
  call.input(DType::U8, {g.batch, g.keys}, c.keyValid);
  call.input(DType::F32, {g.batch, g.queries, g.queryHeads, g.valueDim}, dOut);
  if (g.segmented) call.input(DType::I64, {g.batch, g.keys}, c.segmentIds);
  if (g.documented) call.input(DType::I64, {g.batch, g.keys}, c.documentIds);
  call.output(DType::F32, {g.batch, g.queries, g.queryHeads, g.headDim});
  call.output(DType::F32, {g.batch, g.keys, g.kvHeads, g.headDim});
  call.output(DType::F32, {g.batch, g.keys, g.kvHeads, g.valueDim});
  call.run();
  return {call.result<float>(0), call.result<float>(1), call.result<float>(2)};
}

// The CPU kernel's visible key sets, observed: with q = 0 every visible key has the same score, so
// with v one-hot in the key (Dv = Tk) o[b, i, h, j] = 1 / count when key j is visible, 0 otherwise.
std::vector<uint8_t> cpuVisibility(const Case& c) {
  Case probe = c;
  probe.g.headDim = 1;
  probe.g.valueDim = probe.g.keys;
  const AttentionContract& g = probe.g;
  std::vector<float> q(g.batch * g.queries * g.queryHeads, 0.0f), k(g.batch * g.keys * g.kvHeads, 1.0f);
  std::vector<float> v(g.batch * g.keys * g.kvHeads * g.keys, 0.0f);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t key = 0; key < g.keys; ++key)
      for (int64_t h = 0; h < g.kvHeads; ++h) v[attention::keyRowOf(g, b, key, h) * g.keys + key] = 1.0f;
  const std::vector<float> o = runCpuAttention(probe, q, k, v);
  std::vector<uint8_t> visible(o.size());
  for (size_t e = 0; e < o.size(); ++e) visible[e] = o[e] > 0.0f;
  return visible;
}

TEST(AttentionMath, VisibilityEqualsTheCpuKernelsForEveryQueryAndKey) {
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const std::vector<uint8_t> cpu = cpuVisibility(c);
    int64_t visibleCount = 0;
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t i = 0; i < g.queries; ++i)
        for (int64_t h = 0; h < g.queryHeads; ++h) {
          const KeyRange range = attention::candidateKeys(g, i);
          for (int64_t j = 0; j < g.keys; ++j) {
            const bool expected = cpu[attention::queryRowOf(g, b, i, h) * g.keys + j] != 0;
            const bool visible = attention::keyVisible(g, c.keyValid[b * g.keys + j] != 0,
                                                       attention::maskRowsOf(g, c.segments(), c.documents(), b), i, j);
            ASSERT_EQ(visible, expected) << describe(g) << ": b " << b << " query " << i << " key " << j;
            if (visible) {
              ++visibleCount;
              ASSERT_TRUE(j >= range.begin && j < range.end) << describe(g) << ": key " << j << " of query " << i
                                                             << " outside its candidate range";
            }
          }
          if (i > 0) {  // candidateKeysOfQueries relies on both ends never decreasing
            EXPECT_GE(range.begin, attention::candidateKeys(g, i - 1).begin) << describe(g);
            EXPECT_GE(range.end, attention::candidateKeys(g, i - 1).end) << describe(g);
          }
        }
    EXPECT_GT(visibleCount, 0) << describe(g);
  }
}

// A CUDA block of one thread: every phase loop of AttentionTiles.h covers all its items in order and
// the barriers have nothing to wait for, a legal schedule of the kernel.
struct SerialBlock {
  int thread() const { return 0; }
  int threads() const { return 1; }
  void sync() const {}
};

// A task body's shared memory: exactly `floats` floats, NaN-filled so that a read of an element no
// phase wrote shows up, followed by a guard region that must stay untouched.
class SharedMemory {
 public:
  explicit SharedMemory(int64_t floats) : floats_(floats), data_(floats + kGuard, std::nanf("")) {
    std::fill(data_.begin() + floats, data_.end(), kGuardValue);
  }
  float* data() { return data_.data(); }
  bool guardIntact() const {
    return std::all_of(data_.begin() + floats_, data_.end(), [](float value) { return value == kGuardValue; });
  }

 private:
  static constexpr int64_t kGuard = 64;
  static constexpr float kGuardValue = 12345.0f;
  int64_t floats_;
  std::vector<float> data_;
};

// A CUDA block of `threads` host threads: each runs the body with its own index, and a barrier stands
// for __syncthreads. With several threads a phase's items are split as on the device, so a missing
// barrier or an item written by two threads shows up as a wrong result.
class ThreadedBlocks {
 public:
  explicit ThreadedBlocks(int threads) : threads_(threads), barrier_(threads) {}

  struct Block {
    ThreadedBlocks* group;
    int index;
    int thread() const { return index; }
    int threads() const { return group->threads_; }
    void sync() const { group->barrier_.arrive_and_wait(); }
  };

  // Runs `body(block)` on every thread of the block and waits for all.
  template <typename Body>
  void run(const Body& body) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) workers.emplace_back([&, t] { body(Block{this, t}); });
    for (std::thread& worker : workers) worker.join();
  }

 private:
  int threads_;
  std::barrier<> barrier_;
};

// attentionForwardKernel on the host: one block (of `threads` threads) walks every task, as a
// grid-stride loop does.
std::vector<float> emulateForward(const Case& c, TileShape tiles, const std::vector<float>& q,
                                  const std::vector<float>& k, const std::vector<float>& v, int threads = 1) {
  const AttentionContract& g = c.g;
  std::vector<float> o(g.batch * g.queries * g.queryHeads * g.valueDim, std::nanf(""));
  const attention::AttentionBuffers<float> t{q.data(),     k.data(),      v.data(), c.keyValid.data(),
                                             c.segments(), c.documents(), nullptr,  o.data(),
                                             nullptr,      nullptr,       nullptr};
  SharedMemory shared(attention::forwardSharedFloats(tiles, g.headDim, g.valueDim));
  auto body = [&](const auto& block) {
    for (int64_t task = 0; task < attention::queryTileTasks(g, tiles); ++task)
      attention::forwardTask(block, shared.data(), g, tiles, t, task);
  };
  if (threads == 1)
    body(SerialBlock{});
  else
    ThreadedBlocks(threads).run(body);
  EXPECT_TRUE(shared.guardIntact()) << describe(g) << ": the forward wrote past its shared memory";
  return o;
}

// The backward's two kernels on the host: every query task, then every key task.
Gradients emulateBackward(const Case& c, TileShape tiles, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, const std::vector<float>& dOut, int threads = 1) {
  const AttentionContract& g = c.g;
  Gradients out{std::vector<float>(g.batch * g.queries * g.queryHeads * g.headDim, std::nanf("")),
                std::vector<float>(g.batch * g.keys * g.kvHeads * g.headDim, std::nanf("")),
                std::vector<float>(g.batch * g.keys * g.kvHeads * g.valueDim, std::nanf(""))};
  std::vector<float> statistics(g.batch * g.queries * g.queryHeads * attention::kStatistics, std::nanf(""));
  const attention::AttentionBuffers<float> t{q.data(),      k.data(),      v.data(),         c.keyValid.data(),
                                             c.segments(),  c.documents(), dOut.data(),      out.dq.data(),
                                             out.dk.data(), out.dv.data(), statistics.data()};
  SharedMemory queryShared(attention::backwardQuerySharedFloats(tiles, g.headDim, g.valueDim));
  SharedMemory keyShared(attention::backwardKeySharedFloats(tiles, g.headDim, g.valueDim));
  auto queryKernel = [&](const auto& block) {
    for (int64_t task = 0; task < attention::queryTileTasks(g, tiles); ++task)
      attention::backwardQueryTask(block, queryShared.data(), g, tiles, t, task);
  };
  auto keyKernel = [&](const auto& block) {
    for (int64_t task = 0; task < attention::keyTileTasks(g, tiles); ++task)
      attention::backwardKeyTask(block, keyShared.data(), g, tiles, t, task);
  };
  if (threads == 1) {
    queryKernel(SerialBlock{});
    keyKernel(SerialBlock{});
  } else {
    ThreadedBlocks(threads).run(queryKernel);
    ThreadedBlocks(threads).run(keyKernel);
  }
  EXPECT_TRUE(queryShared.guardIntact() && keyShared.guardIntact())
      << describe(g) << ": the backward wrote past its shared memory";
  return out;
}

// |emulated − cpu| ≤ tolerance · max(1, |cpu|), and no NaN (an element the emulation never wrote).
void expectMatches(const std::vector<float>& emulated, const std::vector<float>& cpu, double tolerance,
                   const std::string& what) {
  ASSERT_EQ(emulated.size(), cpu.size()) << what;
  
  for (size_t e = 0; e < cpu.size(); ++e) {
    ASSERT_FALSE(std::isnan(emulated[e])) << what << ": element " << e << " not written";
    const double error = std::fabs(static_cast<double>(emulated[e]) - cpu[e]) / std::max(1.0, std::fabs(static_cast<double>(cpu[e])));
    ASSERT_LE(error, tolerance) << what << ": element " << e << ": emulated " << emulated[e] << ", cpu " << cpu[e];
  }
}

// The tile shapes the CUDA kernels pick for head dims 8..256 and small odd ones that leave partial
// tiles everywhere.
std::vector<TileShape> tileShapes(const AttentionContract& g) {
  return {attention::chooseTiles(g.headDim, g.valueDim, 96 * 1024,
                                 [](TileShape t, int64_t d, int64_t dv) { return attention::forwardSharedFloats(t, d, dv); }),
          TileShape{3, 5}, TileShape{1, 1}, TileShape{4, 32}};
}

TEST(AttentionMath, ForwardTaskBodiesMatchTheCpuKernel) {
  uint32_t seed = 500;
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const auto q = randomValues<float>(g.batch * g.queries * g.queryHeads * g.headDim, seed++);
    const auto k = randomValues<float>(g.batch * g.keys * g.kvHeads * g.headDim, seed++);
    const auto v = randomValues<float>(g.batch * g.keys * g.kvHeads * g.valueDim, seed++);
    const std::vector<float> cpu = runCpuAttention(c, q, k, v);
    for (TileShape tiles : tileShapes(g))
      expectMatches(emulateForward(c, tiles, q, k, v), cpu, 1e-6,
                    describe(g) + " tiles " + std::to_string(tiles.queryTile) + "x" + std::to_string(tiles.keyTile));
  }
}

TEST(AttentionMath, BackwardTaskBodiesMatchTheCpuKernel) {
  uint32_t seed = 900;
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const auto q = randomValues<float>(g.batch * g.queries * g.queryHeads * g.headDim, seed++);
    const auto k = randomValues<float>(g.batch * g.keys * g.kvHeads * g.headDim, seed++);
    const auto v = randomValues<float>(g.batch * g.keys * g.kvHeads * g.valueDim, seed++);
    const auto dOut = randomValues<float>(g.batch * g.queries * g.queryHeads * g.valueDim, seed++);
    const Gradients cpu = runCpuAttentionBackward(c, q, k, v, dOut);
    for (TileShape tiles : tileShapes(g)) {
      const Gradients emulated = emulateBackward(c, tiles, q, k, v, dOut);
      const std::string what =
          describe(g) + " tiles " + std::to_string(tiles.queryTile) + "x" + std::to_string(tiles.keyTile);
      expectMatches(emulated.dq, cpu.dq, 2e-6, "dq " + what);
      expectMatches(emulated.dk, cpu.dk, 2e-6, "dk " + what);
      expectMatches(emulated.dv, cpu.dv, 2e-6, "dv " + what);
    }
  }
}

// Blocks of several threads (5: the phase loops split their items unevenly) give the one-thread
// block's results exactly: every item is computed by one thread in the same order either way, so
// any difference is a race between phases.
TEST(AttentionMath, ThreadedBlocksEqualTheSerialBlock) {
  uint32_t seed = 2100;
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const auto q = randomValues<float>(g.batch * g.queries * g.queryHeads * g.headDim, seed++);
    const auto k = randomValues<float>(g.batch * g.keys * g.kvHeads * g.headDim, seed++);
    const auto v = randomValues<float>(g.batch * g.keys * g.kvHeads * g.valueDim, seed++);
    const auto dOut = randomValues<float>(g.batch * g.queries * g.queryHeads * g.valueDim, seed++);
    const TileShape tiles{3, 5};
    EXPECT_EQ(emulateForward(c, tiles, q, k, v, 5), emulateForward(c, tiles, q, k, v)) << describe(g);
    const Gradients threaded = emulateBackward(c, tiles, q, k, v, dOut, 5);
    const Gradients serial = emulateBackward(c, tiles, q, k, v, dOut);
    EXPECT_EQ(threaded.dq, serial.dq) << describe(g);
    EXPECT_EQ(threaded.dk, serial.dk) << describe(g);
    EXPECT_EQ(threaded.dv, serial.dv) << describe(g);
  }
}

TEST(AttentionMath, RowWithoutVisibleKeysStaysZero) {
  OnlineSoftmax row;
  float scores[3] = {-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(attention::takeInTile(row, scores, 3), 1.0f);
  EXPECT_EQ(row.sum, 0.0f);
  for (float weight : scores) EXPECT_EQ(weight, 0.0f);
  EXPECT_EQ(attention::normalizedOutput(0.0f, row.sum), 0.0f);
  // The first visible key: nothing accumulated before it survives (factor 0), its weight is 1.
  float next[2] = {-INFINITY, 2.5f};
  EXPECT_EQ(attention::takeInTile(row, next, 2), 0.0f);
  EXPECT_EQ(row.maximum, 2.5f);
  EXPECT_EQ(next[1], 1.0f);
  EXPECT_EQ(row.sum, 1.0f);
}

TEST(AttentionMath, TilesFitTheSharedMemoryBudget) {
  using SharedFloats = int64_t (*)(TileShape, int64_t, int64_t);
  const SharedFloats kernels[] = {
      [](TileShape t, int64_t d, int64_t dv) { return attention::forwardSharedFloats(t, d, dv); },
      [](TileShape t, int64_t d, int64_t dv) { return attention::backwardQuerySharedFloats(t, d, dv); },
      [](TileShape t, int64_t d, int64_t dv) { return attention::backwardKeySharedFloats(t, d, dv); }};
  const int64_t budget = 96 * 1024;
  for (SharedFloats shared : kernels) {
    EXPECT_EQ(attention::chooseTiles(8, 8, budget, shared).queryTile, 16);
    EXPECT_EQ(attention::chooseTiles(8, 8, budget, shared).keyTile, 32);
    for (int64_t dim : {1, 64, 128, 256, 512}) {
      const TileShape t = attention::chooseTiles(dim, dim, budget, shared);
      ASSERT_GT(t.queryTile, 0) << dim;
      EXPECT_LE(shared(t, dim, dim) * 4, budget) << dim;
    }
    EXPECT_EQ(attention::chooseTiles(1 << 14, 1 << 14, budget, shared).queryTile, 0);  // not even 1 x 1
  }
}

// The bf16 instantiation: bf16 buffers read and written by the bodies themselves equal the CPU
// kernel in f32 on the same values, rounded once to bf16 (what the CPU backend's widening computes),
// within one bf16 ulp.
TEST(AttentionMath, Bf16BodiesMatchTheCpuKernelRoundedOnce) {
  uint32_t seed = 1700;
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    auto bf16Bits = [&](int64_t count) {
      std::vector<uint16_t> bits;
      for (float value : randomValues<float>(count, seed++)) bits.push_back(f32ToBf16Bits(value));
      return bits;
    };
    auto widened = [](const std::vector<uint16_t>& bits) {
      std::vector<float> values;
      for (uint16_t b : bits) values.push_back(bf16BitsToF32(b));
      return values;
    };
    const auto q = bf16Bits(g.batch * g.queries * g.queryHeads * g.headDim);
    const auto k = bf16Bits(g.batch * g.keys * g.kvHeads * g.headDim);
    const auto v = bf16Bits(g.batch * g.keys * g.kvHeads * g.valueDim);
    const std::vector<float> cpu = runCpuAttention(c, widened(q), widened(k), widened(v));
    const TileShape tiles = tileShapes(g)[0];
    std::vector<uint16_t> o(cpu.size(), 0xffff);
    const attention::AttentionBuffers<uint16_t> t{q.data(),     k.data(),      v.data(), c.keyValid.data(),
                                                  c.segments(), c.documents(), nullptr,  o.data(),
                                                  nullptr,      nullptr,       nullptr};
    SharedMemory shared(attention::forwardSharedFloats(tiles, g.headDim, g.valueDim));
    for (int64_t task = 0; task < attention::queryTileTasks(g, tiles); ++task)
      attention::forwardTask(SerialBlock{}, shared.data(), g, tiles, t, task);
    for (size_t e = 0; e < cpu.size(); ++e) {
      const float expected = bf16BitsToF32(f32ToBf16Bits(cpu[e]));
      ASSERT_NEAR(bf16BitsToF32(o[e]), expected, std::ldexp(std::fabs(expected), -7) + 1e-6)
          << describe(g) << ": element " << e;
    }
  }
}

TEST(KernelElements, Bf16StoreRoundsAsTheCpuBackend) {
  std::mt19937 generator(3);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, INFINITY, -INFINITY, std::nanf(""), 1.00390625f, 1.01171875f,
                               3.4e38f, 1e-40f};
  for (int n = 0; n < 100000; ++n) {
    const uint32_t bits = generator();
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    values.push_back(value);
  }
  for (float value : values) {
    uint16_t stored = 0;
    kernels::storeFloat(&stored, 0, value);
    ASSERT_EQ(stored, f32ToBf16Bits(value)) << value;
    const float loaded = kernels::loadFloat(&stored, 0);
    if (!std::isnan(loaded)) {
      ASSERT_EQ(loaded, bf16BitsToF32(stored)) << value;
    }
  }
}

}  // namespace
}  // namespace dgemma::test
