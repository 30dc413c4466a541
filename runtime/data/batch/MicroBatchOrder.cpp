#include "runtime/data/batch/MicroBatchOrder.h"

#include "support/Error.h"

namespace dgemma {

MicroBatchOrder::MicroBatchOrder(SamplerKind kind, const std::vector<bool>& isImage, int64_t microBatch, uint64_t seed)
    : order_(kind, static_cast<int64_t>(isImage.size()), seed), isImage_(isImage), microBatch_(microBatch) {
  if (microBatch < 1) throw InputError("micro-batch: expected at least 1 example, got " + std::to_string(microBatch));
  for (int64_t item = 0; item < static_cast<int64_t>(isImage.size()); ++item) streams_[isImage[item] ? 1 : 0].members.push_back(item);
  for (Stream& stream : streams_)
    stream.microBatches = (static_cast<int64_t>(stream.members.size()) + microBatch - 1) / microBatch;
}

int64_t MicroBatchOrder::imageMicroBatchesBefore(int64_t count) const {
  const __int128 perEpoch = microBatchesPerEpoch();
  return static_cast<int64_t>(static_cast<__int128>(count) * streams_[1].microBatches / perEpoch);
}

int64_t MicroBatchOrder::streamSamplesBefore(bool images, int64_t count) const {
  const int64_t imageBatches = imageMicroBatchesBefore(count);
  return (images ? imageBatches : count - imageBatches) * microBatch_;
}

bool MicroBatchOrder::imagesAt(int64_t index) const {
  if (index < 0) throw InputError("micro-batch index: expected a non-negative index, got " + std::to_string(index));
  return imageMicroBatchesBefore(index + 1) > imageMicroBatchesBefore(index);
}

// Sample `sample` of a stream: epoch e = sample / |stream| of the stream is ItemOrder's epoch e
// restricted to the stream's items.
int64_t MicroBatchOrder::streamItem(Stream& stream, int64_t sample) {
  const int64_t size = static_cast<int64_t>(stream.members.size());
  const int64_t epoch = sample / size;
  if (epoch != stream.cachedEpoch) {
    const bool images = &stream == &streams_[1];
    stream.cached.clear();
    const int64_t items = order_.numItems();
    for (int64_t position = 0; position < items; ++position) {
      const int64_t item = order_.itemAt(epoch * items + position);
      if (isImage_[item] == images) stream.cached.push_back(item);
    }
    stream.cachedEpoch = epoch;
  }
  return stream.cached[sample % size];
}

std::vector<int64_t> MicroBatchOrder::itemsAt(int64_t index) {
  const bool images = imagesAt(index);
  const int64_t imageBefore = imageMicroBatchesBefore(index);
  Stream& stream = streams_[images ? 1 : 0];
  const int64_t streamIndex = images ? imageBefore : index - imageBefore;
  std::vector<int64_t> items;
  for (int64_t slot = 0; slot < microBatch_; ++slot) items.push_back(streamItem(stream, streamIndex * microBatch_ + slot));
  return items;
}

}  // namespace dgemma
