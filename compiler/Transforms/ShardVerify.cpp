// dg-shard-verify: checks that the module's shardings agree with every op's sharding rule
// (ShardingConsistency.h); the tests run it after dg-shard-propagate.
#include "compiler/Transforms/Passes.h"
#include "compiler/Transforms/ShardingConsistency.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGSHARDVERIFY
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {
struct DgShardVerifyPass : mlir::dg::impl::DgShardVerifyBase<DgShardVerifyPass> {
  void runOnOperation() override {
    if (failed(verifyShardingConsistency(getOperation()))) signalPassFailure();
  }
};
}  // namespace
