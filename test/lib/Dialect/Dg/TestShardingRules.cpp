// Test pass: emits each op's sharding rule as a remark, so that lit can check the rule of every op.
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
  StringRef getDescription() const final { return "Test pass: emits each op's sharding rule as a remark"; }

  void runOnOperation() override {
    getOperation().walk([](ShardingRuleOpInterface op) {
      op->emitRemark() << "sharding rule: " << op.getShardingRule().str();
    });
  }
};

}  // namespace

void mlir::dg::test::registerTestShardingRulesPass() { PassRegistration<TestShardingRulesPass>(); }
