#include "compiler/Driver/Driver.h"

#include <ctime>
#include <iostream>
#include <set>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Driver/AutoLayout.h"
#include "compiler/Driver/ModelBuild.h"
#include "compiler/Driver/Report.h"
#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/SourceMgr.h"
#include "models/builtin/RmsNormMatmulSoftmax.h"
#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/Presets.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "plan/Names.h"
#include "plan/PlanFile.h"
#include "support/AtomicFile.h"
#include "support/CheckedSize.h"
#include "support/Error.h"
#include "support/PathClash.h"

namespace dgemma {

namespace {

// Every rank must run the same collectives in the same order, or they wait on each other forever.
// The passes that order ops (dg-backward-schedule, dg-memory-plan) decide per rank from its own
// program, so the compiled plans are compared before any is written.
void checkCollectiveOrder(const std::vector<Plan>& plans) {
  for (size_t rank = 1; rank < plans.size(); ++rank)
    for (size_t e = 0; e < plans[0].entryPoints.size(); ++e) {
      auto collectives = [&](const Plan& plan) {
        std::vector<std::string> sequence;
        for (const Step& step : plan.entryPoints[e].steps)
          if (step.kind == Step::Kind::Collective)
            sequence.push_back(step.op + " over " + step.axis + " at " + step.location);
        return sequence;
      };
      const std::vector<std::string> want = collectives(plans[0]), got = collectives(plans[rank]);
      if (got == want) continue;
      size_t at = 0;
      while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
      throw InputError("entry point " + plans[0].entryPoints[e].key() + ": rank " + std::to_string(rank) +
                       "'s collective " + std::to_string(at) + " is " + (at < got.size() ? got[at] : "missing") +
                       ", rank 0's is " + (at < want.size() ? want[at] : "missing") +
                       " (a compiler bug; --backward-order autodiff keeps autodiff's order)");
    }
}

// --auto-layout: ranks every legal layout and recompute policy of --gpus ranks by the cost model,
// prints the table, sets the chosen layout into `options` and returns its prediction; throws
// InputError when no candidate this build compiles fits.
CostPrediction searchLayout(CompileOptions& options) {
  if (options.mode != "train")
    throw InputError("--auto-layout: only --mode train plans are sharded (inference is single-rank)");
  if (options.model == mlir::dg::kRmsNormMatmulSoftmaxName)
    throw InputError(std::string("--auto-layout: ") + mlir::dg::kRmsNormMatmulSoftmaxName + " has no parallel mapping");
  if (!options.explicitLayoutFlags.empty())
    throw InputError("--auto-layout: " + options.explicitLayoutFlags.front() +
                     " is chosen by the layout search; drop it (or drop --auto-layout)");
  if (options.gpus == 0) throw InputError("--auto-layout: --gpus N is required (the number of ranks to lay out)");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(diffusionGemmaConfigPath(options).string());
  LayoutSearchRequest request;
  request.gpus = options.gpus;
  request.accelerator = &findAccelerator(options.gpu.empty() ? "h200" : options.gpu);
  request.memoryBytesPerGpu =
      options.gpuMemory.empty() ? request.accelerator->memoryBytes : parseByteSize(options.gpuMemory, "--gpu-memory");
  request.promptLengths = parsePromptLengths(options.promptLengths);
  request.shape.microBatch = options.microBatch;
  request.shape.promptLength = request.promptLengths.back();
  request.shape.canvasLength = config.canvasLength;
  request.shape.bf16 = options.precision == "bf16";
  request.shape.selfConditioning = options.selfCondProb > 0;
  request.shape.encoderLoss = encoderLossWeight(options) > 0;
  request.shape.routerAuxLoss = options.auxLossCoeff > 0;
  request.shape.distributedOptimizer = options.distributedOptimizer;
  // A policy is built when the compiler takes it as an explicit --recompute.
  auto unbuiltReason = [&](RecomputePolicy policy) -> std::string {
    CompileOptions trial = options;
    trial.recompute = recomputeName(policy);
    try {
      rejectUnbuiltFeatures(trial);
    } catch (const InputError& error) {
      return error.what();
    }
    return "";
  };
  const LayoutSearch search = searchLayouts(config, request, unbuiltReason);
  // With --emit, stdout carries the IR; the table goes to stderr.
  printLayoutSearch(search, request, options.emit.empty() ? std::cout : std::cerr);
  if (!search.chosen)
    throw InputError("--auto-layout: no layout of --gpus " + std::to_string(options.gpus) +
                     " that this build compiles fits --gpu-memory " + formatBytes(request.memoryBytesPerGpu) +
                     " (see the table above)");
  const RankedCandidate& chosen = search.ranked[*search.chosen];
  options.tp = chosen.candidate.layout.tensorParallel;
  options.dp = chosen.candidate.layout.dataParallel;
  options.ep = chosen.candidate.layout.expertParallel;
  options.sequenceParallel = chosen.candidate.layout.sequenceParallel;
  options.recompute = recomputeName(chosen.candidate.recompute);
  return chosen.prediction;
}

// --optimizer-offload: the trainable parameters of one rank's program whose optimizer state goes to
// the host: every one (all), or the routed experts' weights (experts; the state that ZeRO-1 cannot
// split when the expert-data-parallel group has one rank).
std::set<std::string> offloadedParameters(mlir::ModuleOp program, const std::string& mode) {
  std::set<std::string> names;
  if (mode == "none") return names;
  program.walk([&](mlir::dg::ParamOp param) {
    const std::string name = param.getName().str();
    if (!param.getTrainable() || name.rfind(kGradientPrefix, 0) == 0 || name.rfind(kOptimizerStatePrefix, 0) == 0)
      return;
    if (mode == "all" || tensorParallelRole(name) == "experts") names.insert(name);
  });
  if (names.empty())
    throw InputError("--optimizer-offload " + mode + ": the model has no trainable " +
                     (mode == "all" ? std::string("parameter") : std::string("expert weight")) + " to offload");
  return names;
}

// --emit: the stage's IR on stdout.
void printStage(mlir::ModuleOp module) {
  module.print(llvm::outs());
  llvm::outs() << "\n";
}

}  // namespace

void checkOutputAgainstModel(const CompileOptions& options) {
  if (options.model.rfind("builtin:", 0) != 0)
    checkOutputsAgainstInputs({{"-o", options.output}}, {{"--model", options.model}});
}

void compile(CompileOptions options) {
  if (options.mode != "train" && options.mode != "infer") throw InputError("--mode: expected train or infer");
  if (!options.autoLayout && (options.gpus != 0 || !options.gpuMemory.empty() || !options.gpu.empty()))
    throw InputError(std::string(options.gpus != 0            ? "--gpus"
                                 : !options.gpuMemory.empty() ? "--gpu-memory"
                                                              : "--gpu") +
                     ": only with --auto-layout");
  checkObjectiveFlags(options);
  if (options.autoLayout && isPretrainingObjective(options))
    throw InputError("--auto-layout: the cost model knows the SFT train step only; give the layout of --objective " +
                     options.objective + " with --tp/--dp/--ep/--sp");
  std::optional<CostPrediction> predicted;
  if (options.autoLayout) {
    predicted = searchLayout(options);
    if (options.emit.empty() && options.output.empty()) return;  // the table alone
  }
  rejectUnbuiltFeatures(options);
  if (options.emit.empty() && options.output.empty())
    throw InputError("-o: an output plan directory is required (or --emit)");
  // CLI11 checked the policy's form.
  const mlir::dg::RecomputePolicy recompute = *mlir::dg::parseRecomputePolicy(options.recompute);
  if (recompute.kind != mlir::dg::RecomputePolicy::Kind::None && options.mode != "train")
    throw InputError("--recompute " + options.recompute +
                     ": only --mode train has a backward that recomputes (use none)");

  mlir::MLIRContext context;
  // --report times each pass by the process's CPU and collects the planner's numbers as it plans
  // (Pipeline.h, PipelineOptions): the function passes run one at a time, as every stage runs them
  // (Pipeline.cpp, configureStage).
  if (options.report) context.disableMultithreading();
  // Diagnostics go to stderr as "loc: error: message"; a failed stage is bad input (exit 2).
  llvm::SourceMgr sourceManager;
  mlir::SourceMgrDiagnosticHandler diagnostics(sourceManager, &context, llvm::errs());
  nlohmann::json metadata = {{"model", options.model},
                             {"mode", options.mode},
                             {"backend", options.backend},
                             {"recompute", recompute.name()},
                             {"fusion", options.fusion}};
  if (options.optimizerOffload != "none") metadata["optimizer_offload"] = options.optimizerOffload;
  RuntimeFields fields;
  if (!options.preset.empty()) {
    // dgemma-run train takes its defaults (rate, schedule, steps, ...) from here.
    metadata["preset"] = options.preset;
    fields.runDefaults = RunDefaults{options.preset, findPreset(options.preset).train};
  }
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(context, options, fields, metadata);
  checkTensorSizes(*module);
  if (mlir::failed(mlir::verify(*module))) throw InputError("the built model IR does not verify (see above)");
  if (options.emit == "dg") {
    return printStage(*module);
  }

  mlir::dg::PassTimes passTimes;  // --report: the time of each pass, and of the lowering and validation
  auto timed = [&](const char* phase, auto work) {
    const std::clock_t start = std::clock();
    work();
    passTimes.seconds[phase] += double(std::clock() - start) / CLOCKS_PER_SEC;
    ++passTimes.runs[phase];
  };
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = options.mode == "train";
  pipeline.recompute = recompute;
  pipeline.scheduleBackward = options.backwardOrder == "scheduled";
  pipeline.fusion = options.fusion == "on";
  pipeline.baseDtype = options.baseDtype;
  std::map<std::string, mlir::dg::EntryMemoryPlan> rankMemory;  // --report: this rank's planner numbers per entry
  if (options.report) {
    pipeline.passTimes = &passTimes;
    pipeline.memoryPlanObserver = [&](mlir::func::FuncOp function, const mlir::dg::EntryMemoryPlan& memory) {
      rankMemory[function.getSymName().str()] = memory;
    };
  }
  pipeline.lora = loraOptions(options);
  if (options.baseDtype != "f32" && !pipeline.lora)
    throw InputError("--base-dtype " + options.baseDtype +
                     ": needs --lora (only the base weights that adapters freeze are stored in low precision)");
  if (pipeline.lora) {
    // Without --base-dtype the frozen weights keep their f32 masters (cast at each use under bf16).
    const std::string& baseDtype = options.baseDtype;
    fields.adapter = AdapterSettings{pipeline.lora->rank, pipeline.lora->alpha, pipeline.lora->dropout,
                                     pipeline.lora->targets, baseDtype};
    metadata["lora"] = options.lora;
  }
  if (pipeline.train) {
    pipeline.optimizer = options.adam;  // each setting's range is checked as its flag is parsed
    fields.optimizer = pipeline.optimizer;
  }
  if (mlir::failed(mlir::dg::runDifferentiationStage(*module, pipeline))) throw InputError("differentiation failed (see above)");
  if (options.emit == "autodiff") {
    return printStage(*module);
  }
  const bool multiRank = isMultiRank(options);
  mlir::dg::ShardingOptions layout = shardingOptions(options);
  layout.passTimes = pipeline.passTimes;
  if (multiRank && mlir::failed(mlir::dg::runShardingStage(*module, layout)))
    throw InputError("sharding failed (see above)");
  if (options.emit == "sharded") {
    return printStage(*module);
  }

  // One plan per rank, each from its own partition of the annotated module.
  const int64_t worldSize = multiRank ? shardingOptions(options).worldSize() : 1;
  std::vector<Plan> plans;
  std::vector<RankReport> reports;
  for (int64_t rank = 0; rank < worldSize; ++rank) {
    mlir::OwningOpRef<mlir::ModuleOp> partition;
    if (multiRank) {
      auto partitioned = mlir::dg::partitionForRank(*module, rank, layout);
      if (mlir::failed(partitioned)) throw InputError("partitioning for rank " + std::to_string(rank) + " failed (see above)");
      partition = std::move(*partitioned);
    }
    mlir::ModuleOp program = multiRank ? *partition : *module;
    if (mlir::failed(mlir::dg::runRecomputationStage(program, pipeline))) throw InputError("recomputation failed (see above)");
    if (options.emit == "recompute") {  // rank 0's program
      return printStage(program);
    }
    rankMemory.clear();
    if (mlir::failed(mlir::dg::runPlanningStage(program, pipeline))) throw InputError("memory planning failed (see above)");
    mlir::dg::PlanLoweringOptions lowering;
    lowering.producer = "dgemma-compile";
    lowering.metadata = metadata;
    if (multiRank) lowering.rank = rank;
    if (pipeline.train) lowering.offloadedParameters = offloadedParameters(program, options.optimizerOffload);
    mlir::FailureOr<Plan> plan = mlir::failure();
    timed("(lowering to a plan)", [&] { plan = mlir::dg::lowerToPlan(program, lowering); });
    if (mlir::failed(plan)) throw InputError("lowering to a plan failed (see above)");
    fields.copyInto(*plan);
    timed("(plan validation)", [&] { validatePlan(*plan, "<compiled plan of rank " + std::to_string(rank) + ">"); });
    if (options.emit == "plan-json") {
      std::cout << planToJson(*plan).dump(2) << "\n";
      return;
    }
    if (options.report) {
      if (rank == 0) printEntryReport(program, *plan);
      reports.push_back(rankReport(program, *plan, rankMemory));
    }
    if (predicted && rank == 0) printPredictionCheck(*predicted, compiledRankCost(program, *plan), std::cout);
    plans.push_back(std::move(*plan));
  }
  if (options.report) {
    printRankReport(reports, analyticMinimum(*module, shardingOptions(options), fields.modelHiddenSize()),
                    findAccelerator(options.gpu.empty() ? "h200" : options.gpu));
    printPassTimes(passTimes);
  }

  checkCollectiveOrder(plans);
  createOutputDirectory(options.output, "-o");
  for (const Plan& plan : plans) writePlanFile(plan, planFileForRank(options.output, plan.rank));
  std::cerr << "dgemma-compile: wrote " << plans.size() << " plan" << (plans.size() == 1 ? "" : "s") << " to "
            << options.output << " (" << plans.front().entryPoints.size() << " entry points, "
            << plans.front().parameters.size() << " parameters per rank)\n";
}

}  // namespace dgemma
