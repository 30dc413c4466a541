#include "runtime/exec/WeightLoader.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "support/Error.h"
#include "support/Json.h"
#include "runtime/core/Philox.h"
#include "runtime/core/ShardBoxes.h"
#include "runtime/exec/PaddedRows.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TransferProgress.h"
#include "runtime/quant/Quantize.h"

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

// A plan parameter that holds one part of a frozen base weight stored quantized (init
// {"kind": "quantized", "format", "part", "weight", "shape"}; docs/plan-format.md, "Header").
struct QuantizedPart {
  quant::Format format;
  bool codes;  // else the scales ("scale" for int8, "absmax" for nf4)
  std::string weight;
  std::vector<int64_t> shape;  // the weight's global (logical) shape
};

std::optional<QuantizedPart> quantizedPartOf(const Parameter& parameter) {
  const nlohmann::json& init = parameter.init;
  if (!init.is_object() || init.value("kind", nlohmann::json()) != "quantized") return std::nullopt;
  const std::string where = "--plan: parameter " + parameter.name + ": init";
  auto text = [&](const char* key) {
    auto field = init.find(key);
    if (field == init.end() || !field->is_string())
      throw InputError(where + "." + key + ": expected a string, got " +
                       (field == init.end() ? std::string("nothing") : describeJsonValue(*field)));
    return field->get<std::string>();
  };
  QuantizedPart part;
  const std::string format = text("format");
  const std::optional<quant::Format> parsed = quant::parseFormat(format);
  if (!parsed) throw InputError(where + ".format: expected \"int8\" or \"nf4\", got " + quoteForMessage(format));
  part.format = *parsed;
  const std::string which = text("part");
  const std::string scalesName = part.format == quant::Format::Int8 ? "scale" : "absmax";
  if (which != "codes" && which != scalesName)
    throw InputError(where + ".part: expected \"codes\" or \"" + scalesName + "\", got " + quoteForMessage(which));
  part.codes = which == "codes";
  part.weight = text("weight");
  auto shape = init.find("shape");
  if (shape == init.end() || !shape->is_array()) throw InputError(where + ".shape: expected an array of sizes");
  for (const nlohmann::json& size : *shape) {
    if (!size.is_number_integer() || size.get<int64_t>() <= 0)
      throw InputError(where + ".shape: expected positive integers, got " + describeJsonValue(*shape));
    part.shape.push_back(size.get<int64_t>());
  }
  const std::vector<int64_t> expected = part.codes ? quant::codesShape(part.format, part.shape, where + ".shape")
                                                   : quant::scalesShape(part.format, part.shape, where + ".shape");
  if (expected != parameter.globalShape)
    throw InputError(where + ": the " + which + " of a " + format + " weight of shape " + shapeToString(part.shape) +
                     " are " + shapeToString(expected) + ", but the parameter is " +
                     shapeToString(parameter.globalShape));
  return part;
}

// The part's dtype as stored: codes i8 (int8) or u8 (nf4), scales f32.
DType storedDType(const QuantizedPart& part) { return part.codes ? quant::codesDType(part.format) : DType::F32; }

// Quantizes each frozen base weight once for both of its parts, keeping it until the second part takes
// it: the loader's extra memory is one weight in f32 and its quantized form.
class QuantizedWeights {
 public:
  explicit QuantizedWeights(const std::vector<Parameter>& parameters) {
    for (const Parameter& parameter : parameters)
      if (std::optional<QuantizedPart> part = quantizedPartOf(parameter)) ++pending_[part->weight];
  }

  // `part`'s box of the weight that `logical` (the weight's global tensor, any float dtype) holds.
  HostTensor take(const Parameter& parameter, const QuantizedPart& part, const std::function<HostTensor()>& logical) {
    auto found = quantized_.find(part.weight);
    if (found == quantized_.end())
      found = quantized_.emplace(part.weight, quant::quantize(logical(), part.format, "tensor " + part.weight)).first;
    HostTensor box =
        sliceBox(part.codes ? found->second.codes : found->second.scales, parameter.shardOffset, parameter.shardShape);
    if (--pending_[part.weight] == 0) quantized_.erase(found);
    return box;
  }

 private:
  std::map<std::string, int> pending_;
  std::map<std::string, quant::QuantizedTensor> quantized_;
};

}  // namespace

void loadWeights(Executor& executor, const std::string& source, const TensorSource& read, std::vector<std::string> otherProblems) {
  std::vector<std::string> problems;
  QuantizedWeights quantized(executor.plan().parameters);
  for (const Parameter& parameter : executor.plan().parameters) {
    // Gradient buffers and inference run state are no weights: they start at zero and are never
    // read from a checkpoint.
    if (parameter.name.rfind(kGradientPrefix, 0) == 0 || isRunState(parameter.name)) {
      executor.setParameter(parameter.name, HostTensor(executor.plan().buffers[parameter.buffer].dtype, parameter.shardShape));
      continue;
    }
    if (const std::optional<QuantizedPart> part = quantizedPartOf(parameter)) {
      // Quantized at load from the weight's float tensor.
      std::optional<HostTensor> weight = read(part->weight);
      if (!weight || weight->shape != part->shape || !isFloating(weight->dtype)) {
        problems.push_back(
            "tensor " + part->weight + ": expected a float tensor of shape " + shapeToString(part->shape) +
            " to quantize to " + std::string(quant::formatName(part->format)) + ", found " +
            (weight ? std::string(dtypeName(weight->dtype)) + " " + shapeToString(weight->shape) : "none"));
        continue;
      }
      executor.setParameter(parameter.name, quantized.take(parameter, *part, [&] { return *weight; }));
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
    // A padded parameter comes as its logical rows (docs/parallelism.md, "Vocabulary padding").
    if (global->shape != parameter.globalShape && global->shape == logicalShape(parameter))
      global = withZeroRows(*global, parameter.globalShape[0]);
    if (global->shape != parameter.globalShape) {
      problems.push_back("tensor " + parameter.name + ": expected shape " + shapeToString(logicalShape(parameter)) +
                         ", found " + shapeToString(global->shape));
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
  // Where each quantized part comes from: the packed tensor itself (a quantized checkpoint, same name and
  // stored dtype), else the weight's float tensor, quantized at load.
  std::map<std::string, SafetensorsLocation> packedParts, weightsToQuantize;
  std::set<std::string> reported;
  for (const Parameter& parameter : plan.parameters) {
    const std::optional<QuantizedPart> part = quantizedPartOf(parameter);
    if (!part) continue;
    if (std::optional<SafetensorsLocation> packed = locate(parameter.name);
        packed && packed->entry->dtype == storedDType(*part) && packed->entry->shape == parameter.globalShape) {
      packedParts.emplace(parameter.name, *packed);
      totalBytes += static_cast<uint64_t>(boxVolume({parameter.shardOffset, parameter.shardShape})) *
                    dtypeSize(storedDType(*part));
      continue;
    }
    const std::optional<SafetensorsLocation> weight = locate(part->weight);
    if (weightsToQuantize.count(part->weight) || !reported.insert(part->weight).second) continue;  // its other part
    if (!weight)
      problems.push_back("missing tensor " + part->weight + " " + shapeToString(part->shape) + " (stored as " +
                         std::string(quant::formatName(part->format)) + ")");
    else if (weight->entry->shape != part->shape || !isFloating(weight->entry->dtype))
      problems.push_back(weight->file->path() + ": tensor " + weight->entry->name +
                         ": expected a float tensor of shape " + shapeToString(part->shape) + " to quantize to " +
                         std::string(quant::formatName(part->format)) + ", found " +
                         std::string(dtypeName(weight->entry->dtype)) + " " + shapeToString(weight->entry->shape));
    else if (weightsToQuantize.emplace(part->weight, *weight).second)
      totalBytes += static_cast<uint64_t>(boxVolume(wholeBox(part->shape))) * dtypeSize(weight->entry->dtype);
  }
  for (const Parameter& parameter : plan.parameters) {
    if (parameter.name.rfind(kGradientPrefix, 0) == 0 || isRunState(parameter.name) || skipped(parameter)) continue;
    if (quantizedPartOf(parameter)) continue;
    const std::optional<SafetensorsLocation> location = locate(parameter.name);
    if (!location) {
      if (parameter.name.rfind(kOptimizerStatePrefix, 0) != 0)
        problems.push_back("missing tensor " + parameter.name + " " + shapeToString(parameter.globalShape));
      continue;
    }
    const SafetensorsEntry& entry = *location->entry;
    // A padded parameter is stored as its logical rows (docs/parallelism.md, "Vocabulary padding").
    if (entry.shape != logicalShape(parameter))
      problems.push_back(location->file->path() + ": tensor " + entry.name + ": expected shape " +
                         shapeToString(logicalShape(parameter)) + ", found " + shapeToString(entry.shape));
    else if (isFloating(entry.dtype) != isFloating(plan.buffers[parameter.buffer].dtype))
      problems.push_back(location->file->path() + ": tensor " + entry.name + ": dtype " + std::string(dtypeName(entry.dtype)) +
                         " cannot be converted to " + std::string(dtypeName(plan.buffers[parameter.buffer].dtype)));
    totalBytes += static_cast<uint64_t>(boxVolume({parameter.shardOffset, parameter.shardShape})) * dtypeSize(entry.dtype);
  }
  throwIfProblems(source, std::move(problems), otherProblems);

  TransferProgress progress("loading " + source, totalBytes, plan.rank == 0 && transferProgressWanted());
  QuantizedWeights quantized(plan.parameters);
  for (const Parameter& parameter : plan.parameters) {
    if (skipped(parameter)) continue;
    const Buffer& buffer = plan.buffers[parameter.buffer];
    if (const std::optional<QuantizedPart> part = quantizedPartOf(parameter)) {
      if (auto packed = packedParts.find(parameter.name); packed != packedParts.end()) {
        const SafetensorsEntry& entry = *packed->second.entry;
        HostTensor value(entry.dtype, parameter.shardShape);
        const ShardBox box{parameter.shardOffset, parameter.shardShape};
        copyRegion(packed->second.file->data(entry), wholeBox(entry.shape), value.data.data(), box, box,
                   dtypeSize(entry.dtype));
        packed->second.file->release(entry);
        progress.advance(static_cast<uint64_t>(value.numElements()) * dtypeSize(entry.dtype));
        executor.setParameter(parameter.name, value);
        continue;
      }
      const SafetensorsLocation& weight = weightsToQuantize.at(part->weight);
      executor.setParameter(parameter.name, quantized.take(parameter, *part, [&] {
        const SafetensorsEntry& entry = *weight.entry;
        HostTensor logical(DType::F32, entry.shape);
        convertElements(weight.file->data(entry), entry.dtype, logical.data.data(), DType::F32,
                        static_cast<uint64_t>(logical.numElements()), weight.file->path() + ": tensor " + entry.name);
        weight.file->release(entry);
        progress.advance(static_cast<uint64_t>(logical.numElements()) * dtypeSize(entry.dtype));
        return logical;
      }));
      continue;
    }
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
    if (entry.shape != parameter.globalShape) {
      // The logical rows inside this rank's box; the padding rows stay zero.
      ShardBox stored = box;
      stored.shape[0] = std::clamp<int64_t>(entry.shape[0] - box.offset[0], 0, box.shape[0]);
      HostTensor storedBox(entry.dtype, parameter.shardShape);
      if (stored.shape[0] > 0)
        copyRegion(location->file->data(entry), wholeBox(entry.shape), storedBox.data.data(), box, stored,
                   dtypeSize(entry.dtype));
      value = convertDType(std::move(storedBox), buffer.dtype, what);
    } else if (box == wholeBox(entry.shape)) {
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

// The global tensor `parameter`'s init spec draws (in f64).
HostTensor drawGlobal(const Parameter& parameter, uint64_t seed);

}  // namespace

void initializeWeights(Executor& executor, uint64_t seed) {
  initializeWeights(executor, seed, [](const Parameter&) { return true; });
}

void initializeWeights(Executor& executor, uint64_t seed, const std::function<bool(const Parameter&)>& which) {
  QuantizedWeights quantized(executor.plan().parameters);
  for (const Parameter& parameter : executor.plan().parameters) {
    if (!which(parameter)) continue;
    if (const std::optional<QuantizedPart> part = quantizedPartOf(parameter)) {
      // The weight as its own init spec (`base`) draws it under its own name, so a quantized base holds
      // the quantized form of the same weights as an f32 one.
      Parameter weight;
      weight.name = part->weight;
      weight.globalShape = part->shape;
      weight.init = parameter.init.value("base", nlohmann::json());
      executor.setParameter(parameter.name, quantized.take(parameter, *part, [&] { return drawGlobal(weight, seed); }));
      continue;
    }
    HostTensor global = drawGlobal(parameter, seed);
    // Padding rows start at zero; the real rows draw what an unpadded plan draws (same element indices).
    if (const std::optional<int64_t> rows = logicalRows(parameter))
      global = withZeroRows(firstRows(global, *rows), parameter.globalShape[0]);
    const Buffer& buffer = executor.plan().buffers[parameter.buffer];
    HostTensor converted = convertDType(global, buffer.dtype, "parameter " + parameter.name);
    executor.setParameter(parameter.name, sliceBox(converted, parameter.shardOffset, parameter.shardShape));
  }
}

namespace {

HostTensor drawGlobal(const Parameter& parameter, uint64_t seed) {
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
  return global;
}

}  // namespace

}  // namespace dgemma
