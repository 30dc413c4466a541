#include "runtime/generate/DrawSource.h"

#include "runtime/generate/GenerationKeys.h"
#include "support/Error.h"

namespace dgemma {

namespace {

void fillUniform(uint64_t seed, int64_t vocabSize, int64_t request, int64_t canvas, int64_t step, DrawPurpose purpose,
                 std::span<int64_t> ids) {
  if (static_cast<uint64_t>(step) >= kMaxKeyedSteps)
    throw InputError("denoising step " + std::to_string(step) + ": the draw keys take steps below 2^24");
  for (size_t position = 0; position < ids.size(); ++position)
    ids[position] = uniformTokenId(seed, request, canvas, step, purpose, position, vocabSize);
}

}  // namespace

void CounterDrawSource::initialCanvas(int64_t request, int64_t canvas, std::span<int64_t> ids) {
  fillUniform(seed_, vocabSize_, request, canvas, 0, DrawPurpose::InitialCanvas, ids);
}

void CounterDrawSource::renoiseIds(const DrawSite& site, std::span<int64_t> ids) {
  fillUniform(seed_, vocabSize_, site.request, site.canvas, site.step, DrawPurpose::Renoise, ids);
}

std::array<int64_t, 2> CounterDrawSource::sampleKey(const DrawSite& site) {
  return dgemma::sampleKey(seed_, site.request, site.canvas, site.step);
}

}  // namespace dgemma
