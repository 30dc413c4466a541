#include "runtime/exec/Executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "support/CheckedSize.h"
#include "support/Error.h"
#include "plan/HostArena.h"
#include "plan/PlanFile.h"
#include "runtime/comm/PeerLostError.h"

namespace dgemma {

// Where a step runs (plan/HostArena.h): on the device, on the host arena (after the device's work
// so far has finished), or as a copy across the two on the step's stream.
enum class StepPlace { Device, Host, DeviceToHost, HostToDevice };

struct Executor::PreparedStep {
  const Step* step = nullptr;
  StepPlace place = StepPlace::Device;
  std::unique_ptr<Kernel> kernel;  // null for collectives and for copies across the host arena
  Communicator* communicator = nullptr;
  ReduceOp reduce = ReduceOp::Sum;
  int64_t root = 0;
  std::string where;  // names the step in run-time errors
  std::vector<TensorRef> inputs;
  std::vector<TensorRef> outputs;
};

struct Executor::PreparedEntry {
  std::vector<PreparedStep> steps;
};

namespace {

std::string stepWhere(const std::string& source, const EntryPoint& entry, size_t index, const Step& step) {
  std::string where = source + ": entry " + entry.key() + ": step " + std::to_string(index) + " (" + step.op;
  if (!step.location.empty()) where += " at " + step.location;
  return where + ")";
}

// Before anything is allocated: on Linux an oversized CPU arena is granted (overcommit) and the
// process is killed when the arena is first touched, so the plan's total is checked against the
// backend's memory up front (a RuntimeError: the plan is valid, this machine is too small for it).
void refuseArenasLargerThanMemory(const Plan& plan, const Backend& backend, const std::string& source) {
  uint64_t total = 0;
  for (const Arena& arena : plan.arenas) {
    // A GPU's host arena is not device memory (pinned host memory is refused by the allocator itself).
    if (isHostArena(arena) && backend.name() != "cpu") continue;
    total = arena.bytes > UINT64_MAX - total ? UINT64_MAX : total + arena.bytes;
  }
  const uint64_t capacity = backend.memoryCapacityBytes();
  if (total > capacity)
    throw RuntimeError(source + ": the plan's " + std::to_string(plan.arenas.size()) + " arenas need " +
                       std::to_string(total) + " bytes (" + formatBytes(total) + "), more than the " +
                       formatBytes(capacity) + " of memory of the " + backend.name() +
                       " backend; compile for a smaller micro-batch or prompt "
                       "length, or shard the plan over more ranks");
}

// A host arena (--optimizer-offload) needs host memory the device copies to and from and kernels
// that run on it (Backend::hostKernels(); docs/parallelism.md, "Optimizer-state offload"): the CPU
// and CUDA backends have them.
void refuseHostArenasWithoutHostKernels(const Plan& plan, const Backend& backend, const std::string& source) {
  if (backend.hostKernels() != nullptr) return;
  for (const Arena& arena : plan.arenas)
    if (isHostArena(arena))
      throw InputError(source + ": arena \"" + arena.name +
                       "\" lives in host memory (a plan compiled with --optimizer-offload), which the " +
                       backend.name() + " backend cannot run; compile without --optimizer-offload");
}

// A kernel step runs on the host when every buffer it touches is in the host arena; a copy with one
// side there crosses between the two; any other step must stay off the host arena.
StepPlace placeOf(const Plan& plan, const Step& step, const std::string& where) {
  size_t hostBuffers = 0;
  for (const std::vector<int64_t>* ids : {&step.inputs, &step.outputs})
    for (int64_t id : *ids) hostBuffers += isHostArena(plan.arenas[plan.buffers[id].arena]);
  if (hostBuffers == 0) return StepPlace::Device;
  const size_t buffers = step.inputs.size() + step.outputs.size();
  if (step.kind == Step::Kind::Kernel && hostBuffers == buffers) return StepPlace::Host;
  if (step.kind == Step::Kind::Kernel && step.op == "copy" && step.inputs.size() == 1 && step.outputs.size() == 1) {
    const Buffer& from = plan.buffers[step.inputs[0]];
    const Buffer& to = plan.buffers[step.outputs[0]];
    if (from.bytes() != to.bytes())
      throw InputError(where + ": copies " + std::to_string(from.bytes()) + " bytes into a buffer of " +
                       std::to_string(to.bytes()));
    return isHostArena(plan.arenas[to.arena]) ? StepPlace::DeviceToHost : StepPlace::HostToDevice;
  }
  throw InputError(where + ": mixes buffers of the host arena with device buffers (only a copy may cross)");
}

// A step carries every attribute of its op, defaults included (docs/plan-format.md, "Header").
const nlohmann::json& requiredAttr(const Step& step, const std::string& key, const std::string& where) {
  if (step.attrs.is_object())
    if (auto found = step.attrs.find(key); found != step.attrs.end()) return *found;
  throw InputError(where + ": attribute '" + key + "' is missing");
}

ReduceOp parseReduce(const Step& step, const std::string& where) {
  const nlohmann::json& value = requiredAttr(step, "reduce", where);
  std::string name = value.is_string() ? value.get<std::string>() : value.dump();
  if (name == "sum") return ReduceOp::Sum;
  if (name == "max") return ReduceOp::Max;
  if (name == "min") return ReduceOp::Min;
  throw InputError(where + ": attribute 'reduce': expected sum, max or min, got \"" + name + "\"");
}

int64_t parseRoot(const Step& step, const std::string& where) {
  const nlohmann::json& value = requiredAttr(step, "root", where);
  if (!value.is_number_integer())
    throw InputError(where + ": attribute 'root': expected an integer, got " + value.dump());
  return value.get<int64_t>();
}

}  // namespace

Executor::Executor(const Plan& plan, Backend& backend, CommunicatorSet& communicators, std::string source)
    : plan_(plan), backend_(backend), communicators_(communicators), source_(std::move(source)) {
  validatePlan(plan_, source_);  // cheap, and plans built in memory skip the file reader's check
  refuseHostArenasWithoutHostKernels(plan_, backend_, source_);
  const KernelRegistry& registry = backend_.kernels();
  for (const EntryPoint& entry : plan_.entryPoints) {
    auto prepared = std::make_unique<PreparedEntry>();
    for (size_t i = 0; i < entry.steps.size(); ++i) {
      const Step& step = entry.steps[i];
      PreparedStep preparedStep;
      preparedStep.step = &step;
      std::string where = stepWhere(source_, entry, i, step);
      preparedStep.where = where;
      preparedStep.place = placeOf(plan_, step, where);
      if (preparedStep.place == StepPlace::DeviceToHost || preparedStep.place == StepPlace::HostToDevice) {
        // The backend's transfer, not its copy kernel, which works inside one memory.
      } else if (step.kind == Step::Kind::Kernel) {
        const bool onHost = preparedStep.place == StepPlace::Host;
        const KernelFactory* factory = (onHost ? *backend_.hostKernels() : registry).find(step.op);
        if (!factory)
          throw InputError(where + ": kernel \"" + step.op + "\" is not provided by the " + backend_.name() +
                           " backend" + (onHost ? " on the host" : ""));
        KernelSignature signature;
        signature.step = &step;
        signature.where = where;
        for (int64_t id : step.inputs) signature.inputs.push_back(&plan_.buffers[id]);
        for (int64_t id : step.outputs) signature.outputs.push_back(&plan_.buffers[id]);
        preparedStep.kernel = (*factory)(signature);
      } else {
        preparedStep.communicator = &communicators_.axis(step.axis, where);
        if (step.op == "all_reduce") {
          preparedStep.reduce = parseReduce(step, where);
          if (step.inputs.size() != 1 || step.outputs != step.inputs)
            throw InputError(where + ": all_reduce works in place: one buffer as input and output");
        } else if (step.op == "all_gather" || step.op == "reduce_scatter") {
          if (step.inputs.size() != 1 || step.outputs.size() != 1)
            throw InputError(where + ": expected one input and one output buffer");
          const Buffer& in = plan_.buffers[step.inputs[0]];
          const Buffer& out = plan_.buffers[step.outputs[0]];
          int64_t groupSize = preparedStep.communicator->size();
          bool gather = step.op == "all_gather";
          int64_t expectedOut = gather ? in.numElements() * groupSize : in.numElements() / groupSize;
          if (in.dtype != out.dtype || out.numElements() != expectedOut ||
              (!gather && in.numElements() % groupSize != 0))
            throw InputError(where + ": buffer sizes do not match a group of " + std::to_string(groupSize) + " ranks");
          if (!gather) preparedStep.reduce = parseReduce(step, where);
        } else if (step.op == "broadcast" || step.op == "reduce_to_root") {
          preparedStep.root = parseRoot(step, where);
          int64_t groupSize = preparedStep.communicator->size();
          if (preparedStep.root < 0 || preparedStep.root >= groupSize)
            throw InputError(where + ": attribute 'root': expected a rank in [0, " + std::to_string(groupSize) +
                             "), got " + std::to_string(preparedStep.root));
          if (step.inputs.size() != 1 || step.outputs != step.inputs)
            throw InputError(where + ": " + step.op + " works in place: one buffer as input and output");
        } else if (step.op == "all_to_all") {
          if (step.inputs.size() != 2 || step.outputs.size() != 2)
            throw InputError(where +
                             ": expected the rows and the send counts as inputs, the received rows and counts "
                             "as outputs");
          const Buffer& in = plan_.buffers[step.inputs[0]];
          const Buffer& out = plan_.buffers[step.outputs[0]];
          int64_t groupSize = preparedStep.communicator->size();
          if (in.dtype != out.dtype || in.shape.empty() || out.shape.size() != in.shape.size() ||
              !std::equal(in.shape.begin() + 1, in.shape.end(), out.shape.begin() + 1))
            throw InputError(where + ": the received rows must have the sent rows' dtype and trailing shape");
          for (int64_t counts : {step.inputs[1], step.outputs[1]}) {
            const Buffer& buffer = plan_.buffers[counts];
            if (buffer.dtype != DType::I64 || buffer.shape != std::vector<int64_t>{groupSize})
              throw InputError(where + ": buffer " + buffer.name + ": expected i64 [" + std::to_string(groupSize) +
                               "] counts (one per rank of axis " + step.axis + ")");
          }
        } else {
          throw InputError(where + ": unknown collective \"" + step.op + "\"");
        }
      }
      prepared->steps.push_back(std::move(preparedStep));
    }
    entries_[entry.key()] = std::move(prepared);
  }

  refuseArenasLargerThanMemory(plan_, backend_, source_);
  for (const Arena& arena : plan_.arenas) {
    if (isHostArena(arena)) {
      void* base = backend_.allocateHost(arena.bytes, arena.alignment);
      arenaBases_.push_back(base);
      if (arena.bytes) std::memset(base, 0, arena.bytes);
      continue;
    }
    void* base = backend_.allocate(arena.bytes, arena.alignment);
    arenaBases_.push_back(base);
    if (arena.persistent) backend_.fillZero(base, arena.bytes);
  }
  for (auto& [key, entry] : entries_)
    for (PreparedStep& step : entry->steps) {
      for (int64_t id : step.step->inputs) step.inputs.push_back({address(id), &plan_.buffers[id]});
      for (int64_t id : step.step->outputs) step.outputs.push_back({address(id), &plan_.buffers[id]});
    }
  for (const Constant& constant : plan_.constants)
    backend_.copyToDevice(address(constant.buffer), plan_.sections[constant.section].data.data() + constant.offset,
                          constant.bytes);
  backend_.synchronize();
}

Executor::~Executor() {
  // A destructor must not throw; a device error while tearing down is reported and the rest freed.
  try {
    backend_.synchronize();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dgemma: warning: %s\n", error.what());
  }
  for (size_t i = 0; i < arenaBases_.size(); ++i) {
    try {
      if (isHostArena(plan_.arenas[i])) backend_.deallocateHost(arenaBases_[i]);
      else backend_.deallocate(arenaBases_[i]);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "dgemma: warning: %s\n", error.what());
    }
  }
}

void Executor::runAllToAll(const PreparedStep& prepared, ExecContext& context) {
  const TensorRef& rows = prepared.inputs[0];
  const TensorRef& received = prepared.outputs[0];
  Communicator& group = *prepared.communicator;
  const int64_t peers = group.size();
  const int64_t rowElements = rows.shape()[0] == 0 ? 0 : rows.numElements() / rows.shape()[0];
  const uint64_t rowBytes = static_cast<uint64_t>(rowElements) * dtypeSize(rows.dtype());

  // The counts were computed on the device by earlier steps.
  backend_.synchronize();
  std::vector<int64_t> sendCounts(static_cast<size_t>(peers));
  backend_.copyToHost(sendCounts.data(), prepared.inputs[1].data, sendCounts.size() * sizeof(int64_t));
  // A bad count on one rank leaves the others waiting in the exchange until their timeout.
  auto placeBlocks = [&](const std::vector<int64_t>& counts, int64_t capacity, const char* what) {
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int64_t count : counts) {
      if (count < 0)
        throw RuntimeError(prepared.where + ": " + what + " counts: expected non-negative counts, got " +
                           std::to_string(count));
      offsets.push_back(total * rowElements);
      total += count;
    }
    if (total > capacity)
      throw RuntimeError(prepared.where + ": " + what + " " + std::to_string(total) + " rows, more than the " +
                         std::to_string(capacity) + " the buffer holds");
    return std::pair{offsets, total};
  };
  std::vector<int64_t> sendOffsets = placeBlocks(sendCounts, rows.shape()[0], "send").first;
  std::vector<int64_t> recvCounts = group.exchangeCounts(sendCounts);
  auto [recvOffsets, total] = placeBlocks(recvCounts, received.shape()[0], "receive");

  // The contract leaves the rows past the received ones zero.
  const uint64_t usedBytes = static_cast<uint64_t>(total) * rowBytes;
  const uint64_t capacityBytes = static_cast<uint64_t>(received.shape()[0]) * rowBytes;
  if (capacityBytes > usedBytes)
    backend_.fillZero(static_cast<uint8_t*>(received.data) + usedBytes, capacityBytes - usedBytes);

  auto elements = [&](std::vector<int64_t> counts) {
    for (int64_t& count : counts) count *= rowElements;
    return counts;
  };
  group.allToAllV(context, rows.data, elements(sendCounts), sendOffsets, received.data, elements(recvCounts),
                  recvOffsets, rows.dtype());
  backend_.copyToDevice(prepared.outputs[1].data, recvCounts.data(), recvCounts.size() * sizeof(int64_t));
}

void* Executor::address(int64_t bufferId) const {
  const Buffer& buffer = plan_.buffers[bufferId];
  return static_cast<uint8_t*>(arenaBases_[buffer.arena]) + buffer.offset;
}

bool Executor::inHostArena(int64_t bufferId) const { return isHostArena(plan_.arenas[plan_.buffers[bufferId].arena]); }

HostTensor Executor::download(int64_t bufferId) const {
  const Buffer& buffer = plan_.buffers[bufferId];
  HostTensor tensor(buffer.dtype, buffer.shape);
  if (inHostArena(bufferId))  // run() has synchronized: nothing in flight writes it
    std::memcpy(tensor.data.data(), address(bufferId), tensor.data.size());
  else backend_.copyToHost(tensor.data.data(), address(bufferId), tensor.data.size());
  return tensor;
}

void Executor::setParameter(const std::string& name, const HostTensor& value) {
  for (const Parameter& parameter : plan_.parameters) {
    if (parameter.name != name) continue;
    const Buffer& buffer = plan_.buffers[parameter.buffer];
    if (value.dtype != buffer.dtype || value.shape != buffer.shape)
      throw InputError("parameter " + name + ": expected " + std::string(dtypeName(buffer.dtype)) + " " +
                       shapeToString(buffer.shape) + ", got " + std::string(dtypeName(value.dtype)) + " " +
                       shapeToString(value.shape));
    if (inHostArena(parameter.buffer))  // an offloaded moment
      std::memcpy(address(parameter.buffer), value.data.data(), value.data.size());
    else backend_.copyToDevice(address(parameter.buffer), value.data.data(), value.data.size());
    // Its host master, when --optimizer-offload keeps one (plan/HostArena.h): host memory.
    const std::string hostCopy = kHostCopyPrefix + name;
    for (const Buffer& host : plan_.buffers)
      if (isHostArena(plan_.arenas[host.arena]) && host.name == hostCopy && host.bytes() == value.data.size())
        std::memcpy(address(host.id), value.data.data(), value.data.size());
    return;
  }
  throw InputError("parameter " + name + ": the plan has no such parameter");
}

HostTensor Executor::parameter(const std::string& name) const {
  for (const Parameter& parameter : plan_.parameters)
    if (parameter.name == name) return download(parameter.buffer);
  throw InputError("parameter " + name + ": the plan has no such parameter");
}

std::map<std::string, HostTensor> Executor::run(const EntryPoint& entry,
                                                const std::map<std::string, HostTensor>& inputs) {
  auto found = entries_.find(entry.key());
  if (found == entries_.end()) throw InputError(source_ + ": no entry point " + entry.key());
  for (const NamedBuffer& input : entry.inputs) {
    auto it = inputs.find(input.name);
    if (it == inputs.end()) throw InputError("input " + input.name + ": missing (entry " + entry.key() + " needs it)");
    const Buffer& buffer = plan_.buffers[input.buffer];
    if (it->second.dtype != buffer.dtype || it->second.shape != buffer.shape)
      throw InputError("input " + input.name + ": expected " + std::string(dtypeName(buffer.dtype)) + " " +
                       shapeToString(buffer.shape) + ", got " + std::string(dtypeName(it->second.dtype)) + " " +
                       shapeToString(it->second.shape));
    backend_.copyToDevice(address(input.buffer), it->second.data.data(), it->second.data.size());
  }
  for (const auto& [name, tensor] : inputs) {
    bool known = false;
    for (const NamedBuffer& input : entry.inputs) known |= input.name == name;
    if (!known) throw InputError("input " + name + ": entry " + entry.key() + " takes no such input");
  }

  backend_.prepareStreams(entry.numStreams, entry.numEvents);
  bool deviceWorkQueued = true;  // the inputs' uploads, as far as a host step knows
  for (PreparedStep& prepared : found->second->steps) {
    const Step& step = *prepared.step;
    for (int64_t event : step.waitEvents) backend_.waitEvent(event, step.stream);
    if (prepared.place == StepPlace::Host) {
      // Its operands were copied in by the steps before it, asynchronously: wait for them. The host
      // writes nothing a queued copy still reads (copies back are queued after the step that writes).
      if (deviceWorkQueued) backend_.synchronize();
      deviceWorkQueued = false;
      ExecContext context = backend_.hostContext();
      prepared.kernel->run(context, prepared.inputs, prepared.outputs);
      for (int64_t event : step.signalEvents) backend_.recordEvent(event, step.stream);
      continue;
    }
    deviceWorkQueued = true;
    ExecContext context = backend_.context(step.stream);
    if (prepared.place == StepPlace::DeviceToHost) {
      backend_.copyDeviceToHost(context, prepared.outputs[0].data, prepared.inputs[0].data,
                                prepared.outputs[0].buffer->bytes());
    } else if (prepared.place == StepPlace::HostToDevice) {
      backend_.copyHostToDevice(context, prepared.outputs[0].data, prepared.inputs[0].data,
                                prepared.outputs[0].buffer->bytes());
    } else if (prepared.kernel) {
      prepared.kernel->run(context, prepared.inputs, prepared.outputs);
    } else {
      const TensorRef& in = prepared.inputs[0];
      const TensorRef& out = prepared.outputs[0];
      Communicator& group = *prepared.communicator;
      // A peer that died or hangs surfaces here (a Gloo I/O error or timeout): name the step.
      try {
        if (step.op == "all_reduce") {
          group.allReduce(context, in.data, in.numElements(), in.dtype(), prepared.reduce);
        } else if (step.op == "all_gather") {
          group.allGather(context, in.data, out.data, in.numElements(), in.dtype());
        } else if (step.op == "reduce_scatter") {
          group.reduceScatter(context, in.data, out.data, out.numElements(), in.dtype(), prepared.reduce);
        } else if (step.op == "broadcast") {
          group.broadcast(context, in.data, in.numElements(), in.dtype(), prepared.root);
        } else if (step.op == "reduce_to_root") {
          group.reduceToRoot(context, in.data, in.numElements(), in.dtype(), prepared.root);
        } else {
          runAllToAll(prepared, context);
        }
      } catch (const RuntimeError& error) {
        const std::string message = error.what();
        if (message.rfind(prepared.where, 0) == 0) throw;  // runAllToAll's own checks name the step already
        if (dynamic_cast<const PeerLostError*>(&error)) throw PeerLostError(prepared.where + ": " + message);
        throw RuntimeError(prepared.where + ": " + message);
      }
    }
    for (int64_t event : step.signalEvents) backend_.recordEvent(event, step.stream);
  }
  backend_.synchronize();

  std::map<std::string, HostTensor> outputs;
  for (const NamedBuffer& output : entry.outputs) outputs[output.name] = download(output.buffer);
  return outputs;
}

}  // namespace dgemma
