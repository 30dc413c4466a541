#include "runtime/kernel_api/Kernel.h"

#include <limits>
#include <optional>
#include <stdexcept>

#include "support/Error.h"
#include "support/Shape.h"

namespace dgemma {

void KernelRegistry::add(const std::string& name, KernelFactory factory, KernelTraits traits) {
  // Two backends' kernel groups claiming one name is a programming error, not bad input.
  if (!kernels_.emplace(name, Registration{std::move(factory), traits}).second)
    throw std::logic_error("kernel '" + name + "' is registered twice");
}

const KernelFactory* KernelRegistry::find(const std::string& name) const {
  auto found = kernels_.find(name);
  return found == kernels_.end() ? nullptr : &found->second.factory;
}

const KernelTraits& KernelRegistry::traits(const std::string& name) const {
  auto found = kernels_.find(name);
  if (found == kernels_.end()) throw std::logic_error("kernel '" + name + "' is not registered");
  return found->second.traits;
}

std::vector<std::string> KernelRegistry::names() const {
  std::vector<std::string> result;
  result.reserve(kernels_.size());
  for (const auto& entry : kernels_) result.push_back(entry.first);
  return result;
}

namespace {

std::string countOf(size_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

std::string arityText(size_t inputs, size_t outputs) {
  return countOf(inputs, "input") + " and " + countOf(outputs, "output");
}

// The attribute's JSON value, or nullptr when the step has no such attribute.
const nlohmann::json* findAttr(const KernelSignature& signature, const std::string& key) {
  if (signature.step == nullptr || !signature.step->attrs.is_object()) return nullptr;
  auto found = signature.step->attrs.find(key);
  return found == signature.step->attrs.end() ? nullptr : &*found;
}

[[noreturn]] void failAttr(const KernelSignature& signature, const std::string& key, const std::string& problem) {
  failSignature(signature, "attribute '" + key + "': " + problem);
}

[[noreturn]] void failMissingAttr(const KernelSignature& signature, const std::string& key) {
  failSignature(signature, "attribute '" + key + "' is missing");
}

// nlohmann keeps large non-negative integers as unsigned; those beyond int64 would wrap silently.
std::optional<int64_t> asInt64(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return std::nullopt;
  return value.get<int64_t>();
}

}  // namespace

void failSignature(const KernelSignature& signature, const std::string& message) {
  throw InputError(signature.where + ": " + message);
}

void expectArity(const KernelSignature& signature, size_t inputs, size_t outputs) {
  if (signature.inputs.size() != inputs || signature.outputs.size() != outputs)
    failSignature(signature, "expected " + arityText(inputs, outputs) + ", got " +
                                 arityText(signature.inputs.size(), signature.outputs.size()));
}

void expectArityRange(const KernelSignature& signature, size_t minInputs, size_t maxInputs, size_t outputs) {
  size_t inputs = signature.inputs.size();
  if (inputs < minInputs || inputs > maxInputs || signature.outputs.size() != outputs)
    failSignature(signature, "expected " + std::to_string(minInputs) + " to " + countOf(maxInputs, "input") +
                                 " and " + countOf(outputs, "output") + ", got " +
                                 arityText(inputs, signature.outputs.size()));
}

void expectDType(const KernelSignature& signature, const Buffer& buffer, std::initializer_list<DType> allowed,
                 const std::string& role) {
  for (DType dtype : allowed)
    if (buffer.dtype == dtype) return;
  std::string expected;
  size_t position = 0;
  for (DType dtype : allowed) {
    if (position > 0) expected += position + 1 == allowed.size() ? " or " : ", ";
    expected += dtypeName(dtype);
    ++position;
  }
  failSignature(signature, role + " has dtype " + std::string(dtypeName(buffer.dtype)) + ", expected " + expected);
}

void expectShape(const KernelSignature& signature, const Buffer& buffer, const std::vector<int64_t>& expected,
                 const std::string& role) {
  if (buffer.shape != expected)
    failSignature(signature,
                  role + " has shape " + shapeToString(buffer.shape) + ", expected " + shapeToString(expected));
}

namespace {

UnaryOperands checkUnaryOperands(const KernelSignature& signature, const std::initializer_list<DType>* dtypes,
                                  OutputShape shape) {
  expectArity(signature, 1, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  if (dtypes != nullptr) expectDType(signature, x, *dtypes, "input x");
  expectDType(signature, y, {x.dtype}, "output y");
  if (shape == OutputShape::SameAsInput) expectShape(signature, y, x.shape, "output y");
  return {x, y};
}

}  // namespace

UnaryOperands expectUnaryOperands(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                  OutputShape shape) {
  return checkUnaryOperands(signature, &dtypes, shape);
}

UnaryOperands expectUnaryOperands(const KernelSignature& signature, OutputShape shape) {
  return checkUnaryOperands(signature, nullptr, shape);
}

BinaryOperands expectBinaryOperands(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                    std::optional<DType> outputDType) {
  expectArity(signature, 2, 1);
  const Buffer& a = *signature.inputs[0];
  const Buffer& b = *signature.inputs[1];
  const Buffer& c = *signature.outputs[0];
  expectDType(signature, a, dtypes, "input a");
  expectDType(signature, b, {a.dtype}, "input b");
  expectDType(signature, c, {outputDType.value_or(a.dtype)}, "output c");
  return {a, b, c};
}

void expectRank(const KernelSignature& signature, const Buffer& buffer, size_t rank, const std::string& role,
                const std::string& layout) {
  if (buffer.shape.size() != rank)
    failSignature(signature, role + " has shape " + shapeToString(buffer.shape) + ", expected " + layout);
}

DType expectSharedDType(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                        std::initializer_list<std::pair<const Buffer*, std::string>> buffers) {
  const auto& [first, firstRole] = *buffers.begin();
  expectDType(signature, *first, dtypes, firstRole);
  for (auto other = buffers.begin() + 1; other != buffers.end(); ++other)
    expectDType(signature, *other->first, {first->dtype}, other->second);
  return first->dtype;
}

bool hasAttr(const KernelSignature& signature, const std::string& key) { return findAttr(signature, key) != nullptr; }


namespace {

// The attribute `key` read by `read` (which checks its JSON type). Every attribute is required: the
// plan carries each attribute of the op, defaults included (docs/plan-format.md, "Header").
template <typename Read>
auto readAttr(const KernelSignature& signature, const std::string& key, Read read) {
  const nlohmann::json* value = findAttr(signature, key);
  if (value == nullptr) failMissingAttr(signature, key);
  return read(*value);
}

}  // namespace

std::string attrString(const KernelSignature& signature, const std::string& key) {
  return readAttr(signature, key, [&](const nlohmann::json& value) {
    if (!value.is_string()) failAttr(signature, key, "expected a string");
    return value.get<std::string>();
  });
}

double attrDouble(const KernelSignature& signature, const std::string& key) {
  return readAttr(signature, key, [&](const nlohmann::json& value) {
    if (!value.is_number()) failAttr(signature, key, "expected a number");
    return value.get<double>();
  });
}

int64_t attrInt(const KernelSignature& signature, const std::string& key) {
  return readAttr(signature, key, [&](const nlohmann::json& value) {
    std::optional<int64_t> integer = asInt64(value);
    if (!integer) failAttr(signature, key, "expected an integer");
    return *integer;
  });
}

bool attrBool(const KernelSignature& signature, const std::string& key) {
  return readAttr(signature, key, [&](const nlohmann::json& value) {
    if (!value.is_boolean()) failAttr(signature, key, "expected a boolean");
    return value.get<bool>();
  });
}

std::vector<int64_t> attrInts(const KernelSignature& signature, const std::string& key) {
  return readAttr(signature, key, [&](const nlohmann::json& value) {
    if (!value.is_array()) failAttr(signature, key, "expected an array of integers");
    std::vector<int64_t> result;
    result.reserve(value.size());
    for (const nlohmann::json& element : value) {
      std::optional<int64_t> integer = asInt64(element);
      if (!integer) failAttr(signature, key, "expected an array of integers");
      result.push_back(*integer);
    }
    return result;
  });
}

}  // namespace dgemma
