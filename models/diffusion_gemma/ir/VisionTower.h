// The Gemma 4 vision tower and projector of DiffusionGemma as dg ops (docs/model.md, "Vision tower
// and projector"): patch embedding with the two learned position tables, bidirectional layers with
// 2-D RoPE, k×k average pooling by the host-derived pool slots, standardization, the weightless
// norm and projection into the text width, and the merge of the projected features into the
// encoder's input at the image soft tokens. Parameters carry their HF names
// (model.encoder.vision_tower.…, model.encoder.embed_vision.…).
#ifndef MODELS_DIFFUSION_GEMMA_VISIONTOWER_H
#define MODELS_DIFFUSION_GEMMA_VISIONTOWER_H

#include <string>
#include <utility>
#include <vector>

#include "models/diffusion_gemma/ir/GraphBuilder.h"
#include "models/diffusion_gemma/ir/TextStack.h"

namespace mlir::dg::diffusion_gemma {

// The inputs an image twin has beside its text entry's (Builder.h), N = B·I images.
struct ImageInputs {
  Value pixelValues;       // [N, N_p, D_p] f32 in [0, 1]
  Value positionIds;       // [N, N_p, 2] i64, (x, y); (-1, -1) on padding patches
  Value poolSlot;          // [N, N_p] i64: row of the pooled list [N·T]; N·T on padding patches
  Value tokenIndex;        // [B, P] i64: row of the pooled list per image soft token; N·T elsewhere
  Value segmentIds;        // [B, P] i64: the image runs (the encoder's image-bidirectional overlay)
};

// An image twin's bucket: its text entry's dimensions plus images_per_example and image_patches.
std::vector<std::pair<StringRef, int64_t>> imageTwinBucket(ArrayRef<std::pair<StringRef, int64_t>> textBucket,
                                                           const dgemma::DiffusionGemmaConfig& config,
                                                           int64_t imagesPerExample);

class VisionTower {
 public:
  VisionTower(GraphBuilder& graph, int64_t imagesPerExample);

  // The canonical HF names of the vision parameters.
  static std::string towerName(const std::string& suffix) { return "model.encoder.vision_tower." + suffix; }
  static std::string projectionName() { return "model.encoder.embed_vision.embedding_projection.weight"; }

  int64_t images() const { return images_; }
  int64_t pooledRows() const { return images_ * softTokens_; }  // N·T: also the "no row" index

  // Declares the image inputs of an entry whose prompts have `promptLength` positions.
  ImageInputs declareInputs(int64_t promptLength);
  // The projected features of every pooled slot, [N·T, H] in the activation dtype (slots no patch
  // fills hold the projection of the standardized zero row; no token reads them).
  Value features(const ImageInputs& inputs);
  // The encoder input of a prompt: the scaled token embeddings, with the feature row
  // features[tokenIndex] (without the √H scale) in place of each image soft token. `tokenIndex` may
  // be longer than the image prompt (e.g. extended with N·T over a clean target).
  Value mergedEmbedding(TextStack& text, Value ids, Value features, Value tokenIndex);
  // The segment ids the encoder pass over the image prompt gives its attention (the
  // image-bidirectional overlay, docs/model.md, "Encoder attention mask"); null when the config's
  // use_bidirectional_attention is not "vision" (every encoder layer stays causal).
  Value overlaySegmentIds(Value segmentIds) const;

 private:
  Value norm(Value x, Value weight, const std::string& name);
  Value norm(Value x, const std::string& weightName);
  Value linear(Value x, const std::string& weightName, int64_t out, int64_t in);
  Value rope2d(Value x, Value positionsX, Value positionsY, const std::string& name);
  Value layer(int64_t index, Value hidden, Value positionsX, Value positionsY, Value patchValid);
  Value idsAsF32(Value ids, const std::string& name);

  GraphBuilder& g_;
  OpBuilder& b_;
  const dgemma::VisionConfig& vision_;
  int64_t images_, patches_, softTokens_, hidden_;
};

}  // namespace mlir::dg::diffusion_gemma

#endif
