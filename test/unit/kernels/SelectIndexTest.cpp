// runtime/kernels/elementwise/SelectIndex.h, the broadcast map the CUDA select reads through, checked
// on the host: y[index] = condition[offset 0] ? on_true[offset 1] : on_false[offset 2] equals the CPU
// select kernel's output for broadcasts of every operand.
#include "KernelTestSupport.h"
#include "runtime/kernels/elementwise/SelectIndex.h"
#include "support/Shape.h"

namespace dgemma::test {
namespace {

TEST(SelectIndexTest, MatchesTheCpuKernel) {
  struct Case {
    std::vector<int64_t> condition, onTrue, onFalse, y;
  };
  const std::vector<Case> cases = {{{4, 5}, {4, 5}, {4, 5}, {4, 5}},        {{4, 1}, {4, 5}, {5}, {4, 5}},
                                   {{}, {3, 2}, {3, 2}, {3, 2}},            {{2, 1, 3}, {1, 4, 1}, {3}, {2, 4, 3}},
                                   {{1, 1, 6}, {5, 1, 1, 1}, {1}, {5, 1, 1, 6}}, {{0, 3}, {3}, {3}, {0, 3}}};
  std::mt19937 generator(71);
  for (const Case& c : cases) {
    std::vector<uint8_t> condition(static_cast<size_t>(numElementsOf(c.condition)));
    for (uint8_t& flag : condition) flag = static_cast<uint8_t>(generator() % 3);  // 0, 1 or 2 (nonzero: true)
    std::vector<int32_t> onTrue(static_cast<size_t>(numElementsOf(c.onTrue))),
        onFalse(static_cast<size_t>(numElementsOf(c.onFalse)));
    for (size_t i = 0; i < onTrue.size(); ++i) onTrue[i] = static_cast<int32_t>(1000 + i);
    for (size_t i = 0; i < onFalse.size(); ++i) onFalse[i] = -static_cast<int32_t>(1000 + i);
    KernelCall call("select");
    call.input(DType::Bool, c.condition, condition).input(DType::I32, c.onTrue, onTrue).input(DType::I32, c.onFalse, onFalse);
    call.output(DType::I32, c.y);
    call.run();
    const std::vector<int32_t> cpu = call.result<int32_t>();
    select::BroadcastMap map;
    ASSERT_TRUE(select::makeBroadcastMap({c.condition, c.onTrue, c.onFalse}, c.y, map));
    for (size_t i = 0; i < cpu.size(); ++i) {
      const int64_t index = static_cast<int64_t>(i);
      const int32_t expected = condition[select::offsetOf(map, 0, index)] != 0 ? onTrue[select::offsetOf(map, 1, index)]
                                                                               : onFalse[select::offsetOf(map, 2, index)];
      ASSERT_EQ(cpu[i], expected) << "y " << shapeToString(c.y) << ", element " << i;
    }
  }
}

}  // namespace
}  // namespace dgemma::test
