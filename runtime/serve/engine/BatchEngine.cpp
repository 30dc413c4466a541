#include "runtime/serve/engine/BatchEngine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "runtime/data/dataset/Dataset.h"
#include "runtime/generate/CanvasFinalization.h"
#include "runtime/generate/DrawSource.h"
#include "runtime/generate/EntropyBoundAcceptance.h"
#include "runtime/generate/EntryRuns.h"
#include "runtime/generate/GenerationKeys.h"
#include "runtime/generate/StopRule.h"
#include "runtime/generate/Temperature.h"
#include "support/Error.h"

namespace dgemma::serve {

const char* jobEndName(JobEnd end) {
  switch (end) {
    case JobEnd::Eos: return "eos";
    case JobEnd::Length: return "length";
    case JobEnd::Cancelled: return "cancelled";
    case JobEnd::Failed: return "failed";
  }
  return "failed";
}

struct BatchEngine::Queued {
  GenerationJob job;
  std::shared_ptr<JobHandle> handle;
};

// A slot's job between engine steps.
struct BatchEngine::Slot {
  enum class Phase { Prefill, Denoise, Commit };

  Slot(GenerationJob job, std::shared_ptr<JobHandle> handle, const GenerationSettings& settings, int64_t vocabSize)
      : job(std::move(job)),
        handle(std::move(handle)),
        draws(this->job.sampling.seed, vocabSize),
        stopRule(settings.stabilityThreshold, settings.confidenceThreshold, settings.canvasLength) {
    const SamplingOptions& sampling = this->job.sampling;
    steps = sampling.denoisingSteps > 0 ? sampling.denoisingSteps : settings.maxDenoisingSteps;
    entropyBound = sampling.entropyBound > 0 ? sampling.entropyBound : settings.entropyBound;
    promptLength = static_cast<int64_t>(this->job.promptIds.size());
  }

  int64_t drawRequest() const { return job.sampling.drawRequest; }

  GenerationJob job;
  std::shared_ptr<JobHandle> handle;
  CounterDrawSource draws;
  StopRule stopRule;
  Phase phase = Phase::Prefill;
  int64_t steps = 0;
  double entropyBound = 0;
  int64_t promptLength = 0;
  int64_t canvas = 0;  // the canvas being denoised (or, in Commit, the one to encode next is canvas - 1)
  int64_t step = 0;    // passes of the current canvas so far
  std::vector<int64_t> cacheValid;               // [C]: the slots of this row's cache that hold keys
  std::vector<int64_t> current, argmax, block;   // [L]: the canvas, its argmax, the committed canvas
  int64_t emitted = 0;  // completion tokens so far (EOS included)
  int64_t passes = 0;
};

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

BatchEngine::BatchEngine(Session& session, EngineOptions options) : session_(session), options_(std::move(options)) {
  const Plan& plan = session.plan;
  const std::string& planPath = session.planPath;
  if (!plan.generation)
    throw InputError(planPath + ": no generation settings (compile the plan with dgemma-compile --mode infer)");
  if (session.worldSize != 1)
    throw InputError("serving runs on one rank; the plan has " + std::to_string(session.worldSize));
  if (options_.maxQueued < 0)
    throw InputError("the queue bound must be >= 0, got " + std::to_string(options_.maxQueued));
  settings_ = *plan.generation;
  const ModelContract& names = session.model->contract();
  vocabSize_ = session.model->tokens(plan, planPath).vocabSize;
  denoise_ = &entryNamed(plan, names.denoiseEntry, planPath);
  denoiseFirst_ = denoise_;
  for (const EntryPoint& entry : plan.entryPoints)
    if (entry.name == names.firstDenoiseEntry) denoiseFirst_ = &entry;
  commit_ = &entryNamed(plan, names.commitEntry, planPath);
  slots_ = denoise_->bucket.count(names.microBatchDimension) ? denoise_->bucket.at(names.microBatchDimension) : 0;
  if (slots_ < 1)
    throw InputError(planPath + ": entry " + denoise_->key() + ": expected a " + names.microBatchDimension + " bucket");
  for (const EntryPoint& entry : plan.entryPoints) {
    const bool textPrefill = entry.name == names.prefillEntry, imagePrefill = entry.name == names.imagePrefillEntry;
    if (!textPrefill && !imagePrefill && &entry != commit_) continue;
    if (!takesInput(entry, names.writeRows))
      throw InputError(planPath + ": entry " + entry.key() + " takes no \"" + names.writeRows +
                       "\" input: the plan predates serving; compile it again with dgemma-compile --mode infer");
    if (!textPrefill && !imagePrefill) continue;
    if (!entry.bucket.count(names.promptLengthDimension) || entry.bucket.at(names.microBatchDimension) != slots_)
      throw InputError(planPath + ": entry " + entry.key() + ": expected the micro-batch of " + denoise_->key());
    if (textPrefill) maxPromptLength_ = std::max(maxPromptLength_, entry.bucket.at(names.promptLengthDimension));
    if (imagePrefill) imagesPerExample_ = entry.bucket.at("images_per_example");
  }
  if (maxPromptLength_ < 1) throw InputError(planPath + ": no \"" + names.prefillEntry + "\" entry point");
  if (imagesPerExample_ > 0) imageOptions_ = session.model->imageOptions(plan, planPath);
  rows_.resize(slots_);
}

BatchEngine::~BatchEngine() = default;

std::shared_ptr<JobHandle> BatchEngine::submit(GenerationJob job) {
  const int64_t length = static_cast<int64_t>(job.promptIds.size());
  if (length == 0) throw InputError("the prompt is empty");
  if (length > maxPromptLength_)
    throw InputError("the prompt has " + std::to_string(length) + " tokens; the server's largest prompt bucket holds " +
                     std::to_string(maxPromptLength_) + " (dgemma-serve --prompt-len)");
  for (int64_t id : job.promptIds)
    if (id < 0 || id >= vocabSize_)
      throw InputError("prompt token id " + std::to_string(id) + " is out of range for vocab_size " +
                       std::to_string(vocabSize_));
  const int64_t images = static_cast<int64_t>(job.images.size());
  if (images > 0 && imagesPerExample_ == 0)
    throw InputError("the request has " + std::to_string(images) +
                     " image(s), but the server's plan is text-only (dgemma-serve --images-per-example)");
  if (images > 0 && images != imagesPerExample_)
    throw InputError("the request has " + std::to_string(images) + " image(s); the server takes " +
                     std::to_string(imagesPerExample_) + " per prompt, or none");
  if (images > 0 && job.promptTokenTypes.size() != job.promptIds.size())
    throw InputError("expected one token type per prompt token");
  const SamplingOptions& sampling = job.sampling;
  if (sampling.maxTokens < 1 || sampling.maxTokens > settings_.maxNewTokens)
    throw InputError("max_tokens: expected 1 to " + std::to_string(settings_.maxNewTokens) +
                     " (dgemma-serve --max-new-tokens), got " + std::to_string(sampling.maxTokens));
  if (!(sampling.temperature >= 0) || !std::isfinite(sampling.temperature))
    throw InputError("temperature: expected a finite number >= 0");
  if (sampling.denoisingSteps < 0 || static_cast<uint64_t>(sampling.denoisingSteps) > kMaxKeyedSteps)
    throw InputError("denoising_steps: expected 1 to " + std::to_string(kMaxKeyedSteps));
  if (!(sampling.entropyBound >= 0) || !std::isfinite(sampling.entropyBound))
    throw InputError("entropy_bound: expected a finite number > 0");
  if (sampling.drawRequest < 0) throw InputError("the draw request id must be >= 0");
  if (!job.sink) throw InputError("a generation job needs a sink");

  auto handle = std::make_shared<JobHandle>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw EngineFull("the server is shutting down");
    if (static_cast<int64_t>(queue_.size()) >= options_.maxQueued)
      throw EngineFull("the queue holds " + std::to_string(queue_.size()) + " requests waiting for one of " +
                       std::to_string(slots_) + " slots");
    queue_.push_back(std::make_unique<Queued>(Queued{std::move(job), handle}));
  }
  wake_.notify_one();
  return handle;
}

void BatchEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

int64_t BatchEngine::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(queue_.size());
}

int64_t BatchEngine::activeSlots() const { return active_.load(); }

void BatchEngine::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || active_.load() > 0; });
      if (stopping_ && queue_.empty() && active_.load() == 0) return;
    }
    step();
  }
}

void BatchEngine::record(const EntryPoint& entry, bool denoising, double seconds, int64_t rows) {
  if (options_.onStep) options_.onStep({entry.name, denoising, seconds, rows});
}

void BatchEngine::step() {
  endCancelled();
  admit();
  try {
    prefill(/*images=*/false);
    prefill(/*images=*/true);
    commit();
    denoise();
  } catch (const std::exception& error) {
    // An entry that fails fails every job in the batch; the engine goes on with new ones.
    for (std::unique_ptr<Slot>& slot : rows_)
      if (slot) end(*slot, JobEnd::Failed, error.what());
  }
}

void BatchEngine::endCancelled() {
  std::vector<std::unique_ptr<Queued>> cancelled;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->handle->cancelled()) {
        cancelled.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::unique_ptr<Queued>& job : cancelled) job->job.sink->onEnd({JobEnd::Cancelled, 0, 0, ""});
  for (std::unique_ptr<Slot>& slot : rows_)
    if (slot && slot->handle->cancelled()) end(*slot, JobEnd::Cancelled);
}

void BatchEngine::admit() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::unique_ptr<Slot>& slot : rows_) {
    if (slot) continue;
    if (queue_.empty()) return;
    std::unique_ptr<Queued> next = std::move(queue_.front());
    queue_.pop_front();
    slot = std::make_unique<Slot>(std::move(next->job), std::move(next->handle), settings_, vocabSize_);
    active_.fetch_add(1);
  }
}

// The slot is free before the sink hears of the end, so whoever the sink wakes sees it free.
void BatchEngine::end(Slot& slot, JobEnd end, const std::string& error) {
  for (std::unique_ptr<Slot>& row : rows_)
    if (row.get() == &slot) {
      const std::unique_ptr<Slot> ended = std::move(row);
      active_.fetch_sub(1);
      ended->job.sink->onEnd({end, ended->emitted, ended->passes, error});
      return;
    }
}

// The joining slots of one modality, each prompt left-padded to the smallest bucket that holds the
// widest, positions its own (negative on the padding, which is masked): what `generate` gives a
// batch of one. Rows that do not join repeat a joining row's inputs (real, finite values) and are
// not written.
void BatchEngine::prefill(bool images) {
  std::vector<int64_t> joining;
  int64_t width = 0;
  for (int64_t row = 0; row < slots_; ++row) {
    const Slot* slot = rows_[row].get();
    if (!slot || slot->phase != Slot::Phase::Prefill || slot->job.images.empty() == images) continue;
    joining.push_back(row);
    width = std::max(width, slot->promptLength);
  }
  if (joining.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  const ModelContract& names = session_.model->contract();
  const int64_t B = slots_, C = settings_.cacheLength, pad = settings_.padTokenId;
  std::map<std::string, int64_t> sizes = {{names.microBatchDimension, B}, {names.promptLengthDimension, width}};
  if (images) sizes["images_per_example"] = imagesPerExample_;
  const EntryPoint* entry = session_.plan.selectEntry(images ? names.imagePrefillEntry : names.prefillEntry, sizes);
  if (!entry)
    throw InputError(session_.planPath + ": no prefill bucket holds a prompt of " + std::to_string(width) + " tokens");
  const int64_t P = entry->bucket.at(names.promptLengthDimension);
  std::vector<int64_t> inputIds(B * P, pad), attentionMask(B * P, 0), positions(B * P, 0), tokenTypes(B * P, 0);
  std::vector<float> writeRows(B, 0.0f);
  std::vector<std::vector<ProcessedImage>> rowImages;
  for (int64_t row = 0; row < B; ++row) {
    const bool joins = std::find(joining.begin(), joining.end(), row) != joining.end();
    const Slot& slot = *rows_[joins ? row : joining.front()];
    const int64_t length = slot.promptLength, start = P - length;
    std::copy(slot.job.promptIds.begin(), slot.job.promptIds.end(), inputIds.begin() + row * P + start);
    std::fill(attentionMask.begin() + row * P + start, attentionMask.begin() + (row + 1) * P, 1);
    std::iota(positions.begin() + row * P, positions.begin() + (row + 1) * P, -start);
    std::copy(slot.job.promptTokenTypes.begin(), slot.job.promptTokenTypes.end(), tokenTypes.begin() + row * P + start);
    if (images) rowImages.push_back(slot.job.images);
    writeRows[row] = joins ? 1.0f : 0.0f;
  }
  std::map<std::string, HostTensor> inputs = {{names.batch.inputIds, i64Tensor({B, P}, inputIds)},
                                              {names.batch.attentionMask, i64Tensor({B, P}, attentionMask)},
                                              {names.positions, i64Tensor({B, P}, positions)},
                                              {names.writeRows, f32Tensor({B}, writeRows)}};
  if (images) {
    inputs.merge(collateImages(rowImages, names.images));
    inputs[names.batch.tokenTypeIds] = i64Tensor({B, P}, tokenTypes);
    addImagePlanInputs(inputs, imagesPerExample_, imageOptions_, names.images, "the joining requests");
  }
  runEntryPoint(session_, *entry, std::move(inputs));
  for (int64_t row : joining) {
    Slot& slot = *rows_[row];
    slot.cacheValid.assign(C, 0);
    std::fill(slot.cacheValid.end() - slot.promptLength, slot.cacheValid.end(), 1);
    startCanvas(slot);
  }
  record(*entry, false, secondsSince(started), static_cast<int64_t>(joining.size()));
}

void BatchEngine::startCanvas(Slot& slot) {
  const int64_t L = settings_.canvasLength;
  slot.phase = Slot::Phase::Denoise;
  slot.step = 0;
  slot.stopRule.reset();
  slot.current.assign(L, 0);
  slot.draws.initialCanvas(slot.drawRequest(), slot.canvas, slot.current);
  slot.argmax = slot.current;
  if (slot.job.constraint) slot.job.constraint->beginCanvas(L);
}

// Encodes the finished canvas of every slot that goes on to another, then starts that canvas.
void BatchEngine::commit() {
  const int64_t B = slots_, L = settings_.canvasLength, C = settings_.cacheLength, pad = settings_.padTokenId;
  std::vector<int64_t> committing;
  for (int64_t row = 0; row < B; ++row)
    if (rows_[row] && rows_[row]->phase == Slot::Phase::Commit) committing.push_back(row);
  if (committing.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  const ModelContract& names = session_.model->contract();
  std::vector<int64_t> blocks(B * L, pad), cacheValid(B * C, 0), positions(B * L, 0);
  std::vector<float> writeRows(B, 0.0f);
  for (int64_t row : committing) {
    const Slot& slot = *rows_[row];
    std::copy(slot.block.begin(), slot.block.end(), blocks.begin() + row * L);
    std::copy(slot.cacheValid.begin(), slot.cacheValid.end(), cacheValid.begin() + row * C);
    std::iota(positions.begin() + row * L, positions.begin() + (row + 1) * L,
              slot.promptLength + (slot.canvas - 1) * L);
    writeRows[row] = 1.0f;
  }
  runEntryPoint(session_, *commit_,
                {{names.blockIds, i64Tensor({B, L}, blocks)},
                 {names.cacheValid, i64Tensor({B, C}, cacheValid)},
                 {names.positions, i64Tensor({B, L}, positions)},
                 {names.writeRows, f32Tensor({B}, writeRows)}});
  for (int64_t row : committing) {
    Slot& slot = *rows_[row];
    std::copy(slot.cacheValid.begin() + L, slot.cacheValid.end(), slot.cacheValid.begin());
    std::fill(slot.cacheValid.end() - L, slot.cacheValid.end(), 1);
    startCanvas(slot);
  }
  record(*commit_, false, secondsSince(started), static_cast<int64_t>(committing.size()));
}

// One decoder pass over every denoising slot. A slot at its canvas's first pass gets no
// self-conditioning signal (mask 0, exactly none); denoise_first when every slot is at its first.
void BatchEngine::denoise() {
  const int64_t B = slots_, L = settings_.canvasLength, C = settings_.cacheLength;
  std::vector<int64_t> denoising;
  bool allFirst = true;
  for (int64_t row = 0; row < B; ++row)
    if (rows_[row] && rows_[row]->phase == Slot::Phase::Denoise) {
      denoising.push_back(row);
      allFirst = allFirst && rows_[row]->step == 0;
    }
  if (denoising.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  const ModelContract& names = session_.model->contract();
  std::vector<int64_t> canvases(B * L, settings_.padTokenId), cacheValid(B * C, 0), positions(B * L, 0), keys(B * 2, 0);
  std::vector<float> frozen(B, 1.0f), selfConditioning(B, 0.0f), temperature(B, 1.0f);
  for (int64_t row : denoising) {
    Slot& slot = *rows_[row];
    std::copy(slot.current.begin(), slot.current.end(), canvases.begin() + row * L);
    std::copy(slot.cacheValid.begin(), slot.cacheValid.end(), cacheValid.begin() + row * C);
    std::iota(positions.begin() + row * L, positions.begin() + (row + 1) * L, slot.promptLength + slot.canvas * L);
    frozen[row] = 0.0f;
    selfConditioning[row] = slot.step > 0 ? 1.0f : 0.0f;
    const float scheduled = scheduledTemperature(settings_.tMin, settings_.tMax, slot.steps - slot.step, slot.steps);
    const double scale = slot.job.sampling.temperature;
    // Temperature 0 takes the argmax as the sample; the entropies keep the schedule's temperature.
    temperature[row] = scale > 0 ? static_cast<float>(scale * scheduled) : scheduled;
    const std::array<int64_t, 2> key = slot.draws.sampleKey({slot.drawRequest(), slot.canvas, slot.step});
    keys[2 * row] = key[0];
    keys[2 * row + 1] = key[1];
  }
  const EntryPoint& entry = allFirst ? *denoiseFirst_ : *denoise_;
  std::map<std::string, HostTensor> outputs =
      runEntryPoint(session_, entry,
                    {{names.batch.canvasIds, i64Tensor({B, L}, canvases)},
                     {names.cacheValid, i64Tensor({B, C}, cacheValid)},
                     {names.positions, i64Tensor({B, L}, positions)},
                     {names.selfConditioningMask, f32Tensor({B}, selfConditioning)},
                     {names.frozen, f32Tensor({B}, frozen)},
                     {names.temperature, f32Tensor({B}, temperature)},
                     {names.sampleKeys, i64Tensor({B, 2}, keys)}});
  const HostTensor sampled = entryOutput(outputs, names.sampledIds, DType::I64, B * L, entry, session_.planPath);
  const HostTensor argmax = entryOutput(outputs, names.argmaxIds, DType::I64, B * L, entry, session_.planPath);
  const HostTensor entropy = entryOutput(outputs, names.entropy, DType::F32, B * L, entry, session_.planPath);
  record(entry, true, secondsSince(started), static_cast<int64_t>(denoising.size()));
  for (int64_t row : denoising) {
    try {
      applyPass(*rows_[row], sampled.as<int64_t>() + row * L, argmax.as<int64_t>() + row * L,
                entropy.as<float>() + row * L);
    } catch (const InputError& error) {
      // A constraint whose automaton outgrows its bound fails its own job only.
      end(*rows_[row], JobEnd::Failed, error.what());
    }
  }
}

// One slot's share of a pass, as DenoisingBatch::applyPass does for a row (docs/generation.md, "The
// algorithm"), with a constrained request's acceptance filtered by its rule.
void BatchEngine::applyPass(Slot& slot, const int64_t* sampledRow, const int64_t* argmaxRow, const float* entropyRow) {
  const int64_t L = settings_.canvasLength;
  const std::span<const int64_t> argmax(argmaxRow, L);
  const std::span<const float> entropy(entropyRow, L);
  const std::span<const int64_t> sampled =
      slot.job.sampling.temperature > 0 ? std::span<const int64_t>(sampledRow, L) : argmax;
  ++slot.passes;
  std::vector<uint8_t> accepted = entropyBoundAccept(entropy, slot.entropyBound);
  if (slot.job.constraint) {
    std::vector<int64_t> order(L);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return entropy[a] < entropy[b]; });
    std::vector<int64_t> candidates;
    for (int64_t position : order)
      if (accepted[position]) candidates.push_back(position);
    std::fill(accepted.begin(), accepted.end(), 0);
    for (int64_t position : slot.job.constraint->filterAccepted(sampled, candidates)) accepted[position] = 1;
  }
  std::vector<int64_t> renoise(L);
  slot.draws.renoiseIds({slot.drawRequest(), slot.canvas, slot.step}, renoise);
  for (int64_t position = 0; position < L; ++position)
    slot.current[position] = accepted[position] ? sampled[position] : renoise[position];
  std::copy(argmax.begin(), argmax.end(), slot.argmax.begin());
  if (slot.job.sampling.drafts) slot.job.sink->onDraft(slot.canvas, slot.step, slot.current);
  ++slot.step;
  if (slot.stopRule.shouldStop(slot.argmax, entropy) || slot.step >= slot.steps) finishCanvas(slot);
}

// Commits the argmax canvas (a constrained request's rewritten by its rule), after the EOS rule,
// cut at the budget; ends the job or queues the canvas for the next step's commit.
void BatchEngine::finishCanvas(Slot& slot) {
  slot.block = slot.argmax;
  if (slot.job.constraint) slot.job.constraint->commitCanvas(slot.block, slot.current);
  const bool eos = finalizeCanvas(slot.block, false, settings_.eosTokenIds, settings_.padTokenId);
  const int64_t budget = slot.job.sampling.maxTokens - slot.emitted;
  int64_t taken = 0, text = 0;
  bool eosTaken = false;
  for (int64_t id : slot.block) {
    if (taken == budget) break;
    ++taken;
    if (std::find(settings_.eosTokenIds.begin(), settings_.eosTokenIds.end(), id) != settings_.eosTokenIds.end()) {
      eosTaken = true;
      break;
    }
    ++text;
  }
  slot.emitted += taken;
  slot.job.sink->onCanvas(slot.canvas, std::span<const int64_t>(slot.block.data(), text));
  if (eos && eosTaken) return end(slot, JobEnd::Eos);
  if (slot.emitted >= slot.job.sampling.maxTokens) return end(slot, JobEnd::Length);
  ++slot.canvas;
  slot.phase = Slot::Phase::Commit;
}

}  // namespace dgemma::serve
