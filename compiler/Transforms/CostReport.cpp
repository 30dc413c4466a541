#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgRecompute.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGCOSTREPORT
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

struct DgCostReportPass : mlir::dg::impl::DgCostReportBase<DgCostReportPass> {
  void runOnOperation() override {
    func::FuncOp function = getOperation();
    if (!function->hasAttr(kEntryAttr)) return;
    int64_t flops = 0, recomputeFlops = 0, communicationBytes = 0;
    llvm::StringMap<int64_t> parameterBytes;
    function.walk([&](Operation* op) {
      if (auto cost = dyn_cast<CostOpInterface>(op)) {
        flops += cost.getFlops();
        if (op->hasAttr(kRecomputedAttr)) recomputeFlops += cost.getFlops();
      }
      if (auto collective = dyn_cast<CommunicationOpInterface>(op))
        communicationBytes += collective.getCommunicationBytes();
      if (auto param = dyn_cast<ParamOp>(op)) {
        parameterBytes[param.getName()] = storageBytes(param.getType());
      }
    });
    int64_t totalParameterBytes = 0;
    for (auto& entry : parameterBytes) totalParameterBytes += entry.second;
    InFlightDiagnostic remark = function.emitRemark()
                                << "cost: flops=" << flops << " parameters=" << parameterBytes.size()
                                << " parameter_bytes=" << totalParameterBytes;
    if (auto scratch = function->getAttrOfType<IntegerAttr>(kScratchBytesAttr))
      remark << " scratch_bytes=" << scratch.getInt();
    if (auto commBuffers = function->getAttrOfType<IntegerAttr>(kCommBufferBytesAttr); commBuffers && commBuffers.getInt() != 0)
      remark << " comm_buffer_bytes=" << commBuffers.getInt();
    if (communicationBytes != 0) remark << " communication_bytes=" << communicationBytes;
    // dg-recompute's clones, included in flops: the forward computed a second time.
    if (recomputeFlops != 0) remark << " recompute_flops=" << recomputeFlops;
  }
};

}  // namespace
