// Builds one kernel invocation by hand (buffers with host memory, a step, its signature), looks the
// kernel up in a registry filled by registerCpuKernels, and runs it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernel_api/Kernel.h"
#include "support/Error.h"
#include "runtime/core/ThreadPool.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma::test {

inline const KernelRegistry& cpuKernels() {
  static const KernelRegistry registry = [] {
    KernelRegistry filled;
    registerCpuKernels(filled);
    return filled;
  }();
  return registry;
}

class KernelCall {
 public:
  explicit KernelCall(std::string op, nlohmann::json attrs = nlohmann::json::object()) {
    step_.op = std::move(op);
    step_.attrs = std::move(attrs);
  }

  // `values` must hold the buffer's elements in a C++ type of the dtype's size (uint16_t for bf16).
  template <typename T>
  KernelCall& input(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
    Tensor& tensor = add(inputs_, dtype, std::move(shape));
    EXPECT_EQ(sizeof(T), dtypeSize(dtype)) << "test bug: element type does not match the dtype";
    EXPECT_EQ(values.size() * sizeof(T), tensor.bytes.size()) << "test bug: value count does not match the shape";
    const size_t bytes = std::min(tensor.bytes.size(), values.size() * sizeof(T));
    std::copy_n(reinterpret_cast<const uint8_t*>(values.data()), bytes, tensor.bytes.begin());
    return *this;
  }

  // Outputs start as 0xCD bytes, so an element the kernel forgets to write shows up as garbage.
  KernelCall& output(DType dtype, std::vector<int64_t> shape) {
    Tensor& tensor = add(outputs_, dtype, std::move(shape));
    std::fill(tensor.bytes.begin(), tensor.bytes.end(), uint8_t{0xCD});
    return *this;
  }

  // Runs the factory (which throws InputError for a signature it rejects).
  std::unique_ptr<Kernel> create() const {
    const KernelFactory* factory = cpuKernels().find(step_.op);
    if (factory == nullptr) throw std::logic_error("no CPU kernel named " + step_.op);
    KernelSignature signature;
    signature.step = &step_;
    for (const Tensor& tensor : inputs_) signature.inputs.push_back(&tensor.buffer);
    for (const Tensor& tensor : outputs_) signature.outputs.push_back(&tensor.buffer);
    signature.where = where();
    return (*factory)(signature);
  }

  void run(ThreadPool* threads = nullptr) {
    std::unique_ptr<Kernel> kernel = create();
    ExecContext context;
    context.threads = threads;
    kernel->run(context, refs(inputs_), refs(outputs_));
  }

  template <typename T>
  std::vector<T> result(size_t index = 0) const {
    const std::vector<uint8_t>& bytes = outputs_.at(index).bytes;
    std::vector<T> values(bytes.size() / sizeof(T));
    std::copy_n(bytes.begin(), values.size() * sizeof(T), reinterpret_cast<uint8_t*>(values.data()));
    return values;
  }

  std::string where() const { return "step 0 (" + step_.op + ")"; }

 private:
  struct Tensor {
    Buffer buffer;
    std::vector<uint8_t> bytes;
  };

  Tensor& add(std::vector<Tensor>& tensors, DType dtype, std::vector<int64_t> shape) {
    Tensor tensor;
    tensor.buffer.id = static_cast<int64_t>(inputs_.size() + outputs_.size());
    tensor.buffer.dtype = dtype;
    tensor.buffer.shape = std::move(shape);
    tensor.bytes.resize(tensor.buffer.bytes());
    tensors.push_back(std::move(tensor));
    return tensors.back();
  }

  static std::vector<TensorRef> refs(std::vector<Tensor>& tensors) {
    std::vector<TensorRef> result;
    for (Tensor& tensor : tensors) result.push_back(TensorRef{tensor.bytes.data(), &tensor.buffer});
    return result;
  }

  Step step_;
  std::vector<Tensor> inputs_;
  std::vector<Tensor> outputs_;
};

// The message of the InputError the factory throws; a test failure (and "") when it accepts.
inline std::string factoryError(const KernelCall& call) {
  try {
    call.create();
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "the factory accepted the signature";
  return "";
}

template <typename T>
std::vector<T> randomValues(size_t count, uint32_t seed, double low = -2.0, double high = 2.0) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<double> distribution(low, high);
  std::vector<T> values(count);
  for (T& value : values) value = static_cast<T>(distribution(generator));
  return values;
}

// Compares element by element with a tolerance relative to max(1, |expected|).
template <typename T>
void expectClose(const std::vector<T>& actual, const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(static_cast<double>(actual[i]), expected[i], tolerance * std::max(1.0, std::abs(expected[i])))
        << "at flat index " << i;
}

}  // namespace dgemma::test
