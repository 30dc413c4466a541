// Prints what dgemma's pre-training dataset builds for a request, for megatron_interop.py to check
// against megatron-core. Reads one JSON object on stdin:
//   {"sources": [[[tokens of document 0], ...], ...], "weights": [...], "split": "969,30,1",
//    "part": 0, "sequence_length": S, "seed": s, "num_samples": N}
// and writes {"ranges": [[[b, e] x 3] per source], "blend": {"source": [...], "sample": [...]},
//   "datasets": [{"requested", "epochs", "document_order", "sample_starts", "sample_order",
//   "samples": [{"tokens", "documents"}]} per source]}.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "runtime/data/pretrain/BlendedDataset.h"

using namespace dgemma;

int main() {
  const nlohmann::json request = nlohmann::json::parse(std::cin);
  std::vector<BlendSource> sources;
  for (size_t k = 0; k < request["sources"].size(); ++k)
    sources.push_back(
        {std::make_shared<InMemoryDocuments>(request["sources"][k].get<std::vector<std::vector<int64_t>>>()),
         request["weights"][k].get<double>()});
  const BlendOptions options{.sequenceLength = request["sequence_length"],
                             .seed = request["seed"],
                             .numSamples = request["num_samples"],
                             .split = parseSplit(request["split"]),
                             .part = static_cast<SplitPart>(request["part"].get<int>())};
  const BlendedDataset blend(sources, options, nullptr);

  nlohmann::json answer;
  for (const BlendSource& source : sources) {
    nlohmann::json ranges = nlohmann::json::array();
    for (const DocumentRange& range : splitDocumentRanges(options.split, source.documents->sequenceCount()))
      ranges.push_back({range.begin, range.end});
    answer["ranges"].push_back(ranges);
  }
  for (int64_t i = 0; i < blend.size(); ++i) {
    answer["blend"]["source"].push_back(blend.sourceAt(i));
    answer["blend"]["sample"].push_back(blend.sourceSampleAt(i));
  }
  for (int64_t k = 0; k < blend.sourceCount(); ++k) {
    const PackedDataset& dataset = blend.source(k);
    nlohmann::json samples = nlohmann::json::array();
    for (int64_t i = 0; i < dataset.size(); ++i) {
      const PackedSample sample = dataset.sample(i);
      samples.push_back({{"tokens", sample.tokens}, {"documents", sample.segmentDocuments}});
    }
    answer["datasets"].push_back({{"requested", dataset.requestedSamples()},
                                  {"epochs", dataset.epochs()},
                                  {"document_order", dataset.documentOrder()},
                                  {"sample_starts", dataset.sampleStarts()},
                                  {"sample_order", dataset.sampleOrder()},
                                  {"samples", samples}});
  }
  std::cout << answer.dump() << "\n";
}
