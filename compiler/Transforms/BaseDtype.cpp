// dg-base-dtype: the frozen base weights (dg.frozen_base, set by dg-lora) stored in bf16, int8 or NF4,
// decoded by dg.dequantize at each reader (docs/training.md, "Frozen low-precision base").
#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGBASEDTYPE
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

constexpr int64_t kNf4BlockSize = 64;  // as dg.dequantize's verifier

// Whether every reader of `value`, looking through casts, reshapes and transposes, is a contraction
// that takes it as a weight (matmul, moe_experts): such a weight is only ever read whole and decoded, so
// it can be stored quantized. The embedding table is not one: gather reads it row by row, and the tied
// head reads it too, so it stays bf16.
bool readOnlyByContractions(Value value) {
  for (Operation* user : value.getUsers()) {
    if (isa<MatmulOp, MoeExpertsOp>(user)) continue;
    if (isa<CastOp, ReshapeOp, TransposeOp>(user) && readOnlyByContractions(user->getResult(0))) continue;
    return false;
  }
  return true;
}

class BaseDtypePass : public mlir::dg::impl::DgBaseDtypeBase<BaseDtypePass> {
 public:
  using DgBaseDtypeBase::DgBaseDtypeBase;

  void runOnOperation() override {
    if (dtype != "bf16" && dtype != "int8" && dtype != "nf4") {
      mlir::emitError(getOperation().getLoc())
          << "dg-base-dtype: dtype must be bf16, int8 or nf4, got '" << dtype << "'";
      return signalPassFailure();
    }
    SmallVector<ParamOp> frozen;
    // A name is one tensor across the entry points: it is quantized only when every entry reads it
    // only by contractions (the tied embedding is read by the head's matmul alone in some entries).
    llvm::StringMap<bool> contractionsOnly;
    getOperation().walk([&](ParamOp param) {
      if (!param->hasAttr(kFrozenBaseAttr)) return;
      frozen.push_back(param);
      auto [it, first] = contractionsOnly.try_emplace(param.getName(), true);
      it->second = it->second && readOnlyByContractions(param.getResult());
    });
    for (ParamOp param : frozen) {
      auto type = param.getType();
      Type element = type.getElementType();
      if (!element.isF32() && !element.isBF16()) {
        param.emitOpError() << "dg-base-dtype: frozen base parameter '" << param.getName()
                            << "' must be f32 or bf16 (a weight), got " << type;
        return signalPassFailure();
      }
      if (dtype != "bf16" && type.getRank() >= 2 && contractionsOnly.lookup(param.getName())) {
        if (dtype == "nf4" && type.getShape().back() % kNf4BlockSize != 0) {
          // NF4 blocks lie within a row (so that a weight splits by rows or columns with whole
          // blocks): a weight of shorter or ragged rows is kept in bf16, and said so.
          if (rowsNotInBlocks.insert(param.getName()).second)
            keptBf16.push_back("'" + param.getName().str() + "' (rows of " + std::to_string(type.getShape().back()) +
                               ")");
          toBf16(param);
          continue;
        }
        quantize(param);
      } else {
        toBf16(param);
      }
    }
    // One warning for them all, at the module's location (an op's warning would print the op).
    if (!keptBf16.empty()) {
      std::string names;
      for (size_t i = 0; i < keptBf16.size() && i < 3; ++i) names += (i ? ", " : "") + keptBf16[i];
      if (keptBf16.size() > 3) names += " and " + std::to_string(keptBf16.size() - 3) + " more";
      mlir::emitWarning(getOperation().getLoc())
          << "dg-base-dtype: " << keptBf16.size() << " weight(s) stay bf16: nf4 quantizes blocks of " << kNf4BlockSize
          << " elements within a row, and their rows are not whole blocks: " << names;
    }
  }

  llvm::StringSet<> rowsNotInBlocks;
  std::vector<std::string> keptBf16;

 private:
  // The parameter itself becomes bf16: a cast of it to bf16 is the parameter, any other reader gets a
  // widening cast back to the type it read.
  void toBf16(ParamOp param) {
    auto oldType = param.getType();
    auto bf16Type = oldType.clone(BFloat16Type::get(param.getContext()));
    if (oldType == bf16Type) return;
    param.getResult().setType(bf16Type);
    Value widened;
    for (OpOperand& use : llvm::make_early_inc_range(param.getResult().getUses())) {
      auto cast = dyn_cast<CastOp>(use.getOwner());
      if (cast && cast.getType() == bf16Type) {
        cast.getResult().replaceAllUsesWith(param.getResult());
        cast.erase();
        continue;
      }
      if (cast) continue;  // now a cast from bf16 to the type it names
      if (!widened) {
        OpBuilder builder(param->getContext());
        builder.setInsertionPointAfter(param);
        widened = builder.create<CastOp>(param.getLoc(), oldType, param.getResult());
      }
      use.set(widened);
    }
  }

  void quantize(ParamOp param) {
    auto type = param.getType();
    ArrayRef<int64_t> shape = type.getShape();
    const bool nf4 = dtype == "nf4";
    MLIRContext* context = param.getContext();
    OpBuilder builder(context);
    builder.setInsertionPoint(param);
    SmallVector<int64_t> codesShape(shape), scalesShape(shape);
    Type codesElement = nf4 ? IntegerType::get(context, 8, IntegerType::Unsigned) : IntegerType::get(context, 8);
    if (nf4) {
      codesShape.back() /= 2;
      scalesShape.back() /= kNf4BlockSize;
    } else {
      scalesShape.pop_back();
    }
    const std::string scalesName = (param.getName() + (nf4 ? ".absmax" : ".scale")).str();
    auto part = [&](StringRef name, RankedTensorType partType, StringRef partName) {
      // How the runtime fills the part: quantizing the checkpoint's (or the base init's) tensor NAME of
      // the logical shape (docs/plan-format.md, "Header").
      SmallVector<NamedAttribute> init = {
          builder.getNamedAttr("kind", builder.getStringAttr("quantized")),
          builder.getNamedAttr("format", builder.getStringAttr(dtype)),
          builder.getNamedAttr("part", builder.getStringAttr(partName)),
          builder.getNamedAttr("weight", param.getNameAttr()),
          builder.getNamedAttr("shape", builder.getDenseI64ArrayAttr(shape)),
      };
      if (DictionaryAttr base = param.getInitAttr()) init.push_back(builder.getNamedAttr("base", base));
      auto op = builder.create<ParamOp>(param.getLoc(), partType, builder.getStringAttr(name),
                                        builder.getDictionaryAttr(init), builder.getBoolAttr(false));
      op->setAttr(kFrozenBaseAttr, builder.getUnitAttr());
      if (Attribute role = param->getAttr(kRoleAttr)) op->setAttr(kRoleAttr, role);
      return op;
    };
    ParamOp codes = part(param.getName(), RankedTensorType::get(codesShape, codesElement), "codes");
    ParamOp scales =
        part(scalesName, RankedTensorType::get(scalesShape, builder.getF32Type()), nf4 ? "absmax" : "scale");
    auto decode = [&](Operation* at, RankedTensorType resultType) -> Value {
      builder.setInsertionPoint(at);
      return builder.create<DequantizeOp>(at->getLoc(), resultType, codes.getResult(), scales.getResult(),
                                          builder.getStringAttr(dtype));
    };
    for (OpOperand& use : llvm::make_early_inc_range(param.getResult().getUses())) {
      Operation* reader = use.getOwner();
      if (auto cast = dyn_cast<CastOp>(reader); cast && isa<FloatType>(cast.getType().getElementType())) {
        cast.getResult().replaceAllUsesWith(decode(cast, cast.getType()));
        cast.erase();
        continue;
      }
      use.set(decode(reader, type));
    }
    param.erase();
    return;
  }
};

}  // namespace
