#include "runtime/kernels/random/Contract.h"

#include <string>
#include <vector>

#include "support/Shape.h"

namespace dgemma {
namespace {

// The key is [2] (one stream) or [N, 2] (one per row of an [N, ...] output).
StreamRows parseKeys(const KernelSignature& signature) {
  const Buffer& key = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, key, {DType::I64}, "input key");
  const int64_t count = y.numElements();
  if (key.shape == std::vector<int64_t>{2}) return {1, count};
  if (key.shape.size() != 2 || key.shape[1] != 2)
    failSignature(signature, "input key has shape " + shapeToString(key.shape) + ", expected [2] or [N, 2]");
  if (y.shape.empty() || y.shape[0] != key.shape[0])
    failSignature(signature, "output y has shape " + shapeToString(y.shape) + ", expected [" +
                                 std::to_string(key.shape[0]) + ", ...] (one row per key)");
  return {key.shape[0], key.shape[0] == 0 ? 0 : count / key.shape[0]};
}

uint64_t parseStream(const KernelSignature& signature) {
  const int64_t stream = attrInt(signature, "stream");
  // The stream is XORed into one 32-bit counter word; larger values would alias smaller ones.
  if (stream < 0 || stream > int64_t{0xffffffff})
    failSignature(signature, "attribute 'stream': expected an integer in [0, 2^32), got " + std::to_string(stream));
  return static_cast<uint64_t>(stream);
}

// What both kernels check: one key in, one output y of `output` dtype, the keys' layout and the stream.
RandomContract parseKeysAndStream(const KernelSignature& signature, DType output) {
  expectArity(signature, 1, 1);
  expectDType(signature, *signature.outputs[0], {output}, "output y");
  RandomContract contract;
  contract.layout = parseKeys(signature);
  contract.stream = parseStream(signature);
  return contract;
}

}  // namespace

RandomContract parseRandomUniformContract(const KernelSignature& signature) {
  return parseKeysAndStream(signature, DType::F32);
}

RandomContract parseRandomIntContract(const KernelSignature& signature) {
  RandomContract contract = parseKeysAndStream(signature, DType::I64);
  const int64_t high = attrInt(signature, "high");
  // Each element comes from one 32-bit word.
  if (high < 1 || high > (int64_t{1} << 32))
    failSignature(signature, "attribute 'high': expected an integer in [1, 2^32], got " + std::to_string(high));
  contract.high = static_cast<uint64_t>(high);
  return contract;
}

}  // namespace dgemma
