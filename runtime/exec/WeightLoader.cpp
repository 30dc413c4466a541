#include "runtime/exec/WeightLoader.h"

#include <xxhash.h>

#include <cmath>
#include <set>
#include <sstream>

#include "support/Error.h"
#include "support/Json.h"
#include "runtime/core/Philox.h"
#include "runtime/core/ShardBoxes.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TransferProgress.h"

namespace dgemma {

namespace {

// Copies the box [offset, offset + shape) of a row-major global tensor.
HostTensor sliceBox(const HostTensor& global, const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  if (offset == std::vector<int64_t>(offset.size(), 0) && shape == global.shape) return global;
  HostTensor shard(global.dtype, shape);
  const ShardBox box{offset, shape};
  copyRegion(global.data.data(), wholeBox(global.shape), shard.data.data(), box, box, dtypeSize(global.dtype));
  return shard;
}

// One error listing every problem found with `source`'s weights (the checks' own and those the
// caller found), so that a user fixes a checkpoint in one round; nothing when there are none.
void throwIfProblems(const std::string& source, std::vector<std::string> problems, const std::vector<std::string>& otherProblems) {
  problems.insert(problems.end(), otherProblems.begin(), otherProblems.end());
  if (problems.empty()) return;
  std::ostringstream message;
  message << source << ": " << problems.size() << " problem(s) with the weights:";
  for (const std::string& problem : problems) message << "\n  " << problem;
  throw InputError(message.str());
}

}  // namespace

void loadWeights(Executor& executor, const std::string& source, const TensorSource& read, std::vector<std::string> otherProblems) {
  std::vector<std::string> problems;
  for (const Parameter& parameter : executor.plan().parameters) {
    // Gradient buffers and inference run state are no weights: they start at zero and are never
    // read from a checkpoint.
    if (parameter.name.rfind(kGradientPrefix, 0) == 0 || isRunState(parameter.name)) {
      executor.setParameter(parameter.name, HostTensor(executor.plan().buffers[parameter.buffer].dtype, parameter.shardShape));
      continue;
    }
    std::optional<HostTensor> global = read(parameter.name);
    if (!global && parameter.name.rfind(kOptimizerStatePrefix, 0) == 0) {
      executor.setParameter(parameter.name, HostTensor(executor.plan().buffers[parameter.buffer].dtype, parameter.shardShape));
      continue;
    }
    if (!global) {
      problems.push_back("missing tensor " + parameter.name + " " + shapeToString(parameter.globalShape));
      continue;
    }
    if (global->shape != parameter.globalShape) {
      problems.push_back("tensor " + parameter.name + ": expected shape " + shapeToString(parameter.globalShape) + ", found " +
                         shapeToString(global->shape));
      continue;
    }
    const Buffer& buffer = executor.plan().buffers[parameter.buffer];
    try {
      HostTensor converted = convertDType(*global, buffer.dtype, "tensor " + parameter.name);
      executor.setParameter(parameter.name, sliceBox(converted, parameter.shardOffset, parameter.shardShape));
    } catch (const InputError& error) {
      problems.push_back(error.what());
    }
  }
  throwIfProblems(source, std::move(problems), otherProblems);
}

void loadMappedWeights(Executor& executor, const std::string& source, const TensorLocator& locate,
                       std::vector<std::string> otherProblems,
                       const std::function<bool(const Parameter&)>& filledElsewhere) {
  const Plan& plan = executor.plan();
  auto skipped = [&](const Parameter& parameter) { return filledElsewhere && filledElsewhere(parameter); };
  // Checked first, so that a checkpoint with a problem costs no copying.
  std::vector<std::string> problems;
  uint64_t totalBytes = 0;
  for (const Parameter& parameter : plan.parameters) {
    if (parameter.name.rfind(kGradientPrefix, 0) == 0 || isRunState(parameter.name) || skipped(parameter)) continue;
    const std::optional<SafetensorsLocation> location = locate(parameter.name);
    if (!location) {
      if (parameter.name.rfind(kOptimizerStatePrefix, 0) != 0)
        problems.push_back("missing tensor " + parameter.name + " " + shapeToString(parameter.globalShape));
      continue;
    }
    const SafetensorsEntry& entry = *location->entry;
    if (entry.shape != parameter.globalShape)
      problems.push_back(location->file->path() + ": tensor " + entry.name + ": expected shape " +
                         shapeToString(parameter.globalShape) + ", found " + shapeToString(entry.shape));
    else if (isFloating(entry.dtype) != isFloating(plan.buffers[parameter.buffer].dtype))
      problems.push_back(location->file->path() + ": tensor " + entry.name + ": dtype " + std::string(dtypeName(entry.dtype)) +
                         " cannot be converted to " + std::string(dtypeName(plan.buffers[parameter.buffer].dtype)));
    totalBytes += static_cast<uint64_t>(boxVolume({parameter.shardOffset, parameter.shardShape})) * dtypeSize(entry.dtype);
  }
  throwIfProblems(source, std::move(problems), otherProblems);

  TransferProgress progress("loading " + source, totalBytes, plan.rank == 0 && transferProgressWanted());
  for (const Parameter& parameter : plan.parameters) {
    if (skipped(parameter)) continue;
    const Buffer& buffer = plan.buffers[parameter.buffer];
    const std::optional<SafetensorsLocation> location =
        parameter.name.rfind(kGradientPrefix, 0) == 0 || isRunState(parameter.name) ? std::nullopt : locate(parameter.name);
    if (!location) {  // gradients, run state, optimizer state the checkpoint lacks: zeros
      executor.setParameter(parameter.name, HostTensor(buffer.dtype, parameter.shardShape));
      continue;
    }
    // Only this rank's box leaves the mapping: a whole tensor converted straight into the plan's
    // dtype, a part of one cut out in the stored dtype first. The loader's own memory is thus one box
    // in the plan's dtype, plus the stored one for a split tensor (docs/training.md, "Export").
    const SafetensorsEntry& entry = *location->entry;
    const std::string what = location->file->path() + ": tensor " + entry.name;
    const ShardBox box{parameter.shardOffset, parameter.shardShape};
    HostTensor value(buffer.dtype, parameter.shardShape);
    if (box == wholeBox(entry.shape)) {
      convertElements(location->file->data(entry), entry.dtype, value.data.data(), buffer.dtype,
                      static_cast<uint64_t>(value.numElements()), what);
    } else {
      HostTensor stored(entry.dtype, parameter.shardShape);
      copyRegion(location->file->data(entry), wholeBox(entry.shape), stored.data.data(), box, box, dtypeSize(entry.dtype));
      value = convertDType(std::move(stored), buffer.dtype, what);
    }
    location->file->release(entry);
    progress.advance(static_cast<uint64_t>(value.numElements()) * dtypeSize(entry.dtype));
    executor.setParameter(parameter.name, value);
  }
  progress.finish();
}

void loadWeights(Executor& executor, const std::string& weightsPath) {
  SafetensorsDirectory weights = SafetensorsDirectory::open(weightsPath);
  std::set<std::string> expected;
  for (const Parameter& parameter : executor.plan().parameters) expected.insert(parameter.name);
  std::vector<std::string> unexpected;
  for (const std::string& name : weights.names())
    if (!expected.count(name)) unexpected.push_back(weights.find(name)->file->path() + ": unexpected tensor " + name);
  loadMappedWeights(
      executor, weightsPath, [&](const std::string& name) { return weights.find(name); }, std::move(unexpected));
}

namespace {

// A parameter's init spec as the plan file gives it ({"kind": "normal", "std": 0.02}). A plan edited
// by hand (its hash recomputed) can hold any JSON there: each field is checked, since json::value
// would throw a bare type_error ("internal error").
const nlohmann::json* initField(const Parameter& parameter, const char* key, bool (nlohmann::json::*isType)() const noexcept,
                                const char* expected) {
  const std::string where = "--plan: parameter " + parameter.name + ": init";
  if (parameter.init.is_null()) return nullptr;
  if (!parameter.init.is_object()) throw InputError(where + ": expected an object, got " + describeJsonValue(parameter.init));
  auto field = parameter.init.find(key);
  if (field == parameter.init.end()) return nullptr;
  if (!((*field).*isType)()) throw InputError(where + "." + key + ": expected " + expected + ", got " + describeJsonValue(*field));
  return &*field;
}

}  // namespace

void initializeWeights(Executor& executor, uint64_t seed) {
  initializeWeights(executor, seed, [](const Parameter&) { return true; });
}

void initializeWeights(Executor& executor, uint64_t seed, const std::function<bool(const Parameter&)>& which) {
  for (const Parameter& parameter : executor.plan().parameters) {
    if (!which(parameter)) continue;
    const nlohmann::json* kindField = initField(parameter, "kind", &nlohmann::json::is_string, "a string");
    const std::string kind = kindField ? kindField->get<std::string>() : std::string("zeros");
    HostTensor global(DType::F64, parameter.globalShape);
    double* values = global.as<double>();
    const int64_t count = global.numElements();
    if (kind == "normal") {
      const nlohmann::json* stdField = initField(parameter, "std", &nlohmann::json::is_number, "a number");
      const double stddev = stdField ? stdField->get<double>() : 0.02;
      // The parameter's name picks its Philox counter range (the full 64-bit hash as the offset), so
      // adding a parameter never shifts another one's numbers. Box-Muller turns two uniforms into
      // one normal; 1 - u keeps log's argument in (0, 1].
      const uint64_t nameOffset = XXH3_64bits(parameter.name.data(), parameter.name.size());
      for (int64_t pair = 0; 2 * pair < count; ++pair) {
        PhiloxCounter words = philoxUniformBlock(seed, 0, nameOffset, pair);
        for (int64_t half = 0; half < 2 && 2 * pair + half < count; ++half) {
          double u1 = 1.0 - philoxWordToUniform(words[2 * half]);
          double u2 = philoxWordToUniform(words[2 * half + 1]);
          values[2 * pair + half] = stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        }
      }
    } else if (kind == "uniform") {
      // U(-bound, bound) (PEFT's kaiming_uniform(a=sqrt(5)) of a LoRA A is U(-1/sqrt(in), 1/sqrt(in))):
      // one Philox block gives four elements, from the same per-name counter range as "normal".
      const nlohmann::json* boundField = initField(parameter, "bound", &nlohmann::json::is_number, "a number");
      if (!boundField)
        throw InputError("--plan: parameter " + parameter.name + ": init.bound: required for kind \"uniform\"");
      const double bound = boundField->get<double>();
      if (!(bound >= 0.0) || !std::isfinite(bound))
        throw InputError("--plan: parameter " + parameter.name + ": init.bound: expected a finite number >= 0, got " +
                         describeJsonValue(*boundField));
      const uint64_t nameOffset = XXH3_64bits(parameter.name.data(), parameter.name.size());
      for (int64_t block = 0; 4 * block < count; ++block) {
        PhiloxCounter words = philoxUniformBlock(seed, 0, nameOffset, block);
        for (int64_t lane = 0; lane < 4 && 4 * block + lane < count; ++lane)
          values[4 * block + lane] = bound * (2.0 * philoxWordToUniform(words[lane]) - 1.0);
      }
    } else if (kind == "ones" || kind == "zeros") {
      std::fill(values, values + count, kind == "ones" ? 1.0 : 0.0);
    } else {
      throw InputError("--plan: parameter " + parameter.name +
                       ": init.kind: expected \"normal\", \"uniform\", \"ones\" or \"zeros\", got " +
                       quoteForMessage(kind));
    }
    const Buffer& buffer = executor.plan().buffers[parameter.buffer];
    HostTensor converted = convertDType(global, buffer.dtype, "parameter " + parameter.name);
    executor.setParameter(parameter.name, sliceBox(converted, parameter.shardOffset, parameter.shardShape));
  }
}

}  // namespace dgemma
