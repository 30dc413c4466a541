// Times one DiffusionGemma training step on the CPU backend: the train plan is compiled in-process
// (build -> autodiff -> planning -> plan), the weights are drawn from their init specs (or read from
// a safetensors file), and a deterministic batch is fed to `train_step` (forward + backward of the
// whole objective, with t, the noisy canvas and the self-conditioning coins injected, so no
// `corrupt` call is timed). The optimizer_step entry is timed on its own, with zero gradients.
//
//   dgemma-bench-train-step --model CONFIG.json --micro-batch B --prompt-len P
//       [--objective base-sft|reweighted-ce|loo-ce|reweighted-loo-ce] [--self-cond-prob p]
//       [--encoder-loss-weight w] [--threads N] [--warmup K] [--iters N] [--min-seconds T]
//       [--seed S] [--weights FILE.safetensors] [--fusion on|off] [--products openblas|pool] [--profile] [--json]
//
// --products pool (the default) threads the products on the backend's pool, as every dgemma-run
// command does (runtime/kernels/matmul/BlasThreading.h); openblas leaves that to OpenBLAS's own threads.
//
// Each entry runs K untimed steps, then timed steps until it has run N of them and they took at
// least T seconds together (default 0); the mean and the minimum are over the timed steps, and so
// is the CPU time per step (user + system of every thread, from getrusage), which a shared machine's
// other load moves much less than the wall-clock time.
//
// The batch (bench/train_step_vs_pytorch.py builds the same one): splitmix64 seeded with --seed
// draws, in this order, the prompt ids (row-major; position 0 is BOS, the others are redrawn until
// they are no special id), the clean canvas ids (uniform in [0, V)), then for every canvas position a
// uniform u in [0, 1) (53 bits) and, when u < t_b, a replacement id. Every prompt token is real
// (attention_mask 1) and the canvas is full (canvas_mask 1). t_b = 0.1 + 0.8 (b + 0.5) / B, and the
// self-conditioning mask is 1, 0, 1, 0, ... so pass 1 always runs.
//
// --profile runs the same steps once more through a backend wrapper that times every kernel call
// and prints where train_step spends its time, by op and by (op, input shapes).
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/TimingBackend.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/io/Safetensors.h"

namespace {

using namespace dgemma;
using Clock = std::chrono::steady_clock;
using Inputs = std::map<std::string, HostTensor>;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Flags {
  std::string model;
  int64_t microBatch = 0;
  int64_t promptLength = 0;
  std::string objective = "base-sft";
  double selfCondProb = 0.5;
  double encoderLossWeight = 1.0;
  int64_t threads = 2;
  int warmup = 2;
  int iters = 5;
  double minSeconds = 0;
  uint64_t seed = 1234;
  std::string weights;
  bool profile = false;
  bool json = false;
  bool fusion = true;  // dg-fuse-elementwise, as dgemma-compile --fusion
  bool pooledProducts = true;  // --products pool: threadProductsOnPool(), as dgemma-run
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "dgemma-bench-train-step: %s\n"
               "usage: dgemma-bench-train-step --model CONFIG.json --micro-batch B --prompt-len P [--objective NAME]\n"
               "       [--self-cond-prob p] [--encoder-loss-weight w] [--threads N] [--warmup K] [--iters N]\n"
               "       [--min-seconds T] [--seed S] [--weights FILE.safetensors] [--fusion on|off]\n"
               "       [--products openblas|pool] [--profile]\n"
               "       [--json]\n",
               problem.c_str());
  std::exit(2);
}

Flags parseFlags(int argc, char** argv) {
  Flags flags;
  auto number = [&](const char* flag, const char* text) {
    char* end = nullptr;
    double value = std::strtod(text, &end);
    if (end == text || *end != '\0') usage(std::string(flag) + ": expected a number, got \"" + text + "\"");
    return value;
  };
  auto integer = [&](const char* flag, const char* text, int64_t minimum) {
    char* end = nullptr;
    long long value = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || value < minimum)
      usage(std::string(flag) + ": expected an integer >= " + std::to_string(minimum) + ", got \"" + text + "\"");
    return static_cast<int64_t>(value);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json") { flags.json = true; continue; }
    if (flag == "--profile") { flags.profile = true; continue; }
    if (flag == "--help" || flag == "-h") usage("help");
    if (i + 1 >= argc) usage(flag + ": missing value (or unknown flag)");
    const char* value = argv[++i];
    if (flag == "--model") flags.model = value;
    else if (flag == "--micro-batch") flags.microBatch = integer("--micro-batch", value, 1);
    else if (flag == "--prompt-len") flags.promptLength = integer("--prompt-len", value, 1);
    else if (flag == "--objective") flags.objective = value;
    else if (flag == "--self-cond-prob") flags.selfCondProb = number("--self-cond-prob", value);
    else if (flag == "--encoder-loss-weight") flags.encoderLossWeight = number("--encoder-loss-weight", value);
    else if (flag == "--threads") flags.threads = integer("--threads", value, 1);
    else if (flag == "--warmup") flags.warmup = static_cast<int>(integer("--warmup", value, 0));
    else if (flag == "--iters") flags.iters = static_cast<int>(integer("--iters", value, 1));
    else if (flag == "--min-seconds") flags.minSeconds = number("--min-seconds", value);
    else if (flag == "--seed") flags.seed = static_cast<uint64_t>(integer("--seed", value, 0));
    else if (flag == "--weights") flags.weights = value;
    else if (flag == "--products") {
      if (std::string(value) != "openblas" && std::string(value) != "pool") usage("--products: expected openblas or pool");
      flags.pooledProducts = std::string(value) == "pool";
    } else if (flag == "--fusion") {
      if (std::string(value) != "on" && std::string(value) != "off") usage("--fusion: expected on or off");
      flags.fusion = std::string(value) == "on";
    }
    else usage("unknown flag " + flag);
  }
  if (flags.model.empty()) usage("--model is required");
  if (flags.microBatch == 0) usage("--micro-batch is required");
  if (flags.promptLength == 0) usage("--prompt-len is required");
  if (flags.selfCondProb < 0 || flags.selfCondProb > 1) usage("--self-cond-prob: expected a value in [0, 1]");
  if (flags.encoderLossWeight < 0) usage("--encoder-loss-weight: expected a value >= 0");
  return flags;
}

// ---------------------------------------------------------------------------------------------
// The batch.

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

Inputs makeBatch(const DiffusionGemmaConfig& config, int64_t rows, int64_t promptLength, uint64_t seed) {
  const int64_t vocab = config.vocabSize, canvas = config.canvasLength;
  std::set<int64_t> special = {config.padTokenId, config.bosTokenId, config.imageTokenId, config.boiTokenId,
                               config.eoiTokenId};
  special.insert(config.eosTokenIds.begin(), config.eosTokenIds.end());
  SplitMix64 rng{seed};
  HostTensor inputIds(DType::I64, {rows, promptLength}), attentionMask(DType::I64, {rows, promptLength});
  HostTensor canvasIds(DType::I64, {rows, canvas}), canvasMask(DType::F32, {rows, canvas});
  HostTensor noisy(DType::I64, {rows, canvas}), times(DType::F32, {rows}), coins(DType::F32, {rows});
  for (int64_t i = 0; i < rows * promptLength; ++i) {
    int64_t id = config.bosTokenId;
    if (i % promptLength != 0) do id = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(vocab)); while (special.count(id));
    inputIds.as<int64_t>()[i] = id;
    attentionMask.as<int64_t>()[i] = 1;
  }
  for (int64_t i = 0; i < rows * canvas; ++i) {
    canvasIds.as<int64_t>()[i] = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(vocab));
    canvasMask.as<float>()[i] = 1.0f;
  }
  for (int64_t b = 0; b < rows; ++b) {
    times.as<float>()[b] = static_cast<float>(0.1 + 0.8 * (static_cast<double>(b) + 0.5) / static_cast<double>(rows));
    coins.as<float>()[b] = b % 2 == 0 ? 1.0f : 0.0f;
  }
  for (int64_t i = 0; i < rows * canvas; ++i) {
    const double t = times.as<float>()[i / canvas];
    const bool replace = rng.uniform() < t;
    noisy.as<int64_t>()[i] =
        replace ? static_cast<int64_t>(rng.next() % static_cast<uint64_t>(vocab)) : canvasIds.as<int64_t>()[i];
  }
  return {{"input_ids", inputIds},         {"attention_mask", attentionMask}, {"canvas_ids", canvasIds},
          {"canvas_mask", canvasMask},     {"noisy_canvas_ids", noisy},       {"diffusion_t", times},
          {"self_conditioning_mask", coins}};
}

// A checksum the driver compares with its own batch: Σ (i + 1) · id over each id tensor, in order.
uint64_t batchChecksum(const Inputs& batch) {
  uint64_t sum = 0;
  for (const char* name : {"input_ids", "canvas_ids", "noisy_canvas_ids"}) {
    const HostTensor& tensor = batch.at(name);
    for (int64_t i = 0; i < tensor.numElements(); ++i)
      sum += static_cast<uint64_t>(i + 1) * static_cast<uint64_t>(tensor.as<int64_t>()[i]);
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------

// The CPU seconds (user + system, every thread of the process) used so far: on a shared machine the
// wall-clock time of a step moves with the other load, its CPU time much less.
double processCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& time) { return static_cast<double>(time.tv_sec) + 1e-6 * static_cast<double>(time.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Timing {
  double mean = 0, min = 0;
  double cpuMean = 0;  // CPU seconds per timed step (processCpuSeconds)
  int steps = 0;
};

Timing timeRuns(int warmup, int iters, double minSeconds, const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i) body();
  Timing timing;
  timing.min = 1e300;
  double total = 0;
  const double cpuStart = processCpuSeconds();
  while (timing.steps < iters || total < minSeconds) {
    Clock::time_point start = Clock::now();
    body();
    const double seconds = secondsSince(start);
    total += seconds;
    timing.min = std::min(timing.min, seconds);
    ++timing.steps;
  }
  timing.mean = total / timing.steps;
  timing.cpuMean = (processCpuSeconds() - cpuStart) / timing.steps;
  return timing;
}

const EntryPoint& findEntry(const Plan& plan, const std::string& name) {
  for (const EntryPoint& entry : plan.entryPoints)
    if (entry.name == name) return entry;
  throw InputError("the compiled plan has no entry " + name);
}

Inputs taken(const EntryPoint& entry, const Inputs& inputs) {
  Inputs out;
  for (const NamedBuffer& input : entry.inputs) out[input.name] = inputs.at(input.name);
  return out;
}

void fillWeights(Executor& executor, const DiffusionGemmaConfig& config, const Flags& flags) {
  if (flags.weights.empty()) {
    initializeWeights(executor, flags.seed);
    return;
  }
  // An HF state dict (model.decoder.* and/or model.encoder.language_model.*): the loader rules of
  // docs/model.md, "Checkpoint loading rules" map it onto the plan's names, as dgemma-run does.
  SafetensorsDirectory checkpoint = SafetensorsDirectory::open(flags.weights);
  ResolvedCheckpoint resolved = resolveCheckpointNames(config, checkpoint);
  loadWeights(executor, flags.weights, [&](const std::string& name) -> std::optional<HostTensor> {
    auto found = resolved.textTensors.find(name);
    if (found == resolved.textTensors.end()) return std::nullopt;
    return found->second.file->read(found->second.entry->name);
  });
}

void printProfile(std::FILE* out, const TimingBackend& backend, int iters, double stepSeconds) {
  std::fprintf(out, "\nprofile of train_step (%d step%s; kernel time %.4f s/step of %.4f s/step measured)\n", iters,
               iters == 1 ? "" : "s", backend.totalSeconds() / iters, stepSeconds);
  printKernelProfile(out, backend, iters, "step", 25);
}

int run(const Flags& flags) {
  openblas_set_num_threads(static_cast<int>(flags.threads));
  if (flags.pooledProducts) threadProductsOnPool();
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(flags.model);
  auto variant = mlir::dg::parseObjectiveVariant(flags.objective);
  if (!variant) usage("--objective: unknown objective \"" + flags.objective + "\"");

  // Compile, as dgemma-compile --mode train does (AdamW with its default settings).
  Clock::time_point compileStart = Clock::now();
  mlir::MLIRContext context;
  mlir::dg::DiffusionGemmaTrainOptions options;
  options.microBatch = flags.microBatch;
  options.promptLengths = {flags.promptLength};
  options.objective.variant = *variant;
  options.objective.selfConditioningProb = flags.selfCondProb;
  options.objective.encoderLossWeight = flags.encoderLossWeight;
  auto module = mlir::dg::buildDiffusionGemmaTrain(context, config, options);
  if (mlir::failed(mlir::verify(*module))) throw InputError("the built train IR does not verify");
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = true;
  pipeline.optimizer = dgemma::OptimizerSettings{};
  pipeline.fusion = flags.fusion;
  if (mlir::failed(mlir::dg::runDifferentiationStage(*module, pipeline))) throw InputError("differentiation failed");
  if (mlir::failed(mlir::dg::runPlanningStage(*module, pipeline))) throw InputError("memory planning failed");
  mlir::dg::PlanLoweringOptions lowering;
  lowering.producer = "dgemma-bench-train-step";
  auto lowered = mlir::dg::lowerToPlan(*module, lowering);
  if (mlir::failed(lowered)) throw InputError("lowering to a plan failed");
  const Plan plan = std::move(*lowered);
  const double compileSeconds = secondsSince(compileStart);

  int64_t parameters = 0;
  for (const Parameter& parameter : plan.parameters) {
    if (!parameter.trainable) continue;
    int64_t count = 1;
    for (int64_t extent : parameter.globalShape) count *= extent;
    parameters += count;
  }
  uint64_t arenaBytes = 0;
  for (const Arena& arena : plan.arenas) arenaBytes += arena.bytes;

  std::unique_ptr<Backend> backend = createBackend("cpu", flags.threads);
  CommunicatorSet communicators;
  Executor executor(plan, *backend, communicators, "dgemma-bench-train-step");
  fillWeights(executor, config, flags);

  const EntryPoint& trainStep = findEntry(plan, "train_step");
  const EntryPoint& optimizerStep = findEntry(plan, "optimizer_step");
  const Inputs batch = makeBatch(config, flags.microBatch, flags.promptLength, flags.seed);
  const Inputs trainInputs = taken(trainStep, batch);

  float loss = 0, diffusionLoss = 0, encoderLoss = 0;
  Timing train = timeRuns(flags.warmup, flags.iters, flags.minSeconds, [&] {
    Inputs out = executor.run(trainStep, trainInputs);
    loss = out.at("loss").as<float>()[0];
    diffusionLoss = out.at("diffusion_loss").as<float>()[0];
    if (out.count("encoder_loss")) encoderLoss = out.at("encoder_loss").as<float>()[0];
  });

  // optimizer_step with zero gradients: the same work (norm, clip, AdamW over every parameter).
  Inputs optimizerInputs;
  for (const NamedBuffer& input : optimizerStep.inputs) {
    const Buffer& buffer = plan.buffers[input.buffer];
    HostTensor tensor(buffer.dtype, buffer.shape);  // zeros
    const std::map<std::string, double> scalars = {
        {"lr", 1e-4}, {"bias_correction1", 0.1}, {"bias_correction2", 1e-3}, {"gradient_scale", 1.0}};
    if (auto scalar = scalars.find(input.name); scalar != scalars.end()) {
      if (buffer.dtype == DType::F64) tensor.as<double>()[0] = scalar->second;
      else if (buffer.dtype == DType::F32) tensor.as<float>()[0] = static_cast<float>(scalar->second);
      else throw InputError("optimizer_step input " + input.name + ": unexpected dtype " + std::string(dtypeName(buffer.dtype)));
    }
    optimizerInputs[input.name] = std::move(tensor);
  }
  Timing optimizer = timeRuns(std::max(flags.warmup, 1), flags.iters, flags.minSeconds,
                              [&] { executor.run(optimizerStep, optimizerInputs); });

  const int64_t tokens = flags.microBatch * (flags.promptLength + config.canvasLength);
  const double tokensPerSecond = static_cast<double>(tokens) / train.mean;
  const uint64_t checksum = batchChecksum(batch);

  if (flags.json) {
    nlohmann::json line = {
        {"config", flags.model},
        {"params", parameters},
        {"micro_batch", flags.microBatch},
        {"prompt_len", flags.promptLength},
        {"canvas_len", config.canvasLength},
        {"tokens_per_step", tokens},
        {"objective", flags.objective},
        {"self_cond_prob", flags.selfCondProb},
        {"encoder_loss_weight", flags.encoderLossWeight},
        {"threads", flags.threads},
        {"warmup", flags.warmup},
        {"train_steps_timed", train.steps},
        {"optimizer_steps_timed", optimizer.steps},
        {"weights", flags.weights.empty() ? "init" : "file"},
        {"compile_s", compileSeconds},
        {"arena_bytes", arenaBytes},
        {"train_step_mean_s", train.mean},
        {"train_step_min_s", train.min},
        {"train_step_cpu_s", train.cpuMean},
        {"tokens_per_s", tokensPerSecond},
        {"optimizer_step_mean_s", optimizer.mean},
        {"optimizer_step_min_s", optimizer.min},
        {"optimizer_step_cpu_s", optimizer.cpuMean},
        {"loss", loss},
        {"diffusion_loss", diffusionLoss},
        {"encoder_loss", encoderLoss},
        {"batch_checksum", checksum},
    };
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::printf("dgemma train step, CPU backend, %lld thread(s); %s, self-cond p %g, encoder loss weight %g\n",
                static_cast<long long>(flags.threads), flags.objective.c_str(), flags.selfCondProb, flags.encoderLossWeight);
    std::printf("compiled in %.2f s; arenas %.1f MiB; warmup %d, %d timed step(s); loss %.6g\n\n", compileSeconds,
                static_cast<double>(arenaBytes) / (1 << 20), flags.warmup, train.steps, loss);
    std::printf("%-40s %12s %14s %12s %12s %12s %12s %14s\n", "config", "params", "tokens/step", "mean s/step", "min s/step",
                "CPU s/step", "tokens/s", "optimizer s");
    std::printf("%-40s %12lld %14s %12.4f %12.4f %12.4f %12.1f %14.4f\n", flags.model.c_str(), static_cast<long long>(parameters),
                (std::to_string(flags.microBatch) + "x(" + std::to_string(flags.promptLength) + "+" +
                 std::to_string(config.canvasLength) + ")=" + std::to_string(tokens))
                    .c_str(),
                train.mean, train.min, train.cpuMean, tokensPerSecond, optimizer.mean);
  }

  if (flags.profile) {
    auto timing = std::make_unique<TimingBackend>(createBackend("cpu", flags.threads));
    TimingBackend& timed = *timing;
    timed.setEnabled(false);
    Executor profiled(plan, timed, communicators, "dgemma-bench-train-step (profile)");
    fillWeights(profiled, config, flags);
    profiled.run(trainStep, trainInputs);  // warm-up, untimed
    timed.setEnabled(true);
    Clock::time_point start = Clock::now();
    for (int i = 0; i < flags.iters; ++i) profiled.run(trainStep, trainInputs);
    const double stepSeconds = secondsSince(start) / flags.iters;
    timed.setEnabled(false);
    // With --json stdout holds the one JSON line; the profile goes to stderr.
    printProfile(flags.json ? stderr : stdout, timed, flags.iters, stepSeconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parseFlags(argc, argv);
  try {
    return run(flags);
  } catch (const Error& error) {
    std::fprintf(stderr, "dgemma-bench-train-step: %s\n", error.what());
    return error.exitCode();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dgemma-bench-train-step: %s\n", error.what());
    return 1;
  }
}
