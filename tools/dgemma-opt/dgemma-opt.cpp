// dgemma-opt: runs dg passes and dgemma-compile's pipeline stages on .mlir text (the lit tests drive
// the compiler through it).
#include <vector>

#include "compiler/Pipeline/Pipeline.h"
#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "test/lib/Dialect/Dg/TestPasses.h"

int main(int argc, char** argv) {
  // Single-threaded, as every pipeline stage runs (compiler/Pipeline/Pipeline.cpp, configureStage):
  // dg.entry's verifier reads the sibling functions, which a function pass on another thread may be
  // rewriting.
  std::vector<char*> arguments(argv, argv + argc);
  static char disableThreading[] = "--mlir-disable-threading";
  arguments.insert(arguments.begin() + 1, disableThreading);
  argc = static_cast<int>(arguments.size());
  argv = arguments.data();
  mlir::DialectRegistry registry;
  registry.insert<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  mlir::dg::registerDgemmaPasses();
  mlir::dg::registerDgemmaPipelines();
  mlir::dg::test::registerTestShardingRulesPass();
  mlir::dg::test::registerTestPlanLoweringPass();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "dgemma graph optimizer\n", registry));
}
