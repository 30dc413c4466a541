// dgemma-run: executes a plan (train / generate / eval / sample / check-data, and the verification
// subcommands forward / grad), or inspects one; preprocesses a pre-training corpus.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "runtime/core/NoiseKeys.h"
#include "runtime/data/dataset/Gemma4RowTokenizer.h"
#include "runtime/io/Safetensors.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/kernels/matmul/OpenBlasCore.h"
#include "plan/PlanFile.h"
#include "runtime/comm/PeerLostError.h"
#include "runtime/launch/ElasticErrorFile.h"
#include "runtime/launch/LocalLauncher.h"
#include "runtime/launch/RankEnvironment.h"
#include "runtime/session/GlobalTensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/session/Session.h"
#include "runtime/train/CheckpointListing.h"
#include "runtime/train/SaveDirectoryClaim.h"
#include "runtime/train/TrainData.h"
#include "runtime/train/Trainer.h"
#include "support/PathClash.h"
#include "tools/common/CliSupport.h"
#include "tools/common/FlagRanges.h"
#include "tools/dgemma-run/EvalCommand.h"
#include "tools/dgemma-run/ExportCommand.h"
#include "tools/dgemma-run/RlCommand.h"
#include "tools/dgemma-run/GenerateCommand.h"
#include "tools/dgemma-run/PreprocessCommand.h"
#include "tools/dgemma-run/RunDefaults.h"
#include "tools/dgemma-run/SampleCommand.h"

namespace {

using dgemma::HostTensor;
using dgemma::InputError;
using dgemma::loadPlan;
using dgemma::openSession;
using dgemma::runEntry;
using dgemma::Session;
using dgemma::SessionOptions;

// The ranges of the numeric flags (docs/cli.md, "Flag ranges"): far beyond any real run, and small
// enough that nothing computed from them overflows.
constexpr int64_t kMaxThreads = 1024;
constexpr int64_t kMaxSteps = int64_t{1} << 40;  // steps, and step counts between events
constexpr int64_t kMaxAccumulation = int64_t{1} << 20;
constexpr int64_t kMaxKeep = 1 << 20;
constexpr int64_t kMaxLength = int64_t{1} << 20;     // token counts: new tokens, canvas, encoder context
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;  // as a config's vocab_size (docs/model.md)
constexpr int64_t kMaxRank = (int64_t{1} << 20) - 1;  // below the largest world size a plan may have
// Finite; a huge rate is how the NaN guard is tested (it makes the step overflow on purpose).
constexpr double kMaxLearningRate = 1e30;
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;
// Well above the interval at which launchers poll their workers (torchrun's --monitor-interval
// defaults to 0.1 s).
constexpr auto kPeerLostExitDelay = std::chrono::seconds(1);

// How the ranks of a plan-running command start: --nproc-per-node local ranks, or the environment's.
struct RankFlags {
  int64_t processesPerNode = 1;
  double commTimeoutSeconds = 30;  // well under a minute: a rank whose peer died exits soon after
};

void addRankFlags(CLI::App& command, RankFlags& flags) {
  command.add_option("--nproc-per-node", flags.processesPerNode, "local ranks to start (1: this process is the only rank)")
      ->check(dgemma::integerIn(1, 1024));
  command.add_option("--comm-timeout", flags.commTimeoutSeconds,
                     "seconds a rank waits for a peer in the rendezvous and in each collective")
      ->check(dgemma::numberIn(0, kMaxTimeoutSeconds, false));
}

// This process as the rank its environment names: the session's rank, world size and rendezvous.
void applyRankEnvironment(const dgemma::RankEnvironment& environment, const RankFlags& flags, SessionOptions& session) {
  session.rank = environment.rank;
  session.worldSize = environment.worldSize;
  session.device = environment.localRank;  // --backend cuda: one GPU per local rank
  session.rendezvous.storeDirectory = environment.rendezvousDirectory;
  session.rendezvous.masterAddress = environment.masterAddress;
  session.rendezvous.masterPort = environment.masterPort;
  session.rendezvous.externalStore = environment.agentStore;
  session.rendezvous.keyPrefix = environment.storePrefix;
  session.rendezvous.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.commTimeoutSeconds * 1000));
}

// Under torchrun --max-restarts, a restarted group (TORCHELASTIC_RESTART_COUNT > 0) continues from
// the newest complete checkpoint of --save-dir, as --resume-from it would (docs/cli.md, "Several
// ranks"), unless --elastic-resume off or the command line already says where to resume from.
// Rank 0 takes the checkpoints only when the directory records this run's identity, that is, when
// they are the restarted group's own (SaveDirectoryClaim.h); otherwise its claim refuses them.
void applyElasticResume(const dgemma::RankEnvironment& environment, const std::string& elasticResume,
                        dgemma::TrainOptions& options) {
  if (environment.launcher != dgemma::Launcher::Torchrun || environment.restartCount == 0 || elasticResume != "on" ||
      options.saveDir.empty() || options.resume || !options.resumeFrom.empty())
    return;
  if (environment.rank == 0 && dgemma::recordedRunIdentity(options.saveDir) != options.runIdentity) return;
  const std::vector<dgemma::CheckpointEntry> complete = dgemma::listCheckpoints(options.saveDir);
  const std::string restart = "torchrun restart " + std::to_string(environment.restartCount);
  if (complete.empty()) {
    if (environment.rank == 0)
      std::cout << restart << ": no complete checkpoint in " << options.saveDir << " yet; starting from step 0\n";
    return;
  }
  options.resumeFrom = complete.back().directory;
  if (environment.rank == 0)
    std::cout << restart << ": resuming from " << options.resumeFrom << ", the newest complete checkpoint\n";
}

// The identity a run records in its --save-dir (SaveDirectoryClaim.h). Every group torchrun's agent
// starts for one job shares it: the agent (this rank's parent) lives as long as the job.
std::string runIdentity(const dgemma::RankEnvironment& environment) {
  if (environment.launcher != dgemma::Launcher::Torchrun) return dgemma::newRunIdentity();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return "torchrun run " + dgemma::processEnvironment()("TORCHELASTIC_RUN_ID").value_or("none") + ", agent pid " +
         std::to_string(::getppid()) + " on " + host;
}

// With --nproc-per-node N in a process no launcher started, the exit code of running N local ranks
// of this same command line (each of which comes back here as a rank of dgemma-run); nothing when
// this process is a rank itself.
std::optional<int> launchLocalRanksIfAsked(const RankFlags& flags, const dgemma::RankEnvironment& environment,
                                           const std::string& planDir, int argc, char** argv) {
  if (environment.launcher == dgemma::Launcher::DgemmaRun) {
    // The launcher sets the parent-death signal; this catches a rank whose launcher is already gone.
    if (environment.launcherPid != 0 && ::getppid() != environment.launcherPid)
      throw dgemma::RuntimeError("the launcher that started this rank (pid " + std::to_string(environment.launcherPid) +
                                 ") is gone; a rank does not run on alone");
    if (environment.worldSize != flags.processesPerNode)
      throw InputError("--nproc-per-node " + std::to_string(flags.processesPerNode) + ": this rank was started as one of " +
                       std::to_string(environment.worldSize) + " (WORLD_SIZE)");
    return std::nullopt;
  }
  if (flags.processesPerNode == 1) return std::nullopt;
  if (environment.launcher != dgemma::Launcher::None)
    throw InputError("--nproc-per-node: " + std::string(dgemma::launcherName(environment.launcher)) +
                     " already started the ranks (rank " + std::to_string(environment.rank) + " of " +
                     std::to_string(environment.worldSize) + "); leave the flag out");
  dgemma::checkRankPlanCount(planDir, flags.processesPerNode);
  dgemma::LocalLaunch launch;
  launch.processes = flags.processesPerNode;
  launch.command = {dgemma::currentExecutable()};
  for (int i = 1; i < argc; ++i) launch.command.push_back(argv[i]);
  return dgemma::runLocalRanks(launch, std::cerr);
}

// The flags of forward, grad and inspect: the session's, and the batch in and out.
struct ExecutionFlags {
  SessionOptions session;
  std::string input;
  std::string output;
  uint64_t step = 0;        // grad: the noise keys' step
  int64_t firstSample = 0;  // grad: the global sample index of the batch's first row
};

// Every output path of the command against every input path of the run (docs/cli.md, "Outputs and
// inputs"), before any work: exit 2 naming both flags.
void checkOutputPaths(const CLI::App& train, const CLI::App& eval, const CLI::App& exportCommand, const dgemma::TrainOptions& t,
                      const dgemma::tool::EvalFlags& e, const dgemma::tool::ExportFlags& x, const ExecutionFlags& f) {
  using dgemma::NamedPath;
  if (train.parsed()) {
    const std::string tokenizer = t.tokenizer.empty() ? t.session.weights : t.tokenizer;
    const std::vector<NamedPath> directories = {{"--plan", t.session.planDir}, {"--weights", t.session.weights},
                                                {"--tokenizer", tokenizer}, {"--resume-from", t.resumeFrom}};
    std::vector<NamedPath> inputs = directories;
    for (NamedPath split : {NamedPath{"--train", t.train}, NamedPath{"--validation", t.validation}, NamedPath{"--test", t.test}})
      if (split.path != dgemma::kMockSplit) inputs.push_back(split);
    // A --data-path blend alternates weights and prefixes; a prefix's files are PREFIX.bin and PREFIX.idx.
    for (const std::string& word : t.dataPath)
      for (const char* suffix : {".bin", ".idx"})
        if (std::filesystem::exists(word + suffix)) inputs.push_back({"--data-path", word + suffix});
    dgemma::checkOutputsAgainstInputs({{"--metrics", t.metrics}, {"--tensorboard", t.tensorboard}, {"--save-dir", t.saveDir}},
                                      inputs, directories);
    // --overwrite deletes the save directory's checkpoints: none of them may be what the run reads.
    if (t.overwrite)
      for (const std::string& name : dgemma::checkpointEntries(t.saveDir)) {
        const std::string entry = (std::filesystem::path(t.saveDir) / name).string();
        for (const NamedPath& input : inputs)
          if (!input.path.empty() && dgemma::liesWithin(input.path, entry))
            throw dgemma::InputError("--overwrite: " + input.flag + " " + input.path + " lies in " + entry +
                                     ", which --overwrite would delete from --save-dir; resume it, or copy it elsewhere first");
      }
  } else if (eval.parsed()) {
    const std::vector<NamedPath> directories = {
        {"--plan", e.run.session.planDir},
        {"--weights", e.run.session.weights},
        {"--tokenizer", e.run.tokenizer.empty() ? e.run.session.weights : e.run.tokenizer},
        {"--adapter", e.run.session.adapter}};
    std::vector<NamedPath> inputs = directories;
    inputs.push_back({"--test", e.test});
    dgemma::checkOutputsAgainstInputs({{"--out", e.out}}, inputs, directories);
  } else if (exportCommand.parsed()) {
    const std::vector<NamedPath> inputs = {{"--weights", x.weights},
                                           {"--model", x.model},
                                           {"--plan", x.planDir},
                                           {"--tokenizer", x.tokenizer.empty() ? x.weights : x.tokenizer},
                                           {"--merge-adapter", x.mergeAdapter}};
    dgemma::checkOutputsAgainstInputs({{"--out", x.out}}, inputs, inputs);
  } else if (!f.output.empty()) {  // forward, grad
    const std::vector<NamedPath> directories = {
        {"--plan", f.session.planDir}, {"--weights", f.session.weights}, {"--adapter", f.session.adapter}};
    std::vector<NamedPath> inputs = directories;
    inputs.push_back({"--input", f.input});
    dgemma::checkOutputsAgainstInputs({{"--out", f.output}}, inputs, directories);
  }
}

void addPlanFlags(CLI::App& command, SessionOptions& flags) {
  command.add_option("--plan", flags.planDir, "plan directory written by dgemma-compile")->required();
  command.add_option("--backend", flags.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  command.add_option("--threads", flags.threads, "CPU worker threads (0: one per core)")->check(dgemma::integerIn(0, kMaxThreads));
}

// cli.md names no dtype for the 0/1 masks (attention_mask, canvas_mask, self_conditioning_mask):
// any numeric dtype is accepted and converted to the one the plan takes, after checking that every
// element is exactly 0 or 1.
bool isMaskField(const std::string& name) {
  const std::string suffix = "_mask";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

HostTensor convertMask(const HostTensor& tensor, dgemma::DType wanted, const std::string& what) {
  // Every mask value is 0 or 1, so f64 holds it exactly whatever the two dtypes are.
  HostTensor wide = dgemma::isFloating(tensor.dtype) ? dgemma::convertDType(tensor, dgemma::DType::F64, what)
                                                     : HostTensor(dgemma::DType::F64, tensor.shape);
  if (!dgemma::isFloating(tensor.dtype)) {
    HostTensor integers = dgemma::convertDType(tensor, dgemma::DType::I64, what);
    for (int64_t i = 0; i < tensor.numElements(); ++i) wide.as<double>()[i] = static_cast<double>(integers.as<int64_t>()[i]);
  }
  HostTensor flags(dgemma::DType::I64, tensor.shape);
  for (int64_t i = 0; i < tensor.numElements(); ++i) {
    const double flag = wide.as<double>()[i];
    if (flag != 0.0 && flag != 1.0) {
      char shown[64];
      std::snprintf(shown, sizeof shown, "%.17g", flag);
      throw InputError(what + ": element " + std::to_string(i) + ": expected 0 or 1, got " + shown);
    }
    flags.as<int64_t>()[i] = static_cast<int64_t>(flag);
  }
  return dgemma::isFloating(wanted) ? dgemma::convertDType(wide, wanted, what) : dgemma::convertDType(flags, wanted, what);
}

std::map<std::string, HostTensor> readBatch(const std::string& path, const dgemma::Plan& plan, const std::string& entryName) {
  dgemma::SafetensorsFile file = dgemma::SafetensorsFile::open(path);
  std::map<std::string, HostTensor> batch;
  for (const dgemma::SafetensorsEntry& entry : file.entries()) batch[entry.name] = file.read(entry.name);
  // Convert floating fields to the dtype the plan expects (e.g. a bf16 batch into an f32 plan).
  for (const dgemma::EntryPoint& entry : plan.entryPoints) {
    if (entry.name != entryName) continue;
    for (const dgemma::NamedBuffer& input : entry.inputs) {
      auto it = batch.find(input.name);
      if (it == batch.end()) continue;
      const dgemma::DType wanted = plan.buffers[input.buffer].dtype;
      const std::string what = path + ": tensor " + input.name;
      it->second = isMaskField(input.name) ? convertMask(it->second, wanted, what)
                                           : dgemma::convertDType(it->second, wanted, what);
    }
    break;
  }
  dgemma::modelAdapterFor(plan.modelFamily).checkBatch(batch, plan, path);
  return batch;
}

void writeOutputs(const std::string& path, const std::map<std::string, HostTensor>& outputs) {
  std::vector<std::pair<std::string, const HostTensor*>> tensors;
  for (const auto& [name, tensor] : outputs) tensors.push_back({name, &tensor});
  dgemma::writeSafetensors(path, tensors);
}

// Every rank runs the entry on the whole batch file (feeding its box of each input); rank 0 writes
// the assembled outputs.
int runForward(const ExecutionFlags& flags) {
  std::unique_ptr<Session> session = openSession(flags.session);
  const std::string& forward = session->model->contract().forwardEntry;
  std::map<std::string, HostTensor> outputs =
      runEntry(*session, forward, readBatch(flags.input, session->plan, forward), flags.input);
  if (session->isRankZero()) writeOutputs(flags.output, outputs);
  return 0;
}

// The corruption a training step sees (docs/training.md): injected through the test hooks when the
// batch carries the noisy canvas ids and the diffusion time (then nothing is drawn; a missing
// self-conditioning mask conditions every example), otherwise drawn by the plan's corrupt entry
// from per-example keys (seed, train phase, --step, sample index = --first-sample + row).
void addCorruption(Session& session, std::map<std::string, HostTensor>& batch, const ExecutionFlags& flags) {
  const dgemma::ModelContract& names = session.model->contract();
  const bool injected = batch.count(names.noisyCanvasIds) && batch.count(names.diffusionTime);
  if (injected) {
    if (!batch.count(names.selfConditioningMask)) {
      HostTensor mask(dgemma::DType::F32, {batch.at(names.diffusionTime).shape});
      std::fill(mask.as<float>(), mask.as<float>() + mask.numElements(), 1.0f);
      batch[names.selfConditioningMask] = mask;
    }
    return;
  }
  if (batch.count(names.noisyCanvasIds) || batch.count(names.diffusionTime))
    throw InputError(flags.input + ": give both " + names.noisyCanvasIds + " and " + names.diffusionTime +
                     " (injected noise) or neither (drawn noise)");
  const auto& entries = session.plan.entryPoints;
  if (names.corruptEntry.empty() ||
      !std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.name == names.corruptEntry; }))
    return;  // a plan without corruption (the built-in graph)
  for (const std::string* field : {&names.batch.canvasIds, &names.batch.canvasMask})
    if (!batch.count(*field))
      throw InputError(flags.input + ": tensor " + *field + ": missing (the training step needs it)");
  const int64_t examples = batch.at(names.batch.canvasIds).shape.at(0);
  std::vector<int64_t> samples(examples);
  for (int64_t row = 0; row < examples; ++row) samples[row] = flags.firstSample + row;
  addDrawnCorruption(session, batch, flags.session.seed, dgemma::NoisePhase::Train, flags.step, samples, flags.input);
}

// Writes the loss as shape [1], the objective's parts, the step's other outputs (a GRPO step's
// per-example logps, clipped and kl) and each gradient under its parameter's checkpoint name. A plan with an optimizer sums the gradients into its device buffers (zero in a
// fresh session), so after one train_step they hold this batch's; a plan without one outputs them.
int runGrad(const ExecutionFlags& flags) {
  std::unique_ptr<Session> session = openSession(flags.session);
  const dgemma::ModelContract& names = session->model->contract();
  std::map<std::string, HostTensor> batch = readBatch(flags.input, session->plan, names.trainStepEntry);
  addCorruption(*session, batch, flags);
  std::map<std::string, HostTensor> outputs = runEntry(*session, names.trainStepEntry, std::move(batch), flags.input);
  std::map<std::string, HostTensor> written;
  const std::string gradientPrefix = dgemma::kGradientPrefix;
  for (auto& [name, tensor] : outputs) {
    if (name.rfind(gradientPrefix, 0) == 0) {
      written[name.substr(gradientPrefix.size())] = tensor;
    } else {  // the loss and its parts as [1]; per-example outputs (a GRPO step's, docs/rl.md) as they are
      if (tensor.shape.empty()) tensor.shape = {1};
      written[name] = tensor;
    }
  }
  // Gradient buffers are sharded like their parameters, and under data parallelism each rank holds
  // its share of their sum: every rank takes part in assembling each.
  for (const dgemma::Parameter& parameter : session->plan.parameters)
    if (parameter.name.rfind(gradientPrefix, 0) == 0) {
      const dgemma::ShardBox box{parameter.shardOffset, parameter.shardShape};
      const HostTensor& local = session->executor->parameter(parameter.name);
      const std::string what = "parameter " + parameter.name;
      written[parameter.name.substr(gradientPrefix.size())] =
          parameter.pendingSum ? dgemma::sumGlobal(*session->world, local, box, parameter.globalShape, what)
                               : dgemma::assembleGlobal(*session->world, local, box, parameter.globalShape, what);
    }
  if (!written.count(names.loss))
    throw InputError("--plan: entry " + names.trainStepEntry + " has no \"" + names.loss + "\" output");
  if (session->isRankZero()) writeOutputs(flags.output, written);
  return 0;
}

int runInspect(const ExecutionFlags& flags) {
  dgemma::Plan plan = dgemma::readRankPlan(flags.session.planDir, flags.session.rank);
  std::cout << "plan " << dgemma::planFileForRank(flags.session.planDir, flags.session.rank) << ": format v" << plan.version << ", rank "
            << plan.rank << " of " << plan.worldSize << ", producer " << plan.producer << "\n";
  for (const dgemma::Arena& arena : plan.arenas)
    std::cout << "  arena " << arena.name << (arena.persistent ? " (persistent)" : " (scratch)") << ": " << arena.bytes << " bytes\n";
  std::cout << "  parameters: " << plan.parameters.size() << ", buffers: " << plan.buffers.size() << "\n";
  for (const dgemma::EntryPoint& entry : plan.entryPoints)
    std::cout << "  entry " << entry.key() << ": " << entry.steps.size() << " steps, " << entry.inputs.size() << " inputs, "
              << entry.outputs.size() << " outputs\n";
  return 0;
}

struct CheckDataFlags {
  std::string data;
  std::string tokenizer;
  int64_t canvasLength = 256;
  int64_t maxEncoderLength = 8192;
  int64_t maxSoftTokens = 280;
  int64_t vocabSize = 0;  // 0: the tokenizer's
  bool skipBadRows = false;
};

// Builds the dataset exactly as training will (every row validated, images decoded, blocks split)
// and prints its counts; with --skip-bad-rows, every skipped row too.
int runCheckData(const CheckDataFlags& flags) {
  dgemma::Tokenizer tokenizer(flags.tokenizer);
  const int64_t vocabSize = flags.vocabSize > 0 ? flags.vocabSize : tokenizer.vocabSize();
  tokenizer.checkVocabSize(vocabSize);
  dgemma::DatasetOptions options;
  options.canvasLength = flags.canvasLength;
  options.maxEncoderLength = flags.maxEncoderLength;
  options.image.maxSoftTokens = flags.maxSoftTokens;
  options.skipBadRows = flags.skipBadRows;
  auto start = std::chrono::steady_clock::now();
  dgemma::Dataset dataset = dgemma::buildDataset(flags.data, dgemma::gemma4RowTokenizer(tokenizer, vocabSize), options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const dgemma::RowError& error : dataset.skipped) std::cerr << "skipped: " << error.text() << "\n";
  const int64_t rows = dataset.rows + static_cast<int64_t>(dataset.skipped.size());
  std::cout << flags.data << ": rows " << rows << ", kept " << dataset.rows << ", skipped " << dataset.skipped.size()
            << ", blocks " << dataset.items.size() << ", prompt tokens " << dataset.promptTokens << ", target tokens "
            << dataset.targetTokens << ", images " << dataset.images << ", empty completions " << dataset.emptyCompletions
            << "\n";
  std::printf("checked %lld rows in %.3f s (%.0f rows/s)\n", static_cast<long long>(rows), seconds,
              seconds > 0 ? rows / seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dgemma-run: execute a dgemma plan", "dgemma-run"};
  app.require_subcommand(1);
  ExecutionFlags flags;
  RankFlags rankFlags;
  dgemma::TrainOptions trainFlags;
  CLI::App* train = app.add_subcommand("train", "fine-tune from a training plan (block-diffusion SFT, AdamW)");
  addPlanFlags(*train, trainFlags.session);
  train->add_option("--weights", trainFlags.session.weights, "HF or dgemma checkpoint directory to start from");
  train->add_option("--init", trainFlags.session.init, "random: start from the parameters' init distributions")
      ->check(CLI::IsMember({"random"}));
  train->add_option("--seed", trainFlags.session.seed, "seed of the data order, the noise and --init random")
      ->check(dgemma::anyUnsigned64());
  CLI::Option* trainSplit =
      train->add_option("--train", trainFlags.train, "training JSONL, or mock: synthetic smoke-test data");
  CLI::Option* dataPath =
      train->add_option("--data-path", trainFlags.dataPath,
                        "pre-training plans: PREFIX of PREFIX.bin/.idx, or W1 PREFIX1 W2 PREFIX2 ... (a blend)");
  trainSplit->excludes(dataPath);
  train
      ->add_option("--split", trainFlags.split,
                   "with --data-path: train,validation,test weights of each source's documents")
      ->capture_default_str();
  train->add_option("--data-cache-dir", trainFlags.dataCacheDir,
                    "with --data-path: where the index caches go (default: beside the data)");
  train->add_option("--validation", trainFlags.validation, "validation JSONL, evaluated every --eval-every steps and at the end");
  train->add_option("--test", trainFlags.test, "test JSONL, evaluated at the end");
  train->add_option(
      "--tokenizer", trainFlags.tokenizer,
      "tokenizer directory: tokenizer.model, tokenizer.json or vocab.json + merges.txt (default: --weights)");
  train->add_option("--steps", trainFlags.steps, "optimizer steps of the whole run (default: the plan's preset)")
      ->check(dgemma::integerIn(1, kMaxSteps));
  train
      ->add_option("--max-seconds", trainFlags.maxSeconds,
                   "stop and save after the step that reaches this wall-clock budget")
      ->check(dgemma::numberIn(0, kMaxTimeoutSeconds));
  train->add_option("--accumulation", trainFlags.accumulation, "micro-batches per optimizer step (global batch = micro-batch x N)")
      ->check(dgemma::integerIn(1, kMaxAccumulation));
  train->add_option("--lr", trainFlags.lr, "peak learning rate")->check(dgemma::numberIn(0, kMaxLearningRate));
  train->add_option("--min-lr", trainFlags.minLr, "learning rate at the end of the decay")->check(dgemma::numberIn(0, kMaxLearningRate));
  train->add_option("--warmup", trainFlags.warmupSteps, "linear warmup steps from 0")->check(dgemma::integerIn(0, kMaxSteps));
  train->add_option("--decay-steps", trainFlags.decaySteps, "step at which the decay reaches --min-lr (default: --steps)")
      ->check(dgemma::integerIn(0, kMaxSteps));
  train->add_option("--lr-decay-style", trainFlags.decayStyle, "cosine | linear | constant")
      ->check(CLI::IsMember({"cosine", "linear", "constant"}));
  train->add_option("--canvas-tail", trainFlags.canvasTail,
                    "a last block's canvas after its EOS: pad (not scored) | eos_fill (EOS, scored)")
      ->check(CLI::IsMember({"pad", "eos_fill"}));
  train->add_option("--save-dir", trainFlags.saveDir, "checkpoint directory (a checkpoint at the end, and every --save-every)");
  train->add_option("--save-every", trainFlags.saveEvery, "steps between checkpoints (0: only at the end)")
      ->check(dgemma::integerIn(0, kMaxSteps));
  train->add_option("--keep", trainFlags.keep, "keep the newest K checkpoints (0: all)")->check(dgemma::integerIn(0, kMaxKeep));
  train->add_flag("--resume", trainFlags.resume, "continue from the newest checkpoint in --save-dir (an error if it is damaged)");
  train->add_option("--resume-from", trainFlags.resumeFrom, "continue from this checkpoint directory (e.g. an older one)");
  train->add_flag("--overwrite", trainFlags.overwrite, "a fresh run: delete another run's checkpoints in --save-dir first");
  train->add_option("--metrics", trainFlags.metrics, "JSON Lines metrics file");
  train->add_option("--tensorboard", trainFlags.tensorboard, "TensorBoard log directory");
  train->add_option("--eval-every", trainFlags.evalEvery, "steps between validations (0: only at the end)")
      ->check(dgemma::integerIn(0, kMaxSteps));
  train->add_option("--eval-batches", trainFlags.evalBatches, "micro-batches per evaluation (0: the whole split)")
      ->check(dgemma::integerIn(0, kMaxSteps));
  train->add_option("--nan-policy", trainFlags.nanPolicy, "abort | skip: a step with a NaN or Inf loss or gradient")
      ->check(CLI::IsMember({"abort", "skip"}));
  train->add_option("--log-every", trainFlags.logEvery, "off a terminal, a progress line every N steps as well as every 30 s")
      ->check(dgemma::integerIn(0, kMaxSteps));
  train->add_flag("--skip-bad-rows", trainFlags.skipBadRows, "skip, count and list bad rows instead of failing");
  std::string elasticResume = "on";
  train->add_option("--elastic-resume", elasticResume,
                    "on: a group torchrun restarted continues from the newest complete checkpoint in --save-dir")
      ->check(CLI::IsMember({"on", "off"}));
  addRankFlags(*train, rankFlags);

  dgemma::tool::RlFlags rlFlags;
  dgemma::RlOptions& rl = rlFlags.options;
  CLI::App* rlCommand =
      app.add_subcommand("rl", "improve a policy from prompts and a verifier (on-policy GRPO, docs/rl.md)");
  addPlanFlags(*rlCommand, rl.session);
  rlCommand
      ->add_option("--rollout-plan", rl.rolloutPlan, "inference plan of the same model (dgemma-compile --mode infer)")
      ->required();
  rlCommand
      ->add_option("--weights", rl.session.weights,
                   "HF or dgemma checkpoint directory: the policy's start and the KL reference")
      ->required();
  rlCommand->add_option(
      "--tokenizer", rlFlags.tokenizer,
      "tokenizer directory: tokenizer.model, tokenizer.json or vocab.json + merges.txt (default: --weights)");
  rlCommand->add_option("--prompts", rl.prompts, "JSONL rows (docs/data.md) with a \"reference\" for the verifier")
      ->required();
  rlCommand->add_option("--reward", rlFlags.reward, "built-in verifier: exact | numeric | regex")
      ->check(CLI::IsMember({"exact", "numeric", "regex"}));
  rlCommand->add_option("--reward-command", rlFlags.rewardCommand,
                        "verifier process (sh -c): JSON lines {prompt, completion, reference} in, {reward} out");
  rlCommand->add_option("--reward-timeout", rlFlags.rewardTimeoutSeconds, "seconds one --reward-command call may take")
      ->check(dgemma::numberIn(0, kMaxTimeoutSeconds, false));
  rlCommand->add_option("--steps", rl.steps, "RL steps (each: rollouts, rewards, --inner-updates updates)")
      ->required()
      ->check(dgemma::integerIn(1, kMaxSteps));
  rlCommand
      ->add_option("--max-seconds", rl.maxSeconds, "stop and save after the step that reaches this wall-clock budget")
      ->check(dgemma::numberIn(0, kMaxTimeoutSeconds));
  rlCommand->add_option("--group-size", rl.groupSize, "rollouts per prompt (G)")->check(dgemma::integerIn(2, 1 << 16));
  rlCommand->add_option("--prompts-per-step", rl.promptsPerStep, "prompts per step, all ranks together")
      ->check(dgemma::integerIn(1, 1 << 20));
  rlCommand->add_option("--inner-updates", rl.innerUpdates, "optimizer updates per batch of rollouts (mu)")
      ->check(dgemma::integerIn(1, 1024));
  rlCommand
      ->add_option("--diffusion-samples", rl.diffusionSamples, "diffusion times per completion block in the estimate")
      ->check(dgemma::integerIn(1, 1024));
  rlCommand
      ->add_option("--max-new-tokens", rl.maxNewTokens,
                   "new tokens per rollout, in whole canvases (default: the plan's)")
      ->check(dgemma::integerIn(1, kMaxLength));
  rlCommand
      ->add_option("--denoising-steps", rl.denoisingSteps, "decoder passes per canvas at most (default: the plan's)")
      ->check(dgemma::integerIn(1, int64_t{1} << 24));
  rlCommand
      ->add_option("--temperature", rl.temperature,
                   "scales the sampler's temperature schedule (t_min, t_max) for the rollouts")
      ->check(dgemma::numberIn(0, 1e6, false));
  rlCommand
      ->add_option("--negative-advantage-scale", rl.negativeAdvantageScale,
                   "multiplies every negative advantage (1: GRPO's; 0: better-than-average rollouts only)")
      ->check(dgemma::numberIn(0, 1));
  rlCommand->add_option("--pass-threshold", rl.passThreshold, "a rollout passes when its reward is at least this")
      ->check(dgemma::numberIn(-1e30, 1e30));
  rlCommand->add_option("--seed", rl.session.seed, "seed of the prompt order, the rollouts and the estimate's noise")
      ->check(dgemma::anyUnsigned64());
  rlCommand->add_option("--lr", rl.lr, "peak learning rate")->check(dgemma::numberIn(0, kMaxLearningRate));
  rlCommand->add_option("--min-lr", rl.minLr, "learning rate at the end of the decay")
      ->check(dgemma::numberIn(0, kMaxLearningRate));
  rlCommand->add_option("--warmup", rl.warmupSteps, "linear warmup updates from 0")
      ->check(dgemma::integerIn(0, kMaxSteps));
  rlCommand->add_option("--lr-decay-style", rl.decayStyle, "constant | cosine | linear (over steps x inner updates)")
      ->check(CLI::IsMember({"cosine", "linear", "constant"}));
  rlCommand->add_option("--save-dir", rl.saveDir,
                        "checkpoint directory (a checkpoint at the end, and every --save-every)");
  rlCommand->add_option("--save-every", rl.saveEvery, "steps between checkpoints (0: only at the end)")
      ->check(dgemma::integerIn(0, kMaxSteps));
  rlCommand->add_option("--keep", rl.keep, "keep the newest K checkpoints (0: all)")
      ->check(dgemma::integerIn(0, kMaxKeep));
  rlCommand->add_flag("--resume", rl.resume, "continue from the newest checkpoint in --save-dir");
  rlCommand->add_flag("--overwrite", rlFlags.overwrite,
                      "a fresh run: delete another run's checkpoints in --save-dir first");
  rlCommand->add_option("--metrics", rl.metrics, "JSON Lines metrics file");
  rlCommand->add_option("--tensorboard", rl.tensorboard, "TensorBoard log directory");
  rlCommand->add_flag("--skip-bad-rows", rlFlags.skipBadRows,
                      "skip, count and list bad prompt rows instead of failing");
  addRankFlags(*rlCommand, rankFlags);

  dgemma::tool::GenerateFlags generateFlags;
  dgemma::tool::EvalFlags evalFlags;
  CLI::App* generate = app.add_subcommand("generate", "block-diffusion generation from a prompt or JSONL rows");
  CLI::App* eval = app.add_subcommand("eval", "generate a test split and score it against its completions (exact match)");
  for (auto [command, run] : {std::pair{generate, &generateFlags.run}, std::pair{eval, &evalFlags.run}}) {
    addPlanFlags(*command, run->session);
    command->add_option("--weights", run->session.weights, "HF or dgemma checkpoint directory")->required();
    command->add_option(
        "--tokenizer", run->tokenizer,
        "tokenizer directory: tokenizer.model, tokenizer.json or vocab.json + merges.txt (default: --weights)");
    command->add_option("--max-new-tokens", run->maxNewTokens, "new tokens to generate, in whole canvases (default: the plan's)")
        ->check(dgemma::integerIn(1, kMaxLength));
    command->add_option("--steps", run->steps, "max_denoising_steps: decoder passes per canvas at most (default: the plan's)")
        ->check(dgemma::integerIn(1, int64_t{1} << 24));
    command->add_option("--seed", run->seed, "seed of every draw (the same seed gives the same text in any batch)")
        ->check(dgemma::anyUnsigned64());
    command->add_flag("--skip-bad-rows", run->skipBadRows, "skip, count and list bad rows instead of failing");
    command->add_flag("--profile", run->profile, "time every kernel and host phase; print the profile on stderr at the end");
    command->add_option(
        "--adapter", run->session.adapter,
        "LoRA adapter directory (PEFT format) over the --weights base; a plan from dgemma-compile --lora");
  }
  generate->add_option("--prompt", generateFlags.prompt, "one user message, chat-formatted with the model's template");
  generate->add_option("--input", generateFlags.input, "JSONL rows (docs/data.md); a row's completion is ignored");
  generate->add_option("--image", generateFlags.images,
                       "an image of --prompt, before its text (repeatable, in order; the plan's images_per_example of them)");
  CLI::Option* json = generate->add_flag("--json", generateFlags.json, "one JSON object per request on stdout");
  generate->add_flag("--visual", generateFlags.visual, "redraw the canvas at every denoising step (on a terminal)")->excludes(json);
  eval->add_option("--test", evalFlags.test, "JSONL rows with completions")->required();
  eval->add_option("--out", evalFlags.out, "per-row results, JSON Lines (written atomically)");

  CheckDataFlags checkDataFlags;
  CLI::App* checkData = app.add_subcommand("check-data", "validate a JSONL data file as training would and print its counts");
  checkData->add_option("--data", checkDataFlags.data, "JSONL file")->required();
  checkData
      ->add_option("--tokenizer", checkDataFlags.tokenizer,
                   "tokenizer directory: tokenizer.model, tokenizer.json or vocab.json + merges.txt")
      ->required();
  checkData->add_option("--canvas-len", checkDataFlags.canvasLength, "block length")->check(dgemma::integerIn(1, kMaxLength));
  checkData->add_option("--max-encoder-len", checkDataFlags.maxEncoderLength, "longest encoder context allowed")
      ->check(dgemma::integerIn(1, kMaxLength));
  checkData->add_option("--max-soft-tokens", checkDataFlags.maxSoftTokens, "image soft tokens: 70, 140, 280, 560 or 1120")
      ->check(CLI::IsMember({70, 140, 280, 560, 1120}));
  checkData->add_option("--vocab-size", checkDataFlags.vocabSize, "model vocabulary size (default: the tokenizer's)")
      ->check(dgemma::integerIn(1, kMaxVocabSize));
  checkData->add_flag("--skip-bad-rows", checkDataFlags.skipBadRows, "skip, count and list bad rows instead of failing");

  CLI::App* forward = app.add_subcommand("forward", "run the plan's forward entry on a batch (safetensors in, safetensors out)");
  CLI::App* grad = app.add_subcommand("grad", "run the plan's training objective once and write the loss and every gradient");
  for (CLI::App* command : {forward, grad}) {
    addPlanFlags(*command, flags.session);
    command->add_option("--weights", flags.session.weights, "safetensors checkpoint directory or file");
    command->add_option("--init", flags.session.init, "random: draw parameters from their init distributions")->check(CLI::IsMember({"random"}));
    command->add_option("--seed", flags.session.seed, "seed for --init random")->check(dgemma::anyUnsigned64());
    command->add_option(
        "--adapter", flags.session.adapter,
        "LoRA adapter directory (PEFT format) over the --weights base; a plan from dgemma-compile --lora");
    command->add_option("--input", flags.input, "BATCH.safetensors")->required();
    command->add_option("--out", flags.output, "OUT.safetensors")->required();
    addRankFlags(*command, rankFlags);
  }
  grad->add_option("--step", flags.step, "step of the noise keys when the batch injects no noise")
      ->check(dgemma::anyUnsigned64());
  grad->add_option("--first-sample", flags.firstSample, "global sample index of the batch's first row (noise keys)")
      ->check(dgemma::integerIn(0, int64_t{1} << 62));

  dgemma::tool::ExportFlags exportFlags;
  CLI::App* exportCommand = app.add_subcommand("export", "write a checkpoint as an HF model directory (fp32 or bf16, sharded)");
  exportCommand->add_option("--weights", exportFlags.weights, "dgemma checkpoint directory, or an HF directory or file")->required();
  exportCommand->add_option("--out", exportFlags.out, "the HF directory to create (must not exist)")->required();
  exportCommand->add_option("--dtype", exportFlags.dtype, "fp32 | bf16 (round to nearest even)")->check(CLI::IsMember({"fp32", "bf16"}));
  exportCommand->add_option("--max-shard-size", exportFlags.maxShardSize, "tensor data per shard, e.g. 5GB (default), 500MB, 64KiB");
  CLI::Option* exportModel =
      exportCommand->add_option("--model", exportFlags.model, "HF directory or config.json to take the config from (default: --weights)");
  exportCommand->add_option("--plan", exportFlags.planDir, "plan directory whose recorded config to use (default: --weights)")
      ->excludes(exportModel);
  exportCommand->add_option(
      "--tokenizer", exportFlags.tokenizer,
      "tokenizer directory: tokenizer.json, tokenizer.model or vocab.json + merges.txt (default: --weights)");
  exportCommand->add_option("--merge-adapter", exportFlags.mergeAdapter,
                            "LoRA adapter directory (PEFT format) to merge into --weights: W + (alpha/r)·B·A");

  dgemma::tool::PreprocessFlags preprocessFlags;
  CLI::App* preprocess = dgemma::tool::addPreprocessCommand(app, preprocessFlags);
  dgemma::tool::InspectDataFlags inspectDataFlags;
  CLI::App* inspectData = dgemma::tool::addInspectDataCommand(app, inspectDataFlags);
  dgemma::tool::SampleFlags sampleFlags;
  CLI::App* sample = dgemma::tool::addSampleCommand(app, sampleFlags);

  CLI::App* inspect = app.add_subcommand("inspect", "validate a plan and print its summary");
  addPlanFlags(*inspect, flags.session);
  inspect->add_option("--rank", flags.session.rank, "which rank's plan")->check(dgemma::integerIn(0, kMaxRank));

  int exitCode = 0;
  if (!dgemma::parseCommandLine(app, argc, argv, exitCode)) return exitCode;
  generateFlags.promptGiven = generate->get_option("--prompt")->count() > 0;
  sampleFlags.stepsGiven = sample->get_option("--steps")->count() > 0;
  // Generation's time is mostly f32 GEMMs: not on OpenBLAS's Prescott fallback core (OpenBlasCore.h).
  // Training keeps OpenBLAS's own choice for now: the demo recipe's outcome depends on the GEMMs'
  // summation order (docs/generation.md, "Performance").
  if (generate->parsed() || eval->parsed() || sample->parsed()) dgemma::reexecWithBetterOpenBlasCore(argv);
  // Every command threads the products on the backend's pool (BlasThreading.h): a step is many
  // products next to the pool's own kernels, OpenBLAS's threads would spin beside them, and each
  // product's bytes are then the same for every thread count.
  dgemma::threadProductsOnPool();
  // The plan-running commands run as one rank of several: started here (--nproc-per-node), or by
  // dgemma-run, torchrun, Slurm or mpirun, whose environment names the rank.
  const bool runsPlan = train->parsed() || rlCommand->parsed() || forward->parsed() || grad->parsed();
  SessionOptions& session = train->parsed() ? trainFlags.session : rlCommand->parsed() ? rl.session : flags.session;
  dgemma::RankEnvironment environment;
  std::optional<int> launched;
  exitCode = dgemma::runReportingErrors("dgemma-run", [&]() -> int {
    if (!runsPlan) return 0;
    environment = dgemma::detectRankEnvironment(dgemma::processEnvironment());
    launched = launchLocalRanksIfAsked(rankFlags, environment, session.planDir, argc, argv);
    applyRankEnvironment(environment, rankFlags, session);
    if (rlCommand->parsed()) rlFlags.runIdentity = runIdentity(environment);
    if (train->parsed()) {
      trainFlags.runIdentity = runIdentity(environment);
      applyElasticResume(environment, elasticResume, trainFlags);
      // mpirun, srun and torchrun relay a rank's stdout into their own (Open MPI through a
      // pseudo-terminal that is not the user's): progress as whole lines there.
      trainFlags.progressInPlace = environment.launcher == dgemma::Launcher::None ||
                                   environment.launcher == dgemma::Launcher::DgemmaRun;
    }
    return 0;
  }, dgemma::reportToElasticAgent);
  if (exitCode != 0) return exitCode;
  if (launched) return *launched;
  const std::string tool =
      environment.worldSize > 1 ? "dgemma-run (rank " + std::to_string(environment.rank) + ")" : "dgemma-run";
  return dgemma::runReportingErrors(tool, [&]() -> int {
    checkOutputPaths(*train, *eval, *exportCommand, trainFlags, evalFlags, exportFlags, flags);
    if (inspect->parsed()) return runInspect(flags);
    if (runsPlan) {
      try {
        if (forward->parsed()) return runForward(flags);
        if (grad->parsed()) return runGrad(flags);
        if (rlCommand->parsed()) return dgemma::tool::runRl(rlFlags, loadPlan(rl.session));
        dgemma::Plan plan = loadPlan(trainFlags.session);
        dgemma::tool::applyPlanRunDefaults(*train, plan, dgemma::planFileForRank(trainFlags.session.planDir, trainFlags.session.rank));
        return dgemma::runTrain(trainFlags, std::move(plan));
      } catch (const dgemma::PeerLostError&) {
        // Most likely another rank failed first and its exit closed the connections: this rank
        // leaves a moment later, so that a launcher watching both (torchrun's root cause, the local
        // launcher's first failure) names that rank, not this consequence.
        std::this_thread::sleep_for(kPeerLostExitDelay);
        throw;
      }
    }
    if (generate->parsed()) return dgemma::tool::runGenerate(generateFlags);
    if (eval->parsed()) return dgemma::tool::runEval(evalFlags);
    if (exportCommand->parsed()) return dgemma::tool::runExport(exportFlags);
    if (preprocess->parsed()) return dgemma::tool::runPreprocess(preprocessFlags);
    if (inspectData->parsed()) return dgemma::tool::runInspectData(inspectDataFlags);
    if (sample->parsed()) return dgemma::tool::runSample(sampleFlags);
    return runCheckData(checkDataFlags);
  }, dgemma::reportToElasticAgent);
}
