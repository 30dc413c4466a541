#include "dialects/dg/Transforms/Passes.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGTESTSHARDINGRULES
#include "dialects/dg/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

struct DgTestShardingRulesPass : mlir::dg::impl::DgTestShardingRulesBase<DgTestShardingRulesPass> {
  void runOnOperation() override {
    getOperation().walk([](ShardingRuleOpInterface op) {
      op->emitRemark() << "sharding rule: " << op.getShardingRule().str();
    });
  }
};

}  // namespace
