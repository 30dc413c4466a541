// dgemma-compile --auto-layout (AutoLayout.h).
#include "compiler/Driver/AutoLayout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dialects/dg/IR/DgMesh.h"
#include "support/CheckedSize.h"
#include "support/Error.h"
#include "support/Json.h"
#include "compiler/Driver/Report.h"

namespace dgemma {

namespace {

std::vector<int64_t> divisorsOf(int64_t value) {
  std::vector<int64_t> divisors;
  for (int64_t divisor = 1; divisor <= value; ++divisor)
    if (value % divisor == 0) divisors.push_back(divisor);
  return divisors;
}

std::string layoutName(const ParallelLayout& layout) {
  return "tp" + std::to_string(layout.tensorParallel) + " dp" + std::to_string(layout.dataParallel) + " ep" +
         std::to_string(layout.expertParallel) + (layout.sequenceParallel ? " sp" : "");
}

std::string layoutFlags(const Candidate& candidate) {
  const ParallelLayout& layout = candidate.layout;
  return "--tp " + std::to_string(layout.tensorParallel) + " --dp " + std::to_string(layout.dataParallel) + " --ep " +
         std::to_string(layout.expertParallel) + (layout.sequenceParallel ? " --sp" : "") + " --recompute " +
         recomputeName(candidate.recompute);
}

std::string formatted(const char* format, double value) {
  char text[48];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

}  // namespace

LayoutSearch searchLayouts(const DiffusionGemmaConfig& config, const LayoutSearchRequest& request,
                           const std::function<std::string(RecomputePolicy)>& unbuiltReason) {
  LayoutSearch search;
  for (int64_t tp : divisorsOf(request.gpus))
    for (int64_t ep : divisorsOf(request.gpus / tp))
      for (bool sequenceParallel : {false, true}) {
        const ParallelLayout layout{tp, request.gpus / tp, ep, sequenceParallel};
        try {
          checkParallelLayout(config, layout, request.promptLengths, request.shape.canvasLength);
          // The mesh's own rule, which dg-shard-annotate enforces (dialects/dg/IR/DgMesh.h).
          if (!mlir::dg::layoutGroups(tp, layout.dataParallel, ep))
            throw InputError("--tp " + std::to_string(tp) + " does not divide --ep " + std::to_string(ep) +
                             ": an expert group of several TP ranks needs whole TP groups (dialects/dg/IR/DgMesh.h)");
        } catch (const InputError& error) {
          // SP on one TP rank is the same layout as without it; listing it would only repeat the rule.
          if (!(sequenceParallel && tp == 1)) search.refused.push_back({layout, error.what()});
          continue;
        }
        for (RecomputePolicy policy : kRecomputePolicies) {
          RankedCandidate ranked;
          ranked.candidate = {layout, policy};
          ranked.prediction = predictCost(config, request.shape, ranked.candidate, *request.accelerator);
          ranked.fits = ranked.prediction.peakBytes() <= request.memoryBytesPerGpu;
          ranked.unbuilt = unbuiltReason(policy);
          search.ranked.push_back(std::move(ranked));
        }
      }
  std::stable_sort(search.ranked.begin(), search.ranked.end(), [](const RankedCandidate& a, const RankedCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.prediction.peakBytes() < b.prediction.peakBytes();
    return a.prediction.tokensPerSecond() > b.prediction.tokensPerSecond();
  });
  for (size_t index = 0; index < search.ranked.size(); ++index)
    if (search.ranked[index].fits && search.ranked[index].unbuilt.empty()) {
      search.chosen = index;
      break;
    }
  return search;
}

void printLayoutSearch(const LayoutSearch& search, const LayoutSearchRequest& request, std::ostream& out) {
  const TrainingShape& shape = request.shape;
  out << "layout search: " << request.gpus << " x " << request.accelerator->name << ", "
      << formatBytes(request.memoryBytesPerGpu) << " per rank; micro-batch " << shape.microBatch << " per data-parallel rank, "
      << "prompt " << shape.promptLength << " + canvas " << shape.canvasLength << " tokens, "
      << (shape.bf16 ? "bf16" : "fp32") << "\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-3s %-16s %-10s %11s %11s %11s %11s %11s %-4s %12s %10s %11s  %s\n", "#", "layout",
                "recompute", "parameters", "gradients", "optimizer", "activations", "peak", "fits", "comm/step",
                "step ms", "tokens/s", "note");
  out << line;
  for (size_t index = 0; index < search.ranked.size(); ++index) {
    const RankedCandidate& ranked = search.ranked[index];
    const CostPrediction& cost = ranked.prediction;
    const std::string note = search.chosen == index ? "chosen" : ranked.unbuilt.empty() ? "" : "not built yet";
    std::snprintf(line, sizeof line, "%-3zu %-16s %-10s %11s %11s %11s %11s %11s %-4s %12s %10s %11s  %s\n", index + 1,
                  layoutName(ranked.candidate.layout).c_str(), recomputeName(ranked.candidate.recompute).c_str(),
                  formatBytes(cost.parameterBytes).c_str(), formatBytes(cost.gradientBytes).c_str(),
                  formatBytes(cost.optimizerBytes).c_str(), formatBytes(cost.activationBytes).c_str(),
                  formatBytes(cost.peakBytes()).c_str(), ranked.fits ? "yes" : "no",
                  formatBytes(uint64_t(cost.communicationBytes)).c_str(), formatted("%.3f", cost.stepSeconds() * 1e3).c_str(),
                  formatted("%.0f", cost.tokensPerSecond()).c_str(), note.c_str());
    out << line;
  }
  for (const RefusedLayout& refused : search.refused) out << "refused " << layoutName(refused.layout) << ": " << refused.reason << "\n";
  for (RecomputePolicy policy : kRecomputePolicies)
    for (const RankedCandidate& ranked : search.ranked)
      if (ranked.candidate.recompute == policy && !ranked.unbuilt.empty()) {
        out << "not built yet: --recompute " << recomputeName(policy) << " (" << ranked.unbuilt << ")\n";
        break;
      }
  if (search.chosen) {
    const RankedCandidate& chosen = search.ranked[*search.chosen];
    out << "chosen: " << layoutFlags(chosen.candidate) << " (peak " << formatBytes(chosen.prediction.peakBytes()) << " of "
        << formatBytes(request.memoryBytesPerGpu) << ", " << formatted("%.3f", chosen.prediction.stepSeconds() * 1e3)
        << " ms per step, " << formatted("%.0f", chosen.prediction.tokensPerSecond()) << " tokens/s)\n";
  }
}

uint64_t parseByteSize(const std::string& text, const std::string& flag) {
  static const std::vector<std::pair<std::string, double>> units = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0},
      {"TB", 1e12},             {"GB", 1e9},           {"MB", 1e6},        {"KB", 1e3},   {"B", 1.0}};
  const std::string expected = flag + ": expected a size such as 141GiB, 80GB or 512MiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got " +
                               quoteForMessage(text, 40);
  std::string number = text;
  double scale = 1.0;
  for (const auto& [unit, bytes] : units)
    if (number.size() > unit.size() && number.compare(number.size() - unit.size(), unit.size(), unit) == 0) {
      number.resize(number.size() - unit.size());
      scale = bytes;
      break;
    }
  while (!number.empty() && number.back() == ' ') number.pop_back();
  char* stop = nullptr;
  const double value = number.empty() ? 0.0 : std::strtod(number.c_str(), &stop);
  const double bytes = value * scale;
  // Positive and at most 1 PiB: far above any accelerator, far below uint64's range.
  if (number.empty() || number.front() == ' ' || stop != number.c_str() + number.size() || !std::isfinite(bytes) || bytes < 1 ||
      bytes > 1125899906842624.0)
    throw InputError(expected);
  return uint64_t(bytes);
}

CompiledRankCost compiledRankCost(mlir::ModuleOp program, const Plan& plan) {
  const RankReport report = rankReport(program, plan, /*memory=*/{});  // the pools only, not the packings
  CompiledRankCost cost;
  cost.parameterBytes = report.parameterBytes;
  cost.gradientBytes = report.gradientBytes;
  cost.optimizerBytes = report.optimizerBytes;
  // The cost model's activations are all of the step's scratch: the planner's two scratch pools.
  cost.activationBytes = report.activationBytes + report.commBufferBytes;
  cost.communicationBytes = double(report.communicationBytes);
  cost.flops = double(stepFlops(program));
  return cost;
}

void printPredictionCheck(const CostPrediction& predicted, const CompiledRankCost& compiled, std::ostream& out) {
  out << "prediction check, rank 0 of the chosen plan (predicted, compiled, relative error):\n";
  auto row = [&](const char* name, double prediction, double actual, bool bytes) {
    const double error = actual != 0 ? (prediction - actual) / actual : (prediction == 0 ? 0.0 : 1.0);
    const std::string shownPrediction = bytes ? formatBytes(uint64_t(prediction)) : formatted("%.4g", prediction);
    const std::string shownActual = bytes ? formatBytes(uint64_t(actual)) : formatted("%.4g", actual);
    char line[160];
    std::snprintf(line, sizeof line, "  %-12s %14s %14s %+8.1f%%\n", name, shownPrediction.c_str(), shownActual.c_str(), 100 * error);
    out << line;
  };
  row("parameters", double(predicted.parameterBytes), double(compiled.parameterBytes), true);
  row("gradients", double(predicted.gradientBytes), double(compiled.gradientBytes), true);
  row("optimizer", double(predicted.optimizerBytes), double(compiled.optimizerBytes), true);
  row("activations", double(predicted.activationBytes), double(compiled.activationBytes), true);
  row("flops/step", predicted.flopsBound, compiled.flops, false);
  row("comm/step", predicted.communicationBytes, compiled.communicationBytes, true);
}

}  // namespace dgemma
