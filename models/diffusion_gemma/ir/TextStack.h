// The DiffusionGemma text model as dg ops (docs/model.md): the token embedding, the
// decoder's input block with self-conditioning, the layers (attention, dense MLP and routed
// experts, sandwich norms), the causal encoder stack, the decoder over [prefix K/V ; canvas] and the
// tied, soft-capped head. Parameters carry their HF names under model.decoder.
#ifndef MODELS_DIFFUSION_GEMMA_TEXTSTACK_H
#define MODELS_DIFFUSION_GEMMA_TEXTSTACK_H

#include <string>
#include <vector>

#include "models/diffusion_gemma/ir/GraphBuilder.h"

namespace mlir::dg::diffusion_gemma {

// The K/V one encoder layer hands to the decoder layer of the same index.
struct LayerKeyValues {
  Value keys;    // [B, P, Hkv, D], after k_norm and RoPE
  Value values;  // [B, P, Hkv, D], after the weightless v_norm
};

// One layer's K/V cache as an attention reads it (docs/inference-plan.md): C_l right-aligned slots
// of earlier positions, the unfilled ones on the left and invalid.
struct LayerCache {
  Value keys;      // [B, C_l, Hkv, D]
  Value values;    // [B, C_l, Hkv, D]
  Value keyValid;  // [B, C_l] i1
};

class TextStack {
 public:
  explicit TextStack(GraphBuilder& graph);

  // The canonical HF name of a top-level text parameter: model.decoder.<suffix>.
  static std::string top(const std::string& suffix) { return "model.decoder." + suffix; }

  // E[ids] * sqrt(H), rounded to the activation dtype.
  Value embed(Value ids);
  // The soft embedding of self-conditioning logits [B, L, V] f32, times the per-example mask [B].
  Value selfConditioningSignal(Value logits, Value mask);
  // The decoder's input from the canvas ids [B, L] and a signal (null: self-conditioning pass 1).
  Value decoderInput(Value canvasIds, Value signal);
  // The encoder stack over ids [B, T] (causal, key validity [B, T] i1); returns the last hidden
  // state before the final norm and, if asked, every layer's K/V. `segmentIds` [B, T] i64 (null:
  // none) are the image overlay of every layer's attention (docs/model.md, "Encoder attention mask").
  Value encoderStack(Value ids, Value keyValid, Value positions, std::vector<LayerKeyValues>* keyValuesOut,
                     Value segmentIds = {});
  // The same from the encoder's input embedding [B, T, H] (an image prompt's merged input, VisionTower.h).
  Value encoderStackOverEmbeddings(Value embeddings, Value keyValid, Value positions,
                                   std::vector<LayerKeyValues>* keyValuesOut, Value segmentIds = {});
  // The stack over packed documents (docs/pretraining.md, "Objectives"): ids [B, S], key validity
  // [B, S] i1, positions [B, S] (restarting per document) and document_ids [B, S] i64, with `mask`
  // causal (sliding layers: the last W positions) or bidirectional (sliding layers: HF's symmetric
  // window |i - j| <= W // 2 + 1); no key outside the query's document. Returns the last hidden state before
  // the final norm and, if asked, every layer's K/V.
  Value packedStack(Value ids, Value keyValid, Value positions, Value documentIds, AttentionMask mask,
                    std::vector<LayerKeyValues>* keyValuesOut = nullptr);
  // The decoder over [prefix K/V ; block] of packed text (docs/pretraining.md, "Block diffusion on packed
  // text"): x [B, T, H] is the decoder input of the block, whose positions [B, T] are the data path's;
  // `prefix` (null: an empty prefix) holds each layer's clean K/V of the P positions before the block,
  // and documentIds [B, P + T] the documents of those positions and the block's. Like decoderLogits,
  // each query sees the whole block and the prefix (sliding layers: its last W - 1 slots), here only
  // where the key's document is the query's. Returns the last hidden state before the final norm.
  Value packedDecoderBlock(Value x, Value positions, const std::vector<LayerKeyValues>* prefix, Value documentIds);
  // The encoder stack over a block of ids [B, T] (every token real) that continues the cached
  // positions: each layer attends causally over [its cache ; the block] (the window counts cache
  // slots too). Returns the last hidden state before the final norm and, if asked, every layer's
  // K/V of the block alone.
  Value encoderStackOverCache(Value ids, Value positions, const std::vector<LayerCache>& caches,
                              std::vector<LayerKeyValues>* keyValuesOut);
  // The decoder over [prefix K/V ; canvas] from its input; returns the logits, soft-capped unless
  // `capped` is false.
  Value decoderLogits(Value x, Value promptValid, const std::vector<LayerKeyValues>& keyValues, bool capped = true);
  // The decoder over [cache ; canvas] at the canvas positions [B, L]; returns the logits, soft-capped
  // unless `capped` is false (a sampler that caps itself). A sliding layer's cache holds at most
  // W - 1 slots, all of which it sees.
  Value decoderLogitsOverCache(Value x, Value positions, const std::vector<LayerCache>& caches, bool capped = true);
  // Final norm and tied head of hidden states [B, L, H]: f32 logits, soft-capped unless `capped`
  // is false (a cross-entropy that caps itself).
  Value head(Value x, bool capped = true);

  // Where the MoE calls built from now on append their load-balancing loss; null: nowhere.
  void recordLoadBalancingLosses(std::vector<Value>* terms) { auxTerms_ = terms; }
  // The routed experts' tokens in [S·B] order (DiffusionGemmaTrainOptions::sequenceMajorExpertTokens).
  void setSequenceMajorExpertTokens(bool sequenceMajor) { sequenceMajorExpertTokens_ = sequenceMajor; }

 private:
  // Where a layer's attention reads its keys from.
  struct EncoderAttention {
    Value keyValid;              // [B, P] i1, or [B, C_l + T] over [cache ; block]
    const LayerCache* cache = nullptr;  // keys before the block's own
    // The tokens that are real (the load-balancing loss counts only them); null: keyValid.
    Value tokenValid;
    Value segmentIds;  // [B, P] i64, the image overlay; null: plain causal
    Value documentIds;  // [B, P] i64, packed documents; null: one document
    AttentionMask mask = AttentionMask::Causal;  // bidirectional: a packed masked-diffusion pass
  };
  struct DecoderAttention {
    Value keyValid;  // [B, P + L] i1: the prompt mask, then the (always valid) canvas
    const LayerKeyValues* prefix;  // null: no prefix (prefixLength 0)
    int64_t prefixLength;
    Value documentIds;  // [B, P + L] i64, packed documents; null: one document
  };

  static std::string layerName(int64_t layer, const std::string& suffix) {
    return "model.decoder.layers." + std::to_string(layer) + "." + suffix;
  }
  double embeddingScale() const;
  Value embeddingTable();
  Value withoutVocabularyPadding(Value logits, const std::string& name);
  Value gatedMlp(Value x, const std::string& prefix, int64_t inner);
  Value splitHeads(Value x, int64_t heads, int64_t headDim, const std::string& name);
  Value rope(Value x, Value positions, int64_t layer, const std::string& name);
  template <typename KeySet>
  Value attention(int64_t layer, Value x, Value positions, const KeySet& keySet,
                  std::vector<LayerKeyValues>* keyValuesOut);
  Value feedForward(int64_t layer, Value residual, Value tokenValid);
  Value loadBalancingLoss(int64_t layer, Value routerLogits, Value indices, Value tokenValid);
  template <typename KeySet>
  Value layerForward(int64_t layer, Value hidden, Value positions, const KeySet& keySet,
                     std::vector<LayerKeyValues>* keyValuesOut);

  GraphBuilder& g_;
  OpBuilder& b_;
  const dgemma::DiffusionGemmaConfig& config_;
  int64_t batch_, canvasLength_, hidden_;
  Type f32_;
  Type activation_;
  std::vector<Value>* auxTerms_ = nullptr;
  bool sequenceMajorExpertTokens_ = false;
};

}  // namespace mlir::dg::diffusion_gemma

#endif
