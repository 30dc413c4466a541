// Test pass: lowers the module to a plan (docs/plan-format.md) and prints each step's op and
// attributes, so that lit can check what a step carries and that the lowering fails at the op for
// what the plan cannot express.
#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "mlir/Pass/Pass.h"
#include "test/lib/Dialect/Dg/TestPasses.h"

using namespace mlir;

namespace {

struct TestPlanLoweringPass : PassWrapper<TestPlanLoweringPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(TestPlanLoweringPass)

  StringRef getArgument() const final { return "dg-test-lower-to-plan"; }
  StringRef getDescription() const final {
    return "Test pass: lowers the module to a plan and prints each step as `step <op> <attrs as JSON>`";
  }

  void runOnOperation() override {
    FailureOr<dgemma::Plan> plan = dg::lowerToPlan(getOperation(), dg::PlanLoweringOptions{});
    if (failed(plan)) return signalPassFailure();
    for (const dgemma::EntryPoint& entry : plan->entryPoints)
      for (const dgemma::Step& step : entry.steps)
        llvm::outs() << "step " << step.op << " " << step.attrs.dump() << "\n";
  }
};

}  // namespace

void mlir::dg::test::registerTestPlanLoweringPass() { PassRegistration<TestPlanLoweringPass>(); }
