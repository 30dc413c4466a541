// Named recipes (`dgemma-compile --preset NAME`): defaults for the compile flags (objective,
// optimizer, shapes) and for the run (`dgemma-run train` reads them from the plan metadata), each
// overridable by an explicit flag.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dgemma {

struct Preset {
  std::string name;
  std::string summary;
  nlohmann::json compile;  // dgemma-compile flag name (without "--") -> value
  nlohmann::json train;    // dgemma-run train flag name (without "--") -> value
};

const std::vector<Preset>& presets();
// Throws InputError naming the known presets for an unknown name.
const Preset& findPreset(const std::string& name);

}  // namespace dgemma
