// The items of each micro-batch (docs/data.md, "Item order"): a micro-batch is all-image or
// all-text, because the two run different entry points (train_step, train_step_images).
//
// The item order of ItemOrder (a permutation per epoch of every item, a pure function of the seed
// and the epoch) is split into two streams by modality, each keeping that order: the text stream
// of epoch e is epoch e's permutation with the image items left out, and the other way round. Each
// stream is cyclic on its own, so every epoch of a stream visits each of its items once. Micro-batch
// g (samples [g·B, (g+1)·B)) draws B consecutive samples from one stream; the streams take turns in
// proportion to their micro-batches per epoch, m = ceil(items / B) each: among the first g
// micro-batches, floor(g · m_image / (m_image + m_text)) are image ones. Everything is a function of
// (seed, g), so a run resumes from its consumed-samples count alone. With one modality the order is
// exactly ItemOrder's.
#pragma once

#include <cstdint>
#include <vector>


#include "runtime/data/batch/ItemOrder.h"

namespace dgemma {

class MicroBatchOrder {
 public:
  // `isImage[i]`: item i has images. Throws InputError for an empty item list or microBatch < 1.
  MicroBatchOrder(SamplerKind kind, const std::vector<bool>& isImage, int64_t microBatch, uint64_t seed);

  // Whether micro-batch `index` is an image micro-batch.
  bool imagesAt(int64_t index) const;
  // The B items of micro-batch `index`, in sample order.
  std::vector<int64_t> itemsAt(int64_t index);

  // The items of a stream (images: the image stream, else the text stream).
  const std::vector<int64_t>& streamItems(bool images) const { return streams_[images ? 1 : 0].members; }
  // How many samples the stream has given in the first `count` micro-batches.
  int64_t streamSamplesBefore(bool images, int64_t count) const;
  // The item of the stream's sample `sample` (its epoch sample / |stream|).
  int64_t streamItemAt(bool images, int64_t sample) { return streamItem(streams_[images ? 1 : 0], sample); }

  int64_t numItems() const { return order_.numItems(); }
  int64_t imageItems() const { return static_cast<int64_t>(streams_[1].members.size()); }
  int64_t microBatch() const { return microBatch_; }
  // m_text + m_image: one pass over each stream (what an evaluation runs).
  int64_t microBatchesPerEpoch() const { return streams_[0].microBatches + streams_[1].microBatches; }

 private:
  struct Stream {
    std::vector<int64_t> members;  // its items, ascending
    int64_t microBatches = 0;      // ceil(|members| / B)
    int64_t cachedEpoch = -1;
    std::vector<int64_t> cached;   // the stream's order in cachedEpoch
  };
  // Micro-batches among the first `count` that are image ones.
  int64_t imageMicroBatchesBefore(int64_t count) const;
  int64_t streamItem(Stream& stream, int64_t sample);

  ItemOrder order_;
  std::vector<bool> isImage_;
  int64_t microBatch_;
  Stream streams_[2];  // text, image
};

}  // namespace dgemma
