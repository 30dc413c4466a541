// The inference entries (Inference.h, docs/inference-plan.md) over the text stack of TextStack.h.
#include "models/diffusion_gemma/ir/Inference.h"

#include <algorithm>

#include "models/diffusion_gemma/ir/GraphBuilder.h"
#include "models/diffusion_gemma/ir/TextStack.h"
#include "models/diffusion_gemma/ir/VisionTower.h"
#include "models/diffusion_gemma/spec/Interface.h"
#include "plan/Names.h"

namespace mlir::dg {

using namespace ::dgemma::diffusion_gemma;

using dgemma::DiffusionGemmaConfig;
using diffusion_gemma::GraphBuilder;
using diffusion_gemma::LayerCache;
using diffusion_gemma::LayerKeyValues;
using diffusion_gemma::shapeOf;
using diffusion_gemma::TextStack;

std::string cacheKeysName(int64_t layer) { return std::string(dgemma::kCachePrefix) + "k." + std::to_string(layer); }
std::string cacheValuesName(int64_t layer) { return std::string(dgemma::kCachePrefix) + "v." + std::to_string(layer); }

int64_t inferenceCacheLength(int64_t maxPromptLength, int64_t maxNewTokens, int64_t canvasLength) {
  const int64_t canvases = (maxNewTokens + canvasLength - 1) / canvasLength;
  return maxPromptLength + (canvases - 1) * canvasLength;
}

int64_t layerCacheLength(const DiffusionGemmaConfig& config, int64_t layer, int64_t cacheLength) {
  return config.isFullAttention(layer) ? cacheLength : std::min(cacheLength, config.slidingWindow - 1);
}

namespace {

// The cache as run state: every layer's K/V parameters, with the slots `cacheValid` [B, C] i1 marks
// (a sliding layer's C_l slots are the last C_l columns).
class CacheState {
 public:
  CacheState(GraphBuilder& g, int64_t cacheLength, Value cacheValid) : g_(g) {
    const DiffusionGemmaConfig& config = g.config();
    for (int64_t layer = 0; layer < config.numHiddenLayers; ++layer) {
      const int64_t slots = layerCacheLength(config, layer, cacheLength);
      const dgemma::LayerGeometry& geometry = config.layer(layer);
      const SmallVector<int64_t> shape{g.batch(), slots, geometry.numKeyValueHeads, geometry.headDim};
      LayerCache cache;
      cache.keys = g.state(cacheKeysName(layer), shape, g.activation());
      cache.values = g.state(cacheValuesName(layer), shape, g.activation());
      if (cacheValid)
        cache.keyValid = slots == cacheLength
                             ? cacheValid
                             : g.slice(cacheValid, 1, cacheLength - slots, slots, "cache_valid.last" + std::to_string(slots));
      layers_.push_back(cache);
    }
  }

  const std::vector<LayerCache>& layers() const { return layers_; }

  // Every layer's cache := the last C_l slots of [old cache, if `append` ; new K/V], zeros on the
  // left when that is shorter than C_l, on the rows `writeRows` [B] f32 marks (non-zero); the other
  // rows keep their cache, so a server can fill one slot while the others are mid-generation
  // (docs/serving.md, "Continuous batching"). The assigns come after every read of the cache.
  void write(const std::vector<LayerKeyValues>& newKeyValues, bool append, Value writeRows) {
    Value rows =
        g_.reshape(g_.compare(writeRows, g_.scalar(0.0, "write_rows.zero"), ComparePredicate::Ne, "write_rows"),
                   {g_.batch(), 1, 1, 1}, "write_rows.rows");
    auto written = [&](Value cache, Value fresh, const std::string& name) -> Value {
      Value next = lastSlots(append ? cache : Value(), fresh, shapeOf(cache)[1], name);
      return g_.builder().create<SelectOp>(g_.loc(name + ".written"), rows, next, cache);
    };
    for (size_t layer = 0; layer < layers_.size(); ++layer) {
      const LayerCache& cache = layers_[layer];
      const std::string keys = cacheKeysName(layer), values = cacheValuesName(layer);
      g_.assign(cache.keys, written(cache.keys, newKeyValues[layer].keys, keys), keys + ".assign");
      g_.assign(cache.values, written(cache.values, newKeyValues[layer].values, values), values + ".assign");
    }
  }

 private:
  // The last `slots` positions of [old ; fresh] (old may be null: zeros).
  Value lastSlots(Value old, Value fresh, int64_t slots, const std::string& name) {
    const int64_t freshLength = shapeOf(fresh)[1];
    if (freshLength >= slots) return freshLength == slots ? fresh : g_.slice(fresh, 1, freshLength - slots, slots, name + ".last");
    Value earlier = old ? g_.slice(old, 1, freshLength, slots - freshLength, name + ".kept")
                        : g_.zeros({shapeOf(fresh)[0], slots - freshLength, shapeOf(fresh)[2], shapeOf(fresh)[3]},
                                   diffusion_gemma::elementTypeOf(fresh), name + ".unfilled");
    return g_.concat({earlier, fresh}, 1, name + ".shifted");
  }

  GraphBuilder& g_;
  std::vector<LayerCache> layers_;
};

// prefill: the causal encoder over the prompt; its K/V right-aligned into the cache. With images
// (prefill_images) the encoder reads the prompt merged with the vision features.
void buildPrefill(GraphBuilder& g, TextStack& text, int64_t promptLength, int64_t cacheLength, int64_t imagesPerExample) {
  OpBuilder& b = g.builder();
  const int64_t batch = g.batch();
  Value inputIds = g.input(kInputIds, {batch, promptLength}, b.getI64Type());
  Value attentionMask = g.input(kAttentionMask, {batch, promptLength}, b.getI64Type());
  Value positions = g.input(kPositions, {batch, promptLength}, b.getI64Type());
  Value promptValid = g.castTo(attentionMask, b.getI1Type(), "attention_mask");
  Value writeRows = g.input(kWriteRows, {batch}, g.f32());
  std::vector<LayerKeyValues> keyValues;
  if (imagesPerExample > 0) {
    diffusion_gemma::VisionTower vision(g, imagesPerExample);
    const diffusion_gemma::ImageInputs images = vision.declareInputs(promptLength);
    Value merged = vision.mergedEmbedding(text, inputIds, vision.features(images), images.tokenIndex);
    text.encoderStackOverEmbeddings(merged, promptValid, positions, &keyValues, vision.overlaySegmentIds(images.segmentIds));
  } else {
    text.encoderStack(inputIds, promptValid, positions, &keyValues);
  }
  CacheState(g, cacheLength, Value()).write(keyValues, /*append=*/false, writeRows);
}

// denoise: one decoder step over [cache ; canvas], the fused sampler, and the next step's
// self-conditioning state. denoise_first (`selfConditioned` false) is the step a canvas starts
// with: its self-conditioning mask is 0 on every row, so the signal is exactly zero and the
// softmax over the stored [B, L, V] state, its product with the embedding and the
// self-conditioning MLP are left out (TextStack::decoderInput without a signal).
void buildDenoise(GraphBuilder& g, TextStack& text, int64_t cacheLength, bool selfConditioned) {
  const DiffusionGemmaConfig& config = g.config();
  OpBuilder& b = g.builder();
  const int64_t batch = g.batch(), canvasLength = config.canvasLength;
  Value canvasIds = g.input(kCanvasIds, {batch, canvasLength}, b.getI64Type());
  Value cacheValid = g.castTo(g.input(kCacheValid, {batch, cacheLength}, b.getI64Type()), b.getI1Type(), "cache_valid");
  Value positions = g.input(kPositions, {batch, canvasLength}, b.getI64Type());
  Value selfConditioningMask = selfConditioned ? g.input(kSelfConditioningMask, {batch}, g.f32()) : Value();
  Value frozen = g.input(kFrozen, {batch}, g.f32());
  Value temperature = g.input(kTemperature, {batch}, g.f32());
  Value sampleKeys = g.input(kSampleKeys, {batch, 2}, b.getI64Type());

  // The stored z is in the activation dtype (HF keeps it in the embedding's dtype); the
  // self-conditioning softmax reads it widened to f32, as forward reads its f32 input.
  Value stored = g.state(kSelfConditioningStateName, {batch, canvasLength, config.vocabSize}, g.activation());
  Value signal =
      selfConditioned ? text.selfConditioningSignal(g.toF32(stored, "sc.stored"), selfConditioningMask) : Value();
  CacheState cache(g, cacheLength, cacheValid);
  // canvas_sample soft-caps the logits as it reads them: the capped [B, L, V] logits and the
  // three passes of the div, tanh and mul ops over them are never made.
  Value logits =
      text.decoderLogitsOverCache(text.decoderInput(canvasIds, signal), positions, cache.layers(), /*capped=*/false);
  const double softcap = std::max(config.finalLogitSoftcapping, 0.0);

  auto idsType = RankedTensorType::get({batch, canvasLength}, b.getI64Type());
  auto sample = b.create<CanvasSampleOp>(g.loc("sample"),
                                         TypeRange{idsType, idsType, g.f32Type({batch, canvasLength}),
                                                   g.activationType({batch, canvasLength, config.vocabSize})},
                                         logits, temperature, sampleKeys, b.getF64FloatAttr(softcap));
  g.output(kSampledIds, sample.getSampled());
  g.output(kArgmaxIds, sample.getArgmax());
  g.output(kEntropy, sample.getEntropy());
  // A row that finished denoising keeps its state (HF freezes its processed logits).
  Value frozenRows = g.reshape(g.compare(frozen, g.scalar(0.0, "frozen.zero"), ComparePredicate::Ne, "frozen"),
                               {batch, 1, 1}, "frozen.rows");
  g.assign(stored, b.create<SelectOp>(g.loc("sc.next"), frozenRows, stored, sample.getScaled()), "sc.assign");
}

// commit: the accepted block encoded causally over [cache ; block]; the cache shifts by L.
void buildCommit(GraphBuilder& g, TextStack& text, int64_t cacheLength) {
  OpBuilder& b = g.builder();
  const int64_t batch = g.batch(), canvasLength = g.config().canvasLength;
  Value blockIds = g.input(kBlockIds, {batch, canvasLength}, b.getI64Type());
  Value cacheValid = g.castTo(g.input(kCacheValid, {batch, cacheLength}, b.getI64Type()), b.getI1Type(), "cache_valid");
  Value positions = g.input(kPositions, {batch, canvasLength}, b.getI64Type());
  Value writeRows = g.input(kWriteRows, {batch}, g.f32());
  CacheState cache(g, cacheLength, cacheValid);
  std::vector<LayerKeyValues> keyValues;
  text.encoderStackOverCache(blockIds, positions, cache.layers(), &keyValues);
  cache.write(keyValues, /*append=*/true, writeRows);
}

}  // namespace

OwningOpRef<ModuleOp> buildDiffusionGemmaInference(MLIRContext& context, const DiffusionGemmaConfig& config,
                                                   const DiffusionGemmaInferenceOptions& options) {
  DiffusionGemmaForwardOptions forward{options.microBatch, options.promptLengths, options.precision,
                                       options.imagesPerExample};
  OwningOpRef<ModuleOp> module = buildDiffusionGemmaForward(context, config, forward);
  OpBuilder builder(&context);
  auto body = [&](auto build) {
    return [&, build] {
      GraphBuilder graph(builder, config, options.microBatch, options.precision);
      TextStack text(graph);
      build(graph, text);
    };
  };
  for (int64_t promptLength : options.promptLengths) {
    const std::vector<std::pair<StringRef, int64_t>> bucket{{kMicroBatchDimension, options.microBatch},
                                                            {kPromptLengthDimension, promptLength}};
    diffusion_gemma::addEntryFunction(builder, *module,
                                      std::string(kPrefillEntry) + "_p" + std::to_string(promptLength), kPrefillEntry,
                                      bucket, body([&, promptLength](GraphBuilder& g, TextStack& text) {
                                        buildPrefill(g, text, promptLength, options.cacheLength, 0);
                                      }));
    if (options.imagesPerExample > 0)
      diffusion_gemma::addEntryFunction(
          builder, *module, std::string(kPrefillImagesEntry) + "_p" + std::to_string(promptLength), kPrefillImagesEntry,
          diffusion_gemma::imageTwinBucket(bucket, config, options.imagesPerExample),
          body([&, promptLength](GraphBuilder& g, TextStack& text) {
            buildPrefill(g, text, promptLength, options.cacheLength, options.imagesPerExample);
          }));
  }
  diffusion_gemma::addEntryFunction(builder, *module, kDenoiseEntry, kDenoiseEntry,
                                    {{kMicroBatchDimension, options.microBatch}},
                                    body([&](GraphBuilder& g, TextStack& text) {
                                      buildDenoise(g, text, options.cacheLength, /*selfConditioned=*/true);
                                    }));
  diffusion_gemma::addEntryFunction(builder, *module, kDenoiseFirstEntry, kDenoiseFirstEntry,
                                    {{kMicroBatchDimension, options.microBatch}},
                                    body([&](GraphBuilder& g, TextStack& text) {
                                      buildDenoise(g, text, options.cacheLength, /*selfConditioned=*/false);
                                    }));
  diffusion_gemma::addEntryFunction(
      builder, *module, kCommitEntry, kCommitEntry, {{kMicroBatchDimension, options.microBatch}},
      body([&](GraphBuilder& g, TextStack& text) { buildCommit(g, text, options.cacheLength); }));
  return module;
}

}  // namespace mlir::dg
