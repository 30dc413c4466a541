// The memory a weight load costs (docs/training.md, "Export"): a synthetic checkpoint with the
// tensor list of a config (bench/configs/26b-tensor-list-reduced.json: the 26B model's 30 layers,
// 128 experts and 262144-row embedding, narrower), sharded like a release, and a load of it into a
// plan's parameters whose peak resident memory is read from /proc/self/status.
//
//   dgemma-bench-weight-load generate CONFIG OUT_DIR SHARD_BYTES   bf16 HF directory, HF shard names
//   dgemma-bench-weight-load load PLAN_DIR WEIGHTS_DIR [--whole-tensor]
//
// `load` streams each box out of the mapping (loadMappedWeights, what dgemma-run does); with
// --whole-tensor it reads every global tensor whole first and converts and slices that copy (the
// loader's earlier path, kept as the comparison). It prints the parameter bytes, the RSS before, the
// peak (VmHWM) and the peak above what the parameters themselves occupy.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "plan/PlanFile.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/io/Safetensors.h"
#include "runtime/kernel_api/Backend.h"
#include "support/AtomicFile.h"
#include "support/DType.h"
#include "support/Json.h"

namespace {

using namespace dgemma;

// A /proc/self/status field in bytes (VmRSS, VmHWM, RssAnon, RssFile).
uint64_t statusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  return 0;
}

double mb(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

int generate(const std::string& configPath, const std::string& out, uint64_t shardBytes) {
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(configPath);
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  for (const ExpectedTensor& tensor : expectedTextWeights(config)) tensors.emplace_back(tensor.name, tensor.shape);
  std::vector<std::vector<size_t>> shards(1);
  uint64_t bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t size = 2;
    for (int64_t extent : tensors[i].second) size *= static_cast<uint64_t>(extent);
    if (!shards.back().empty() && bytes + size > shardBytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += size;
    total += size;
  }
  std::filesystem::create_directories(out);
  nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<StreamedTensor> streamed;
    for (size_t i : shards[s]) {
      weightMap[tensors[i].first] = name;
      // Small finite values that differ between tensors and elements.
      uint64_t count = 1;
      for (int64_t extent : tensors[i].second) count *= static_cast<uint64_t>(extent);
      streamed.push_back({tensors[i].first, DType::BF16, tensors[i].second, [i, count](uint8_t* data) {
                            for (uint64_t e = 0; e < count; ++e) {
                              const float value = static_cast<float>((e * 2654435761u + i * 40503u) % 2001) * 1e-3f - 1.0f;
                              const uint16_t bits = f32ToBf16Bits(value);
                              std::memcpy(data + 2 * e, &bits, 2);
                            }
                          }});
    }
    writeSafetensorsStreamed(out + "/" + name, streamed, {{"format", "pt"}});
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weightMap}};
  writeFileAtomically(out + "/model.safetensors.index.json", index.dump(2) + "\n");
  std::filesystem::copy_file(configPath, out + "/config.json", std::filesystem::copy_options::overwrite_existing);
  std::printf("%zu tensors in %zu shards, %.1f MB (bf16)\n", tensors.size(), shards.size(), mb(total));
  return 0;
}

int load(const std::string& planDir, const std::string& weightsPath, bool wholeTensor) {
  const Plan plan = readPlanFile(planFileForRank(planDir, 0));
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  CommunicatorSet communicators;
  Executor executor(plan, *backend, communicators, planDir);
  uint64_t parameterBytes = 0;
  for (const Parameter& parameter : plan.parameters) {
    uint64_t count = 1;
    for (int64_t extent : parameter.shardShape) count *= static_cast<uint64_t>(extent);
    parameterBytes += count * dtypeSize(plan.buffers[parameter.buffer].dtype);
  }
  const DiffusionGemmaConfig config = parseDiffusionGemmaConfig(plan.modelConfig, "plan");
  const SafetensorsDirectory checkpoint = SafetensorsDirectory::open(weightsPath);
  const ResolvedCheckpoint resolved = resolveCheckpointNames(config, checkpoint);
  const uint64_t before = statusBytes("VmRSS");
  const auto started = std::chrono::steady_clock::now();
  if (wholeTensor) {
    loadWeights(executor, weightsPath, [&](const std::string& name) -> std::optional<HostTensor> {
      auto found = resolved.textTensors.find(name);
      if (found == resolved.textTensors.end()) return std::nullopt;
      return found->second.file->read(found->second.entry->name);
    });
  } else {
    loadMappedWeights(executor, weightsPath, [&](const std::string& name) -> std::optional<SafetensorsLocation> {
      auto found = resolved.textTensors.find(name);
      if (found == resolved.textTensors.end()) return std::nullopt;
      return found->second;
    });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const uint64_t peak = statusBytes("VmHWM");
  std::printf("%s: parameters %.1f MB; RSS before %.1f MB, after %.1f MB (anon %.1f, file %.1f); peak %.1f MB; "
              "peak above before + parameters %.1f MB; %.2f s\n",
              wholeTensor ? "whole-tensor" : "mapped", mb(parameterBytes), mb(before), mb(statusBytes("VmRSS")),
              mb(statusBytes("RssAnon")), mb(statusBytes("RssFile")), mb(peak),
              mb(peak > before + parameterBytes ? peak - before - parameterBytes : 0), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "generate" && argc == 5) return generate(argv[2], argv[3], std::stoull(argv[4]));
    if (mode == "load" && (argc == 4 || (argc == 5 && std::string(argv[4]) == "--whole-tensor")))
      return load(argv[2], argv[3], argc == 5);
    std::cerr << "usage: dgemma-bench-weight-load generate CONFIG OUT_DIR SHARD_BYTES\n"
                 "       dgemma-bench-weight-load load PLAN_DIR WEIGHTS_DIR [--whole-tensor]\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "dgemma-bench-weight-load: " << error.what() << "\n";
    return 1;
  }
}
