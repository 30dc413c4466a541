// Structural checks of a plan: everything the executor relies on without checking again.
#include <algorithm>
#include <climits>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include "support/CheckedSize.h"
#include "support/Error.h"
#include "support/Shape.h"
#include "plan/HostArena.h"
#include "plan/PlanFile.h"

namespace dgemma {

namespace {

// Far above any real layout, and small enough that products and per-rank tables stay small.
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
constexpr int64_t kMaxStreams = 1024;
constexpr int64_t kMaxEvents = int64_t{1} << 24;
constexpr size_t kMaxRank = 16;  // dimensions of one tensor

class PlanChecker {
 public:
  PlanChecker(const Plan& plan, const std::string& source) : plan_(plan), source_(source) {}

  void run() {
    checkMesh();
    checkArenas();
    checkBuffers();
    checkParameters();
    checkConstants();
    checkEntryPoints();
    checkOverlaps();
    checkBehaviourFields();
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& message) const {
    throw InputError(source_ + ": " + where + ": " + message);
  }

  // The typed fields that drive the runtime refer to what the plan has.
  void checkBehaviourFields() {
    if (plan_.modelFamily == ModelFamily::DiffusionGemma && !plan_.modelConfig.is_object())
      fail("model.config", "expected the DiffusionGemma config.json object");
    // The host generation loop reads the canvas and cache sizes from `generation`.
    for (size_t i = 0; i < plan_.entryPoints.size(); ++i) {
      const std::string& name = plan_.entryPoints[i].name;
      if (!plan_.generation && (name == "prefill" || name == "prefill_images" || name == "denoise" || name == "denoise_first" ||
                                name == "commit"))
        fail(at("entry_points", i), "an inference entry (\"" + name + "\") needs the plan's generation field");
    }
    if (!plan_.bucketPadding) return;
    const BucketPadding& padding = *plan_.bucketPadding;
    const bool bucketed = std::any_of(plan_.entryPoints.begin(), plan_.entryPoints.end(),
                                      [&](const EntryPoint& entry) { return entry.bucket.count(padding.dimension) != 0; });
    if (!bucketed) fail("bucket_padding.dimension", "\"" + padding.dimension + "\" is no entry point's bucket dimension");
    // The runtime pads the inputs and crops the outputs along `axis` in every bucketed entry, so
    // each of those tensors must have that axis, at the bucket's size.
    if (padding.axis < 0) fail("bucket_padding.axis", "expected a non-negative axis, got " + std::to_string(padding.axis));
    for (size_t e = 0; e < plan_.entryPoints.size(); ++e) {
      const EntryPoint& entry = plan_.entryPoints[e];
      auto size = entry.bucket.find(padding.dimension);
      if (size == entry.bucket.end()) continue;
      auto checkAxis = [&](const NamedBuffer& named, const std::string& where) {
        const std::vector<int64_t>& shape = named.isWhole() ? plan_.buffers[named.buffer].shape : named.globalShape;
        if (padding.axis >= static_cast<int64_t>(shape.size()) || shape[padding.axis] != size->second)
          fail("bucket_padding.axis", std::to_string(padding.axis) + ": " + where + " (\"" + named.name + "\", shape " +
                                          shapeToString(shape) + ") has no axis " + std::to_string(padding.axis) +
                                          " of the bucket's " + padding.dimension + " " + std::to_string(size->second));
      };
      for (size_t i = 0; i < entry.inputs.size(); ++i)
        if (padding.inputs.count(entry.inputs[i].name)) checkAxis(entry.inputs[i], at(at("entry_points", e) + ".inputs", i));
      for (size_t i = 0; i < entry.outputs.size(); ++i)
        for (const std::string& prefix : padding.outputPrefixes)
          if (entry.outputs[i].name.rfind(prefix, 0) == 0) {
            checkAxis(entry.outputs[i], at(at("entry_points", e) + ".outputs", i));
            break;
          }
    }
  }

  // A tensor the runtime may allocate: its size must not overflow and must fit kMaxTensorBytes.
  void checkTensorSize(const std::vector<int64_t>& shape, int64_t elementBytes, const std::string& where) const {
    if (shape.size() > kMaxRank)
      fail(where, "has " + std::to_string(shape.size()) + " dimensions, expected at most " + std::to_string(kMaxRank));
    const std::optional<int64_t> bytes = checkedTensorBytes(shape, elementBytes);
    if (!bytes || *bytes > kMaxTensorBytes)
      fail(where, shapeToString(shape) + " holds more than " + formatBytes(kMaxTensorBytes) +
                      " (the bound on one tensor), or a negative dimension");
  }

  static std::string at(const std::string& list, size_t index) { return list + "[" + std::to_string(index) + "]"; }

  void checkMesh() {
    if (plan_.worldSize < 1 || plan_.worldSize > kMaxWorldSize)
      fail("world_size", "expected an integer in [1, " + std::to_string(kMaxWorldSize) + "], got " + std::to_string(plan_.worldSize));
    if (plan_.rank >= plan_.worldSize)
      fail("rank", std::to_string(plan_.rank) + " is not below world_size " + std::to_string(plan_.worldSize));
    int64_t product = 1;
    std::set<std::string> names;
    for (size_t i = 0; i < plan_.mesh.size(); ++i) {
      const MeshAxis& axis = plan_.mesh[i];
      if (!names.insert(axis.name).second) fail(at("mesh", i), "axis \"" + axis.name + "\" appears twice");
      if (axis.size < 1 || axis.size > kMaxWorldSize)
        fail(at("mesh", i) + ".size", "expected an integer in [1, " + std::to_string(kMaxWorldSize) + "], got " +
                                          std::to_string(axis.size));
      if (axis.coord >= axis.size)
        fail(at("mesh", i) + ".coord", std::to_string(axis.coord) + " is outside the axis of size " + std::to_string(axis.size));
      product = checkedMultiply(product, axis.size).value_or(kMaxWorldSize + 1);
      if (product > kMaxWorldSize) fail("mesh", "axis sizes multiply to more than " + std::to_string(kMaxWorldSize) + " ranks");
    }
    if (!plan_.mesh.empty() && product != plan_.worldSize)
      fail("mesh", "axis sizes multiply to " + std::to_string(product) + ", world_size is " + std::to_string(plan_.worldSize));
  }

  void checkArenas() {
    for (size_t i = 0; i < plan_.arenas.size(); ++i) {
      uint64_t alignment = plan_.arenas[i].alignment;
      if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        fail(at("arenas", i) + ".alignment", "expected a power of two, got " + std::to_string(alignment));
      // Host memory holds only state that outlives a call (the offloaded optimizer state and its staging).
      if (isHostArena(plan_.arenas[i]) && !plan_.arenas[i].persistent)
        fail(at("arenas", i) + ".persistent", "the host arena must be persistent");
    }
  }

  void checkBuffers() {
    // Sizes first: the checks below compute every buffer's bytes, views' targets included.
    for (size_t i = 0; i < plan_.buffers.size(); ++i)
      checkTensorSize(plan_.buffers[i].shape, static_cast<int64_t>(dtypeSize(plan_.buffers[i].dtype)),
                      at("buffers", i) + ".shape");
    for (size_t i = 0; i < plan_.buffers.size(); ++i) {
      const Buffer& buffer = plan_.buffers[i];
      std::string where = at("buffers", i);
      if (buffer.id != static_cast<int64_t>(i)) fail(where + ".id", "expected " + std::to_string(i) + " (ids are positions)");
      for (int64_t dim : buffer.shape)
        if (dim < 0) fail(where + ".shape", "negative dimension " + std::to_string(dim));
      if (buffer.arena >= static_cast<int64_t>(plan_.arenas.size()))
        fail(where + ".arena", "no arena " + std::to_string(buffer.arena) + " (plan has " + std::to_string(plan_.arenas.size()) + ")");
      const Arena& arena = plan_.arenas[buffer.arena];
      if (buffer.offset % dtypeSize(buffer.dtype) != 0)
        fail(where + ".offset", std::to_string(buffer.offset) + " is not aligned to the element size");
      if (buffer.offset > arena.bytes || buffer.bytes() > arena.bytes - buffer.offset)
        fail(where + ".offset", std::to_string(buffer.offset) + " + " + std::to_string(buffer.bytes()) + " bytes exceeds arena \"" +
                                    arena.name + "\" of " + std::to_string(arena.bytes) + " bytes");
      if (buffer.lifetime && buffer.lifetime->first > buffer.lifetime->last)
        fail(where + ".lifetime", "first step " + std::to_string(buffer.lifetime->first) + " is after last step " +
                                      std::to_string(buffer.lifetime->last));
      if (arena.persistent == buffer.lifetime.has_value())
        fail(where + ".lifetime", arena.persistent ? "a buffer in a persistent arena has no lifetime"
                                                   : "a buffer in a scratch arena needs a lifetime");
      if (buffer.aliasOf) {
        if (*buffer.aliasOf >= static_cast<int64_t>(plan_.buffers.size()) || *buffer.aliasOf == buffer.id)
          fail(where + ".alias_of", "no such other buffer " + std::to_string(*buffer.aliasOf));
        const Buffer& target = plan_.buffers[*buffer.aliasOf];
        if (target.arena != buffer.arena || target.offset != buffer.offset || target.bytes() != buffer.bytes())
          fail(where + ".alias_of", "a view must cover exactly the bytes of buffer " + std::to_string(target.id));
      }
    }
  }

  const Buffer& bufferAt(int64_t id, const std::string& where) const {
    if (id < 0 || id >= static_cast<int64_t>(plan_.buffers.size()))
      fail(where, "no buffer " + std::to_string(id) + " (plan has " + std::to_string(plan_.buffers.size()) + ")");
    return plan_.buffers[id];
  }

  void checkParameters() {
    std::set<std::string> names;
    for (size_t i = 0; i < plan_.parameters.size(); ++i) {
      const Parameter& parameter = plan_.parameters[i];
      std::string where = at("parameters", i);
      if (!names.insert(parameter.name).second) fail(where + ".name", "\"" + parameter.name + "\" appears twice");
      const Buffer& buffer = bufferAt(parameter.buffer, where + ".buffer");
      if (buffer.lifetime) fail(where + ".buffer", "a parameter must live in a persistent arena");
      size_t rank = parameter.globalShape.size();
      if (parameter.shardOffset.size() != rank || parameter.shardShape.size() != rank)
        fail(where, "global_shape, shard_offset and shard_shape must have the same rank");
      // initializeWeights draws the whole global tensor (in f64) before cutting this rank's box.
      checkTensorSize(parameter.globalShape, 8, where + ".global_shape");
      for (size_t d = 0; d < rank; ++d) {
        const std::optional<int64_t> end = checkedAdd(parameter.shardOffset[d], parameter.shardShape[d]);
        if (!end || *end > parameter.globalShape[d])
          fail(where + ".shard_offset", "the shard box leaves the global shape in dimension " + std::to_string(d));
      }
      if (buffer.shape != parameter.shardShape) fail(where + ".shard_shape", "differs from the shape of its buffer");
    }
  }

  void checkConstants() {
    for (size_t i = 0; i < plan_.constants.size(); ++i) {
      const Constant& constant = plan_.constants[i];
      std::string where = at("constants", i);
      const Buffer& buffer = bufferAt(constant.buffer, where + ".buffer");
      if (buffer.lifetime) fail(where + ".buffer", "a constant must live in a persistent arena");
      if (constant.section < 0 || constant.section >= static_cast<int64_t>(plan_.sections.size()))
        fail(where + ".section", "no section " + std::to_string(constant.section));
      uint64_t sectionBytes = plan_.sections[constant.section].data.size();
      if (constant.offset > sectionBytes || constant.bytes > sectionBytes - constant.offset)
        fail(where + ".offset", "range leaves section \"" + plan_.sections[constant.section].name + "\"");
      if (constant.bytes != buffer.bytes())
        fail(where + ".bytes", std::to_string(constant.bytes) + " differs from the buffer's " + std::to_string(buffer.bytes()));
    }
  }

  void checkOperand(const EntryPoint& entry, int64_t stepIndex, int64_t id, const std::string& where) const {
    const Buffer& buffer = bufferAt(id, where);
    if (!buffer.lifetime) return;
    if (buffer.lifetime->entry != entry.key())
      fail(where, "buffer " + std::to_string(id) + " belongs to entry \"" + buffer.lifetime->entry + "\"");
    if (stepIndex < buffer.lifetime->first || stepIndex > buffer.lifetime->last)
      fail(where, "buffer " + std::to_string(id) + " is used at step " + std::to_string(stepIndex) + " outside its lifetime [" +
                      std::to_string(buffer.lifetime->first) + ", " + std::to_string(buffer.lifetime->last) + "]");
  }

  // An input's or output's box lies inside its global shape, and its extent is the buffer's shape.
  void checkBox(const NamedBuffer& named, const std::string& where) const {
    const Buffer& buffer = plan_.buffers[named.buffer];
    if (named.shardOffset.size() != named.globalShape.size())
      fail(where + ".shard_offset", "has " + std::to_string(named.shardOffset.size()) + " dimensions, global_shape has " +
                                        std::to_string(named.globalShape.size()));
    if (named.isWhole()) return;
    // The runtime assembles the whole tensor from the ranks' boxes.
    checkTensorSize(named.globalShape, static_cast<int64_t>(dtypeSize(buffer.dtype)), where + ".global_shape");
    if (named.globalShape.size() != buffer.shape.size())
      fail(where + ".global_shape", "has " + std::to_string(named.globalShape.size()) + " dimensions, buffer " +
                                        std::to_string(buffer.id) + " has " + std::to_string(buffer.shape.size()));
    for (size_t d = 0; d < buffer.shape.size(); ++d)
      if (const std::optional<int64_t> end = checkedAdd(named.shardOffset[d], buffer.shape[d]);
          !end || *end > named.globalShape[d])
        fail(where + ".shard_offset", "the box [" + std::to_string(named.shardOffset[d]) + ", " +
                                          (end ? std::to_string(*end)
                                               : std::to_string(named.shardOffset[d]) + " + " + std::to_string(buffer.shape[d])) +
                                          ") of buffer " +
                                          std::to_string(buffer.id) + " leaves global_shape " +
                                          std::to_string(named.globalShape[d]) + " in dimension " + std::to_string(d));
  }

  void checkEntryPoints() {
    std::set<std::string> keys;
    std::set<std::string> axes;
    for (const MeshAxis& axis : plan_.mesh) axes.insert(axis.name);
    for (size_t e = 0; e < plan_.entryPoints.size(); ++e) {
      const EntryPoint& entry = plan_.entryPoints[e];
      std::string where = at("entry_points", e);
      if (!keys.insert(entry.key()).second) fail(where, "entry \"" + entry.key() + "\" appears twice");
      if (entry.numStreams < 1 || entry.numStreams > kMaxStreams)
        fail(where + ".streams", "expected an integer in [1, " + std::to_string(kMaxStreams) + "], got " +
                                     std::to_string(entry.numStreams));
      if (entry.numEvents > kMaxEvents)
        fail(where + ".events", "expected an integer in [0, " + std::to_string(kMaxEvents) + "], got " +
                                    std::to_string(entry.numEvents));
      int64_t lastStep = static_cast<int64_t>(entry.steps.size()) - 1;
      for (size_t i = 0; i < entry.inputs.size(); ++i) {
        checkOperand(entry, 0, entry.inputs[i].buffer, at(where + ".inputs", i));
        checkBox(entry.inputs[i], at(where + ".inputs", i));
      }
      for (size_t i = 0; i < entry.outputs.size(); ++i) {
        checkOperand(entry, std::max<int64_t>(lastStep, 0), entry.outputs[i].buffer, at(where + ".outputs", i));
        checkBox(entry.outputs[i], at(where + ".outputs", i));
      }
      for (size_t s = 0; s < entry.steps.size(); ++s) {
        const Step& step = entry.steps[s];
        std::string stepWhere = at(where + ".steps", s);
        if (step.op.empty()) fail(stepWhere + ".op", "empty");
        for (size_t i = 0; i < step.inputs.size(); ++i) checkOperand(entry, s, step.inputs[i], at(stepWhere + ".inputs", i));
        for (size_t i = 0; i < step.outputs.size(); ++i) checkOperand(entry, s, step.outputs[i], at(stepWhere + ".outputs", i));
        if (step.stream >= entry.numStreams) fail(stepWhere + ".stream", "no stream " + std::to_string(step.stream));
        for (int64_t event : step.waitEvents)
          if (event < 0 || event >= entry.numEvents) fail(stepWhere + ".wait", "no event " + std::to_string(event));
        for (int64_t event : step.signalEvents)
          if (event < 0 || event >= entry.numEvents) fail(stepWhere + ".signal", "no event " + std::to_string(event));
        if (step.kind == Step::Kind::Collective && !axes.count(step.axis))
          fail(stepWhere + ".axis", "no mesh axis \"" + step.axis + "\"");
      }
    }
  }

  // Two buffers may share bytes only if they are never live together: persistent buffers never
  // share, scratch buffers share only across entry points or disjoint step ranges. Views share with
  // the buffer they view. Per arena and entry point, a sweep over the steps keeps the buffers live
  // at the current step by offset; they must be disjoint, so a buffer that starts is checked
  // against its two neighbours alone (n log n where comparing every pair in the same bytes was
  // quadratic on large plans).
  void checkOverlaps() const {
    std::map<std::pair<int64_t, std::string>, std::vector<const Buffer*>> groups;  // (arena, entry) -> owners
    for (const Buffer& buffer : plan_.buffers)
      if (!buffer.aliasOf && buffer.bytes() > 0)
        groups[{buffer.arena, buffer.lifetime ? buffer.lifetime->entry : std::string()}].push_back(&buffer);
    auto first = [](const Buffer* buffer) { return buffer->lifetime ? buffer->lifetime->first : 0; };
    auto last = [](const Buffer* buffer) { return buffer->lifetime ? buffer->lifetime->last : INT64_MAX; };
    for (auto& [key, owners] : groups) {
      std::sort(owners.begin(), owners.end(), [&](const Buffer* a, const Buffer* b) {
        return std::make_tuple(first(a), a->offset, a->id) < std::make_tuple(first(b), b->offset, b->id);
      });
      std::map<uint64_t, const Buffer*> live;  // offset -> the live buffer there
      using Ending = std::pair<int64_t, const Buffer*>;
      std::priority_queue<Ending, std::vector<Ending>, std::greater<>> ending;
      for (const Buffer* buffer : owners) {
        while (!ending.empty() && ending.top().first < first(buffer)) {
          auto it = live.find(ending.top().second->offset);
          if (it != live.end() && it->second == ending.top().second) live.erase(it);
          ending.pop();
        }
        auto next = live.lower_bound(buffer->offset);
        if (next != live.end() && next->first < buffer->offset + buffer->bytes()) failOverlap(*buffer, *next->second);
        if (next != live.begin() && std::prev(next)->first + std::prev(next)->second->bytes() > buffer->offset)
          failOverlap(*buffer, *std::prev(next)->second);
        live[buffer->offset] = buffer;
        ending.push({last(buffer), buffer});
      }
    }
  }

  // Names the buffer at the higher (offset, id) as the one that overlaps the other.
  [[noreturn]] void failOverlap(const Buffer& a, const Buffer& b) const {
    const Buffer& lower = std::tie(a.offset, a.id) < std::tie(b.offset, b.id) ? a : b;
    const Buffer& upper = &lower == &a ? b : a;
    fail("buffers[" + std::to_string(upper.id) + "]", "overlaps buffer " + std::to_string(lower.id) + " in arena \"" +
                                                           plan_.arenas[lower.arena].name + "\" while both are live");
  }

  const Plan& plan_;
  const std::string& source_;
};

}  // namespace

void validatePlan(const Plan& plan, const std::string& source) { PlanChecker(plan, source).run(); }

}  // namespace dgemma
