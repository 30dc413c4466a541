#include "runtime/session/RunEntry.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "runtime/session/GlobalTensors.h"
#include "support/Error.h"
#include "support/Shape.h"

namespace dgemma {

namespace {

// The entry named `name` whose inputs have exactly the batch's (global) shapes (plans are
// shape-specialised).
// Inputs the batch lacks do not decide; optional ones get defaults, the rest are reported missing.
const EntryPoint& selectEntry(const Plan& plan, const std::string& name, const std::map<std::string, HostTensor>& inputs, const std::string& batchPath) {
  std::string available;
  for (const EntryPoint& entry : plan.entryPoints) {
    if (entry.name != name) continue;
    available += "\n  " + entry.key() + ":";
    bool matches = true;
    for (const NamedBuffer& input : entry.inputs) {
      const std::vector<int64_t> shape = globalShapeOf(input, plan);
      available += " " + input.name + shapeToString(shape);
      auto it = inputs.find(input.name);
      matches &= it == inputs.end() || it->second.shape == shape;
    }
    if (matches) return entry;
  }
  if (available.empty()) throw InputError("--plan: the plan has no entry point \"" + name + "\" (compiled with the other --mode?)");
  throw InputError(batchPath + ": no bucket of \"" + name + "\" takes these tensor shapes; the plan has:" + available);
}

// Every input the entry takes is in the batch with its global shape; otherwise an error naming the
// batch file, the tensor and both shapes (rather than the executor's, which knows no file).
void checkBatchFits(const std::map<std::string, HostTensor>& batch, const EntryPoint& entry, const Plan& plan,
                    const std::string& batchPath) {
  for (const NamedBuffer& input : entry.inputs) {
    const std::vector<int64_t> shape = globalShapeOf(input, plan);
    auto it = batch.find(input.name);
    if (it == batch.end())
      throw InputError(batchPath + ": tensor " + input.name + ": missing (entry " + entry.key() + " takes " + input.name +
                       shapeToString(shape) + ")");
    if (it->second.shape != shape)
      throw InputError(batchPath + ": tensor " + input.name + ": expected shape " + shapeToString(shape) + " (entry " +
                       entry.key() + "), got " + shapeToString(it->second.shape));
  }
}

// This rank's box of every input that the plan shards.
void cutInputBoxes(std::map<std::string, HostTensor>& batch, const EntryPoint& entry, const Plan& plan,
                   const std::string& batchPath) {
  for (const NamedBuffer& input : entry.inputs) {
    auto it = batch.find(input.name);
    if (it == batch.end() || input.isWhole()) continue;
    it->second = cutBox(it->second, input.globalShape, boxOf(input, plan), batchPath + ": tensor " + input.name);
  }
}

// Every sharded output assembled from the ranks' boxes; every rank takes part, in the plan's order.
void assembleOutputs(std::map<std::string, HostTensor>& outputs, const EntryPoint& entry, Session& session) {
  for (const NamedBuffer& output : entry.outputs) {
    if (output.isWhole()) continue;
    HostTensor& tensor = outputs.at(output.name);
    tensor = assembleGlobal(*session.world, tensor, boxOf(output, session.plan), output.globalShape,
                            "output " + output.name + " of " + entry.key());
  }
}

// Left-pads `tensor` along `axis` to `size` with `value` (integer tensors only).
HostTensor leftPad(const HostTensor& tensor, int64_t axis, int64_t size, int64_t value, const std::string& name) {
  if (tensor.dtype != DType::I64 || axis >= static_cast<int64_t>(tensor.shape.size()))
    throw InputError("input " + name + ": expected an i64 tensor with a dimension " + std::to_string(axis));
  std::vector<int64_t> shape = tensor.shape;
  const int64_t padding = size - shape[axis];
  shape[axis] = size;
  HostTensor padded(tensor.dtype, shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t oldRow = tensor.shape[axis] * inner, newRow = size * inner;
  for (int64_t o = 0; o < outer; ++o) {
    std::fill(padded.as<int64_t>() + o * newRow, padded.as<int64_t>() + o * newRow + padding * inner, value);
    std::copy(tensor.as<int64_t>() + o * oldRow, tensor.as<int64_t>() + (o + 1) * oldRow,
              padded.as<int64_t>() + o * newRow + padding * inner);
  }
  return padded;
}

// Keeps the last `size` entries along `axis` (undoes leftPad on an output).
HostTensor cropLeft(const HostTensor& tensor, int64_t axis, int64_t size) {
  std::vector<int64_t> shape = tensor.shape;
  const int64_t drop = shape[axis] - size;
  shape[axis] = size;
  HostTensor cropped(tensor.dtype, shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const size_t element = dtypeSize(tensor.dtype);
  const size_t oldRow = tensor.shape[axis] * inner * element, newRow = size * inner * element;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(cropped.data.data() + o * newRow, tensor.data.data() + o * oldRow + drop * inner * element, newRow);
  return cropped;
}

}  // namespace

std::map<std::string, HostTensor> runEntry(Session& session, const std::string& entryName, std::map<std::string, HostTensor> batch,
                                           const std::string& batchPath) {
  const Plan& plan = session.plan;
  // With a padding contract, the batch runs in the smallest bucket that holds it, left-padded.
  const std::optional<BucketPadding>& padding = plan.bucketPadding;
  int64_t requested = -1;
  const EntryPoint* chosen = nullptr;
  if (padding) {
    for (const auto& [name, value] : padding->inputs)
      if (auto it = batch.find(name); it != batch.end() && padding->axis < static_cast<int64_t>(it->second.shape.size()))
        requested = std::max(requested, it->second.shape[padding->axis]);
    if (requested >= 0) chosen = plan.selectEntry(entryName, {{padding->dimension, requested}});
  }
  const EntryPoint& entry = chosen ? *chosen : selectEntry(plan, entryName, batch, batchPath);
  const int64_t bucketSize = chosen ? entry.bucket.at(padding->dimension) : -1;
  if (chosen && bucketSize > requested)
    for (const auto& [name, value] : padding->inputs)
      if (auto it = batch.find(name); it != batch.end()) it->second = leftPad(it->second, padding->axis, bucketSize, value, name);
  session.model->addEntryDefaults(batch, entry, plan);
  for (auto it = batch.begin(); it != batch.end();) {  // fields this model does not read are allowed
    bool used = std::any_of(entry.inputs.begin(), entry.inputs.end(), [&](const auto& input) { return input.name == it->first; });
    it = used ? std::next(it) : batch.erase(it);
  }
  checkBatchFits(batch, entry, plan, batchPath);
  cutInputBoxes(batch, entry, plan, batchPath);
  std::map<std::string, HostTensor> outputs = session.executor->run(entry, batch);
  assembleOutputs(outputs, entry, session);
  if (chosen && bucketSize > requested)
    for (auto& [name, tensor] : outputs)
      for (const std::string& prefix : padding->outputPrefixes)
        if (name.rfind(prefix, 0) == 0) tensor = cropLeft(tensor, padding->axis, requested);
  return outputs;
}

void addDrawnCorruption(Session& session, std::map<std::string, HostTensor>& batch, uint64_t seed, NoisePhase phase,
                        uint64_t step, const std::vector<int64_t>& samples, const std::string& batchPath) {
  const ModelContract& names = session.model->contract();
  HostTensor keys = noiseKeys(seed, phase, step, samples);
  // A train step that draws too (LoRA dropout, on streams of its own) reads the same keys.
  batch[names.noiseKeys] = keys;
  std::map<std::string, HostTensor> corruptInputs = {{names.noiseKeys, std::move(keys)},
                                                     {names.batch.canvasIds, batch.at(names.batch.canvasIds)},
                                                     {names.batch.canvasMask, batch.at(names.batch.canvasMask)}};
  for (auto& [name, tensor] : runEntry(session, names.corruptEntry, std::move(corruptInputs), batchPath))
    batch[name] = std::move(tensor);
}

}  // namespace dgemma
