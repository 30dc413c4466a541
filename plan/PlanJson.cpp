// JSON header <-> Plan. Reading reports the exact field path of the first problem.
#include <cstdint>
#include <map>
#include <set>
#include <sstream>

#include "support/Error.h"
#include "support/Json.h"
#include "plan/PlanFile.h"

namespace dgemma {

using nlohmann::json;

namespace {

// A larger standard deviation or uniform bound has no use in any init and lets f32 parameters overflow.
constexpr double kMaxInitStd = 1.0;

// Every key planToJson and serializePlan write at the top level.
const std::set<std::string> kHeaderFields = {"format",       "version", "producer",       "rank",       "world_size",
                                             "mesh",         "arenas",  "buffers",        "parameters", "constants",
                                             "entry_points", "model",   "bucket_padding", "optimizer",  "run_defaults",
                                             "generation",   "adapter", "metadata",       "sections"};

// Reads typed fields out of a JSON object, naming "SOURCE: path.to.field" in every error.
class FieldReader {
 public:
  FieldReader(const json& node, std::string source, std::string path)
      : node_(node), source_(std::move(source)), path_(std::move(path)) {
    if (!node_.is_object()) fail("expected an object");
  }

  [[noreturn]] void fail(const std::string& message, const std::string& field = "") const {
    std::string where = path_;
    if (!field.empty()) where += (where.empty() ? "" : ".") + field;
    throw InputError(source_ + ": " + (where.empty() ? "header" : where) + ": " + message);
  }

  bool has(const std::string& key) const { return node_.contains(key); }

  const json& raw(const std::string& key) const {
    auto it = node_.find(key);
    if (it == node_.end()) fail("missing", key);
    return *it;
  }

  int64_t integer(const std::string& key) const { return integerValue(raw(key), key); }
  // An unsigned value above int64's range would wrap to a negative one in get<int64_t>.
  int64_t integerValue(const json& value, const std::string& field) const {
    if (!value.is_number_integer()) fail("expected an integer, got " + describeJsonValue(value), field);
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail("expected an integer below 2^63, got " + describeJsonValue(value), field);
    return value.get<int64_t>();
  }
  int64_t nonNegative(const std::string& key) const {
    int64_t value = integer(key);
    if (value < 0) fail("expected a non-negative integer, got " + std::to_string(value), key);
    return value;
  }
  std::string string(const std::string& key) const {
    const json& value = raw(key);
    if (!value.is_string()) fail("expected a string", key);
    return value.get<std::string>();
  }
  double number(const std::string& key) const {
    const json& value = raw(key);
    if (!value.is_number()) fail("expected a number", key);
    return value.get<double>();
  }
  bool boolean(const std::string& key) const {
    const json& value = raw(key);
    if (!value.is_boolean()) fail("expected true or false", key);
    return value.get<bool>();
  }
  std::vector<int64_t> integers(const std::string& key) const {
    const json& value = raw(key);
    if (!value.is_array()) fail("expected an array of integers", key);
    std::vector<int64_t> out;
    for (size_t i = 0; i < value.size(); ++i) out.push_back(integerValue(value[i], key + "[" + std::to_string(i) + "]"));
    return out;
  }
  std::vector<std::string> strings(const std::string& key) const {
    const json& value = array(key);
    std::vector<std::string> out;
    for (size_t i = 0; i < value.size(); ++i) {
      if (!value[i].is_string()) fail("expected a string", key + "[" + std::to_string(i) + "]");
      out.push_back(value[i].get<std::string>());
    }
    return out;
  }
  const json& array(const std::string& key) const {
    const json& value = raw(key);
    if (!value.is_array()) fail("expected an array", key);
    return value;
  }
  FieldReader child(const std::string& key) const { return FieldReader(raw(key), source_, join(key)); }
  FieldReader element(const std::string& key, size_t index) const {
    return FieldReader(array(key)[index], source_, join(key) + "[" + std::to_string(index) + "]");
  }
  const json& node() const { return node_; }

 private:
  std::string join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json& node_;
  std::string source_;
  std::string path_;
};

json stepToJson(const Step& step) {
  json node = {{"kind", step.kind == Step::Kind::Kernel ? "kernel" : "collective"},
               {"op", step.op},
               {"attrs", step.attrs},
               {"inputs", step.inputs},
               {"outputs", step.outputs},
               {"stream", step.stream},
               {"wait", step.waitEvents},
               {"signal", step.signalEvents}};
  if (step.kind == Step::Kind::Collective) node["axis"] = step.axis;
  if (!step.location.empty()) node["loc"] = step.location;
  return node;
}

Step stepFromJson(const FieldReader& reader) {
  Step step;
  std::string kind = reader.string("kind");
  if (kind == "kernel") {
    step.kind = Step::Kind::Kernel;
  } else if (kind == "collective") {
    step.kind = Step::Kind::Collective;
    step.axis = reader.string("axis");
  } else {
    reader.fail("expected \"kernel\" or \"collective\", got \"" + kind + "\"", "kind");
  }
  step.op = reader.string("op");
  step.attrs = reader.raw("attrs");
  if (!step.attrs.is_object()) reader.fail("expected an object", "attrs");
  step.inputs = reader.integers("inputs");
  step.outputs = reader.integers("outputs");
  step.stream = reader.nonNegative("stream");
  step.waitEvents = reader.integers("wait");
  step.signalEvents = reader.integers("signal");
  if (reader.has("loc")) step.location = reader.string("loc");
  return step;
}

json namedBuffersToJson(const std::vector<NamedBuffer>& named) {
  json list = json::array();
  for (const NamedBuffer& entry : named) {
    json node = {{"name", entry.name}, {"buffer", entry.buffer}};
    if (!entry.isWhole()) {
      node["global_shape"] = entry.globalShape;
      node["shard_offset"] = entry.shardOffset;
    }
    list.push_back(node);
  }
  return list;
}

std::vector<NamedBuffer> namedBuffersFromJson(const FieldReader& reader, const std::string& key) {
  std::vector<NamedBuffer> named;
  for (size_t i = 0; i < reader.array(key).size(); ++i) {
    FieldReader item = reader.element(key, i);
    NamedBuffer entry(item.string("name"), item.nonNegative("buffer"));
    // A box is both fields or neither: absent means the buffer is the whole tensor.
    if (item.has("global_shape") || item.has("shard_offset")) {
      entry.globalShape = item.integers("global_shape");
      entry.shardOffset = item.integers("shard_offset");
    }
    named.push_back(std::move(entry));
  }
  return named;
}

json bucketPaddingToJson(const BucketPadding& padding) {
  return {{"dimension", padding.dimension},
          {"axis", padding.axis},
          {"inputs", padding.inputs},
          {"output_prefixes", padding.outputPrefixes}};
}

BucketPadding bucketPaddingFromJson(const FieldReader& reader) {
  BucketPadding padding;
  padding.dimension = reader.string("dimension");
  padding.axis = reader.nonNegative("axis");
  FieldReader inputs = reader.child("inputs");
  for (const auto& [name, value] : inputs.node().items()) padding.inputs[name] = inputs.integer(name);
  if (padding.inputs.empty()) reader.fail("expected at least one input to pad", "inputs");
  padding.outputPrefixes = reader.strings("output_prefixes");
  return padding;
}

json adapterToJson(const AdapterSettings& adapter) {
  return {{"rank", adapter.rank},
          {"alpha", adapter.alpha},
          {"dropout", adapter.dropout},
          {"targets", adapter.targets},
          {"base_dtype", adapter.baseDtype}};
}

AdapterSettings adapterFromJson(const FieldReader& reader) {
  AdapterSettings adapter;
  adapter.rank = reader.nonNegative("rank");
  if (adapter.rank < 1) reader.fail("expected a rank >= 1", "rank");
  adapter.alpha = reader.number("alpha");
  if (!(adapter.alpha > 0))
    reader.fail("expected a number > 0, got " + describeJsonValue(reader.raw("alpha")), "alpha");
  adapter.dropout = reader.number("dropout");
  if (!(adapter.dropout >= 0 && adapter.dropout < 1))
    reader.fail("expected a number in [0, 1), got " + describeJsonValue(reader.raw("dropout")), "dropout");
  adapter.targets = reader.strings("targets");
  if (adapter.targets.empty()) reader.fail("expected at least one target", "targets");
  adapter.baseDtype = reader.string("base_dtype");
  if (adapter.baseDtype != "f32" && adapter.baseDtype != "bf16" && adapter.baseDtype != "int8" &&
      adapter.baseDtype != "nf4")
    reader.fail("expected f32, bf16, int8 or nf4, got " + quoteForMessage(adapter.baseDtype), "base_dtype");
  return adapter;
}

json optimizerToJson(const OptimizerSettings& adam) {
  return {{"kind", "adamw"},
          {"beta1", adam.beta1},
          {"beta2", adam.beta2},
          {"eps", adam.epsilon},
          {"weight_decay", adam.weightDecay},
          {"max_grad_norm", adam.maxGradNorm}};
}

OptimizerSettings optimizerFromJson(const FieldReader& reader) {
  const std::string kind = reader.string("kind");
  if (kind != "adamw") reader.fail("expected \"adamw\", got \"" + kind + "\"", "kind");
  OptimizerSettings adam;
  adam.beta1 = reader.number("beta1");
  adam.beta2 = reader.number("beta2");
  adam.epsilon = reader.number("eps");
  adam.weightDecay = reader.number("weight_decay");
  adam.maxGradNorm = reader.number("max_grad_norm");
  for (auto [field, beta] : {std::pair{"beta1", adam.beta1}, std::pair{"beta2", adam.beta2}})
    if (!(beta >= 0.0 && beta < 1.0)) reader.fail("expected a value in [0, 1), got " + describeJsonValue(json(beta)), field);
  if (!(adam.epsilon > 0.0)) reader.fail("expected a positive number, got " + describeJsonValue(json(adam.epsilon)), "eps");
  if (!(adam.weightDecay >= 0.0))
    reader.fail("expected a number >= 0, got " + describeJsonValue(json(adam.weightDecay)), "weight_decay");
  if (!(adam.maxGradNorm > 0.0))
    reader.fail("expected a positive number, got " + describeJsonValue(json(adam.maxGradNorm)), "max_grad_norm");
  return adam;
}

json generationToJson(const GenerationSettings& generation) {
  return {{"canvas_length", generation.canvasLength},
          {"max_new_tokens", generation.maxNewTokens},
          {"cache_length", generation.cacheLength},
          {"max_denoising_steps", generation.maxDenoisingSteps},
          {"entropy_bound", generation.entropyBound},
          {"t_min", generation.tMin},
          {"t_max", generation.tMax},
          {"stability_threshold", generation.stabilityThreshold},
          {"confidence_threshold", generation.confidenceThreshold},
          {"eos_token_ids", generation.eosTokenIds},
          {"pad_token_id", generation.padTokenId}};
}

// The ranges are those HF's DiffusionGemmaGenerationConfig accepts (docs/plan-format.md), plus
// the sizes the entries need to exist.
GenerationSettings generationFromJson(const FieldReader& reader) {
  GenerationSettings generation;
  auto positive = [&](const char* field) {
    int64_t value = reader.integer(field);
    if (value < 1) reader.fail("expected a positive integer, got " + std::to_string(value), field);
    return value;
  };
  generation.canvasLength = positive("canvas_length");
  generation.maxNewTokens = positive("max_new_tokens");
  generation.cacheLength = reader.nonNegative("cache_length");
  generation.maxDenoisingSteps = positive("max_denoising_steps");
  generation.entropyBound = reader.number("entropy_bound");
  generation.tMin = reader.number("t_min");
  generation.tMax = reader.number("t_max");
  generation.stabilityThreshold = reader.nonNegative("stability_threshold");
  generation.confidenceThreshold = reader.number("confidence_threshold");
  generation.eosTokenIds = reader.integers("eos_token_ids");
  generation.padTokenId = reader.nonNegative("pad_token_id");
  if (!(generation.entropyBound > 0.0))
    reader.fail("expected a positive number, got " + describeJsonValue(json(generation.entropyBound)), "entropy_bound");
  if (!(generation.tMin >= 0.0)) reader.fail("expected a number >= 0, got " + describeJsonValue(json(generation.tMin)), "t_min");
  if (!(generation.tMax > generation.tMin))
    reader.fail("expected a number above t_min " + describeJsonValue(json(generation.tMin)) + ", got " + describeJsonValue(json(generation.tMax)),
                "t_max");
  if (!(generation.confidenceThreshold > 0.0))
    reader.fail("expected a positive number, got " + describeJsonValue(json(generation.confidenceThreshold)), "confidence_threshold");
  for (size_t i = 0; i < generation.eosTokenIds.size(); ++i)
    if (generation.eosTokenIds[i] < 0)
      reader.fail("expected a non-negative token id, got " + std::to_string(generation.eosTokenIds[i]),
                  "eos_token_ids[" + std::to_string(i) + "]");
  return generation;
}

// What initializeWeights draws a parameter from (docs/plan-format.md, "Header": parameters): the kind,
// and for "normal" a standard deviation that yields finite, usable values.
json initFromJson(const FieldReader& reader) {
  const std::string kind = reader.string("kind");
  // One part of a frozen base weight stored quantized, filled from the weight's tensor (docs/plan-format.md,
  // "Header"); `base` is the weight's own init.
  if (kind == "quantized") {
    const std::string format = reader.string("format");
    if (format != "int8" && format != "nf4")
      reader.fail("expected \"int8\" or \"nf4\", got " + quoteForMessage(format), "format");
    const std::string part = reader.string("part");
    if (part != "codes" && part != (format == "int8" ? "scale" : "absmax"))
      reader.fail("expected \"codes\" or \"" + std::string(format == "int8" ? "scale" : "absmax") + "\", got " +
                      quoteForMessage(part),
                  "part");
    if (reader.string("weight").empty()) reader.fail("expected the weight's name", "weight");
    const std::vector<int64_t> shape = reader.integers("shape");
    if (shape.empty() || std::any_of(shape.begin(), shape.end(), [](int64_t size) { return size <= 0; }))
      reader.fail("expected a weight's shape (positive sizes)", "shape");
    for (const auto& [key, value] : reader.node().items())
      if (key != "kind" && key != "format" && key != "part" && key != "weight" && key != "shape" && key != "base")
        reader.fail("unknown field (init quantized takes kind, format, part, weight, shape and base)", key);
    if (reader.has("base")) initFromJson(reader.child("base"));
    return reader.node();
  }
  const std::map<std::string, std::string> spreadField = {{"normal", "std"}, {"uniform", "bound"}};
  if (kind != "normal" && kind != "uniform" && kind != "ones" && kind != "zeros")
    reader.fail("expected \"normal\", \"uniform\", \"ones\" or \"zeros\", got " + quoteForMessage(kind), "kind");
  auto spread = spreadField.find(kind);
  // "logical_rows": rows from it on are vocabulary padding (docs/parallelism.md, "Vocabulary padding").
  for (const auto& [key, value] : reader.node().items())
    if (key != "kind" && key != "logical_rows" && (spread == spreadField.end() || key != spread->second))
      reader.fail("unknown field (init " + kind + " takes " +
                      (spread == spreadField.end() ? std::string("kind") : "kind, " + spread->second) +
                      " and optionally logical_rows)",
                  key);
  if (reader.has("logical_rows") && reader.integer("logical_rows") < 1)
    reader.fail("expected a positive row count", "logical_rows");
  if (kind == "uniform") {
    const double bound = reader.number("bound");
    if (!(bound > 0.0 && bound <= kMaxInitStd))
      reader.fail("expected a number in (0, " + describeJsonValue(json(kMaxInitStd)) + "], got " +
                      describeJsonValue(reader.raw("bound")),
                  "bound");
  }
  if (reader.has("std")) {  // absent: the runtime's 0.02
    const double stddev = reader.number("std");
    if (!(stddev > 0.0 && stddev <= kMaxInitStd))
      reader.fail("expected a number in (0, " + describeJsonValue(json(kMaxInitStd)) + "], got " +
                      describeJsonValue(reader.raw("std")),
                  "std");
  }
  return reader.node();
}

}  // namespace

json planToJson(const Plan& plan) {
  json root;
  root["format"] = "dgemma-plan";
  root["version"] = plan.version;
  root["producer"] = plan.producer;
  root["rank"] = plan.rank;
  root["world_size"] = plan.worldSize;

  json mesh = json::array();
  for (const MeshAxis& axis : plan.mesh) mesh.push_back({{"name", axis.name}, {"size", axis.size}, {"coord", axis.coord}});
  root["mesh"] = mesh;

  json arenas = json::array();
  for (const Arena& arena : plan.arenas)
    arenas.push_back({{"name", arena.name},
                      {"persistent", arena.persistent},
                      {"bytes", arena.bytes},
                      {"alignment", arena.alignment}});
  root["arenas"] = arenas;

  json buffers = json::array();
  for (const Buffer& buffer : plan.buffers) {
    json node = {{"id", buffer.id},
                 {"name", buffer.name},
                 {"dtype", std::string(dtypeName(buffer.dtype))},
                 {"shape", buffer.shape},
                 {"arena", buffer.arena},
                 {"offset", buffer.offset}};
    if (buffer.lifetime)
      node["lifetime"] = {{"entry", buffer.lifetime->entry}, {"first", buffer.lifetime->first}, {"last", buffer.lifetime->last}};
    if (buffer.aliasOf) node["alias_of"] = *buffer.aliasOf;
    buffers.push_back(node);
  }
  root["buffers"] = buffers;

  json parameters = json::array();
  for (const Parameter& parameter : plan.parameters) {
    parameters.push_back({{"name", parameter.name},
                          {"buffer", parameter.buffer},
                          {"global_shape", parameter.globalShape},
                          {"shard_offset", parameter.shardOffset},
                          {"shard_shape", parameter.shardShape},
                          {"trainable", parameter.trainable},
                          {"init", parameter.init}});
    if (parameter.pendingSum) parameters.back()["pending_sum"] = true;
  }
  root["parameters"] = parameters;

  json constants = json::array();
  for (const Constant& constant : plan.constants)
    constants.push_back({{"buffer", constant.buffer},
                         {"section", constant.section},
                         {"offset", constant.offset},
                         {"bytes", constant.bytes}});
  root["constants"] = constants;

  json entries = json::array();
  for (const EntryPoint& entry : plan.entryPoints) {
    json steps = json::array();
    for (const Step& step : entry.steps) steps.push_back(stepToJson(step));
    entries.push_back({{"name", entry.name},
                       {"bucket", entry.bucket},
                       {"inputs", namedBuffersToJson(entry.inputs)},
                       {"outputs", namedBuffersToJson(entry.outputs)},
                       {"streams", entry.numStreams},
                       {"events", entry.numEvents},
                       {"steps", steps}});
  }
  root["entry_points"] = entries;
  json model = {{"family", modelFamilyName(plan.modelFamily)}};
  if (!plan.modelConfig.is_null()) model["config"] = plan.modelConfig;
  if (!plan.modelGenerationConfig.is_null()) model["generation_config"] = plan.modelGenerationConfig;
  root["model"] = model;
  if (plan.bucketPadding) root["bucket_padding"] = bucketPaddingToJson(*plan.bucketPadding);
  if (plan.optimizer) root["optimizer"] = optimizerToJson(*plan.optimizer);
  if (plan.runDefaults) root["run_defaults"] = {{"preset", plan.runDefaults->preset}, {"train", plan.runDefaults->trainFlags}};
  if (plan.generation) root["generation"] = generationToJson(*plan.generation);
  if (plan.adapter) root["adapter"] = adapterToJson(*plan.adapter);
  root["metadata"] = plan.metadata;
  // "sections" (name, offset, bytes) is added by serializePlan, which knows the layout.
  return root;
}

Plan planFromJson(const json& header, const std::string& source) {
  FieldReader root(header, source, "");
  if (root.string("format") != "dgemma-plan") root.fail("expected \"dgemma-plan\"", "format");
  Plan plan;
  for (const auto& [key, value] : header.items())
    if (!kHeaderFields.count(key)) root.fail("unknown field (not written by any dgemma-compile of format version " +
                                                 std::to_string(kPlanFormatVersion) + ")",
                                             quoteForMessage(key, 40));
  const int64_t version = root.nonNegative("version");
  if (version != kPlanFormatVersion) root.fail(unreadVersionMessage(static_cast<uint64_t>(version)), "version");
  plan.version = kPlanFormatVersion;
  plan.producer = root.string("producer");
  plan.rank = root.nonNegative("rank");
  plan.worldSize = root.nonNegative("world_size");

  for (size_t i = 0; i < root.array("mesh").size(); ++i) {
    FieldReader axis = root.element("mesh", i);
    plan.mesh.push_back({axis.string("name"), axis.nonNegative("size"), axis.nonNegative("coord")});
  }
  for (size_t i = 0; i < root.array("arenas").size(); ++i) {
    FieldReader arena = root.element("arenas", i);
    plan.arenas.push_back({arena.string("name"), arena.boolean("persistent"),
                           static_cast<uint64_t>(arena.nonNegative("bytes")),
                           static_cast<uint64_t>(arena.nonNegative("alignment"))});
  }
  for (size_t i = 0; i < root.array("buffers").size(); ++i) {
    FieldReader node = root.element("buffers", i);
    Buffer buffer;
    buffer.id = node.nonNegative("id");
    buffer.name = node.string("name");
    std::string dtype = node.string("dtype");
    auto parsed = parseDType(dtype);
    if (!parsed) node.fail("unknown dtype \"" + dtype + "\"", "dtype");
    buffer.dtype = *parsed;
    buffer.shape = node.integers("shape");
    buffer.arena = node.nonNegative("arena");
    buffer.offset = static_cast<uint64_t>(node.nonNegative("offset"));
    if (node.has("lifetime")) {
      FieldReader lifetime = node.child("lifetime");
      buffer.lifetime = Lifetime{lifetime.string("entry"), lifetime.nonNegative("first"), lifetime.nonNegative("last")};
    }
    if (node.has("alias_of")) buffer.aliasOf = node.nonNegative("alias_of");
    plan.buffers.push_back(std::move(buffer));
  }
  for (size_t i = 0; i < root.array("parameters").size(); ++i) {
    FieldReader node = root.element("parameters", i);
    Parameter parameter;
    parameter.name = node.string("name");
    parameter.buffer = node.nonNegative("buffer");
    parameter.globalShape = node.integers("global_shape");
    parameter.shardOffset = node.integers("shard_offset");
    parameter.shardShape = node.integers("shard_shape");
    parameter.trainable = node.boolean("trainable");
    parameter.pendingSum = node.has("pending_sum") && node.boolean("pending_sum");
    parameter.init = initFromJson(node.child("init"));
    plan.parameters.push_back(std::move(parameter));
  }
  for (size_t i = 0; i < root.array("constants").size(); ++i) {
    FieldReader node = root.element("constants", i);
    plan.constants.push_back({node.nonNegative("buffer"), node.nonNegative("section"),
                              static_cast<uint64_t>(node.nonNegative("offset")),
                              static_cast<uint64_t>(node.nonNegative("bytes"))});
  }
  for (size_t i = 0; i < root.array("entry_points").size(); ++i) {
    FieldReader node = root.element("entry_points", i);
    EntryPoint entry;
    entry.name = node.string("name");
    FieldReader bucket = node.child("bucket");
    for (const auto& [dimension, size] : bucket.node().items()) entry.bucket[dimension] = bucket.nonNegative(dimension);
    entry.inputs = namedBuffersFromJson(node, "inputs");
    entry.outputs = namedBuffersFromJson(node, "outputs");
    entry.numStreams = node.nonNegative("streams");
    entry.numEvents = node.nonNegative("events");
    for (size_t s = 0; s < node.array("steps").size(); ++s) entry.steps.push_back(stepFromJson(node.element("steps", s)));
    plan.entryPoints.push_back(std::move(entry));
  }
  FieldReader model = root.child("model");
  const std::string family = model.string("family");
  std::optional<ModelFamily> parsedFamily = parseModelFamily(family);
  if (!parsedFamily) model.fail("expected \"builtin\" or \"diffusion_gemma\", got \"" + family + "\"", "family");
  plan.modelFamily = *parsedFamily;
  if (model.has("config")) {
    plan.modelConfig = model.raw("config");
    if (!plan.modelConfig.is_object()) model.fail("expected an object (the model's config.json)", "config");
  } else if (plan.modelFamily == ModelFamily::DiffusionGemma) {
    model.fail("missing (a DiffusionGemma plan carries its config.json)", "config");
  }
  if (model.has("generation_config")) {
    plan.modelGenerationConfig = model.raw("generation_config");
    if (!plan.modelGenerationConfig.is_object())
      model.fail("expected an object (the model's generation_config.json)", "generation_config");
  }
  if (root.has("bucket_padding")) plan.bucketPadding = bucketPaddingFromJson(root.child("bucket_padding"));
  if (root.has("optimizer")) plan.optimizer = optimizerFromJson(root.child("optimizer"));
  if (root.has("run_defaults")) {
    FieldReader defaults = root.child("run_defaults");
    FieldReader train = defaults.child("train");
    // Each becomes the text of a flag: a scalar, never a structure.
    for (const auto& [flag, value] : train.node().items())
      if (!value.is_string() && !value.is_number() && !value.is_boolean())
        train.fail("expected a string, number or boolean, got " + describeJsonValue(value), flag);
    plan.runDefaults = RunDefaults{defaults.string("preset"), train.node()};
  }
  if (root.has("generation")) plan.generation = generationFromJson(root.child("generation"));
  if (root.has("adapter")) plan.adapter = adapterFromJson(root.child("adapter"));
  plan.metadata = root.has("metadata") ? root.raw("metadata") : json::object();
  return plan;
}

}  // namespace dgemma
