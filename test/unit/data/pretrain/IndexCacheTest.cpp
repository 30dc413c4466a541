#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "runtime/data/pretrain/BlendedDataset.h"
#include "runtime/data/pretrain/IndexCache.h"
#include "runtime/data/pretrain/PackedDataset.h"
#include "test/unit/TestSupport.h"
#include "test/unit/data/pretrain/PretrainTestCorpus.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using test::fileBytes;
using test::makeSource;
using test::mentions;
using test::TempDir;
using test::writeBytes;

PackedDatasetOptions options(const std::string& cacheDirectory = "") {
  return {.sequenceLength = 12, .seed = 3, .numSamples = 80, .documents = {0, 30}, .cacheDirectory = cacheDirectory};
}

std::vector<std::string> filesIn(const std::string& directory) {
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(IndexCache, WrittenBesideTheDataAndReusedWithoutRebuilding) {
  TempDir dir;
  const auto source = makeSource(30, 20, dir / "corpus");
  std::ostringstream log;
  PackedDataset first(source, options(), &log);
  EXPECT_TRUE(first.builtIndex());
  ASSERT_TRUE(fs::exists(first.cachePath()));
  EXPECT_EQ(fs::path(first.cachePath()).parent_path(), dir.path);
  EXPECT_EQ(fs::path(first.cachePath()).filename().string().rfind("corpus.packed-", 0), 0u);
  EXPECT_EQ(filesIn(dir.path.string()).size(), 1u);  // no temporary file left behind
  const fs::file_time_type written = fs::last_write_time(first.cachePath());

  PackedDataset second(source, options(), &log);
  EXPECT_FALSE(second.builtIndex());
  EXPECT_EQ(second.cachePath(), first.cachePath());
  EXPECT_EQ(fs::last_write_time(second.cachePath()), written);
  EXPECT_EQ(second.documentOrder(), first.documentOrder());
  EXPECT_EQ(second.sampleStarts(), first.sampleStarts());
  EXPECT_EQ(second.sampleOrder(), first.sampleOrder());
  for (int64_t i = 0; i < first.size(); i += 7) EXPECT_EQ(second.sample(i).tokens, first.sample(i).tokens);
  EXPECT_EQ(log.str(), "");
}

// Each thing that defines the arrays names another file.
TEST(IndexCache, EveryDefiningOptionChangesTheFile) {
  TempDir dir;
  const auto source = makeSource(30, 20, dir / "corpus");
  const std::string base = PackedDataset(source, options(), nullptr).cachePath();
  PackedDatasetOptions changed = options();
  changed.seed = 4;
  EXPECT_NE(PackedDataset(source, changed, nullptr).cachePath(), base);
  changed = options();
  changed.sequenceLength = 13;
  EXPECT_NE(PackedDataset(source, changed, nullptr).cachePath(), base);
  changed = options();
  changed.numSamples = 81;
  EXPECT_NE(PackedDataset(source, changed, nullptr).cachePath(), base);
  changed = options();
  changed.documents = {1, 30};
  EXPECT_NE(PackedDataset(source, changed, nullptr).cachePath(), base);
  const auto otherData = makeSource(30, 20, dir / "corpus", 6);
  EXPECT_NE(PackedDataset(otherData, options(), nullptr).cachePath(), base);
  EXPECT_EQ(filesIn(dir.path.string()).size(), 6u);
}

TEST(IndexCache, AGivenDirectoryIsUsedInstead) {
  TempDir dir;
  const auto source = makeSource(30, 20, dir / "data/corpus");
  PackedDataset dataset(source, options(dir / "cache/nested"), nullptr);
  EXPECT_EQ(fs::path(dataset.cachePath()).parent_path(), dir.path / "cache/nested");
  EXPECT_TRUE(fs::exists(dataset.cachePath()));
  EXPECT_FALSE(PackedDataset(source, options(dir / "cache/nested"), nullptr).builtIndex());
  // Documents with no place on disk and no cache directory are not cached.
  PackedDataset memoryOnly(makeSource(30, 20), options(), nullptr);
  EXPECT_EQ(memoryOnly.cachePath(), "");
  EXPECT_TRUE(memoryOnly.builtIndex());
}

TEST(IndexCache, ACorruptOrTruncatedCacheIsRebuiltWithAMessage) {
  TempDir dir;
  const auto source = makeSource(30, 20, dir / "corpus");
  const PackedDataset first(source, options(), nullptr);
  const std::string good = fileBytes(first.cachePath());

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x10;
  writeBytes(first.cachePath(), flipped);
  std::ostringstream log;
  PackedDataset rebuilt(source, options(), &log);
  EXPECT_TRUE(rebuilt.builtIndex());
  EXPECT_TRUE(mentions(log.str(), first.cachePath() + ": corrupt (checksum mismatch); rebuilding it"));
  EXPECT_EQ(rebuilt.sampleOrder(), first.sampleOrder());
  EXPECT_EQ(fileBytes(first.cachePath()), good);  // rewritten whole

  writeBytes(first.cachePath(), good.substr(0, 20));
  log.str("");
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "truncated (20 bytes); rebuilding it"));

  writeBytes(first.cachePath(), "");
  log.str("");
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "truncated (0 bytes)"));
  EXPECT_FALSE(PackedDataset(source, options(), nullptr).builtIndex());
}

// A file with a valid checksum is still refused when it was written for another key, or when its
// arrays are not this dataset's index.
TEST(IndexCache, AStaleCacheIsRebuiltWithAMessage) {
  TempDir dir;
  const auto source = makeSource(30, 20, dir / "corpus");
  const PackedDataset first(source, options(), nullptr);
  const IndexArrays arrays = {first.documentOrder(), first.sampleStarts(), first.sampleOrder()};

  storeIndexCache(first.cachePath(), "another dataset", arrays, nullptr);
  std::ostringstream log;
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "stale: built for another dataset definition; rebuilding it"));

  IndexArrays wrongStarts = arrays;
  std::swap(wrongStarts[1][2], wrongStarts[1][4]);
  storeIndexCache(first.cachePath(), first.cacheKey(), wrongStarts, nullptr);
  log.str("");
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "stale: sample starts do not match the document order"));

  IndexArrays repeated = arrays;
  repeated[2][0] = repeated[2][1];
  storeIndexCache(first.cachePath(), first.cacheKey(), repeated, nullptr);
  log.str("");
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "stale: sample order is not a permutation"));

  IndexArrays foreignDocument = arrays;
  foreignDocument[0][0] = 31;
  storeIndexCache(first.cachePath(), first.cacheKey(), foreignDocument, nullptr);
  log.str("");
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "stale: document order of epoch 0 is not a permutation"));

  storeIndexCache(first.cachePath(), first.cacheKey(), {arrays[0], arrays[1]}, nullptr);
  log.str("");
  EXPECT_TRUE(PackedDataset(source, options(), &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "expected 3 arrays, got 2"));
  EXPECT_FALSE(PackedDataset(source, options(), nullptr).builtIndex());
}

TEST(IndexCache, TheBlendOrderIsCachedToo) {
  TempDir dir;
  const std::vector<BlendSource> sources = {{makeSource(30, 20, dir / "a"), 0.6},
                                            {makeSource(20, 30, dir / "b", 9), 0.4}};
  const BlendOptions blend{.sequenceLength = 10, .seed = 1, .numSamples = 90, .split = parseSplit("8,1,1")};
  const BlendedDataset first(sources, blend, nullptr);
  EXPECT_TRUE(first.builtIndex());
  EXPECT_TRUE(first.source(0).builtIndex());
  ASSERT_TRUE(fs::exists(first.cachePath()));
  EXPECT_EQ(fs::path(first.cachePath()).filename().string().rfind("a.blend-", 0), 0u);

  const BlendedDataset second(sources, blend, nullptr);
  EXPECT_FALSE(second.builtIndex());
  EXPECT_FALSE(second.source(0).builtIndex());
  EXPECT_FALSE(second.source(1).builtIndex());
  for (int64_t i = 0; i < first.size(); ++i) ASSERT_EQ(second.sourceAt(i), first.sourceAt(i));

  // A blend order that skips a source's sample is refused.
  IndexArrays skipping(2);
  for (int64_t i = 0; i < first.size(); ++i) {
    skipping[0].push_back(first.sourceAt(i));
    skipping[1].push_back(first.sourceSampleAt(i) + (i == 5 ? 1 : 0));
  }
  storeIndexCache(first.cachePath(), first.cacheKey(), skipping, nullptr);
  std::ostringstream log;
  EXPECT_TRUE(BlendedDataset(sources, blend, &log).builtIndex());
  EXPECT_TRUE(mentions(log.str(), "stale: sample 5 skips samples of source"));
}

}  // namespace
}  // namespace dgemma
