#include "runtime/data/pretrain/BlendedDataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "support/Error.h"

namespace dgemma {

namespace {

// megatron-core's mid_level_dataset_surplus: each source builds 0.5% more samples than its share,
// computed as megatron-core computes it: ceil(ceil(N · w) · (1 + 0.005)) in double.
constexpr double kSampleSurplus = 0.005;

std::string shortest(double value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  (void)error;  // 32 characters hold any double's shortest form
  return std::string(buffer, end);
}

}  // namespace

std::vector<int64_t> greedyBlendOrder(const std::vector<double>& normalizedWeights, int64_t numSamples) {
  const size_t sources = normalizedWeights.size();
  std::vector<int64_t> taken(sources, 0);
  std::vector<int64_t> order(static_cast<size_t>(numSamples));
  for (int64_t i = 0; i < numSamples; ++i) {
    // megatron-core's target count: max(i, 1), so samples 0 and 1 both aim at one sample's worth.
    const double target = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double bestDeficit = normalizedWeights[0] * target - static_cast<double>(taken[0]);
    for (size_t k = 1; k < sources; ++k) {
      const double deficit = normalizedWeights[k] * target - static_cast<double>(taken[k]);
      if (deficit > bestDeficit) {  // strictly: a tie stays with the lower index
        best = k;
        bestDeficit = deficit;
      }
    }
    order[i] = static_cast<int64_t>(best);
    ++taken[best];
  }
  return order;
}

BlendedDataset::BlendedDataset(const std::vector<BlendSource>& sources, const BlendOptions& options,
                               std::ostream* log) {
  if (sources.empty()) throw InputError("blend: expected at least one source");
  // Checked here too, so that a bad value leaves no blend cache behind.
  if (options.sequenceLength < 1)
    throw InputError("sequence length: expected at least 1 token, got " + std::to_string(options.sequenceLength));
  if (options.numSamples < 1)
    throw InputError("number of samples: expected at least 1, got " + std::to_string(options.numSamples));
  double sum = 0;
  for (const BlendSource& source : sources) {
    if (!(source.weight > 0) || !std::isfinite(source.weight))
      throw InputError(source.documents->identity() + ": expected a blend weight > 0, got " + shortest(source.weight));
    sum += source.weight;
  }
  for (const BlendSource& source : sources) weights_.push_back(source.weight / sum);

  // The blend order depends on the weights and N alone; the key also names the sources, split, S and
  // seed so that every blend has a file of its own.
  key_ = "dgemma blend index v1\n";
  for (const BlendSource& source : sources)
    key_ += "source: " + source.documents->identity() + " weight " + shortest(source.weight) + "\n";
  key_ += "split: " + formatSplit(options.split) + " " + splitPartName(options.part) +
          "\nsequence_length: " + std::to_string(options.sequenceLength) + "\nseed: " + std::to_string(options.seed) +
          "\nnum_samples: " + std::to_string(options.numSamples) + "\n";
  const std::optional<IndexCacheLocation> location =
      indexCacheLocation(options.cacheDirectory, sources[0].documents->cachePrefix());
  std::optional<IndexArrays> arrays;
  if (location) {
    cachePath_ = indexCachePath(*location, "blend", key_);
    arrays = loadIndexCache(
        cachePath_, key_, 2,
        [this, &options](const IndexArrays& loaded) {
          if (static_cast<int64_t>(loaded[0].size()) != options.numSamples || loaded[1].size() != loaded[0].size())
            return std::string("expected " + std::to_string(options.numSamples) + " samples");
          return validate(loaded);
        },
        log);
  }
  if (!arrays) {
    builtIndex_ = true;
    IndexArrays built(2);
    built[0] = greedyBlendOrder(weights_, options.numSamples);
    std::vector<int64_t> taken(sources.size(), 0);
    for (int64_t source : built[0]) built[1].push_back(taken[source]++);
    if (location) storeIndexCache(cachePath_, key_, built, log);
    arrays = std::move(built);
  }
  sourceOf_ = std::move((*arrays)[0]);
  sourceSample_ = std::move((*arrays)[1]);

  std::vector<int64_t> taken(sources.size(), 0);
  for (int64_t source : sourceOf_) ++taken[source];
  for (size_t k = 0; k < sources.size(); ++k) {
    const TokenDocuments& documents = *sources[k].documents;
    const DocumentRange range =
        splitDocumentRanges(options.split, documents.sequenceCount())[static_cast<int>(options.part)];
    if (range.size() == 0)
      throw InputError(documents.identity() + ": --split " + formatSplit(options.split) + " gives the " +
                       splitPartName(options.part) + " part none of its " + std::to_string(documents.sequenceCount()) +
                       " documents");
    const double margin =
        std::ceil(std::ceil(static_cast<double>(options.numSamples) * weights_[k]) * (1 + kSampleSurplus));
    PackedDatasetOptions packed{.sequenceLength = options.sequenceLength,
                                .seed = options.seed,
                                .numSamples = std::max(static_cast<int64_t>(margin), taken[k]),
                                .documents = range,
                                .cacheDirectory = options.cacheDirectory};
    sources_.push_back(std::make_unique<PackedDataset>(sources[k].documents, packed, log));
  }
}

// Each entry names a source, and each source's samples are taken in order: 0, 1, 2, ...
std::string BlendedDataset::validate(const IndexArrays& arrays) const {
  std::vector<int64_t> taken(weights_.size(), 0);
  for (size_t i = 0; i < arrays[0].size(); ++i) {
    const int64_t source = arrays[0][i];
    if (source < 0 || source >= static_cast<int64_t>(weights_.size()))
      return "sample " + std::to_string(i) + " names source " + std::to_string(source);
    if (arrays[1][i] != taken[source]++)
      return "sample " + std::to_string(i) + " skips samples of source " + std::to_string(source);
  }
  return "";
}

PackedSample BlendedDataset::sample(int64_t index) const {
  if (index < 0 || index >= size())
    throw InputError("blend: sample " + std::to_string(index) + " outside its " + std::to_string(size()) + " samples");
  return sources_[sourceOf_[index]]->sample(sourceSample_[index]);
}

}  // namespace dgemma
