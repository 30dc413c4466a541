#include "runtime/data/pretrain/PackedDataset.h"

#include <algorithm>
#include <numeric>

#include "runtime/data/pretrain/PhiloxShuffle.h"
#include "support/Error.h"

namespace dgemma {

namespace {

// "" when `values` holds each of [first, first + count) once; else the first problem.
std::string checkPermutation(const int64_t* values, int64_t count, int64_t first, const std::string& what) {
  std::vector<bool> seen(static_cast<size_t>(count), false);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t value = values[i] - first;
    if (value < 0 || value >= count || seen[value]) return what + " is not a permutation";
    seen[value] = true;
  }
  return "";
}

}  // namespace

std::vector<float> autoregressiveLossMask(const PackedSample& sample) {
  std::vector<float> mask(sample.tokens.size() - 1);
  for (size_t k = 0; k < mask.size(); ++k) mask[k] = sample.endsDocument[k] ? 0.0f : 1.0f;
  return mask;
}

PackedDataset::PackedDataset(std::shared_ptr<const TokenDocuments> source, const PackedDatasetOptions& options,
                             std::ostream* log)
    : source_(std::move(source)), options_(options) {
  const std::string name = source_->identity();
  const DocumentRange range = options.documents;
  if (options.sequenceLength < 1)
    throw InputError("sequence length: expected at least 1 token, got " + std::to_string(options.sequenceLength));
  if (options.numSamples < 1)
    throw InputError("number of samples: expected at least 1, got " + std::to_string(options.numSamples));
  if (range.begin < 0 || range.end > source_->sequenceCount() || range.begin > range.end)
    throw InputError(name + ": documents [" + std::to_string(range.begin) + ", " + std::to_string(range.end) +
                     ") outside its " + std::to_string(source_->sequenceCount()) + " documents");
  for (int64_t document = range.begin; document < range.end; ++document) {
    const int64_t length = source_->sequenceLength(document);
    if (length < 0 || __builtin_add_overflow(tokensPerEpoch_, length, &tokensPerEpoch_))
      throw InputError(name + ": document " + std::to_string(document) + ": bad length " + std::to_string(length));
    lengths_.push_back(length);
  }
  if (tokensPerEpoch_ == 0)
    throw InputError(name + ": documents [" + std::to_string(range.begin) + ", " + std::to_string(range.end) +
                     ") hold no tokens to pack");

  // E, the fewest epochs whose tokens cover N samples of S tokens plus the one token the last
  // sample's labels reach past them.
  const __int128 needed = static_cast<__int128>(options.numSamples) * options.sequenceLength + 1;
  const __int128 epochs = (needed + tokensPerEpoch_ - 1) / tokensPerEpoch_;
  const __int128 orderLength = epochs * range.size();
  if (epochs > UINT32_MAX || orderLength > (int64_t{1} << 40))
    throw InputError(name + ": " + std::to_string(options.numSamples) + " samples of " +
                     std::to_string(options.sequenceLength) + " tokens need more epochs of its " +
                     std::to_string(tokensPerEpoch_) + " tokens than an index can hold");
  epochs_ = static_cast<int64_t>(epochs);
  samples_ = static_cast<int64_t>((epochs * tokensPerEpoch_ - 1) / options.sequenceLength);

  key_ = "dgemma packed index v1\nsource: " + name + "\ndocuments: " + std::to_string(range.begin) + ".." +
         std::to_string(range.end) + " lengths " + documentLengthsDigest(lengths_) +
         "\nsequence_length: " + std::to_string(options.sequenceLength) + "\nseed: " + std::to_string(options.seed) +
         "\nnum_samples: " + std::to_string(options.numSamples) + "\n";
  const std::optional<IndexCacheLocation> location = indexCacheLocation(options.cacheDirectory, source_->cachePrefix());
  if (location) {
    cachePath_ = indexCachePath(*location, "packed", key_);
    const auto validator = [this](const IndexArrays& arrays) { return validate(arrays); };
    if (std::optional<IndexArrays> arrays = loadIndexCache(cachePath_, key_, 3, validator, log)) {
      documentOrder_ = std::move((*arrays)[0]);
      sampleStarts_ = std::move((*arrays)[1]);
      sampleOrder_ = std::move((*arrays)[2]);
      return;
    }
  }
  build();
  builtIndex_ = true;
  if (location) storeIndexCache(cachePath_, key_, {documentOrder_, sampleStarts_, sampleOrder_}, log);
}

namespace {

// Sample j starts at token j·S of the concatenated document order: (position, offset). As in
// megatron-core's build_sample_idx, sample 0 starts at (0, 0) even when that document is empty, and
// every later start lies inside a document that has tokens.
std::vector<int64_t> computeSampleStarts(const std::vector<int64_t>& documentOrder, const std::vector<int64_t>& lengths,
                                         int64_t begin, int64_t samples, int64_t sequenceLength) {
  std::vector<int64_t> starts;
  starts.reserve(2 * static_cast<size_t>(samples + 1));
  int64_t position = 0, offset = 0;
  auto lengthAt = [&](int64_t p) { return lengths[documentOrder[p] - begin]; };
  for (int64_t sample = 0; sample <= samples; ++sample) {
    for (int64_t remaining = sample == 0 ? 0 : sequenceLength; remaining > 0;) {
      const int64_t available = lengthAt(position) - offset;
      if (available > remaining) {
        offset += remaining;
        remaining = 0;
      } else {
        remaining -= available;
        ++position;
        offset = 0;
      }
    }
    // Token sample·S <= E·T − 1 exists, so this stops inside the order.
    while (sample > 0 && offset >= lengthAt(position)) {
      ++position;
      offset = 0;
    }
    starts.push_back(position);
    starts.push_back(offset);
  }
  return starts;
}

}  // namespace

void PackedDataset::build() {
  const DocumentRange range = options_.documents;
  documentOrder_.clear();
  documentOrder_.reserve(static_cast<size_t>(epochs_ * range.size()));
  std::vector<int64_t> epochOrder(static_cast<size_t>(range.size()));
  for (int64_t epoch = 0; epoch < epochs_; ++epoch) {
    std::iota(epochOrder.begin(), epochOrder.end(), range.begin);
    philoxShuffle(epochOrder, options_.seed, ShufflePurpose::DocumentOrder, static_cast<uint32_t>(epoch));
    documentOrder_.insert(documentOrder_.end(), epochOrder.begin(), epochOrder.end());
  }
  sampleStarts_ = computeSampleStarts(documentOrder_, lengths_, range.begin, samples_, options_.sequenceLength);
  sampleOrder_.resize(static_cast<size_t>(samples_));
  std::iota(sampleOrder_.begin(), sampleOrder_.end(), 0);
  philoxShuffle(sampleOrder_, options_.seed, ShufflePurpose::SampleOrder, 0);
}

// What a cache file's arrays must satisfy beyond its checksum and key: each epoch of the document
// order a permutation of the split, the sample starts those of that order, the sample order a
// permutation of the samples.
std::string PackedDataset::validate(const IndexArrays& arrays) const {
  const DocumentRange range = options_.documents;
  const std::vector<int64_t>& order = arrays[0];
  if (static_cast<int64_t>(order.size()) != epochs_ * range.size())
    return "document order holds " + std::to_string(order.size()) + " entries, expected " +
           std::to_string(epochs_ * range.size());
  for (int64_t epoch = 0; epoch < epochs_; ++epoch)
    if (std::string problem = checkPermutation(order.data() + epoch * range.size(), range.size(), range.begin,
                                               "document order of epoch " + std::to_string(epoch));
        !problem.empty())
      return problem;
  if (arrays[1] != computeSampleStarts(order, lengths_, range.begin, samples_, options_.sequenceLength))
    return "sample starts do not match the document order";
  if (static_cast<int64_t>(arrays[2].size()) != samples_)
    return "sample order holds " + std::to_string(arrays[2].size()) + " entries, expected " + std::to_string(samples_);
  return checkPermutation(arrays[2].data(), samples_, 0, "sample order");
}

PackedSample PackedDataset::sample(int64_t index) const {
  if (index < 0 || index >= size())
    throw InputError(source_->identity() + ": sample " + std::to_string(index) + " outside its " +
                     std::to_string(size()) + " samples");
  const int64_t unshuffled = sampleOrder_[index];
  int64_t position = sampleStarts_[2 * unshuffled], offset = sampleStarts_[2 * unshuffled + 1];
  const int64_t width = options_.sequenceLength + 1;
  PackedSample sample;
  sample.tokens.reserve(width);
  std::vector<int64_t> piece;
  for (int64_t segment = 0; static_cast<int64_t>(sample.tokens.size()) < width; ++position, offset = 0) {
    const int64_t document = documentOrder_[position];
    const int64_t length = lengths_[document - options_.documents.begin];
    const int64_t take = std::min(length - offset, width - static_cast<int64_t>(sample.tokens.size()));
    if (take <= 0) continue;  // an empty document
    piece.clear();
    source_->readTokens(document, offset, take, piece);
    if (static_cast<int64_t>(piece.size()) != take)
      throw RuntimeError(source_->identity() + ": document " + std::to_string(document) + ": read " +
                         std::to_string(piece.size()) + " tokens, expected " + std::to_string(take));
    sample.tokens.insert(sample.tokens.end(), piece.begin(), piece.end());
    for (int64_t k = 0; k < take; ++k) {
      sample.segmentIds.push_back(segment);
      sample.positionIds.push_back(offset + k);
      sample.endsDocument.push_back(offset + k == length - 1 ? 1 : 0);
    }
    sample.segmentDocuments.push_back(document);
    ++segment;
  }
  return sample;
}

}  // namespace dgemma
