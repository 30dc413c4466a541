// dg-lora: freezes the model's weights and adds trainable low-rank adapters beside the targeted
// ones (docs/training.md, "LoRA adapters"). The adapter of a linear weight is two more matmuls on
// the same input, and the routed experts' adapters are operands of dg.moe_experts, whose kernels
// add each expert's low-rank products; W + ΔW is never formed and the frozen W can stay in any
// storage format.
#include <cmath>
#include <map>
#include <set>

#include "compiler/Transforms/LoraTargets.h"
#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgMesh.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGLORA
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

// The weight-name suffix of each single target, and the groups as lists of singles.
const std::map<std::string, std::string>& linearTargetSuffixes() {
  static const std::map<std::string, std::string> suffixes = {
      {"q_proj", ".self_attn.q_proj.weight"}, {"k_proj", ".self_attn.k_proj.weight"},
      {"v_proj", ".self_attn.v_proj.weight"}, {"o_proj", ".self_attn.o_proj.weight"},
      {"gate_proj", ".mlp.gate_proj.weight"}, {"up_proj", ".mlp.up_proj.weight"},
      {"down_proj", ".mlp.down_proj.weight"}, {"router.proj", ".router.proj.weight"},
  };
  return suffixes;
}

const std::map<std::string, std::vector<std::string>>& targetGroups() {
  static const std::map<std::string, std::vector<std::string>> groups = {
      {"attention", {"q_proj", "k_proj", "v_proj", "o_proj"}},
      {"mlp", {"gate_proj", "up_proj", "down_proj"}},
      {"experts", {"experts.gate_up_proj", "experts.down_proj"}},
      {"router", {"router.proj"}},
  };
  return groups;
}

bool isExpertTarget(const std::string& single) { return single.rfind("experts.", 0) == 0; }

// The value a matmul's weight operand reads, seen through the precision casts between it and its
// parameter (the f32 master cast to the activation dtype; an fp32 island's widening back).
ParamOp weightParam(Value operand) {
  while (auto cast = operand.getDefiningOp<CastOp>()) operand = cast.getInput();
  return operand.getDefiningOp<ParamOp>();
}

Type elementOf(Value value) { return cast<RankedTensorType>(value.getType()).getElementType(); }
ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

class Adapters {
 public:
  Adapters(MLIRContext* context, int64_t rank, double alpha, double dropout)
      : rank_(rank), scale_(alpha / static_cast<double>(rank)), dropout_(dropout), builder_(context) {}

  // The single target whose suffix `name` ends with, if it is one of `singles`.
  std::optional<std::string> targetOf(StringRef name, const std::set<std::string>& singles) const {
    for (const auto& [single, suffix] : linearTargetSuffixes())
      if (singles.count(single) && name.ends_with(suffix)) return single;
    return std::nullopt;
  }

  // y = x W^T becomes y + ((x' A^T) B^T) * s, x' = x (or its dropout) in x's dtype.
  void adapt(MatmulOp matmul, ParamOp weight, Value dropoutKeys) {
    Location loc = matmul.getLoc();
    Value x = matmul.getLhs();
    Type element = elementOf(x);
    const int64_t out = weight.getType().getShape()[0], in = weight.getType().getShape()[1];
    const std::string prefix = weight.getName().drop_back(std::string(".weight").size()).str();
    const std::string role = cast<StringAttr>(weight->getAttr(kRoleAttr)).getValue().str();
    // A reads the weight's input dimension, B writes its output: each splits where the weight does.
    builder_.setInsertionPoint(matmul);
    ParamOp a =
        parameter(prefix + ".lora_A.weight", {rank_, in}, uniformInit(in), role == "row" ? "row" : "replicated");
    ParamOp b =
        parameter(prefix + ".lora_B.weight", {out, rank_}, zerosInit(), role == "column" ? "column" : "replicated");
    // B's rows are the weight's: heads that tensor parallelism replicates stay whole with them.
    if (auto heads = weight->getAttr(kHeadsAttr)) b->setAttr(kHeadsAttr, heads);
    Value aUse = inDtype(a, element, loc), bUse = inDtype(b, element, loc);
    builder_.setInsertionPointAfter(matmul);
    if (dropoutKeys && dropout_ > 0) x = dropped(x, dropoutKeys, loc);
    Value down = builder_.create<MatmulOp>(loc, x, aUse, builder_.getBoolAttr(false), builder_.getBoolAttr(true));
    Value up = builder_.create<MatmulOp>(loc, down, bUse, builder_.getBoolAttr(false), builder_.getBoolAttr(true));
    Value scaled = builder_.create<MulOp>(
        loc, up, builder_.create<FillOp>(loc, RankedTensorType::get({}, element), builder_.getF64FloatAttr(scale_)));
    auto sum = builder_.create<AddOp>(loc, matmul.getResult(), scaled);
    matmul.getResult().replaceAllUsesExcept(sum.getResult(), sum);
  }

  // The routed experts' adapters (per expert, inside dg.moe_experts' grouped products): for a
  // targeted `P` = ...experts.gate_up_proj [E, 2I, H], `P.lora_A` [E, r, H] and `P.lora_B` [E, 2I, r];
  // for ...experts.down_proj [E, H, I], [E, r, I] and [E, H, r]. Inits as PEFT's parameter targets
  // (one nn.Linear per factor over all the experts): A uniform over ±1/√fan_in, B zeros.
  void adaptExperts(MoeExpertsOp experts, ParamOp gateUp, ParamOp down) {
    Location loc = experts.getLoc();
    Type element = elementOf(experts.getInput());
    auto shape = cast<RankedTensorType>(experts.getGateUp().getType()).getShape();
    const int64_t count = shape[0], width = shape[1], hidden = shape[2], inner = width / 2;
    builder_.setInsertionPoint(experts);
    auto pair = [&](ParamOp weight, int64_t fanIn, int64_t fanOut) -> std::pair<Value, Value> {
      const std::string prefix = weight.getName().str();
      ParamOp a = parameter(prefix + ".lora_A", {count, rank_, fanIn}, uniformInit(fanIn), kRoleExperts);
      ParamOp b = parameter(prefix + ".lora_B", {count, fanOut, rank_}, zerosInit(), kRoleExperts);
      return {inDtype(a, element, loc), inDtype(b, element, loc)};
    };
    if (gateUp) {
      auto [a, b] = pair(gateUp, hidden, width);
      experts.getLoraGateUpAMutable().assign(a);
      experts.getLoraGateUpBMutable().assign(b);
    }
    if (down) {
      auto [a, b] = pair(down, inner, hidden);
      experts.getLoraDownAMutable().assign(a);
      experts.getLoraDownBMutable().assign(b);
    }
    experts.setLoraScaleAttr(builder_.getF64FloatAttr(scale_));
  }

 private:
  DictionaryAttr uniformInit(int64_t fanIn) {
    return builder_.getDictionaryAttr(
        {builder_.getNamedAttr("kind", builder_.getStringAttr("uniform")),
         builder_.getNamedAttr("bound", builder_.getF64FloatAttr(1.0 / std::sqrt(double(fanIn))))});
  }
  DictionaryAttr zerosInit() {
    return builder_.getDictionaryAttr({builder_.getNamedAttr("kind", builder_.getStringAttr("zeros"))});
  }

  // A trainable f32 adapter parameter, created just before its first reader in each entry point.
  ParamOp parameter(const std::string& name, ArrayRef<int64_t> shape, DictionaryAttr init, StringRef role) {
    auto param = builder_.create<ParamOp>(NameLoc::get(builder_.getStringAttr(name)),
                                          RankedTensorType::get(shape, builder_.getF32Type()),
                                          builder_.getStringAttr(name), init, builder_.getBoolAttr(true));
    param->setAttr(kRoleAttr, builder_.getStringAttr(role));
    return param;
  }

  Value inDtype(ParamOp param, Type element, Location loc) {
    if (param.getType().getElementType() == element) return param;
    return builder_.create<CastOp>(loc, RankedTensorType::get(param.getType().getShape(), element), param);
  }

  // x * (u >= p) / (1 - p), u uniform per element from the example's key: one stream per site.
  Value dropped(Value x, Value keys, Location loc) {
    auto uniformType = RankedTensorType::get(shapeOf(x), builder_.getF32Type());
    Value u = builder_.create<RandomUniformOp>(loc, uniformType, keys,
                                               builder_.getI64IntegerAttr(kFirstDropoutStream + site_++));
    auto scalar = [&](double value, Type element) {
      return builder_.create<FillOp>(loc, RankedTensorType::get({}, element), builder_.getF64FloatAttr(value));
    };
    auto boolType = RankedTensorType::get(shapeOf(x), builder_.getI1Type());
    Value keep = builder_.create<CompareOp>(loc, boolType, u, scalar(dropout_, builder_.getF32Type()),
                                            ComparePredicateAttr::get(builder_.getContext(), ComparePredicate::Ge));
    Type element = elementOf(x);
    Value mask = builder_.create<SelectOp>(loc, keep, scalar(1.0 / (1.0 - dropout_), element), scalar(0.0, element));
    return builder_.create<MulOp>(loc, x, mask);
  }

  // Streams 0-15 belong to the objective's draws (docs/kernels.md, "Random numbers").
  static constexpr int64_t kFirstDropoutStream = 16;
  int64_t rank_;
  double scale_;
  double dropout_;
  OpBuilder builder_;
  int64_t site_ = 0;
};

struct DgLoraPass : mlir::dg::impl::DgLoraBase<DgLoraPass> {
  using DgLoraBase::DgLoraBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (rank < 1) return fail(module, "rank must be >= 1, got " + std::to_string(rank));
    if (!(alpha > 0)) return fail(module, "alpha must be > 0");
    if (!(dropout >= 0 && dropout < 1)) return fail(module, "dropout must be in [0, 1)");
    std::string error;
    const std::vector<std::string> expanded = expandLoraTargets(targets, error);
    if (!error.empty()) return fail(module, error);
    const std::set<std::string> singles(expanded.begin(), expanded.end());
    if (singles.empty()) return fail(module, "no targets");
    for (const std::string& single : singles)
      if (isExpertTarget(single) && dropout > 0)
        return fail(module, "target '" + single +
                                "': the routed experts' adapters take no dropout (PEFT rejects lora_dropout on "
                                "parameter targets); use dropout 0 or leave the experts out");

    // The dropout masks are drawn per example from the key the objective's corruption draws from
    // (another entry's input); a train step that does not read it yet gets it as an input of its own.
    RankedTensorType keysType;
    if (dropout > 0) {
      module.walk([&](InputOp input) {
        if (input.getName() == dropoutKeys) keysType = input.getType();
      });
      if (!keysType)
        return fail(module, "no entry has an input '" + dropoutKeys + "' whose shape the dropout keys take");
    }

    Adapters adapters(module.getContext(), rank, alpha, dropout);
    std::set<std::string> matched;
    for (auto function : module.getOps<func::FuncOp>()) {
      if (!function->hasAttr(kEntryAttr)) continue;
      Value keys;
      const bool withDropout =
          dropout > 0 &&
          llvm::is_contained(dropoutEntries, cast<StringAttr>(function->getAttr(kEntryAttr)).getValue().str());
      if (withDropout) {
        function.walk([&](InputOp input) {
          if (input.getName() == dropoutKeys) keys = input.getResult();
        });
        if (!keys) {
          OpBuilder builder = OpBuilder::atBlockBegin(&function.getBody().front());
          keys = builder.create<InputOp>(function.getLoc(), keysType, builder.getStringAttr(dropoutKeys));
        }
      }
      SmallVector<std::pair<MatmulOp, ParamOp>> sites;
      function.walk([&](MatmulOp matmul) {
        ParamOp weight = weightParam(matmul.getRhs());
        if (!weight || !weight.getTrainable() || matmul.getTransposeA() || !matmul.getTransposeB()) return;
        if (std::optional<std::string> single = adapters.targetOf(weight.getName(), singles)) {
          sites.push_back({matmul, weight});
          matched.insert(*single);
        }
      });
      for (auto [matmul, weight] : sites) adapters.adapt(matmul, weight, keys);
      function.walk([&](MoeExpertsOp experts) {
        auto targeted = [&](Value operand, StringRef single) -> ParamOp {
          ParamOp weight = weightParam(operand);
          if (!weight || !weight.getTrainable() || !singles.count(single.str()) ||
              !weight.getName().ends_with(("." + single).str()))
            return {};
          matched.insert(single.str());
          return weight;
        };
        ParamOp gateUp = targeted(experts.getGateUp(), "experts.gate_up_proj");
        ParamOp down = targeted(experts.getDown(), "experts.down_proj");
        if (gateUp || down) adapters.adaptExperts(experts, gateUp, down);
      });
    }
    for (const std::string& single : singles)
      if (!matched.count(single)) return fail(module, "target '" + single + "' matches no weight of the model");

    // Everything trainable before the pass is the base: frozen from here on.
    module.walk([&](ParamOp param) {
      if (!param.getTrainable() || isAdapter(param.getName())) return;
      param.setTrainable(false);
      param->setAttr(kFrozenBaseAttr, UnitAttr::get(module.getContext()));
    });
  }

  static bool isAdapter(StringRef name) { return name.contains(".lora_A") || name.contains(".lora_B"); }

  // At the module's location: an error on the module op itself would print the whole module.
  void fail(ModuleOp module, const std::string& message) {
    mlir::emitError(module.getLoc()) << "dg-lora: " << message;
    signalPassFailure();
  }
};

}  // namespace

std::vector<std::string> mlir::dg::expandLoraTargets(llvm::ArrayRef<std::string> targets, std::string& error) {
  std::set<std::string> singles;
  for (const std::string& target : targets) {
    auto group = targetGroups().find(target);
    if (group != targetGroups().end()) {
      singles.insert(group->second.begin(), group->second.end());
    } else if (linearTargetSuffixes().count(target) || target == "experts.gate_up_proj" ||
               target == "experts.down_proj") {
      singles.insert(target);
    } else {
      error = "unknown target '" + target +
              "' (expected attention, mlp, experts, router or a projection name: q_proj, k_proj, v_proj, o_proj, "
              "gate_proj, up_proj, down_proj, router.proj, experts.gate_up_proj, experts.down_proj)";
      return {};
    }
  }
  return {singles.begin(), singles.end()};
}
