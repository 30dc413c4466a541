#include "runtime/generate/Generator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "runtime/generate/CanvasFinalization.h"
#include "runtime/generate/DenoisingBatch.h"
#include "runtime/generate/EntryRuns.h"
#include "runtime/generate/Temperature.h"
#include "runtime/data/dataset/Dataset.h"
#include "support/Error.h"

namespace dgemma {

const char* finishReasonName(FinishReason reason) { return reason == FinishReason::Eos ? "eos" : "length"; }

namespace {

// Adds the seconds from its construction to its end to `total`.
class PhaseTimer {
 public:
  explicit PhaseTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

// positions[b, l] = first + l on every row (transformers' one shared arange).
std::vector<int64_t> sharedPositions(int64_t rows, int64_t length, int64_t first) {
  std::vector<int64_t> positions(rows * length);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t l = 0; l < length; ++l) positions[row * length + l] = first + l;
  return positions;
}

}  // namespace

Generator::Generator(Session& session, const GeneratorOptions& options) : session_(session) {
  const Plan& plan = session.plan;
  const std::string& planPath = session.planPath;
  if (!plan.generation) throw InputError(planPath + ": no generation settings (compile the plan with dgemma-compile --mode infer)");
  if (session.worldSize != 1)
    throw InputError("generation runs on one rank; the plan has " + std::to_string(session.worldSize));
  settings_ = *plan.generation;
  if (options.maxNewTokens < 0 || options.maxNewTokens > settings_.maxNewTokens)
    throw InputError("max_new_tokens: expected 1 to " + std::to_string(settings_.maxNewTokens) +
                     " (the plan's cache is sized for that; recompile for more), got " + std::to_string(options.maxNewTokens));
  if (options.maxNewTokens > 0) settings_.maxNewTokens = options.maxNewTokens;
  if (options.maxDenoisingSteps < 0 || static_cast<uint64_t>(options.maxDenoisingSteps) > (uint64_t{1} << 24))
    throw InputError("max_denoising_steps: expected 1 to 2^24, got " + std::to_string(options.maxDenoisingSteps));
  if (options.maxDenoisingSteps > 0) settings_.maxDenoisingSteps = options.maxDenoisingSteps;
  if (!(options.temperatureScale > 0 && options.temperatureScale <= 1e6))
    throw InputError("temperature: expected a scale in (0, 1e6], got " + std::to_string(options.temperatureScale));
  settings_.tMin *= options.temperatureScale;
  settings_.tMax *= options.temperatureScale;
  if (settings_.maxDenoisingSteps < 1 || settings_.canvasLength < 1)
    throw InputError(planPath + ": generation: expected max_denoising_steps and canvas_length >= 1");
  const ModelContract& names = session_.model->contract();
  vocabSize_ = session_.model->tokens(plan, planPath).vocabSize;

  denoise_ = &entryNamed(plan, names.denoiseEntry, planPath);
  commit_ = &entryNamed(plan, names.commitEntry, planPath);
  denoiseFirst_ = denoise_;
  for (const EntryPoint& entry : plan.entryPoints)
    if (entry.name == names.firstDenoiseEntry) denoiseFirst_ = &entry;
  if (denoiseFirst_->bucket != denoise_->bucket)
    throw InputError(planPath + ": entry " + denoiseFirst_->key() + ": expected the buckets of " + denoise_->key());
  entryNamed(plan, names.prefillEntry, planPath);
  const std::string& microBatch = names.microBatchDimension;
  const std::string& promptLength = names.promptLengthDimension;
  microBatch_ = denoise_->bucket.count(microBatch) ? denoise_->bucket.at(microBatch) : 0;
  for (const EntryPoint& entry : plan.entryPoints) {
    if (entry.name != names.prefillEntry) continue;
    if (!entry.bucket.count(promptLength) || entry.bucket.count(microBatch) == 0 ||
        entry.bucket.at(microBatch) != microBatch_)
      throw InputError(planPath + ": entry " + entry.key() + ": expected the buckets {" + microBatch + ": " +
                       std::to_string(microBatch_) + ", " + promptLength + ": P} (the " + names.denoiseEntry +
                       " entry's micro-batch)");
    maxPromptLength_ = std::max(maxPromptLength_, entry.bucket.at(promptLength));
  }
  if (microBatch_ < 1)
    throw InputError(planPath + ": entry " + denoise_->key() + ": expected a " + microBatch + " bucket");
  for (const EntryPoint& entry : plan.entryPoints) {
    if (entry.name != names.imagePrefillEntry) continue;
    auto images = entry.bucket.find("images_per_example");
    if (images == entry.bucket.end() || images->second < 1 ||
        (imagesPerExample_ != 0 && images->second != imagesPerExample_) || entry.bucket.count(microBatch) == 0 ||
        entry.bucket.at(microBatch) != microBatch_)
      throw InputError(planPath + ": entry " + entry.key() + ": expected the buckets of a " + names.prefillEntry +
                       " entry plus one images_per_example >= 1");
    imagesPerExample_ = images->second;
  }
  if (imagesPerExample_ > 0) imageOptions_ = session_.model->imageOptions(plan, planPath);
  if (maxPromptLength_ > settings_.cacheLength)
    throw InputError(planPath + ": generation: cache_length " + std::to_string(settings_.cacheLength) +
                     " is below the largest prompt bucket " + std::to_string(maxPromptLength_));
}

int64_t Generator::canvases() const {
  return (settings_.maxNewTokens + settings_.canvasLength - 1) / settings_.canvasLength;
}

std::vector<GenerationResult> Generator::generate(std::span<const GenerationRequest> requests, DrawSource& draws,
                                                  GenerationObserver* observer) {
  for (const GenerationRequest& request : requests) {
    if (request.promptIds.empty()) throw InputError("request " + std::to_string(request.id) + ": the prompt is empty");
    if (static_cast<int64_t>(request.promptIds.size()) > maxPromptLength_)
      throw InputError("request " + std::to_string(request.id) + ": the prompt has " + std::to_string(request.promptIds.size()) +
                       " tokens; the plan's largest prefill bucket holds " + std::to_string(maxPromptLength_) +
                       " (dgemma-compile --prompt-len)");
    for (int64_t id : request.promptIds)
      if (id < 0 || id >= vocabSize_)
        throw InputError("request " + std::to_string(request.id) + ": token id " + std::to_string(id) +
                         " is out of range for vocab_size " + std::to_string(vocabSize_));
    if (request.images.empty()) continue;
    const int64_t images = static_cast<int64_t>(request.images.size());
    if (imagesPerExample_ == 0)
      throw InputError("request " + std::to_string(request.id) + ": " + std::to_string(images) +
                       " image(s), but the plan is text-only (compile it with dgemma-compile --images-per-example " +
                       std::to_string(images) + ")");
    if (images != imagesPerExample_)
      throw InputError("request " + std::to_string(request.id) + ": " + std::to_string(images) + " image(s); the plan takes " +
                       std::to_string(imagesPerExample_) + " per prompt (its images_per_example)");
    if (request.promptTokenTypes.size() != request.promptIds.size())
      throw InputError("request " + std::to_string(request.id) + ": expected one token type per prompt token");
  }
  // A micro-batch runs one prefill entry: text prompts and prompts with images go separately.
  std::vector<GenerationRequest> byModality[2];
  std::vector<size_t> positions[2];
  for (size_t index = 0; index < requests.size(); ++index) {
    const int modality = requests[index].images.empty() ? 0 : 1;
    byModality[modality].push_back(requests[index]);
    positions[modality].push_back(index);
  }
  std::vector<GenerationResult> results(requests.size());
  for (int modality = 0; modality < 2; ++modality) {
    const std::span<const GenerationRequest> group(byModality[modality]);
    std::vector<GenerationResult> groupResults;
    for (size_t first = 0; first < group.size(); first += microBatch_)
      generateMicroBatch(group.subspan(first, std::min<size_t>(microBatch_, group.size() - first)), draws, observer, groupResults);
    for (size_t i = 0; i < groupResults.size(); ++i) results[positions[modality][i]] = std::move(groupResults[i]);
  }
  return results;
}

void Generator::generateMicroBatch(std::span<const GenerationRequest> requests, DrawSource& draws,
                                   GenerationObserver* observer, std::vector<GenerationResult>& results) {
  const int64_t B = microBatch_, L = settings_.canvasLength, C = settings_.cacheLength;
  const int64_t N = settings_.maxDenoisingSteps, pad = settings_.padTokenId;
  const int64_t real = static_cast<int64_t>(requests.size());
  const std::string& planPath = session_.planPath;

  // Prefill: the batch's prompts left-padded to its widest (positions 0 .. width-1, shared), and
  // that to the bucket (negative positions, masked).
  int64_t width = 0;
  for (const GenerationRequest& request : requests) width = std::max<int64_t>(width, request.promptIds.size());
  const bool images = !requests.front().images.empty();
  const ModelContract& names = session_.model->contract();
  std::map<std::string, int64_t> sizes = {{names.microBatchDimension, B}, {names.promptLengthDimension, width}};
  if (images) sizes["images_per_example"] = imagesPerExample_;
  const EntryPoint* prefill = session_.plan.selectEntry(images ? names.imagePrefillEntry : names.prefillEntry, sizes);
  if (!prefill)
    throw InputError(planPath + ": no " + names.prefillEntry + " bucket holds a prompt of " + std::to_string(width) +
                     " tokens");
  const int64_t P = prefill->bucket.at(names.promptLengthDimension);
  std::vector<int64_t> inputIds(B * P, pad), attentionMask(B * P, 0), tokenTypes(B * P, 0);
  std::vector<std::vector<ProcessedImage>> rowImages;
  for (int64_t row = 0; row < B; ++row) {
    // Rows that pad a short batch repeat the first prompt: real, finite inputs whose outputs are dropped.
    const GenerationRequest& request = requests[row < real ? row : 0];
    const std::vector<int64_t>& prompt = request.promptIds;
    const int64_t start = P - static_cast<int64_t>(prompt.size());
    std::copy(prompt.begin(), prompt.end(), inputIds.begin() + row * P + start);
    std::fill(attentionMask.begin() + row * P + start, attentionMask.begin() + (row + 1) * P, 1);
    std::copy(request.promptTokenTypes.begin(), request.promptTokenTypes.end(), tokenTypes.begin() + row * P + start);
    if (images) rowImages.push_back(request.images);
  }
  {
    PhaseTimer timer(phaseTimes_.prefill);
    ++phaseTimes_.prefills;
    std::map<std::string, HostTensor> inputs = {{names.batch.inputIds, i64Tensor({B, P}, inputIds)},
                                                {names.batch.attentionMask, i64Tensor({B, P}, attentionMask)},
                                                {names.positions, i64Tensor({B, P}, sharedPositions(B, P, width - P))},
                                                {names.writeRows, f32Tensor({B}, std::vector<float>(B, 1.0f))}};
    if (images) {
      inputs.merge(collateImages(rowImages, names.images));
      inputs[names.batch.tokenTypeIds] = i64Tensor({B, P}, tokenTypes);
      addImagePlanInputs(inputs, imagesPerExample_, imageOptions_, names.images,
                         "requests " + std::to_string(requests.front().id) + ".." + std::to_string(requests.back().id));
    }
    runEntryPoint(session_, *prefill, std::move(inputs));
  }
  // The cache's validity: the last P slots hold the prompt's mask; each commit shifts in L ones.
  std::vector<int64_t> cacheValid(B * C, 0);
  for (int64_t row = 0; row < B; ++row)
    std::copy(attentionMask.begin() + row * P, attentionMask.begin() + (row + 1) * P, cacheValid.begin() + row * C + (C - P));

  std::vector<int64_t> requestIds(real);
  std::vector<GenerationResult> batchResults(real);
  for (int64_t row = 0; row < real; ++row) {
    requestIds[row] = requests[row].id;
    batchResults[row].id = requests[row].id;
  }
  std::vector<uint8_t> finished(B, 0);
  std::fill(finished.begin() + real, finished.end(), 1);  // padding rows take part in nothing
  DenoisingBatch batch(settings_, B);
  std::vector<int64_t> committed;
  const int64_t canvasCount = canvases();
  for (int64_t canvas = 0; canvas < canvasCount; ++canvas) {
    const int64_t canvasStart = width + canvas * L;  // transformers' cur_len
    if (canvas > 0) {
      PhaseTimer timer(phaseTimes_.commit);
      ++phaseTimes_.commits;
      runEntryPoint(session_, *commit_,
                    {{names.blockIds, i64Tensor({B, L}, committed)},
                     {names.cacheValid, i64Tensor({B, C}, cacheValid)},
                     {names.positions, i64Tensor({B, L}, sharedPositions(B, L, canvasStart - L))},
                     {names.writeRows, f32Tensor({B}, std::vector<float>(B, 1.0f))}});
      for (int64_t row = 0; row < B; ++row) {
        auto rowBegin = cacheValid.begin() + row * C;
        std::copy(rowBegin + L, rowBegin + C, rowBegin);
        std::fill(rowBegin + (C - L), rowBegin + C, 1);
      }
    }
    std::vector<uint8_t> takesPart(B);
    std::vector<int64_t> initial(B * L, pad);
    for (int64_t row = 0; row < B; ++row) {
      takesPart[row] = finished[row] ? 0 : 1;
      if (takesPart[row]) draws.initialCanvas(requestIds[row], canvas, std::span<int64_t>(initial.data() + row * L, L));
    }
    batch.startCanvas(takesPart, std::move(initial));
    const std::vector<int64_t> positions = sharedPositions(B, L, canvasStart);
    for (int64_t step = 0; step < N; ++step) {
      const int64_t remaining = N - step;
      const float temperature = scheduledTemperature(settings_.tMin, settings_.tMax, remaining, N);
      const std::vector<uint8_t> frozenBefore = batch.frozen();
      std::vector<float> frozenInput(B), selfConditioning(B, step > 0 ? 1.0f : 0.0f);
      std::vector<int64_t> keys(B * 2, 0);
      for (int64_t row = 0; row < B; ++row) {
        frozenInput[row] = frozenBefore[row] ? 1.0f : 0.0f;
        if (row < real) {
          const std::array<int64_t, 2> key = draws.sampleKey({requestIds[row], canvas, step});
          keys[2 * row] = key[0];
          keys[2 * row + 1] = key[1];
        }
      }
      // The first pass has no signal: the entry without the self-conditioning work.
      const EntryPoint& denoise = step == 0 ? *denoiseFirst_ : *denoise_;
      std::map<std::string, HostTensor> outputs;
      {
        PhaseTimer timer(phaseTimes_.denoise);
        ++phaseTimes_.denoisePasses;
        outputs = runEntryPoint(session_, denoise,
                                {{names.batch.canvasIds, i64Tensor({B, L}, batch.canvas())},
                                 {names.cacheValid, i64Tensor({B, C}, cacheValid)},
                                 {names.positions, i64Tensor({B, L}, positions)},
                                 {names.selfConditioningMask, f32Tensor({B}, selfConditioning)},
                                 {names.frozen, f32Tensor({B}, frozenInput)},
                                 {names.temperature, f32Tensor({B}, std::vector<float>(B, temperature))},
                                 {names.sampleKeys, i64Tensor({B, 2}, keys)}});
      }
      PhaseTimer samplerTimer(phaseTimes_.samplerHost);
      HostTensor sampled = entryOutput(outputs, names.sampledIds, DType::I64, B * L, denoise, planPath);
      HostTensor argmax = entryOutput(outputs, names.argmaxIds, DType::I64, B * L, denoise, planPath);
      HostTensor entropy = entryOutput(outputs, names.entropy, DType::F32, B * L, denoise, planPath);
      for (int64_t row = 0; row < real; ++row)
        if (!frozenBefore[row])
          draws.replaceSampled({requestIds[row], canvas, step}, std::span<int64_t>(sampled.as<int64_t>() + row * L, L));
      const std::vector<uint8_t> accepted = batch.applyPass(
          std::span<const int64_t>(sampled.as<int64_t>(), B * L), std::span<const int64_t>(argmax.as<int64_t>(), B * L),
          std::span<const float>(entropy.as<float>(), B * L),
          [&](int64_t row, std::span<int64_t> ids) { draws.renoiseIds({requestIds[row], canvas, step}, ids); });
      if (observer) {
        DenoisePassReport report;
        report.canvas = canvas;
        report.step = step;
        report.remaining = remaining;
        report.temperature = temperature;
        report.canvasLength = L;
        report.requests = requestIds;
        report.sampled = std::span<const int64_t>(sampled.as<int64_t>(), real * L);
        report.argmax = std::span<const int64_t>(argmax.as<int64_t>(), real * L);
        report.entropy = std::span<const float>(entropy.as<float>(), real * L);
        report.accepted = std::span<const uint8_t>(accepted.data(), real * L);
        report.newCanvas = std::span<const int64_t>(batch.canvas().data(), real * L);
        report.frozen = std::span<const uint8_t>(frozenBefore.data(), real);
        report.done = std::span<const uint8_t>(batch.frozen().data(), real);
        observer->onDenoisePass(report);
      }
      if (batch.allFrozen()) break;
    }

    // Commit the argmax canvas, after the EOS rule.
    PhaseTimer eosTimer(phaseTimes_.samplerHost);
    committed = batch.argmaxCanvas();
    std::vector<int64_t> passes(real);
    for (int64_t row = 0; row < B; ++row) {
      const bool finishedBefore = finished[row] != 0;
      std::span<int64_t> tokens(committed.data() + row * L, L);
      finished[row] = finalizeCanvas(tokens, finishedBefore, settings_.eosTokenIds, pad) ? 1 : 0;
      if (row >= real) continue;
      passes[row] = batch.passes(row);
      if (finishedBefore) continue;
      GenerationResult& result = batchResults[row];
      result.newTokens.insert(result.newTokens.end(), tokens.begin(), tokens.end());
      result.stepsPerCanvas.push_back(batch.passes(row));
      result.decoderPasses += batch.passes(row);
      if (finished[row]) result.finishReason = FinishReason::Eos;
    }
    if (observer) {
      CanvasCommitReport report;
      report.canvas = canvas;
      report.canvasLength = L;
      report.requests = requestIds;
      report.tokens = std::span<const int64_t>(committed.data(), real * L);
      report.passes = passes;
      report.finished = std::span<const uint8_t>(finished.data(), real);
      observer->onCanvasCommitted(report);
    }
    if (std::all_of(finished.begin(), finished.end(), [](uint8_t done) { return done != 0; })) break;
  }
  for (GenerationResult& result : batchResults) {
    result.tokensPerForward = tokensPerForward(result.newTokens, result.decoderPasses, pad);
    results.push_back(std::move(result));
  }
}

}  // namespace dgemma
