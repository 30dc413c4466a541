// The ops of the dg dialect against the CPU kernel registry: every op the plan lowering makes a kernel
// step of has a kernel of its name, and every kernel runs some op's step (docs/architecture.md,
// "Adding an op").
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/IR/MLIRContext.h"
#include "runtime/kernel_api/Kernel.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

// Steps the plan lowering writes that no op is lowered to one-to-one: an assign, or a collective that
// works on a copy of its input, copies bytes.
const std::set<std::string> kPlanMadeSteps = {"copy"};

struct RegisteredDgOps {
  std::set<std::string> all;          // every dg op, without "dg."
  std::set<std::string> kernelSteps;  // those that lower to a kernel step
};

RegisteredDgOps registeredDgOps() {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect>();
  RegisteredDgOps ops;
  for (mlir::RegisteredOperationName name : context.getRegisteredOperations()) {
    if (name.getDialectNamespace() != mlir::dg::DgDialect::getDialectNamespace()) continue;
    std::string bare = name.stripDialect().str();
    ops.all.insert(bare);
    if (mlir::dg::lowersToKernelStep(name)) ops.kernelSteps.insert(bare);
  }
  return ops;
}

std::set<std::string> cpuKernelNames() {
  KernelRegistry registry;
  registerCpuKernels(registry);
  const std::vector<std::string> names = registry.names();
  return {names.begin(), names.end()};
}

TEST(OpKernelRegistry, EveryKernelStepOpHasACpuKernel) {
  const RegisteredDgOps ops = registeredDgOps();
  ASSERT_FALSE(ops.kernelSteps.empty());
  const std::set<std::string> kernels = cpuKernelNames();
  for (const std::string& op : ops.kernelSteps)
    EXPECT_TRUE(kernels.contains(op)) << "dg." << op << " lowers to a kernel step, but no CPU kernel is named " << op;
}

TEST(OpKernelRegistry, EveryCpuKernelRunsAnOpOrAPlanMadeStep) {
  const RegisteredDgOps ops = registeredDgOps();
  for (const std::string& kernel : cpuKernelNames())
    EXPECT_TRUE(ops.all.contains(kernel) || kPlanMadeSteps.contains(kernel))
        << "CPU kernel " << kernel << " is named after no dg op and is no step the plan lowering makes";
}

}  // namespace
}  // namespace dgemma
