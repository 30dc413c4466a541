#include <gtest/gtest.h>

#include <vector>

#include "runtime/generate/RecordedDraws.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

TEST(RecordedDraws, ReplaysWhatWasRecordedPerSite) {
  RecordedDraws draws;
  draws.setInitialCanvas(3, 0, {1, 2});
  draws.setRenoiseIds({3, 0, 1}, {5, 6});
  draws.setSampled({3, 0, 1}, {7, 8});
  std::vector<int64_t> ids(2);
  draws.initialCanvas(3, 0, ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 2}));
  draws.renoiseIds({3, 0, 1}, ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{5, 6}));
  std::vector<int64_t> sampled = {0, 0};
  EXPECT_TRUE(draws.replaceSampled({3, 0, 1}, sampled));
  EXPECT_EQ(sampled, (std::vector<int64_t>{7, 8}));
}

TEST(RecordedDraws, AMissingOrMisshapenDrawNamesItsSite) {
  RecordedDraws draws;
  draws.setInitialCanvas(0, 0, {1, 2, 3});
  std::vector<int64_t> ids(2);
  EXPECT_TRUE(test::mentions(test::expectInputError([&] { draws.initialCanvas(0, 0, ids); }), "expected 2 ids, got 3"));
  EXPECT_TRUE(test::mentions(test::expectInputError([&] { draws.renoiseIds({0, 1, 4}, ids); }),
                             "the renoise ids of request 0, canvas 1, step 4: not recorded"));
  EXPECT_TRUE(test::mentions(test::expectInputError([&] { draws.replaceSampled({0, 0, 0}, ids); }), "sampled ids"));
}

}  // namespace
}  // namespace dgemma
