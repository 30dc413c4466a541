#include "runtime/generate/RecordedDraws.h"

#include <algorithm>
#include <string>

#include "support/Error.h"

namespace dgemma {

namespace {

std::string describe(const char* what, int64_t request, int64_t canvas, int64_t step) {
  return std::string("recorded draws: ") + what + " of request " + std::to_string(request) + ", canvas " +
         std::to_string(canvas) + (step >= 0 ? ", step " + std::to_string(step) : std::string());
}

void copyRecorded(const std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<int64_t>>& recorded, const char* what,
                  int64_t request, int64_t canvas, int64_t step, std::span<int64_t> ids) {
  auto it = recorded.find({request, canvas, step});
  if (it == recorded.end()) throw InputError(describe(what, request, canvas, step) + ": not recorded");
  if (it->second.size() != ids.size())
    throw InputError(describe(what, request, canvas, step) + ": expected " + std::to_string(ids.size()) + " ids, got " +
                     std::to_string(it->second.size()));
  std::copy(it->second.begin(), it->second.end(), ids.begin());
}

}  // namespace

void RecordedDraws::setInitialCanvas(int64_t request, int64_t canvas, std::vector<int64_t> ids) {
  initial_[{request, canvas, -1}] = std::move(ids);
}

void RecordedDraws::setRenoiseIds(const DrawSite& site, std::vector<int64_t> ids) {
  renoise_[{site.request, site.canvas, site.step}] = std::move(ids);
}

void RecordedDraws::setSampled(const DrawSite& site, std::vector<int64_t> ids) {
  sampled_[{site.request, site.canvas, site.step}] = std::move(ids);
}

void RecordedDraws::initialCanvas(int64_t request, int64_t canvas, std::span<int64_t> ids) {
  copyRecorded(initial_, "the initial canvas", request, canvas, -1, ids);
}

void RecordedDraws::renoiseIds(const DrawSite& site, std::span<int64_t> ids) {
  copyRecorded(renoise_, "the renoise ids", site.request, site.canvas, site.step, ids);
}

std::array<int64_t, 2> RecordedDraws::sampleKey(const DrawSite&) { return {0, 0}; }

bool RecordedDraws::replaceSampled(const DrawSite& site, std::span<int64_t> sampled) {
  copyRecorded(sampled_, "the sampled ids", site.request, site.canvas, site.step, sampled);
  return true;
}

}  // namespace dgemma
