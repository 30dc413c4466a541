// Test-only passes of the dg dialect, registered by dgemma-opt for the lit suite (as mlir-opt
// registers MLIR's test/lib passes).
#ifndef TEST_LIB_DIALECT_DG_TESTPASSES_H
#define TEST_LIB_DIALECT_DG_TESTPASSES_H

namespace mlir::dg::test {

void registerTestShardingRulesPass();
void registerTestPlanLoweringPass();

}  // namespace mlir::dg::test

#endif
