// Test pass: emits each op's sharding rule as a remark, so that lit can check the rule of every op,
// and an error where the rule does not fit the op's operand and result types.
#include "test/lib/Dialect/Dg/TestPasses.h"

#include "dialects/dg/IR/DgOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

struct TestShardingRulesPass : PassWrapper<TestShardingRulesPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(TestShardingRulesPass)

  StringRef getArgument() const final { return "dg-test-sharding-rules"; }
  StringRef getDescription() const final { return "Test pass: emits each op's sharding rule as a remark and checks it against the op's types"; }

  void runOnOperation() override {
    getOperation().walk([&](ShardingRuleOpInterface op) {
      ShardingRuleAttr rule = op.getShardingRule();
      op->emitRemark() << "sharding rule: " << rule;
      if (failed(rule.verifyShapes(op))) signalPassFailure();
    });
  }
};

}  // namespace

void mlir::dg::test::registerTestShardingRulesPass() { PassRegistration<TestShardingRulesPass>(); }
