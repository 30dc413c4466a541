#include "runtime/kernels/elementwise/Contract.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "support/Shape.h"

namespace dgemma {
namespace {

// The broadcast shape of the signature's inputs, which `roles` names in order; a plan error lists
// them when they do not broadcast.
std::vector<int64_t> broadcastShape(const KernelSignature& signature, const std::vector<std::string>& roles) {
  std::vector<int64_t> shape;
  for (const Buffer* input : signature.inputs) {
    const std::vector<int64_t>& next = input->shape;
    const size_t rank = std::max(shape.size(), next.size());
    std::vector<int64_t> merged(rank);
    for (size_t d = 0; d < rank; ++d) {
      // Aligned on the right: dimension d of the result is the operand's dimension d - (rank - size).
      const int64_t dimSoFar = d + shape.size() >= rank ? shape[d + shape.size() - rank] : 1;
      const int64_t dimNext = d + next.size() >= rank ? next[d + next.size() - rank] : 1;
      if (dimSoFar != dimNext && dimSoFar != 1 && dimNext != 1) {
        std::string inputs;
        for (size_t i = 0; i < roles.size(); ++i)
          inputs += (i == 0 ? "" : i + 1 == roles.size() ? " and " : ", ") + roles[i] + " " +
                    shapeToString(signature.inputs[i]->shape);
        failSignature(signature, "inputs " + inputs + " do not broadcast");
      }
      merged[d] = dimSoFar == 1 ? dimNext : dimSoFar;
    }
    shape = std::move(merged);
  }
  return shape;
}

ComparePredicate parsePredicate(const KernelSignature& signature) {
  const std::string predicate = attrString(signature, "predicate");
  if (predicate == "lt") return ComparePredicate::Less;
  if (predicate == "le") return ComparePredicate::LessEqual;
  if (predicate == "gt") return ComparePredicate::Greater;
  if (predicate == "ge") return ComparePredicate::GreaterEqual;
  if (predicate == "eq") return ComparePredicate::Equal;
  if (predicate == "ne") return ComparePredicate::NotEqual;
  failSignature(signature, "attribute 'predicate': expected lt, le, gt, ge, eq or ne, got '" + predicate + "'");
}

template <typename Int>
void expectIntegerValue(const KernelSignature& signature, double value, DType dtype) {
  // Bounds as doubles: the upper one is exclusive because max() + 1 is a power of two while max()
  // itself may not be representable.
  const double lowest = static_cast<double>(std::numeric_limits<Int>::lowest());
  const double upperExclusive = static_cast<double>(std::numeric_limits<Int>::max()) + 1.0;
  if (std::trunc(value) != value || value < lowest || value >= upperExclusive)
    failSignature(signature, "attribute 'value': " + std::to_string(value) + " is not representable in " +
                                 std::string(dtypeName(dtype)));
}

}  // namespace

BinaryContract parseBinaryContract(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                   std::optional<DType> output) {
  const auto [a, b, c] = expectBinaryOperands(signature, dtypes, output);
  BinaryContract contract;
  contract.dtype = a.dtype;
  contract.shape = broadcastShape(signature, {"a", "b"});
  expectShape(signature, c, contract.shape, "output c");
  contract.sameShapes = a.shape == contract.shape && b.shape == contract.shape;
  return contract;
}

CompareContract parseCompareContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  CompareContract contract;
  contract.predicate = parsePredicate(signature);
  contract.operands = parseBinaryContract(signature, dtypes, DType::Bool);
  return contract;
}

SelectContract parseSelectContract(const KernelSignature& signature) {
  expectArity(signature, 3, 1);
  const Buffer& condition = *signature.inputs[0];
  const Buffer& onTrue = *signature.inputs[1];
  const Buffer& onFalse = *signature.inputs[2];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, condition, {DType::Bool}, "input condition");
  expectDType(signature, onFalse, {onTrue.dtype}, "input on_false");
  expectDType(signature, y, {onTrue.dtype}, "output y");
  SelectContract contract;
  contract.dtype = onTrue.dtype;
  contract.shape = broadcastShape(signature, {"condition", "on_true", "on_false"});
  expectShape(signature, y, contract.shape, "output y");
  return contract;
}

UnaryContract parseUnaryContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const Buffer& x = expectUnaryOperands(signature, dtypes, OutputShape::SameAsInput).x;
  return UnaryContract{x.dtype, x.numElements()};
}

CopyContract parseCopyContract(const KernelSignature& signature) {
  return CopyContract{expectUnaryOperands(signature, OutputShape::SameAsInput).x.bytes()};
}

FillContract parseFillContract(const KernelSignature& signature) {
  expectArity(signature, 0, 1);
  FillContract contract;
  contract.dtype = signature.outputs[0]->dtype;
  contract.value = attrDouble(signature, "value");
  switch (contract.dtype) {
    case DType::F32:
    case DType::F64:
    case DType::BF16:
    case DType::F16: break;  // rounded to the nearest value of the dtype
    case DType::I64: expectIntegerValue<int64_t>(signature, contract.value, contract.dtype); break;
    case DType::I32: expectIntegerValue<int32_t>(signature, contract.value, contract.dtype); break;
    case DType::I8: expectIntegerValue<int8_t>(signature, contract.value, contract.dtype); break;
    case DType::U8: expectIntegerValue<uint8_t>(signature, contract.value, contract.dtype); break;
    case DType::Bool:
      if (contract.value != 0.0 && contract.value != 1.0)
        failSignature(signature, "attribute 'value': " + std::to_string(contract.value) +
                                     " is not representable in bool");
      break;
    default: failSignature(signature, "output y has an unknown dtype");
  }
  return contract;
}

CastContract parseCastContract(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectShape(signature, y, x.shape, "output y");
  if (isFloating(x.dtype) && !isFloating(y.dtype))
    failSignature(signature, "cast from " + std::string(dtypeName(x.dtype)) + " to " + std::string(dtypeName(y.dtype)) +
                                 " is not supported (float to integer)");
  return CastContract{x.dtype, y.dtype};
}

}  // namespace dgemma
