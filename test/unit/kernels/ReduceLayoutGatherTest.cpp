// Reductions, transpose, reshape, gather and scatter_add against index-by-index references.
#include <cmath>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

std::vector<int64_t> coordinatesOf(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coord(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = index % shape[d];
    index /= shape[d];
  }
  return coord;
}

// Reduces x over `dims` by visiting every element and folding it into its output slot.
std::vector<double> reduceReference(const std::vector<double>& x, const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& dims, const std::string& kind) {
  std::vector<int64_t> keptShape;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) keptShape.push_back(shape[d]);
  int64_t outputs = 1, reducedCount = 1;
  for (int64_t dim : keptShape) outputs *= dim;
  for (int64_t dim : dims) reducedCount *= shape[dim];
  std::vector<double> y(outputs, kind == "max" ? -INFINITY : 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    const std::vector<int64_t> coord = coordinatesOf(static_cast<int64_t>(i), shape);
    int64_t slot = 0;
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) slot = slot * shape[d] + coord[d];
    y[slot] = kind == "max" ? std::max(y[slot], x[i]) : y[slot] + x[i];
  }
  if (kind == "mean")
    for (double& value : y) value /= reducedCount;
  return y;
}

template <typename T>
void checkReduce(const std::string& kind, DType dtype, const std::vector<int64_t>& shape,
                 const std::vector<int64_t>& dims, bool keepDims, const std::vector<int64_t>& outShape,
                 ThreadPool* threads = nullptr) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  const std::vector<T> x = randomValues<T>(count, 41, -3, 3);
  KernelCall call("reduce_" + kind, {{"dims", dims}, {"keep_dims", keepDims}});
  call.input(dtype, shape, x).output(dtype, outShape);
  call.run(threads);
  SCOPED_TRACE("reduce_" + kind);
  expectClose(call.result<T>(), reduceReference(std::vector<double>(x.begin(), x.end()), shape, dims, kind),
              dtype == DType::F64 ? 1e-14 : 1e-6);
}

TEST(ReduceKernels, SumMaxMeanOverInnerOuterAndMixedDims) {
  for (const char* kind : {"sum", "max", "mean"}) {
    checkReduce<float>(kind, DType::F32, {2, 3, 4}, {2}, false, {2, 3});
    checkReduce<float>(kind, DType::F32, {2, 3, 4}, {0}, false, {3, 4});
    checkReduce<double>(kind, DType::F64, {2, 3, 4, 5}, {0, 2}, false, {3, 5});
    checkReduce<double>(kind, DType::F64, {2, 3, 4}, {0, 1, 2}, false, {});
  }
}

TEST(ReduceKernels, KeepDimsLeavesOnes) {
  checkReduce<float>("sum", DType::F32, {2, 3, 4}, {1}, true, {2, 1, 4});
  checkReduce<double>("max", DType::F64, {2, 3, 4}, {0, 2}, true, {1, 3, 1});
  checkReduce<float>("mean", DType::F32, {5}, {0}, true, {1});
}

TEST(ReduceKernels, ManyOutputsAcrossThreads) {
  ThreadPool threads(2);
  checkReduce<float>("sum", DType::F32, {300, 200}, {1}, false, {300}, &threads);
  checkReduce<float>("max", DType::F32, {40, 30, 20}, {1}, true, {40, 1, 20}, &threads);
}

// Long contiguous reductions (interleaved partial accumulators with a remainder) and reductions over
// leading dims (outputs accumulated a row of x at a time), split across threads.
TEST(ReduceKernels, LongRowsAndLeadingDimsAcrossThreads) {
  ThreadPool threads(2);
  for (const char* kind : {"sum", "max", "mean"}) {
    checkReduce<float>(kind, DType::F32, {6, 1003}, {1}, false, {6}, &threads);
    checkReduce<float>(kind, DType::F32, {4, 33, 257}, {0, 1}, false, {257}, &threads);
    checkReduce<double>(kind, DType::F64, {3, 70, 9}, {0}, true, {1, 70, 9}, &threads);
    checkReduce<float>(kind, DType::F32, {5, 6, 7, 8}, {0, 2}, false, {6, 8}, &threads);
  }
}

TEST(ReduceKernels, MaxPropagatesNaNAlongEveryPath) {
  std::vector<float> x(2 * 20, 1.0f);
  x[13] = NAN;  // row 0 of the contiguous reduction, column 13 of the leading-dim one
  KernelCall rows("reduce_max", {{"dims", {1}}, {"keep_dims", false}});
  rows.input<float>(DType::F32, {2, 20}, x).output(DType::F32, {2});
  rows.run();
  EXPECT_TRUE(std::isnan(rows.result<float>()[0]));
  EXPECT_EQ(rows.result<float>()[1], 1.0f);
  KernelCall columns("reduce_max", {{"dims", {0}}, {"keep_dims", false}});
  columns.input<float>(DType::F32, {2, 20}, x).output(DType::F32, {20});
  columns.run();
  EXPECT_TRUE(std::isnan(columns.result<float>()[13]));
  EXPECT_EQ(columns.result<float>()[12], 1.0f);
}

TEST(ReduceKernels, MaxPropagatesNaN) {
  KernelCall call("reduce_max", {{"dims", {1}}, {"keep_dims", false}});
  call.input<float>(DType::F32, {2, 3}, {1, NAN, 2, 4, 5, 6}).output(DType::F32, {2});
  call.run();
  const std::vector<float> y = call.result<float>();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 6.0f);
}

template <typename T>
void checkTranspose(DType dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& perm,
                    ThreadPool* threads = nullptr) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  std::vector<T> x(count);
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<T>(i + 1);  // distinct, so any misplacement shows
  std::vector<int64_t> outShape;
  for (int64_t axis : perm) outShape.push_back(shape[axis]);
  KernelCall call("transpose", {{"perm", perm}});
  call.input(dtype, shape, x).output(dtype, outShape);
  call.run(threads);
  const std::vector<T> y = call.result<T>();
  // y at coordinates c holds x at the coordinates whose dimension perm[k] is c[k].
  for (int64_t o = 0; o < count; ++o) {
    const std::vector<int64_t> coord = coordinatesOf(o, outShape);
    std::vector<int64_t> source(shape.size());
    for (size_t k = 0; k < perm.size(); ++k) source[perm[k]] = coord[k];
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + source[d];
    ASSERT_EQ(y[o], x[flat]) << "output index " << o;
  }
}

TEST(TransposeKernel, PermutationsOfDifferentRanksAndElementSizes) {
  checkTranspose<float>(DType::F32, {2, 3}, {1, 0});
  checkTranspose<float>(DType::F32, {2, 3, 4}, {2, 0, 1});
  checkTranspose<double>(DType::F64, {2, 3, 4, 5}, {0, 2, 1, 3});
  checkTranspose<int64_t>(DType::I64, {3, 1, 2}, {1, 2, 0});
  checkTranspose<uint16_t>(DType::BF16, {4, 6}, {1, 0});
  checkTranspose<int8_t>(DType::I8, {3, 5}, {1, 0});
  checkTranspose<float>(DType::F32, {2, 3}, {0, 1});  // identity
}

TEST(TransposeKernel, LargeTransposeAcrossThreads) {
  ThreadPool threads(2);
  checkTranspose<float>(DType::F32, {130, 70, 3}, {1, 2, 0}, &threads);
}

// Swapping the last two dims takes a tiled path: sizes that are and are not multiples of its 32-wide
// tiles, a batch of matrices, an empty one, and a split across threads.
TEST(TransposeKernel, LastTwoDimsSwapInTiles) {
  checkTranspose<float>(DType::F32, {64, 96}, {1, 0});
  checkTranspose<float>(DType::F32, {33, 70}, {1, 0});
  checkTranspose<double>(DType::F64, {3, 31, 45}, {0, 2, 1});
  checkTranspose<uint16_t>(DType::BF16, {2, 2, 40, 7}, {0, 1, 3, 2});
  checkTranspose<float>(DType::F32, {0, 5}, {1, 0});
  ThreadPool threads(2);
  checkTranspose<float>(DType::F32, {5, 100, 130}, {0, 2, 1}, &threads);
  checkTranspose<float>(DType::F32, {256, 1030}, {1, 0}, &threads);
}

TEST(ReshapeKernel, CopiesBytesUnderANewShape) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  KernelCall call("reshape");
  call.input(DType::F32, {2, 3}, x).output(DType::F32, {3, 1, 2});
  call.run();
  EXPECT_EQ(call.result<float>(), x);
}

TEST(ConcatKernel, JoinsAlongInnerAndOuterDims) {
  // [2, 1, 2] and [2, 2, 2] along dim 1 (the decoder's [prefix K/V ; canvas K/V] along tokens).
  KernelCall tokens("concat", {{"dim", 1}});
  tokens.input<float>(DType::F32, {2, 1, 2}, {1, 2, 3, 4})
      .input<float>(DType::F32, {2, 2, 2}, {10, 11, 12, 13, 20, 21, 22, 23})
      .output(DType::F32, {2, 3, 2});
  tokens.run();
  EXPECT_EQ(tokens.result<float>(), (std::vector<float>{1, 2, 10, 11, 12, 13, 3, 4, 20, 21, 22, 23}));

  // Booleans along dim 0, three inputs.
  KernelCall rows("concat", {{"dim", 0}});
  rows.input<uint8_t>(DType::Bool, {1, 2}, {1, 0}).input<uint8_t>(DType::Bool, {2, 2}, {0, 1, 1, 1})
      .input<uint8_t>(DType::Bool, {1, 2}, {0, 0}).output(DType::Bool, {4, 2});
  ThreadPool threads(2);
  rows.run(&threads);
  EXPECT_EQ(rows.result<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 1, 1, 1, 0, 0}));
}

TEST(ConcatKernel, RejectsMismatchedShapes) {
  KernelCall call("concat", {{"dim", 1}});
  call.input<float>(DType::F32, {2, 1}, {1, 2}).input<float>(DType::F32, {3, 1}, {1, 2, 3}).output(DType::F32, {2, 2});
  try {
    call.create();
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), call.where() + ": input 1 [3,1] differs from output [2,2] outside dim 1");
  }
}

TEST(SliceKernel, CutsBlocksOfInnerAndOuterDims) {
  // [2, 3, 2]: tokens 1..2 of every row (the decoder's cotangent split back into prefix and canvas).
  KernelCall tokens("slice", {{"dim", 1}, {"start", 1}});
  tokens.input<float>(DType::F32, {2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}).output(DType::F32, {2, 2, 2});
  tokens.run();
  EXPECT_EQ(tokens.result<float>(), (std::vector<float>{3, 4, 5, 6, 9, 10, 11, 12}));
  KernelCall rows("slice", {{"dim", 0}, {"start", 2}});
  rows.input<int64_t>(DType::I64, {3, 2}, {1, 2, 3, 4, 5, 6}).output(DType::I64, {1, 2});
  rows.run();
  EXPECT_EQ(rows.result<int64_t>(), (std::vector<int64_t>{5, 6}));
  KernelCall outside("slice", {{"dim", 0}, {"start", 2}});
  outside.input<int64_t>(DType::I64, {3, 2}, {1, 2, 3, 4, 5, 6}).output(DType::I64, {2, 2});
  try {
    outside.create();
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), outside.where() + ": attribute 'start': block [2, 4) leaves dim 0 of size 3");
  }
}

TEST(GatherKernel, SelectsTableRows) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21, 30, 31};  // [4, 2]
  KernelCall call32("gather", {{"row_offset", 0}});
  call32.input(DType::F32, {4, 2}, table).input<int32_t>(DType::I32, {2, 2}, {3, 0, 1, 3});
  call32.output(DType::F32, {2, 2, 2});
  call32.run();
  EXPECT_EQ(call32.result<float>(), (std::vector<float>{30, 31, 0, 1, 10, 11, 30, 31}));

  ThreadPool threads(2);
  const std::vector<double> wide = randomValues<double>(50 * 64, 51);  // [50, 64]
  std::vector<int64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 50);
  KernelCall call64("gather", {{"row_offset", 0}});
  call64.input(DType::F64, {50, 64}, wide).input(DType::I64, {1000}, ids).output(DType::F64, {1000, 64});
  call64.run(&threads);
  const std::vector<double> y = call64.result<double>();
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t h = 0; h < 64; ++h) ASSERT_EQ(y[i * 64 + h], wide[ids[i] * 64 + h]) << "row " << i;
}

TEST(GatherKernel, NegativeIdIsARunTimeErrorNamingIdAndIndex) {
  KernelCall call("gather", {{"row_offset", 0}});
  call.input<float>(DType::F32, {4, 1}, {0, 1, 2, 3}).input<int64_t>(DType::I64, {3}, {0, -1, 2});
  call.output(DType::F32, {3, 1});
  try {
    call.run();
    ADD_FAILURE() << "id -1 was accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(error.exitCode(), 1);
    EXPECT_EQ(std::string(error.what()), "step 0 (gather): id -1 at flat index 1 is negative, not a row of the table");
  }
}

// A [6, 2] table cut into the global rows [0, 2) and [2, 6): each block gives zero rows for the ids
// it does not hold, and the blocks' results summed are the whole table's gather.
TEST(GatherKernel, BlocksOfTheTableSumToTheWholeGather) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51};
  const std::vector<int32_t> ids = {5, 0, 2, 1, 4, 3, 1};
  const auto gather = [&](int64_t rowOffset, int64_t rows) {
    KernelCall call("gather", {{"row_offset", rowOffset}});
    call.input(DType::F32, {rows, 2}, std::vector<float>(table.begin() + rowOffset * 2, table.begin() + (rowOffset + rows) * 2));
    call.input(DType::I32, {7}, ids).output(DType::F32, {7, 2});
    call.run();
    return call.result<float>();
  };
  const std::vector<float> low = gather(0, 2), high = gather(2, 4), whole = gather(0, 6);
  EXPECT_EQ(low, (std::vector<float>{0, 0, 0, 1, 0, 0, 10, 11, 0, 0, 0, 0, 10, 11}));
  EXPECT_EQ(high, (std::vector<float>{50, 51, 0, 0, 20, 21, 0, 0, 40, 41, 30, 31, 0, 0}));
  std::vector<float> sum(low.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = low[i] + high[i];
  EXPECT_EQ(sum, whole);

  KernelCall negative("gather", {{"row_offset", -1}});
  negative.input(DType::F32, {6, 2}, table).input(DType::I32, {7}, ids).output(DType::F32, {7, 2});
  EXPECT_EQ(factoryError(negative), "step 0 (gather): attribute 'row_offset': -1 must be >= 0");
}

// Table [4, 2], ids [2, 3]: rows hit twice add up, unread rows stay zero, and with skip_id = 0 (a
// gather's padding_idx) the positions reading row 0 add nothing.
TEST(ScatterAddKernel, AddsRowsAtTheIdsAndSkipsThePaddingRow) {
  const std::vector<int64_t> ids = {2, 0, 2, 3, 0, 0};
  const std::vector<double> updates = {1, 2, 10, 20, 100, 200, 1000, 2000, 3, 4, 5, 6};
  KernelCall all("scatter_add", {{"row_offset", 0}});
  all.input(DType::I64, {2, 3}, ids).input(DType::F64, {2, 3, 2}, updates).output(DType::F64, {4, 2});
  all.run();
  EXPECT_EQ(all.result<double>(), (std::vector<double>{10 + 3 + 5, 20 + 4 + 6, 0, 0, 1 + 100, 2 + 200, 1000, 2000}));

  KernelCall skipped("scatter_add", {{"skip_id", 0}, {"row_offset", 0}});
  skipped.input<int32_t>(DType::I32, {2, 3}, {2, 0, 2, 3, 0, 0});
  skipped.input(DType::F32, {2, 3, 2}, std::vector<float>(updates.begin(), updates.end())).output(DType::F32, {4, 2});
  skipped.run();
  EXPECT_EQ(skipped.result<float>(), (std::vector<float>{0, 0, 0, 0, 101, 202, 1000, 2000}));
}

// The global rows [0, 2) and [2, 5) of a [5, 2] table: each block's scatter_add is that block of the
// whole one, with the skipped padding row (global row 3) skipped in the block that holds it only.
TEST(ScatterAddKernel, BlocksOfTheTableAreBlocksOfTheWholeScatter) {
  const std::vector<int64_t> ids = {4, 0, 3, 1, 4, 2, 0};
  const std::vector<double> updates = randomValues<double>(7 * 2, 61);
  const auto scatter = [&](int64_t rowOffset, int64_t rows) {
    KernelCall call("scatter_add", {{"skip_id", 3}, {"row_offset", rowOffset}});
    call.input(DType::I64, {7}, ids).input(DType::F64, {7, 2}, updates).output(DType::F64, {rows, 2});
    call.run();
    return call.result<double>();
  };
  const std::vector<double> whole = scatter(0, 5);
  EXPECT_EQ(std::vector<double>(whole.begin() + 6, whole.begin() + 8), (std::vector<double>{0, 0})) << "padding row";
  EXPECT_EQ(scatter(0, 2), std::vector<double>(whole.begin(), whole.begin() + 4));
  EXPECT_EQ(scatter(2, 3), std::vector<double>(whole.begin() + 4, whole.end()));
}

TEST(ScatterAddKernel, RejectsNegativeSkipIdAndRowOffset) {
  const auto call = [](nlohmann::json attrs) {
    KernelCall scatter("scatter_add", std::move(attrs));
    scatter.input<int64_t>(DType::I64, {1}, {0}).input<float>(DType::F32, {1, 2}, {1, 2}).output(DType::F32, {4, 2});
    return scatter;
  };
  EXPECT_EQ(factoryError(call({{"skip_id", -1}, {"row_offset", 0}})),
            "step 0 (scatter_add): attribute 'skip_id': -1 must be >= 0");
  EXPECT_EQ(factoryError(call({{"row_offset", -2}})), "step 0 (scatter_add): attribute 'row_offset': -2 must be >= 0");
  // A padding row beyond this block belongs to another rank's block.
  EXPECT_NO_THROW(call({{"skip_id", 4}, {"row_offset", 0}}).create());
}

}  // namespace
}  // namespace dgemma::test
