// dgemma-opt: runs dg passes on .mlir text (the lit tests drive the compiler through it).
#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  mlir::dg::registerDgPasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "dgemma graph optimizer\n", registry));
}
