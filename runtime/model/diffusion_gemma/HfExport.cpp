#include "runtime/model/diffusion_gemma/HfExport.h"

#include "runtime/data/text/Tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/core/HostTensor.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TransferProgress.h"
#include "runtime/model/diffusion_gemma/PeftAdapter.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/CheckpointManifest.h"
#include "support/AtomicFile.h"
#include "support/Error.h"
#include "support/Json.h"
#include "support/Shape.h"

namespace dgemma {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLayerScalarSuffix = ".layer_scalar";

// What transformers' GenerationConfig of DiffusionGemma holds when the model brings none: every
// sampler field null (docs/generation.md gives the values they stand for).
nlohmann::ordered_json defaultGenerationConfig() {
  return {{"confidence_threshold", nullptr}, {"max_denoising_steps", nullptr}, {"return_dict_in_generate", true},
          {"sampler_config", nullptr},       {"stability_threshold", nullptr}, {"t_max", nullptr},
          {"t_min", nullptr}};
}

std::string jsonFileText(const nlohmann::json& value) { return value.dump(2) + "\n"; }

nlohmann::json readJsonFile(const fs::path& path) { return parseJson(readWholeFile(path.string()), path.string()); }

// HF's name for the dtype in config.json.
const char* hfDtypeName(DType dtype) { return dtype == DType::BF16 ? "bfloat16" : "float32"; }

// The export's config.json: the model's, with "dtype" saying what the weights now are (HF reads it
// as the default load dtype).
nlohmann::json exportedConfig(nlohmann::json config, DType dtype) {
  config["dtype"] = hfDtypeName(dtype);
  if (config.contains("text_config") && config["text_config"].is_object() && config["text_config"].contains("dtype"))
    config["text_config"]["dtype"] = hfDtypeName(dtype);
  return config;
}

// One tensor the export writes: its HF name, shape, and the source tensor it copies.
struct ExportedTensor {
  std::string name;
  std::vector<int64_t> shape;
  SafetensorsLocation source;
};

std::string shardFileName(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// Whether `weights` is a dgemma checkpoint: then it is verified whole (CheckpointReader::load) before a
// byte of it is exported, and its model group must carry HF's index (every checkpoint this build
// saves does; docs/training.md, "Checkpoints").
void verifyIfCheckpoint(const fs::path& weights) {
  const fs::path manifestPath = weights / "manifest.json";
  if (!fs::is_directory(weights) || !fs::exists(manifestPath)) return;
  const CheckpointManifest manifest = parseCheckpointManifest(readWholeFile(manifestPath.string()), manifestPath.string());
  CheckpointReader::load(weights.string(), manifest.state.model);
  for (const ManifestGroup& group : manifest.groups)
    if (group.name == "model" && !fs::exists(weights / "model.safetensors.index.json"))
      throw InputError(weights.string() +
                       ": group 'model' holds tensors split across ranks and no HF index (a checkpoint of an earlier "
                       "build): resume it with --resume-from under this build and save it again, or export a one-rank "
                       "save of it");
}

void copyTokenizerFiles(const fs::path& from, std::vector<std::pair<std::string, std::string>>& files) {
  for (const std::string& name : hfTokenizerFileNames())
    if (fs::is_regular_file(from / name)) files.emplace_back(name, readWholeFile((from / name).string()));
}

}  // namespace

const std::vector<std::string>& hfTokenizerFileNames() {
  static const std::vector<std::string> names = {
      "tokenizer.json",        "tokenizer.model",         "vocab.json",        "merges.txt",
      "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
      "chat_template.json",    "processor_config.json"};
  return names;
}

std::vector<std::pair<std::string, std::string>> hfSideFiles(const nlohmann::json& config,
                                                             const nlohmann::json& generationConfig,
                                                             const std::string& tokenizerDir) {
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("config.json", jsonFileText(config));
  files.emplace_back("generation_config.json", generationConfig.is_null() ? defaultGenerationConfig().dump(2) + "\n"
                                                                          : jsonFileText(generationConfig));
  if (!tokenizerDir.empty()) {
    const fs::path directory(tokenizerDir);
    if (!holdsTokenizer(tokenizerDir))
      throw InputError("--tokenizer: " + tokenizerDir +
                       ": expected a directory with tokenizer.json, tokenizer.model or vocab.json + merges.txt");
    copyTokenizerFiles(directory, files);
  }
  return files;
}

std::optional<std::string> untiedEncoderCopyName(const std::string& canonicalName) {
  const std::string decoderLayers = std::string(kDecoderPrefix) + "layers.";
  const size_t suffixLength = std::strlen(kLayerScalarSuffix);
  if (canonicalName.rfind(decoderLayers, 0) != 0 || canonicalName.size() <= suffixLength ||
      canonicalName.compare(canonicalName.size() - suffixLength, suffixLength, kLayerScalarSuffix) != 0)
    return std::nullopt;
  return std::string(kEncoderTextPrefix) + canonicalName.substr(kDecoderPrefix.size());
}

HfExportResult exportHfDirectory(const HfExportOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  if (options.dtype != DType::F32 && options.dtype != DType::BF16)
    throw InputError("--dtype: expected fp32 or bf16, got " + std::string(dtypeName(options.dtype)));
  if (options.maxShardBytes == 0) throw InputError("--max-shard-size: expected a positive size");
  const fs::path weights(options.weights), out(options.out);
  if (!fs::exists(weights)) throw InputError("--weights: " + options.weights + ": no such file or directory");
  if (fs::exists(fs::symlink_status(out)))
    throw InputError("--out: " + options.out + ": already exists (the export writes a new directory; remove it or pick another)");
  const fs::path weightsDir = fs::is_directory(weights) ? weights : weights.parent_path();

  HfExportResult result;
  nlohmann::json config = options.config;
  if (config.is_null()) {
    if (!fs::exists(weightsDir / "config.json"))
      throw InputError("--weights: " + options.weights +
                       ": no config.json (a checkpoint of an earlier build): name the model with --model DIR or --plan DIR");
    config = readJsonFile(weightsDir / "config.json");
  }
  const DiffusionGemmaConfig model = parseDiffusionGemmaConfig(config, "config.json");
  nlohmann::json generationConfig = options.generationConfig;
  if (generationConfig.is_null() && fs::exists(weightsDir / "generation_config.json"))
    generationConfig = readJsonFile(weightsDir / "generation_config.json");

  std::vector<std::pair<std::string, std::string>> sideFiles =
      hfSideFiles(exportedConfig(config, options.dtype), generationConfig, options.tokenizerDir);
  if (options.tokenizerDir.empty()) copyTokenizerFiles(weightsDir, sideFiles);
  if (sideFiles.size() == 2) result.notes.push_back("no tokenizer files (pass --tokenizer DIR to include them)");

  verifyIfCheckpoint(weights);
  const SafetensorsDirectory source = SafetensorsDirectory::open(options.weights);
  const ResolvedCheckpoint resolved = resolveCheckpointNames(model, source);
  std::vector<ExportedTensor> tensors;
  for (const ExpectedTensor& expected : expectedTextWeights(model)) {
    const SafetensorsLocation location = resolved.textTensors.at(expected.name);
    tensors.push_back({expected.name, expected.shape, location});
    if (std::optional<std::string> copy = untiedEncoderCopyName(expected.name)) tensors.push_back({*copy, expected.shape, location});
  }
  // The vision tower's tensors go out as the source holds them. A checkpoint of a text-only plan
  // (compiled without --images-per-example) has none: the export says so rather than failing, since
  // the text model it carries is complete.
  if (model.hasVision) {
    const std::vector<ExpectedTensor> vision = expectedVisionWeights(model);
    for (const ExpectedTensor& expected : vision)
      if (auto found = resolved.visionTensors.find(expected.name); found != resolved.visionTensors.end())
        tensors.push_back({expected.name, expected.shape, found->second});
    if (const size_t missing = vision.size() - resolved.visionTensors.size(); missing > 0)
      result.notes.push_back(std::to_string(missing) + " of " + std::to_string(vision.size()) +
                             " vision tensors absent from the source (a text-only plan's checkpoint?): transformers "
                             "will initialise them");
  } else if (!resolved.visionTensorNames.empty()) {
    result.notes.push_back(std::to_string(resolved.visionTensorNames.size()) +
                           " vision tensors not exported: the config has no vision_config");
  }

  // The adapter's ΔW by the canonical name of the weight it changes: each must be one of the text
  // weights, of its shape.
  std::map<std::string, HostTensor> deltas;
  if (!options.mergeAdapter.empty()) {
    deltas = peftMergeDeltas(options.mergeAdapter);
    std::vector<std::string> problems;
    for (const auto& [name, delta] : deltas) {
      const auto tensor =
          std::find_if(tensors.begin(), tensors.end(), [&](const ExportedTensor& t) { return t.name == name; });
      if (tensor == tensors.end())
        problems.push_back("the adapter changes " + name + ", which the model does not have");
      else if (tensor->shape != delta.shape)
        problems.push_back("the adapter's update of " + name + " is " + shapeToString(delta.shape) + ", the weight " +
                           shapeToString(tensor->shape));
    }
    if (!problems.empty()) {
      std::string message =
          "--merge-adapter: " + options.mergeAdapter + ": does not fit --weights " + options.weights + ":";
      for (const std::string& problem : problems) message += "\n  " + problem;
      throw InputError(message);
    }
  }

  // Greedy shards in tensor order, as save_pretrained splits: a tensor that would push a shard past
  // the limit opens the next one.
  std::vector<std::vector<const ExportedTensor*>> shards(1);
  uint64_t shardBytes = 0;
  for (const ExportedTensor& tensor : tensors) {
    const uint64_t bytes = streamedTensorBytes({tensor.name, options.dtype, tensor.shape, nullptr});
    if (!shards.back().empty() && shardBytes + bytes > options.maxShardBytes) {
      shards.emplace_back();
      shardBytes = 0;
    }
    shards.back().push_back(&tensor);
    shardBytes += bytes;
    result.weightBytes += bytes;
  }

  createOutputDirectory(out.has_parent_path() ? out.parent_path().string() : ".", "--out");
  const fs::path tmp = (out.has_parent_path() ? out.parent_path() : fs::path(".")) /
                       ("." + out.filename().string() + ".tmp-export-" + std::to_string(::getpid()));
  try {
    fs::remove_all(tmp);
    fs::create_directory(tmp);
    TransferProgress progress("export", result.weightBytes, options.progress);
    nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
    std::map<std::string, std::string> sortedMap;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string fileName = shardFileName(i, shards.size());
      std::vector<StreamedTensor> streamed;
      for (const ExportedTensor* tensor : shards[i]) {
        sortedMap[tensor->name] = fileName;
        streamed.push_back({tensor->name, options.dtype, tensor->shape, [&, tensor](uint8_t* bytes) {
                              const SafetensorsEntry& entry = *tensor->source.entry;
                              const uint64_t count = entry.bytes / dtypeSize(entry.dtype);
                              const std::string what = tensor->source.file->path() + ": tensor " + entry.name;
                              const auto delta = deltas.find(tensor->name);
                              if (delta == deltas.end()) {
                                convertElements(tensor->source.file->data(entry), entry.dtype, bytes, options.dtype,
                                                count, what);
                              } else {
                                HostTensor merged(DType::F64, tensor->shape);
                                convertElements(tensor->source.file->data(entry), entry.dtype, merged.data.data(),
                                                DType::F64, count, what);
                                for (uint64_t i = 0; i < count; ++i)
                                  merged.as<double>()[i] += delta->second.as<double>()[i];
                                convertElements(merged.data.data(), DType::F64, bytes, options.dtype, count, what);
                              }
                              progress.advance(entry.bytes / dtypeSize(entry.dtype) * dtypeSize(options.dtype));
                              tensor->source.file->release(entry);
                            }});
      }
      writeSafetensorsStreamed((tmp / fileName).string(), streamed, {{"format", "pt"}});
    }
    progress.finish();
    for (const auto& [name, file] : sortedMap) weightMap[name] = file;
    if (shards.size() > 1) {
      nlohmann::ordered_json index = {{"metadata", {{"total_size", result.weightBytes}}}, {"weight_map", weightMap}};
      sideFiles.emplace_back("model.safetensors.index.json", index.dump(2) + "\n");
    }
    for (const auto& [name, bytes] : sideFiles) writeFileAtomically((tmp / name).string(), bytes);
    syncDirectory(tmp.string());
    fs::rename(tmp, out);
    syncDirectory(out.has_parent_path() ? out.parent_path().string() : ".");
  } catch (const fs::filesystem_error& error) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw RuntimeError("--out: " + options.out + ": cannot write the export: " + error.what());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }

  result.tensors = static_cast<int>(tensors.size());
  result.shards = static_cast<int>(shards.size());
  for (const fs::directory_entry& entry : fs::directory_iterator(out)) result.totalBytes += entry.file_size();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace dgemma
