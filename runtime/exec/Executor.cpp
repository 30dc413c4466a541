#include "runtime/exec/Executor.h"

#include <cstdio>

#include "support/Error.h"
#include "plan/PlanFile.h"

namespace dgemma {

struct Executor::PreparedStep {
  const Step* step = nullptr;
  std::unique_ptr<Kernel> kernel;  // null for collectives
  Communicator* communicator = nullptr;
  ReduceOp reduce = ReduceOp::Sum;
  int64_t root = 0;
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

ReduceOp parseReduce(const Step& step, const std::string& where) {
  std::string name = step.attrs.value("reduce", std::string("sum"));
  if (name == "sum") return ReduceOp::Sum;
  if (name == "max") return ReduceOp::Max;
  if (name == "min") return ReduceOp::Min;
  throw InputError(where + ": attribute 'reduce': expected sum, max or min, got \"" + name + "\"");
}

}  // namespace

Executor::Executor(const Plan& plan, Backend& backend, CommunicatorSet& communicators, std::string source)
    : plan_(plan), backend_(backend), communicators_(communicators), source_(std::move(source)) {
  validatePlan(plan_, source_);  // cheap, and plans built in memory skip the file reader's check
  const KernelRegistry& registry = backend_.kernels();
  for (const EntryPoint& entry : plan_.entryPoints) {
    auto prepared = std::make_unique<PreparedEntry>();
    for (size_t i = 0; i < entry.steps.size(); ++i) {
      const Step& step = entry.steps[i];
      PreparedStep preparedStep;
      preparedStep.step = &step;
      std::string where = stepWhere(source_, entry, i, step);
      if (step.kind == Step::Kind::Kernel) {
        const KernelFactory* factory = registry.find(step.op);
        if (!factory) throw InputError(where + ": kernel \"" + step.op + "\" is not provided by the " + backend_.name() + " backend");
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
          if (in.dtype != out.dtype || out.numElements() != expectedOut || (!gather && in.numElements() % groupSize != 0))
            throw InputError(where + ": buffer sizes do not match a group of " + std::to_string(groupSize) + " ranks");
          if (!gather) preparedStep.reduce = parseReduce(step, where);
        } else if (step.op == "broadcast") {
          preparedStep.root = step.attrs.value("root", int64_t{0});
          if (step.inputs.size() != 1 || step.outputs != step.inputs)
            throw InputError(where + ": broadcast works in place: one buffer as input and output");
        } else {
          throw InputError(where + ": unknown collective \"" + step.op + "\"");
        }
      }
      prepared->steps.push_back(std::move(preparedStep));
    }
    entries_[entry.key()] = std::move(prepared);
  }

  for (const Arena& arena : plan_.arenas) {
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
  for (void* base : arenaBases_) {
    try {
      backend_.deallocate(base);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "dgemma: warning: %s\n", error.what());
    }
  }
}

void* Executor::address(int64_t bufferId) const {
  const Buffer& buffer = plan_.buffers[bufferId];
  return static_cast<uint8_t*>(arenaBases_[buffer.arena]) + buffer.offset;
}

HostTensor Executor::download(int64_t bufferId) const {
  const Buffer& buffer = plan_.buffers[bufferId];
  HostTensor tensor(buffer.dtype, buffer.shape);
  backend_.copyToHost(tensor.data.data(), address(bufferId), tensor.data.size());
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
    backend_.copyToDevice(address(parameter.buffer), value.data.data(), value.data.size());
    return;
  }
  throw InputError("parameter " + name + ": the plan has no such parameter");
}

HostTensor Executor::parameter(const std::string& name) const {
  for (const Parameter& parameter : plan_.parameters)
    if (parameter.name == name) return download(parameter.buffer);
  throw InputError("parameter " + name + ": the plan has no such parameter");
}

std::map<std::string, HostTensor> Executor::run(const EntryPoint& entry, const std::map<std::string, HostTensor>& inputs) {
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
  for (PreparedStep& prepared : found->second->steps) {
    const Step& step = *prepared.step;
    for (int64_t event : step.waitEvents) backend_.waitEvent(event, step.stream);
    ExecContext context = backend_.context(step.stream);
    if (prepared.kernel) {
      prepared.kernel->run(context, prepared.inputs, prepared.outputs);
    } else {
      const TensorRef& in = prepared.inputs[0];
      const TensorRef& out = prepared.outputs[0];
      Communicator& group = *prepared.communicator;
      if (step.op == "all_reduce") {
        group.allReduce(context, in.data, in.numElements(), in.dtype(), prepared.reduce);
      } else if (step.op == "all_gather") {
        group.allGather(context, in.data, out.data, in.numElements(), in.dtype());
      } else if (step.op == "reduce_scatter") {
        group.reduceScatter(context, in.data, out.data, out.numElements(), in.dtype(), prepared.reduce);
      } else {
        group.broadcast(context, in.data, in.numElements(), in.dtype(), prepared.root);
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
