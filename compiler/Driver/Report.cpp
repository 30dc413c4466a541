// dgemma-compile --report (Report.h).
#include "compiler/Driver/Report.h"

#include <algorithm>
#include <cstdio>

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgMesh.h"
#include "dialects/dg/IR/DgOps.h"
#include "dialects/dg/IR/DgRecompute.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringSet.h"
#include "models/diffusion_gemma/spec/Interface.h"
#include "plan/HostArena.h"
#include "plan/Names.h"

namespace {

using namespace mlir;

std::string entryName(func::FuncOp function) {
  auto name = function->getAttrOfType<StringAttr>(dg::kEntryAttr);
  return name ? name.getValue().str() : std::string();
}

int64_t bucketSize(func::FuncOp function, StringRef dimension) {
  auto bucket = function->getAttrOfType<DictionaryAttr>(dg::kBucketAttr);
  auto size = bucket ? dyn_cast_or_null<IntegerAttr>(bucket.get(dimension)) : IntegerAttr();
  return size ? size.getInt() : 0;
}

// The entry points one optimizer step of one micro-batch runs: every entry except the train_step,
// logps (a GRPO plan's) and forward buckets but the largest (by prompt length).
SmallVector<func::FuncOp> stepEntries(ModuleOp module) {
  SmallVector<func::FuncOp> entries;
  std::map<std::string, func::FuncOp> largestBucket;
  for (auto function : module.getOps<func::FuncOp>()) {
    std::string name = entryName(function);
    if (name.empty()) continue;
    namespace names = ::dgemma::diffusion_gemma;
    if (name != names::kTrainStepEntry && name != names::kLogpsEntry && name != names::kForwardEntry) {
      entries.push_back(function);
      continue;
    }
    auto [slot, inserted] = largestBucket.try_emplace(name, function);
    if (!inserted && bucketSize(function, "prompt_len") > bucketSize(slot->second, "prompt_len")) slot->second = function;
  }
  for (auto& [name, function] : largestBucket) entries.push_back(function);
  return entries;
}

uint64_t bytesOf(RankedTensorType type) {
  return static_cast<uint64_t>(type.getNumElements()) * ((type.getElementTypeBitWidth() + 7) / 8);
}

dg::ShardingAttr resultSharding(Value value) {
  Operation* producer = value.getDefiningOp();
  auto shardings = producer ? producer->getAttrOfType<ArrayAttr>(dg::kShardingsAttr) : ArrayAttr();
  if (!shardings) return {};
  return dyn_cast<dg::ShardingAttr>(shardings[cast<OpResult>(value).getResultNumber()]);
}

// How many ways `value`'s dim `dim` is split in the annotated module (1 when not annotated).
int64_t splitOf(const dg::Mesh& mesh, Value value, int64_t dim) {
  dg::ShardingAttr sharding = resultSharding(value);
  return sharding ? mesh.splitOf(sharding, dim) : 1;
}

// The ring factor of a collective over g ranks: each rank receives (g - 1) / g of the buffer.
double ringShare(int64_t groupSize) { return groupSize > 1 ? double(groupSize - 1) / double(groupSize) : 0.0; }

// Bytes with a binary unit that keeps three significant digits or more: "11.7 GiB", "412 KiB".
std::string human(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

}  // namespace

void printEntryReport(ModuleOp program, const dgemma::Plan& plan) {
  std::printf("%-44s %14s %14s %8s\n", "entry point (rank 0)", "flops", "scratch_bytes", "steps");
  for (auto function : program.getOps<func::FuncOp>()) {
    if (!function->hasAttr(dg::kEntryAttr)) continue;
    dgemma::EntryPoint entry;  // only for its key
    entry.name = entryName(function);
    if (auto bucket = function->getAttrOfType<DictionaryAttr>(dg::kBucketAttr))
      for (NamedAttribute dimension : bucket)
        entry.bucket[dimension.getName().str()] = cast<IntegerAttr>(dimension.getValue()).getInt();
    int64_t flops = 0, recomputeFlops = 0;
    function.walk([&](dg::CostOpInterface op) {
      flops += op.getFlops();
      if (op->hasAttr(dg::kRecomputedAttr)) recomputeFlops += op.getFlops();
    });
    int64_t scratch = function->getAttrOfType<IntegerAttr>(dg::kScratchBytesAttr).getInt();
    // The plan steps the runtime launches: what dg-fuse-elementwise reduces.
    size_t steps = 0;
    for (const dgemma::EntryPoint& lowered : plan.entryPoints)
      if (lowered.key() == entry.key()) steps = lowered.steps.size();
    std::printf("%-44s %14lld %14lld %8zu\n", entry.key().c_str(), static_cast<long long>(flops),
                static_cast<long long>(scratch), steps);
    if (recomputeFlops != 0)  // dg-recompute's clones, part of the flops above
      std::printf("  of which recomputed: %lld (%.1f%% more than without recomputation)\n",
                  static_cast<long long>(recomputeFlops), 100.0 * double(recomputeFlops) / double(flops - recomputeFlops));
  }
}

RankReport rankReport(ModuleOp program, const dgemma::Plan& plan, const std::map<std::string, dg::EntryMemoryPlan>& memory) {
  RankReport report;
  report.rank = plan.rank;
  for (const dgemma::Parameter& parameter : plan.parameters) {
    uint64_t bytes = plan.buffers[parameter.buffer].bytes();
    if (dgemma::isHostArena(plan.arenas[plan.buffers[parameter.buffer].arena])) report.hostMomentBytes += bytes;
    else if (parameter.name.rfind(dgemma::kGradientPrefix, 0) == 0) report.gradientBytes += bytes;
    else if (parameter.name.rfind(dgemma::kOptimizerStatePrefix, 0) == 0) report.optimizerBytes += bytes;
    else if (parameter.name.rfind(dgemma::kCachePrefix, 0) == 0) report.cacheBytes += bytes;
    else if (parameter.name.rfind(dgemma::kGenerationStatePrefix, 0) == 0) report.generationStateBytes += bytes;
    else {
      report.parameterBytes += bytes;
      int64_t elements = 1;
      for (int64_t size : parameter.globalShape) elements *= size;
      // A quantized frozen weight (docs/plan-format.md, "Header") counts its logical elements once, on
      // its codes; its bytes are the packed ones.
      if (parameter.init.is_object() && parameter.init.value("kind", "") == "quantized") {
        elements = 0;
        if (parameter.init.value("part", "") == "codes" && parameter.init.contains("shape")) {
          elements = 1;
          for (const nlohmann::json& size : parameter.init["shape"]) elements *= size.get<int64_t>();
        }
      }
      (parameter.trainable ? report.trainableElements : report.frozenElements) += elements;
      (parameter.trainable ? report.trainableBytes : report.frozenBytes) += bytes;
    }
  }
  for (const dgemma::Constant& constant : plan.constants) report.constantBytes += plan.buffers[constant.buffer].bytes();
  // The arenas are the truth the runtime allocates: alignment padding of the persistent pools goes
  // to their pool (parameters for the model's).
  uint64_t persistentArenas = 0;
  for (const dgemma::Arena& arena : plan.arenas) {
    if (dgemma::isHostArena(arena)) report.hostBytes += arena.bytes;
    else if (arena.persistent) persistentArenas += arena.bytes;
    else if (arena.name == "communication") report.commBufferBytes += arena.bytes;
    else report.activationBytes += arena.bytes;
  }
  if (persistentArenas > report.staticBytes()) report.parameterBytes += persistentArenas - report.staticBytes();

  // The host offload's traffic, once per step: optimizer_step's copies that cross between the host
  // arena and a device arena, and what its host updates (steps writing the host arena) read and write.
  auto inHost = [&](int64_t buffer) { return dgemma::isHostArena(plan.arenas[plan.buffers[buffer].arena]); };
  for (const dgemma::EntryPoint& entry : plan.entryPoints) {
    if (entry.name != "optimizer_step") continue;
    for (const dgemma::Step& step : entry.steps) {
      if (step.op == "copy") {
        if (inHost(step.inputs[0]) != inHost(step.outputs[0]))
          report.pcieBytesPerStep += plan.buffers[step.inputs[0]].bytes();
      } else if (!step.outputs.empty() && inHost(step.outputs[0])) {
        for (int64_t id : step.inputs) report.hostUpdateBytes += plan.buffers[id].bytes();
        for (int64_t id : step.outputs) report.hostUpdateBytes += plan.buffers[id].bytes();
      }
    }
  }

  int64_t largestActivations = -1, largestCommBuffers = -1;
  for (auto function : program.getOps<func::FuncOp>()) {
    if (!function->hasAttr(dg::kEntryAttr)) continue;
    auto planned = memory.find(function.getSymName().str());
    if (planned == memory.end()) continue;
    const dg::EntryMemoryPlan& pools = planned->second;
    if (pools.activations.plannedBytes() > largestActivations) {
      largestActivations = pools.activations.plannedBytes();
      report.activationPacking = pools.activations;
      report.largestEntry = entryName(function);
    }
    if (pools.communication.plannedBytes() > largestCommBuffers) {
      largestCommBuffers = pools.communication.plannedBytes();
      report.commBufferPacking = pools.communication;
    }
  }
  for (func::FuncOp function : stepEntries(program)) {
    function.walk([&](dg::CommunicationOpInterface op) { report.communicationBytes += op.getCommunicationBytes(); });
    function.walk([&](dg::CostOpInterface op) {
      report.flopsPerStep += op.getFlops();
      // dg-recompute's clones: the forward work the backward does a second time.
      if (op->hasAttr(dg::kRecomputedAttr)) report.recomputeFlops = report.recomputeFlops.value_or(0) + op.getFlops();
    });
  }
  return report;
}

uint64_t stepFlops(ModuleOp program) {
  uint64_t flops = 0;
  for (func::FuncOp function : stepEntries(program))
    function.walk([&](dg::CostOpInterface op) { flops += static_cast<uint64_t>(op.getFlops()); });
  return flops;
}

AnalyticMinimum analyticMinimum(ModuleOp annotated, const dg::ShardingOptions& layout, int64_t hiddenSize) {
  AnalyticMinimum minimum;
  dg::Mesh mesh = dg::Mesh::of(annotated);
  const int64_t world = mesh.worldSize();

  // Each trainable parameter's gradient is reduce-scattered and the update all-gathered over the
  // ranks that hold the same block of it.
  llvm::StringSet<> counted;
  annotated.walk([&](dg::ParamOp param) {
    StringRef name = param.getName();
    if (!param.getTrainable() || name.starts_with(dgemma::kGradientPrefix) ||
        name.starts_with(dgemma::kOptimizerStatePrefix) || !counted.insert(name).second)
      return;
    auto type = cast<RankedTensorType>(param.getType());
    int64_t blocks = 1;
    for (int64_t dim = 0; dim < type.getRank(); ++dim) blocks *= splitOf(mesh, param.getResult(), dim);
    uint64_t localBytes = bytesOf(type) / blocks;
    minimum.parameterBytes += static_cast<uint64_t>(2.0 * ringShare(world / blocks) * double(localBytes));
  });

  for (func::FuncOp function : stepEntries(annotated)) {
    // Dispatch and combine move every routed (token, slot) row of this rank once each way, in the
    // forward and again in the backward; (EP - 1) / EP of them leave the rank.
    function.walk([&](Operation* op) {
      if (!isa<dg::MoeExpertsOp, dg::MoeExpertsBackwardOp>(op)) return;
      Value input = op->getOperand(0), weights = op->getOperand(1);
      auto inputType = cast<RankedTensorType>(input.getType());
      int64_t localTokens = inputType.getDimSize(0) / splitOf(mesh, input, 0);
      int64_t slots = cast<RankedTensorType>(weights.getType()).getDimSize(1);
      uint64_t rowBytes = bytesOf(inputType) / inputType.getDimSize(0);
      minimum.expertDispatchBytes += static_cast<uint64_t>(2.0 * ringShare(layout.expertParallel) *
                                                           double(localTokens * slots) * double(rowBytes));
    });
    // Megatron's tensor parallelism exchanges the [tokens, hidden] activations twice per layer and
    // direction (after the attention and the MLP; their input-gradient twins in the backward), each
    // an all-reduce or, with sequence parallelism, an all-gather plus a reduce-scatter: the same bytes.
    if (layout.tensorParallel > 1)
      function.walk([&](Operation* op) {
        if (!isa<dg::AttentionOp, dg::AttentionBackwardOp>(op)) return;
        Value query = op->getOperand(0);
        auto queryType = cast<RankedTensorType>(query.getType());
        int64_t tokens = queryType.getDimSize(0) / splitOf(mesh, query, 0) * queryType.getDimSize(1);
        uint64_t elementBytes = (queryType.getElementTypeBitWidth() + 7) / 8;
        minimum.tensorParallelBytes += static_cast<uint64_t>(2.0 * 2.0 * ringShare(layout.tensorParallel) *
                                                             double(tokens * hiddenSize) * double(elementBytes));
      });
  }
  return minimum;
}

void printRankReport(const std::vector<RankReport>& ranks, const AnalyticMinimum& minimum,
                     const dgemma::Accelerator& accelerator) {
  std::printf("\n%-5s %10s | %10s %10s %10s %10s %10s %11s %10s %9s | %11s %10s\n", "rank", "peak", "parameters",
              "gradients", "optimizer", "run state", "constants", "activations", "comm bufs", "workspace", "flops/step",
              "comm/step");
  for (const RankReport& rank : ranks) {
    char flops[32];
    std::snprintf(flops, sizeof flops, "%.3g", double(rank.flopsPerStep));
    std::printf("%-5lld %10s | %10s %10s %10s %10s %10s %11s %10s %9s | %11s %10s\n", static_cast<long long>(rank.rank),
                human(rank.peakBytes()).c_str(), human(rank.parameterBytes).c_str(), human(rank.gradientBytes).c_str(),
                human(rank.optimizerBytes).c_str(), human(rank.cacheBytes + rank.generationStateBytes).c_str(),
                human(rank.constantBytes).c_str(), human(rank.activationBytes).c_str(), human(rank.commBufferBytes).c_str(),
                human(rank.workspaceBytes).c_str(), flops, human(rank.communicationBytes).c_str());
  }
  // The planner's two packings of the largest entry, and how close the winner is to the bytes live at once.
  for (const RankReport& rank : ranks) {
    const dg::PoolPacking& a = rank.activationPacking;
    const dg::PoolPacking& c = rank.commBufferPacking;
    std::printf("rank %lld activations (%s): largest-first %s, best-fit %s, max live %s, fragmentation %.3f; "
                "comm buffers: largest-first %s, best-fit %s, max live %s, fragmentation %.3f\n",
                static_cast<long long>(rank.rank), rank.largestEntry.c_str(), human(a.largestFirstBytes).c_str(),
                human(a.bestFitBytes).c_str(), human(a.maxLiveBytes).c_str(), a.fragmentation(),
                human(c.largestFirstBytes).c_str(), human(c.bestFitBytes).c_str(), human(c.maxLiveBytes).c_str(),
                c.fragmentation());
  }
  for (const RankReport& rank : ranks) {
    if (!rank.recomputeFlops) {
      std::printf("rank %lld recompute overhead: none (nothing recomputed)\n", static_cast<long long>(rank.rank));
      continue;
    }
    double share = rank.flopsPerStep > 0 ? 100.0 * double(*rank.recomputeFlops) / double(rank.flopsPerStep) : 0.0;
    std::printf("rank %lld recompute overhead: %.3g flops per step (%.1f%% of the step)\n", static_cast<long long>(rank.rank),
                double(*rank.recomputeFlops), share);
  }
  for (const RankReport& rank : ranks)
    std::printf("rank %lld parameters: %lld trainable (%s here), %lld frozen (%s here); optimizer state %s\n",
                static_cast<long long>(rank.rank), static_cast<long long>(rank.trainableElements),
                human(rank.trainableBytes).c_str(), static_cast<long long>(rank.frozenElements),
                human(rank.frozenBytes).c_str(), human(rank.optimizerBytes).c_str());
  // --optimizer-offload: the host's share, and what it costs a step if nothing overlaps it.
  for (const RankReport& rank : ranks) {
    if (rank.hostBytes == 0) continue;
    const dgemma::HostOffloadSeconds seconds =
        dgemma::predictHostOffload(accelerator, rank.pcieBytesPerStep, rank.hostUpdateBytes);
    std::printf(
        "rank %lld host: %s (AdamW moments %s, update staging %s); PCIe %s per step (%.3g s on %s), host "
        "update %s read and written (%.3g s)\n",
        static_cast<long long>(rank.rank), human(rank.hostBytes).c_str(), human(rank.hostMomentBytes).c_str(),
        human(rank.hostBytes - rank.hostMomentBytes).c_str(), human(rank.pcieBytesPerStep).c_str(), seconds.transfer,
        accelerator.name.c_str(), human(rank.hostUpdateBytes).c_str(), seconds.update);
  }
  // Inference plans: the run state's two parts, on their own line.
  for (const RankReport& rank : ranks)
    if (rank.cacheBytes + rank.generationStateBytes > 0)
      std::printf("rank %lld run state: K/V cache %s, self-conditioning logits %s\n",
                  static_cast<long long>(rank.rank), human(rank.cacheBytes).c_str(), human(rank.generationStateBytes).c_str());
  std::printf("analytic minimum per rank and step: %s (parameters %s, expert dispatch %s, tensor-parallel "
              "activations %s)\n",
              human(minimum.total()).c_str(), human(minimum.parameterBytes).c_str(), human(minimum.expertDispatchBytes).c_str(),
              human(minimum.tensorParallelBytes).c_str());
}

void printPassTimes(const dg::PassTimes& times) {
  double total = 0;
  for (const auto& [name, seconds] : times.seconds) total += seconds;
  std::printf("\n%-32s %10s %6s %7s\n", "compiler pass (all ranks)", "cpu s", "runs", "share");
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, seconds] : times.seconds) order.push_back({seconds, name});
  std::sort(order.rbegin(), order.rend());
  for (const auto& [seconds, name] : order)
    std::printf("%-32s %10.3f %6lld %6.1f%%\n", name.c_str(), seconds, static_cast<long long>(times.runs.at(name)),
                total > 0 ? 100.0 * seconds / total : 0.0);
  std::printf("%-32s %10.3f\n", "total", total);
}
