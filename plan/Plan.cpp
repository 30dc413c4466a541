#include "plan/Plan.h"

#include <limits>

#include "support/Shape.h"

namespace dgemma {

const char* modelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::Builtin: return "builtin";
    case ModelFamily::DiffusionGemma: return "diffusion_gemma";
  }
  return "?";
}

std::optional<ModelFamily> parseModelFamily(const std::string& name) {
  for (ModelFamily family : {ModelFamily::Builtin, ModelFamily::DiffusionGemma})
    if (name == modelFamilyName(family)) return family;
  return std::nullopt;
}

int64_t Buffer::numElements() const { return numElementsOf(shape); }

std::string EntryPoint::key() const {
  if (bucket.empty()) return name;
  std::string text = name + "[";
  bool first = true;
  for (const auto& [dimension, size] : bucket) {
    text += (first ? "" : ",") + dimension + "=" + std::to_string(size);
    first = false;
  }
  return text + "]";
}

const EntryPoint* Plan::selectEntry(const std::string& name, const std::map<std::string, int64_t>& sizes) const {
  const EntryPoint* best = nullptr;
  int64_t bestTotal = std::numeric_limits<int64_t>::max();
  for (const EntryPoint& entry : entryPoints) {
    if (entry.name != name) continue;
    bool fits = true;
    int64_t total = 0;
    for (const auto& [dimension, size] : sizes) {
      auto it = entry.bucket.find(dimension);
      if (it == entry.bucket.end() || it->second < size) {
        fits = false;
        break;
      }
      total += it->second;
    }
    if (fits && total < bestTotal) {
      best = &entry;
      bestTotal = total;
    }
  }
  return best;
}

}  // namespace dgemma
