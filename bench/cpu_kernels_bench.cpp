// Times CPU kernels through the same registry the executor uses and prints a table:
// effective GFLOP/s for GEMMs, GB/s (bytes read + written) for memory-bound kernels.
//   dgemma-bench-cpu-kernels [--threads N] [--repeats R]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernel_api/Backend.h"
#include "runtime/core/HostTensor.h"

namespace {

using namespace dgemma;

struct Case {
  std::string label;
  std::string kernel;
  nlohmann::json attrs;
  std::vector<std::vector<int64_t>> inputShapes;
  std::vector<int64_t> outputShape;
  double flops;  // 0 for memory-bound kernels
};

double timeCase(Backend& backend, const Case& spec, int repeats, double& bytesMoved) {
  Step step;
  step.op = spec.kernel;
  step.attrs = spec.attrs;
  std::vector<Buffer> buffers;
  for (const auto& shape : spec.inputShapes) buffers.push_back({int64_t(buffers.size()), "in", DType::F32, shape, 0, 0, {}, {}});
  buffers.push_back({int64_t(buffers.size()), "out", DType::F32, spec.outputShape, 0, 0, {}, {}});

  KernelSignature signature;
  signature.step = &step;
  signature.where = spec.label;
  for (size_t i = 0; i + 1 < buffers.size(); ++i) signature.inputs.push_back(&buffers[i]);
  signature.outputs.push_back(&buffers.back());
  std::unique_ptr<Kernel> kernel = (*backend.kernels().find(spec.kernel))(signature);

  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<HostTensor> storage;
  std::vector<TensorRef> inputs, outputs;
  bytesMoved = 0;
  for (const Buffer& buffer : buffers) {
    storage.emplace_back(DType::F32, buffer.shape);
    for (int64_t i = 0; i < storage.back().numElements(); ++i) storage.back().as<float>()[i] = uniform(rng);
    bytesMoved += static_cast<double>(buffer.bytes());
  }
  for (size_t i = 0; i < buffers.size(); ++i)
    (i + 1 < buffers.size() ? inputs : outputs).push_back({storage[i].data.data(), &buffers[i]});

  ExecContext context = backend.context(0);
  kernel->run(context, inputs, outputs);  // warm-up: page in, spin up threads
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) kernel->run(context, inputs, outputs);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t threads = 0;
  int repeats = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
  }
  std::unique_ptr<Backend> backend = createBackend("cpu", threads);
  const std::vector<Case> cases = {
      {"matmul 512x512x512", "matmul", nlohmann::json::object(), {{512, 512}, {512, 512}}, {512, 512}, 2.0 * 512 * 512 * 512},
      {"matmul [4,256,1024]x[1024,1024]", "matmul", nlohmann::json::object(), {{4, 256, 1024}, {1024, 1024}}, {4, 256, 1024},
       2.0 * 4 * 256 * 1024 * 1024},
      {"rms_norm 4096x2816 +w", "rms_norm", {{"eps", 1e-6}}, {{4096, 2816}, {2816}}, {4096, 2816}, 0},
      {"softmax 1024x4096", "softmax", {{"axis", -1}}, {{1024, 4096}}, {1024, 4096}, 0},
      {"gelu_tanh 4M", "gelu_tanh", nlohmann::json::object(), {{4 << 20}}, {4 << 20}, 0},
      {"add [4096,2816]+[2816]", "add", nlohmann::json::object(), {{4096, 2816}, {2816}}, {4096, 2816}, 0},
  };
  std::printf("%-34s %12s %12s\n", "kernel (f32, cpu)", "ms", "rate");
  for (const Case& spec : cases) {
    double bytes = 0;
    double seconds = timeCase(*backend, spec, repeats, bytes);
    if (spec.flops > 0) std::printf("%-34s %12.3f %8.1f GFLOP/s\n", spec.label.c_str(), seconds * 1e3, spec.flops / seconds / 1e9);
    else std::printf("%-34s %12.3f %8.1f GB/s\n", spec.label.c_str(), seconds * 1e3, bytes / seconds / 1e9);
  }
  return 0;
}
