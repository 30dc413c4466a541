// The CUDA kernels against their CPU twins on the same random inputs, the CUDA backend's memory /
// stream / event primitives, and the CUDA factories' plan-load checks.
//
// The kernel comparisons are rows of one table (kernelTable: kernel, shapes, attributes, dtypes, inputs,
// tolerance per output), run by one harness (CudaVsCpu.Rows, per family of rows). Tests that need a
// device GTEST_SKIP (naming the reason) when none is usable; the factory tests, the backend-creation
// test and the table's own check (KernelTable.RowsAreWellFormed, the CPU side of every row) run
// everywhere.
//
// Tolerances (relative to the CPU result unless said otherwise):
//  - add sub mul div maximum minimum neg sqrt rsqrt copy: 1e-6 (single IEEE operations on both
//    sides: they agree exactly); exp log tanh: 1e-6 (libdevice and libm are within an ulp or two);
//  - gelu_tanh: 1e-6 of max(|y|, |x|): tanhf differs by an ulp or two between libdevice and libm,
//    and 1 + tanh cancels for negative x, so the error scales with |x|, not with |y|;
//  - rms_norm, softmax: 1e-6 for rows of up to 64 elements, growing as sqrt(cols / 64) beyond: the
//    CPU may sum a row sequentially and the GPU sums it as a tree, and the f32 rounding of two
//    summation orders differs by about sqrt(cols) ulps (measured: ~1e-6 at 257 columns);
//  - matmul: 1e-5 of sum_k |a_ik| |b_kj| (the natural scale of a dot product's rounding error), with
//    cuBLAS in pedantic math mode (no TF32; the test also checks the backend did not enable TF32);
//    bf16 (cuBLASLt, f32 accumulation): against the CPU backend's widened bf16 matmul on the same
//    bf16 inputs, one bf16 ulp of the CPU result plus 1e-5 of sum_k |a_ik| |b_kj|.
//  - canvas_sample: the ids and the scaled logits exactly, the entropy 1e-6.
//  - attention (f32): 1e-5 of max(1, |cpu|) for o, 2e-5 for dq, dk, dv: the same f32 operations as
//    the CPU kernel in another order (online softmax over key tiles, sums over tiles), plus libdevice
//    expf against the CPU's fastExp; the host emulation of the tiles (AttentionMathTest) agrees with
//    the CPU kernel to 1e-6 and 2e-6;
//  - cross_entropy (f32): the loss 2e-6 of max(1, |cpu|), grad_logits 4e-6 of |cpu| (+1e-12): f64
//    sums on both sides, each exp and the soft-cap's tanhf within an ulp or two of the CPU's;
//  - bf16 (attention, cross_entropy): against the CPU kernel in f32 on the bf16-rounded inputs, its
//    results rounded to bf16 (what the CPU backend's widening computes): one bf16 ulp (2^-7 relative)
//    plus the f32 tolerance, as the two f32 results may straddle a rounding boundary.
//  - random_uniform, random_int: exactly (both call runtime/core/Philox.h).
//  - adamw: exactly (both evaluate runtime/kernels/optimizer/AdamwMath.h).
//  - reduce_max exactly; reduce_sum, reduce_mean: 2^-23 of |y| plus 1e-12 of the summed |x| (both
//    accumulate in f64 and round once, in different orders).
//  - rope: 1e-6 of |x_i| + |x_{i+D/2}| (libdevice's cosf/sinf against libm's), unrotated pairs exactly.
//  - gather, scatter_add: exactly (moved bits; each row summed from zero in id order on both).
//  - transpose, reshape, concat, slice: exactly (moved bits); cast: exactly (elementwise/CastMath.h);
//    fill: exactly (elementwise/FillPattern.h); compare: exactly (IEEE comparisons on both);
//    select: exactly (moved bits).
//  - moe_dispatch: exactly (DispatchTable.h on the host for both).
//  - moe_route: the indices exactly, the weights 1e-6 (libdevice's expf against libm's);
//    moe_route_backward: dlogits 1e-5 of its token's Σ|dw|, dscale 1e-5 of Σ|dw|.
//  - rms_norm_backward: 2^-23 of |cpu| plus 1e-9 (f64 sums on both, rounded once, other orders).
//  - moe_experts, moe_experts_backward (with adapters too), moe_local_experts[_backward]: 1e-5 of max(1, |cpu|) (cuBLAS
//    against OpenBLAS, libdevice tanhf against fastTanh); a negative index raises the CPU kernel's error.
//  - fused_elementwise: exactly for IEEE-only programs, 4e-6 of max(1, |cpu|) with tanh, exp or
//    gelu_tanh; bf16 outputs one bf16 ulp more.
//  - bf16 steps of the f32-only kernels (the backend's widening): one bf16 ulp plus the f32 tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "runtime/kernel_api/Backend.h"
#include "runtime/kernel_api/Kernel.h"
#include "runtime/backends/cpu/ReducedPrecision.h"
#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/backends/cuda/CudaCommon.h"
#include "support/DType.h"
#include "support/Error.h"
#include "runtime/core/HostTensor.h"
#include "runtime/core/ThreadPool.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/reduce/ReduceIndex.h"

namespace dgemma {
namespace {

// ---- plan-side scaffolding: a step, its buffers and the signature the factories see -------------

struct StepSetup {
  Step step;
  std::deque<Buffer> buffers;  // stable addresses: signatures point into it
  std::vector<const Buffer*> inputs;
  std::vector<const Buffer*> outputs;

  StepSetup(const std::string& op, nlohmann::json attrs) {
    step.op = op;
    step.attrs = attrs.is_null() ? nlohmann::json::object() : std::move(attrs);
    step.location = "cuda_vs_cpu_test";
  }
  const Buffer* add(DType dtype, std::vector<int64_t> shape, bool output) {
    Buffer buffer;
    buffer.id = static_cast<int64_t>(buffers.size());
    buffer.name = (output ? "out" : "in") + std::to_string(buffer.id);
    buffer.dtype = dtype;
    buffer.shape = std::move(shape);
    buffers.push_back(std::move(buffer));
    const Buffer* added = &buffers.back();
    (output ? outputs : inputs).push_back(added);
    (output ? step.outputs : step.inputs).push_back(added->id);
    return added;
  }
  StepSetup& in(std::vector<int64_t> shape, DType dtype = DType::F32) {
    add(dtype, std::move(shape), false);
    return *this;
  }
  StepSetup& out(std::vector<int64_t> shape, DType dtype = DType::F32) {
    add(dtype, std::move(shape), true);
    return *this;
  }
  // Moving keeps the buffers' addresses (std::deque's move); a copy would point into the original's.
  StepSetup(const StepSetup&) = delete;
  StepSetup(StepSetup&&) = default;

  KernelSignature signature() const {
    KernelSignature signature;
    signature.step = &step;
    signature.inputs = inputs;
    signature.outputs = outputs;
    signature.where = "test step (" + step.op + ")";
    return signature;
  }
};

// A plan's matmul step carries both transposes, false ones included.
const nlohmann::json kUntransposed = {{"transpose_a", false}, {"transpose_b", false}};

std::unique_ptr<Kernel> makeKernel(const KernelRegistry& registry, const StepSetup& setup) {
  const KernelFactory* factory = registry.find(setup.step.op);
  if (factory == nullptr) throw std::runtime_error("no kernel named " + setup.step.op);
  return (*factory)(setup.signature());
}

const KernelRegistry& cpuRegistry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    registerCpuKernels(r);
    return r;
  }();
  return registry;
}

const KernelRegistry& cudaRegistry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    registerCudaKernels(r);
    return r;
  }();
  return registry;
}

std::vector<float> randomFloats(int64_t count, uint32_t seed, float low = -2.0f, float high = 2.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = distribution(generator);
  return values;
}

// ---- the CUDA backend, created once; tests that need it skip when it cannot be created ---------

struct SharedBackend {
  std::unique_ptr<Backend> backend;
  std::string skipReason;  // no usable device: skip
  bool broken = false;     // a device, but setting it up failed: fail
};

SharedBackend& sharedBackend() {
  static SharedBackend shared = [] {
    SharedBackend s;
    try {
      s.backend = createCudaBackend(0);
    } catch (const RuntimeError& error) {  // no usable device (or none this build can run on)
      s.skipReason = error.what();
      return s;
    }
    try {
      s.backend->prepareStreams(2, 2);
      // Pedantic math on every stream's cuBLAS handle: no TF32, no reduced-precision shortcuts.
      for (int64_t stream = 0; stream < 2; ++stream) {
        cublasHandle_t handle = cuda::streamState(s.backend->context(stream)).cublas;
        cublasMath_t mode;
        if (cublasGetMathMode(handle, &mode) != CUBLAS_STATUS_SUCCESS || (mode & CUBLAS_TF32_TENSOR_OP_MATH) != 0 ||
            cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)
          throw std::logic_error("cannot set the cuBLAS math mode (or the backend enabled TF32)");
      }
    } catch (const std::exception& error) {
      s.backend.reset();
      s.skipReason = error.what();
      s.broken = true;
    }
    return s;
  }();
  return shared;
}

#define REQUIRE_CUDA_BACKEND()                                                              \
  do {                                                                                      \
    if (sharedBackend().broken) FAIL() << "cuda backend setup: " << sharedBackend().skipReason; \
    if (!sharedBackend().backend) GTEST_SKIP() << sharedBackend().skipReason;               \
  } while (0)

// runCpu and runGpu move every buffer as raw bytes in a vector<float> (an f32 buffer's elements; an
// i64 or bf16 buffer's bytes, rounded up to whole floats).

// The step's outputs on the CPU kernel.
std::vector<std::vector<float>> runCpu(const StepSetup& setup, const std::vector<std::vector<float>>& inputs,
                                       const KernelRegistry& registry = cpuRegistry()) {
  EXPECT_EQ(inputs.size(), setup.inputs.size());
  static ThreadPool pool(2);
  std::unique_ptr<Kernel> kernel = makeKernel(registry, setup);
  std::vector<std::vector<float>> inputCopies = inputs;
  std::vector<TensorRef> inRefs, outRefs;
  for (size_t i = 0; i < inputs.size(); ++i) inRefs.push_back(TensorRef{inputCopies[i].data(), setup.inputs[i]});
  std::vector<std::vector<float>> outputs(setup.outputs.size());
  for (size_t i = 0; i < setup.outputs.size(); ++i) {
    outputs[i].assign(static_cast<size_t>((setup.outputs[i]->bytes() + 3) / 4), std::nanf(""));
    outRefs.push_back(TensorRef{outputs[i].data(), setup.outputs[i]});
  }
  ExecContext context;
  context.threads = &pool;
  kernel->run(context, inRefs, outRefs);
  return outputs;
}

// The step's outputs on the CUDA kernel (the device buffers are freed also when the kernel throws).
std::vector<std::vector<float>> runGpu(const StepSetup& setup, const std::vector<std::vector<float>>& inputs,
                                       const KernelRegistry& registry = cudaRegistry()) {
  EXPECT_EQ(inputs.size(), setup.inputs.size());
  Backend& backend = *sharedBackend().backend;
  std::unique_ptr<Kernel> kernel = makeKernel(registry, setup);
  struct Allocations {
    Backend& backend;
    std::vector<void*> pointers;
    ~Allocations() {
      for (void* pointer : pointers) backend.deallocate(pointer);
    }
  } allocations{backend, {}};
  auto allocate = [&](uint64_t bytes) {
    void* pointer = backend.allocate(bytes, 256);
    allocations.pointers.push_back(pointer);
    return pointer;
  };
  std::vector<TensorRef> inRefs, outRefs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    void* device = allocate(std::max<uint64_t>(inputs[i].size() * sizeof(float), setup.inputs[i]->bytes()));
    backend.copyToDevice(device, inputs[i].data(), inputs[i].size() * sizeof(float));
    inRefs.push_back(TensorRef{device, setup.inputs[i]});
  }
  for (size_t i = 0; i < setup.outputs.size(); ++i) {
    uint64_t bytes = setup.outputs[i]->bytes();
    void* device = allocate(bytes);
    // NaN-fill (0xff bytes) so that an element the kernel forgets to write cannot pass.
    std::vector<uint8_t> poison(bytes, 0xff);
    backend.copyToDevice(device, poison.data(), bytes);
    outRefs.push_back(TensorRef{device, setup.outputs[i]});
  }
  ExecContext context = backend.context(0);
  kernel->run(context, inRefs, outRefs);
  backend.synchronize();
  std::vector<std::vector<float>> outputs(setup.outputs.size());
  for (size_t i = 0; i < setup.outputs.size(); ++i) {
    outputs[i].resize(static_cast<size_t>((setup.outputs[i]->bytes() + 3) / 4));
    backend.copyToHost(outputs[i].data(), outRefs[i].data, setup.outputs[i]->bytes());
  }
  return outputs;
}

// Compares element by element: |gpu - cpu| <= tolerance(i) (and both NaN, or both the same inf).
template <typename Tolerance>
void expectClose(const std::vector<float>& cpu, const std::vector<float>& gpu, Tolerance tolerance,
                 const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  int reported = 0;
  int64_t mismatches = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const float c = cpu[i];
    const float g = gpu[i];
    bool ok;
    if (std::isnan(c) || std::isnan(g))
      ok = std::isnan(c) && std::isnan(g);
    else if (std::isinf(c) || std::isinf(g))
      ok = c == g;
    else
      ok = std::fabs(static_cast<double>(g) - c) <= tolerance(i);
    if (!ok) {
      ++mismatches;
      if (reported++ < 8)
        ADD_FAILURE() << what << ": element " << i << ": cpu " << c << ", gpu " << g << " (|diff| "
                      << std::fabs(static_cast<double>(g) - c) << ", tolerance " << tolerance(i) << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << cpu.size() << " elements differ";
}

// 1e-6 for rows of up to 64 elements, growing like the summation-order noise beyond.
double rowTolerance(int64_t cols) { return 1e-6 * std::max(1.0, std::sqrt(static_cast<double>(cols) / 64.0)); }

// ---- no device needed ----------------------------------------------------------------------------

TEST(CudaBackendCreation, SucceedsOrThrowsRuntimeErrorWithReason) {
  std::string reason;
  const bool available = cudaDeviceAvailable(&reason);
  if (!available) {
    EXPECT_FALSE(reason.empty());
  }
  try {
    std::unique_ptr<Backend> backend = createCudaBackend(0);
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(backend->name(), "cuda");
    EXPECT_TRUE(available);
  } catch (const RuntimeError& error) {
    const std::string message = error.what();
    EXPECT_FALSE(message.empty());
    EXPECT_NE(message.find("cuda backend"), std::string::npos) << message;
    EXPECT_EQ(error.exitCode(), 1);
    if (!available) {
      EXPECT_NE(message.find(reason), std::string::npos) << message;
    }
  }
  // A device index that cannot exist is always an error, never a crash.
  EXPECT_THROW(createCudaBackend(1 << 20), RuntimeError);
  EXPECT_THROW(createCudaBackend(-1), RuntimeError);
}

TEST(CudaKernelFactories, RejectNonF32) {
  EXPECT_THROW(makeKernel(cudaRegistry(), StepSetup("add", {}).in({4}, DType::F64).in({4}, DType::F64).out({4}, DType::F64)),
               InputError);
  EXPECT_THROW(makeKernel(cudaRegistry(), StepSetup("gelu_tanh", {}).in({4}, DType::BF16).out({4}, DType::BF16)),
               InputError);
  EXPECT_THROW(
      makeKernel(
          cudaRegistry(),
          StepSetup("matmul", kUntransposed).in({2, 3}, DType::F64).in({3, 4}, DType::F64).out({2, 4}, DType::F64)),
      InputError);
  EXPECT_THROW(makeKernel(cudaRegistry(), StepSetup("rms_norm", {{"eps", 1e-6}}).in({2, 3}, DType::F64).out({2, 3}, DType::F64)),
               InputError);
  EXPECT_THROW(makeKernel(cudaRegistry(), StepSetup("softmax", {{"axis", -1}}).in({2, 3}, DType::F16).out({2, 3}, DType::F16)),
               InputError);
}

TEST(CudaKernelFactories, RejectBadShapesAndAttributes) {
  const KernelRegistry& r = cudaRegistry();
  try {
    makeKernel(r, StepSetup("softmax", {{"axis", 0}}).in({2, 3}).out({2, 3}));
    FAIL() << "softmax over axis 0 accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("last axis"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(makeKernel(r, StepSetup("softmax", {{"axis", 1}}).in({2, 3}).out({2, 3})));
  EXPECT_NO_THROW(makeKernel(r, StepSetup("softmax", {{"axis", -1}}).in({2, 3}).out({2, 3})));
  EXPECT_THROW(makeKernel(r, StepSetup("softmax", {{"axis", 2}}).in({2, 3}).out({2, 3})), InputError);
  EXPECT_THROW(makeKernel(r, StepSetup("add", {}).in({2, 3}).in({4}).out({2, 3})), InputError);     // not broadcastable
  EXPECT_THROW(makeKernel(r, StepSetup("add", {}).in({2, 3}).in({3}).out({2, 4})), InputError);     // wrong c
  EXPECT_THROW(makeKernel(r, StepSetup("mul", {}).in({2, 1}).in({1, 3}).out({2, 1})), InputError);  // c not broadcast
  EXPECT_THROW(makeKernel(r, StepSetup("matmul", kUntransposed).in({2, 3}).in({4, 5}).out({2, 5})),
               InputError);  // K differs
  EXPECT_THROW(makeKernel(r, StepSetup("matmul", kUntransposed).in({2, 3}).in({3, 5}).out({3, 5})),
               InputError);  // bad c
  EXPECT_THROW(makeKernel(r, StepSetup("matmul", kUntransposed).in({2, 2, 3}).in({3, 2, 3, 5}).out({2, 2, 5})),
               InputError);  // b rank
  EXPECT_THROW(makeKernel(r, StepSetup("matmul", kUntransposed).in({2, 2, 3}).in({3, 3, 5}).out({2, 2, 5})),
               InputError);  // batch dims differ
  EXPECT_NO_THROW(makeKernel(r, StepSetup("matmul", {{"transpose_a", true}, {"transpose_b", true}})
                                    .in({4, 3, 2})
                                    .in({4, 5, 3})
                                    .out({4, 2, 5})));
  EXPECT_THROW(makeKernel(r, StepSetup("rms_norm", {{"eps", 1e-6}}).in({2, 3}).in({2}).out({2, 3})),
               InputError);  // weight shape
  EXPECT_THROW(makeKernel(r, StepSetup("rms_norm", {{"eps", 1e-6}}).in({2, 3}).out({3, 2})), InputError);
  EXPECT_THROW(makeKernel(r, StepSetup("gelu_tanh", {}).in({2, 3}).out({6})), InputError);
}

// ---- backend primitives --------------------------------------------------------------------------

TEST(CudaBackend, CopyFillStreamEventRoundTrip) {
  REQUIRE_CUDA_BACKEND();
  Backend& backend = *sharedBackend().backend;
  backend.prepareStreams(2, 2);
  const int64_t count = 100003;  // odd size
  const uint64_t bytes = count * sizeof(float);
  for (uint64_t alignment : {64ull, 256ull, 4096ull, 65536ull}) {
    void* p = backend.allocate(bytes, alignment);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u) << alignment;
    backend.deallocate(p);
  }
  void* a = backend.allocate(bytes, 256);
  void* b = backend.allocate(bytes, 256);
  void* c = backend.allocate(bytes, 4096);
  std::vector<float> source = randomFloats(count, 7);
  std::vector<float> back(count, -1.0f);

  backend.copyToDevice(a, source.data(), bytes);
  backend.copyToHost(back.data(), a, bytes);
  EXPECT_EQ(std::memcmp(back.data(), source.data(), bytes), 0) << "host -> device -> host";

  backend.fillZero(a, bytes);
  backend.copyToHost(back.data(), a, bytes);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(back[i], 0.0f) << "fillZero, element " << i;

  // a <- source; on stream 1: b <- a, event 0; stream 0 waits for event 0, then c <- b.
  backend.copyToDevice(a, source.data(), bytes);
  backend.fillZero(b, bytes);
  backend.fillZero(c, bytes);
  ExecContext stream0 = backend.context(0);
  ExecContext stream1 = backend.context(1);
  EXPECT_NE(stream0.streamHandle, nullptr);
  EXPECT_NE(stream1.streamHandle, nullptr);
  EXPECT_NE(stream0.streamHandle, stream1.streamHandle);
  EXPECT_NE(stream0.backendState, stream1.backendState);
  EXPECT_EQ(stream1.stream, 1);
  backend.copyOnDevice(stream1, b, a, bytes);
  backend.recordEvent(0, 1);
  backend.waitEvent(0, 0);
  backend.copyOnDevice(stream0, c, b, bytes);
  backend.recordEvent(1, 0);
  backend.synchronize();
  std::fill(back.begin(), back.end(), -1.0f);
  backend.copyToHost(back.data(), c, bytes);
  EXPECT_EQ(std::memcmp(back.data(), source.data(), bytes), 0) << "copyOnDevice across streams with an event";

  EXPECT_THROW(backend.context(99), RuntimeError);
  EXPECT_THROW(backend.recordEvent(99, 0), RuntimeError);
  EXPECT_THROW(backend.waitEvent(0, 99), RuntimeError);
  backend.deallocate(a);
  backend.deallocate(b);
  backend.deallocate(c);
  backend.deallocate(nullptr);
}

TEST(CudaKernelFactories, ReduceRejectsF64) {
  EXPECT_THROW(
      makeKernel(
          cudaRegistry(),
          StepSetup("reduce_sum", {{"dims", {0}}, {"keep_dims", false}}).in({4}, DType::F64).out({}, DType::F64)),
      InputError);
}

TEST(CudaKernelFactories, MoePermuteRejectsOneByteElements) {
  StepSetup setup("moe_permute", {});
  setup.in({2, 3}, DType::I8).in({2, 1}, DType::I64).out({2, 3}, DType::I8);
  EXPECT_THROW(makeKernel(cudaRegistry(), setup), InputError);
}

// ---- buffers as bytes ----------------------------------------------------------------------------

// i64 values ride in two floats each.
std::vector<float> int64Bytes(const std::vector<int64_t>& values) {
  std::vector<float> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), values.size() * sizeof(int64_t));
  return bytes;
}

// A bf16 buffer travels as its 16-bit patterns packed into floats' bytes.
std::vector<float> bf16Bytes(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32ToBf16Bits(values[i]);
  std::vector<float> bytes((values.size() + 1) / 2);
  std::memcpy(bytes.data(), bits.data(), bits.size() * sizeof(uint16_t));
  return bytes;
}
std::vector<float> bf16Values(const std::vector<float>& bytes, size_t count) {
  std::vector<uint16_t> bits(count);
  std::memcpy(bits.data(), bytes.data(), count * sizeof(uint16_t));
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = bf16BitsToF32(bits[i]);
  return values;
}
std::vector<float> roundedToBf16(const std::vector<float>& values) { return bf16Values(bf16Bytes(values), values.size()); }

// One bf16 ulp of the reference plus the f32 tolerance.
double bf16Tolerance(float reference, double f32Tolerance) { return std::ldexp(std::fabs(reference), -7) + f32Tolerance; }

// The backends' registries: the CPU backend's (bf16 widened as it runs plans) and the CUDA backend's.
const KernelRegistry& cpuWidenedRegistry() {
  static const KernelRegistry registry = withReducedPrecisionFloats(cpuRegistry());
  return registry;
}

const KernelRegistry& cudaBackendRegistry() {
  static const KernelRegistry registry = cudaBackendKernels();
  return registry;
}

// ---- the table: one row per kernel run, one harness that runs and compares them ------------------
//
// A row names its family (a kernel group's cases, e.g. "Softmax": the "GPU test" column of
// docs/kernels.md, "CUDA twins"), its step (kernel, attributes, buffer shapes and dtypes), how its
// inputs are built, and how each output is compared. The harness builds the inputs, runs the step on the CPU
// kernel (the reference) and on the CUDA kernel, and compares. A row may name the backends' registries
// instead of the kernels' own, or another reference or device run (the CPU kernel in f32 for a bf16
// step). A new kernel is a row here, or a few.

using Buffers = std::vector<std::vector<float>>;  // each buffer's bytes, as runCpu and runGpu move them

// The tolerance of output element i, given the reference output (decoded floats) and the inputs.
using Tolerance = std::function<double(size_t i, const std::vector<float>& expected, const Buffers& inputs)>;

struct OutputCheck {
  enum class Kind {
    Bits,  // the output's bytes are equal (ids, moved bits, arithmetic both sides do alike)
    Floats,  // f32 outputs within the tolerance (NaN matches NaN, an infinity itself)
    Bf16Floats,  // bf16 outputs on both sides, decoded, within the tolerance
    Bf16AgainstF32,  // a bf16 device output against the f32 reference rounded to bf16; the tolerance
    // gets the f32 reference
  };
  Kind kind = Kind::Floats;
  Tolerance tolerance;
  std::string name;  // in failure messages; empty: the output's index
  bool finite = false;  // Floats: also every device value is finite
};

OutputCheck bitsEqual(std::string name = "") { return {OutputCheck::Kind::Bits, nullptr, std::move(name)}; }
OutputCheck finiteAnd(OutputCheck check) {
  check.finite = true;
  return check;
}
OutputCheck within(Tolerance tolerance, std::string name = "") {
  return {OutputCheck::Kind::Floats, std::move(tolerance), std::move(name)};
}
// rtol of |expected|.
OutputCheck relative(double rtol, std::string name = "") {
  return within(
      [rtol](size_t i, const std::vector<float>& expected, const Buffers&) { return rtol * std::fabs(expected[i]); },
      std::move(name));
}
// rtol of max(1, |expected|).
OutputCheck relativeAboveOne(double rtol, std::string name = "") {
  return within([rtol](size_t i, const std::vector<float>& expected,
                       const Buffers&) { return rtol * std::max(1.0, std::fabs(static_cast<double>(expected[i]))); },
                std::move(name));
}

using Run = std::function<Buffers(const Buffers& inputs)>;

struct KernelCase {
  std::string family;
  std::string what;
  std::shared_ptr<const StepSetup> setup;
  std::function<Buffers()> inputs;
  std::vector<OutputCheck> checks;  // one per output
  const KernelRegistry& (*cpuKernels)() = cpuRegistry;
  const KernelRegistry& (*cudaKernels)() = cudaRegistry;
  Run reference;  // unset: the step on cpuKernels
  Run device;  // unset: the step on cudaKernels
};

// A step whose buffers are added in place (a StepSetup's signature points into its own buffers).
std::shared_ptr<StepSetup> step(const std::string& op, nlohmann::json attrs) {
  return std::make_shared<StepSetup>(op, std::move(attrs));
}

// Inputs known when the row is made.
std::function<Buffers()> given(Buffers inputs) {
  return [inputs = std::move(inputs)] { return inputs; };
}

Buffers referenceRun(const KernelCase& row, const Buffers& inputs) {
  return row.reference ? row.reference(inputs) : runCpu(*row.setup, inputs, row.cpuKernels());
}

Buffers deviceRun(const KernelCase& row, const Buffers& inputs) {
  return row.device ? row.device(inputs) : runGpu(*row.setup, inputs, row.cudaKernels());
}

void compareOutputs(const KernelCase& row, const Buffers& inputs, const Buffers& expected, const Buffers& actual) {
  ASSERT_EQ(row.checks.size(), row.setup->outputs.size()) << row.what;
  ASSERT_EQ(expected.size(), row.checks.size()) << row.what;
  ASSERT_EQ(actual.size(), row.checks.size()) << row.what;
  for (size_t k = 0; k < row.checks.size(); ++k) {
    const OutputCheck& check = row.checks[k];
    const Buffer& output = *row.setup->outputs[k];
    const size_t count = static_cast<size_t>(output.numElements());
    const std::string what =
        row.family + ": " + row.what + ", output " + (check.name.empty() ? std::to_string(k) : check.name);
    auto tolerance = [&](const std::vector<float>& reference) {
      return [&check, &reference, &inputs](size_t i) { return check.tolerance(i, reference, inputs); };
    };
    switch (check.kind) {
      case OutputCheck::Kind::Bits:
        ASSERT_GE(expected[k].size() * sizeof(float), output.bytes()) << what;
        ASSERT_GE(actual[k].size() * sizeof(float), output.bytes()) << what;
        EXPECT_EQ(std::memcmp(expected[k].data(), actual[k].data(), output.bytes()), 0) << what;
        break;
      case OutputCheck::Kind::Floats:
        expectClose(expected[k], actual[k], tolerance(expected[k]), what);
        if (check.finite) {
          for (float value : actual[k]) ASSERT_TRUE(std::isfinite(value)) << what;
        }
        break;
      case OutputCheck::Kind::Bf16Floats: {
        const std::vector<float> reference = bf16Values(expected[k], count);
        expectClose(reference, bf16Values(actual[k], count), tolerance(reference), what);
        break;
      }
      case OutputCheck::Kind::Bf16AgainstF32:
        expectClose(roundedToBf16(expected[k]), bf16Values(actual[k], count), tolerance(expected[k]), what);
        break;
    }
  }
}

void runRow(const KernelCase& row) {
  const Buffers inputs = row.inputs();
  compareOutputs(row, inputs, referenceRun(row, inputs), deviceRun(row, inputs));
}

// ---- rows: norms, softmax, elementwise, matmul ---------------------------------------------------

struct RmsNormCase {
  std::vector<int64_t> shape;
  bool weight;
};

void addRmsNormRows(std::vector<KernelCase>& rows) {
  const std::vector<RmsNormCase> cases = {
      {{3, 5, 64}, true}, {{3, 5, 64}, false}, {{7, 33}, true},  {{2, 1}, true},      {{4, 1000}, true},
      {{2, 4097}, false}, {{1, 8192}, true},   {{300, 96}, true}, {{70000, 8}, false}, {{0, 16}, true},
  };
  uint32_t seed = 1;
  for (const RmsNormCase& c : cases) {
    const int64_t cols = c.shape.back();
    auto setup = step("rms_norm", {{"eps", 1e-5}});
    setup->in(c.shape);
    if (c.weight) setup->in({cols});
    setup->out(c.shape);
    Buffers inputs = {randomFloats(numElementsOf(c.shape), seed++)};
    if (c.weight) inputs.push_back(randomFloats(cols, seed++, 0.5f, 1.5f));
    rows.push_back({"RmsNorm",
                    shapeToString(c.shape) + (c.weight ? " with weight" : ""),
                    setup,
                    given(std::move(inputs)),
                    {relative(rowTolerance(cols))}});
  }
}

// dx and dw: f64 sums on both sides, rounded once to f32, in different orders (a tree over the block
// against the CPU's sequential sum): 2^-23 of |cpu| plus 1e-9.
void addRmsNormBackwardRows(std::vector<KernelCase>& rows) {
  const OutputCheck::Kind floats = OutputCheck::Kind::Floats;
  const Tolerance oneRounding = [](size_t i, const std::vector<float>& expected, const Buffers&) {
    return std::ldexp(std::fabs(expected[i]), -23) + 1e-9;
  };
  uint32_t seed = 2100;
  for (const RmsNormCase& c : std::vector<RmsNormCase>{
           {{3, 5, 64}, true}, {{7, 33}, false}, {{4, 1000}, true}, {{300, 96}, true}, {{2, 1}, true}, {{0, 16}, true}}) {
    const int64_t cols = c.shape.back(), count = numElementsOf(c.shape);
    auto setup = step("rms_norm_backward", {{"eps", 1e-6}});
    setup->in(c.shape).in(c.shape);
    if (c.weight) setup->in({cols});
    setup->out(c.shape);
    if (c.weight) setup->out({cols});
    Buffers inputs = {randomFloats(count, seed++), randomFloats(count, seed++)};
    if (c.weight) inputs.push_back(randomFloats(cols, seed++, 0.5f, 1.5f));
    std::vector<OutputCheck> checks = {{floats, oneRounding, "dx"}};
    if (c.weight) checks.push_back({floats, oneRounding, "dw"});
    rows.push_back({"RmsNormBackward", shapeToString(c.shape) + (c.weight ? " with weight" : ""), setup,
                    given(std::move(inputs)), std::move(checks)});
  }
}

void addSoftmaxRows(std::vector<KernelCase>& rows) {
  const std::vector<std::vector<int64_t>> shapes = {{4, 7, 33}, {3, 64}, {5, 1000}, {2, 5000}, {1, 1}, {65537, 3}, {16}};
  uint32_t seed = 100;
  for (const auto& shape : shapes) {
    for (int64_t axis : {int64_t{-1}, static_cast<int64_t>(shape.size()) - 1}) {
      auto setup = step("softmax", {{"axis", axis}});
      setup->in(shape).out(shape);
      rows.push_back({"Softmax",
                      shapeToString(shape) + " axis " + std::to_string(axis),
                      setup,
                      given({randomFloats(numElementsOf(shape), seed++, -8.0f, 8.0f)}),
                      {relative(rowTolerance(shape.back()))}});
    }
  }
  // exp(x) would overflow without the max subtraction.
  auto large = step("softmax", {{"axis", -1}});
  large->in({6, 50}).out({6, 50});
  rows.push_back({"SoftmaxLargeMagnitudes",
                  "values in [80, 120)",
                  large,
                  given({randomFloats(6 * 50, 5, 80.0f, 120.0f)}),
                  {finiteAnd(relative(rowTolerance(50)))}});
}

struct BinaryCase {
  std::vector<int64_t> a, b, c;
};

void addBinaryRows(std::vector<KernelCase>& rows) {
  const std::vector<BinaryCase> cases = {
      {{1000}, {1000}, {1000}},
      {{2, 3, 4}, {4}, {2, 3, 4}},
      {{4}, {2, 3, 4}, {2, 3, 4}},
      {{2, 1, 4}, {3, 1}, {2, 3, 4}},
      {{5, 1}, {1, 6}, {5, 6}},
      {{}, {3, 4}, {3, 4}},
      {{3, 4}, {}, {3, 4}},
      {{1}, {1}, {1}},
      {{2, 3, 1, 5}, {1, 3, 7, 1}, {2, 3, 7, 5}},
      {{6, 1, 4, 1, 2}, {1, 5, 1, 3, 1}, {6, 5, 4, 3, 2}},
      {{1, 1, 8}, {8, 1, 1}, {8, 1, 8}},
      {{64, 128, 96}, {128, 1}, {64, 128, 96}},
      {{0, 3}, {3}, {0, 3}},
  };
  uint32_t seed = 200;
  for (const char* op : {"add", "mul", "sub", "div", "maximum", "minimum"}) {
    for (const BinaryCase& c : cases) {
      auto setup = step(op, nlohmann::json::object());
      setup->in(c.a).in(c.b).out(c.c);
      Buffers inputs = {randomFloats(numElementsOf(c.a), seed), randomFloats(numElementsOf(c.b), seed + 1)};
      seed += 2;
      rows.push_back({"BinaryBroadcast",
                      std::string(op) + " " + shapeToString(c.a) + " with " + shapeToString(c.b),
                      setup,
                      given(std::move(inputs)),
                      {relative(1e-6)}});
    }
  }
}

void addUnaryRows(std::vector<KernelCase>& rows) {
  const std::vector<int64_t> shape = {3, 517};
  uint32_t seed = 250;
  for (const char* op : {"neg", "exp", "log", "tanh", "sqrt", "rsqrt", "copy"}) {
    auto setup = step(op, nlohmann::json::object());
    setup->in(shape).out(shape);
    // Positive inputs away from log's zero at 1 (where a relative comparison is ill-conditioned).
    std::vector<float> x = randomFloats(numElementsOf(shape), seed++, 1.5f, 6.0f);
    for (size_t i = 0; i < x.size(); i += 3) x[i] = 1.0f / x[i];  // and some in (1/6, 2/3)
    rows.push_back({"UnaryMaps", op, setup, given({std::move(x)}), {relative(1e-6)}});
  }
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1 << 20}}) {
    auto setup = step("gelu_tanh", nlohmann::json::object());
    setup->in({count}).out({count});
    rows.push_back({"GeluTanh",
                    "of " + std::to_string(count),
                    setup,
                    given({randomFloats(count, 300 + static_cast<uint32_t>(count), -8.0f, 8.0f)}),
                    {within([](size_t i, const std::vector<float>& expected, const Buffers& inputs) {
                      return 1e-6 * std::max(std::fabs(expected[i]), std::fabs(inputs[0][i]));
                    })}});
  }
}

// Exactly: IEEE comparisons on both sides, NaN and signed zeros among the inputs.
void addCompareRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 1400;
  for (const char* predicate : {"lt", "le", "gt", "ge", "eq", "ne"}) {
    for (const BinaryCase& c : std::vector<BinaryCase>{{{1000}, {1000}, {1000}}, {{2, 3, 4}, {4}, {2, 3, 4}},
                                                       {{5, 1}, {1, 6}, {5, 6}}, {{}, {3, 4}, {3, 4}}}) {
      std::vector<float> a = randomFloats(numElementsOf(c.a), seed++), b = randomFloats(numElementsOf(c.b), seed++);
      for (size_t i = 0; i < a.size(); i += 5) a[i] = std::round(a[i]);  // equal pairs
      for (size_t i = 0; i < b.size(); i += 3) b[i] = std::round(b[i]);
      if (a.size() > 7) a[7] = std::nanf("");
      if (b.size() > 2) b[2] = -0.0f;
      auto setup = step("compare", {{"predicate", predicate}});
      setup->in(c.a).in(c.b).out(c.c, DType::Bool);
      rows.push_back({"Compare",
                      std::string(predicate) + " " + shapeToString(c.a) + " with " + shapeToString(c.b),
                      setup,
                      given({std::move(a), std::move(b)}),
                      {bitsEqual()}});
    }
  }
}

// Exactly: the chosen values are copied as their bits.
void addSelectRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 1500;
  struct Case {
    std::vector<int64_t> condition, onTrue, onFalse, y;
  };
  for (const Case& c : std::vector<Case>{{{1000}, {1000}, {1000}, {1000}}, {{4, 1}, {4, 5}, {5}, {4, 5}},
                                         {{}, {3, 2}, {3, 2}, {3, 2}}, {{2, 1, 3}, {1, 4, 1}, {3}, {2, 4, 3}},
                                         {{64, 1}, {64, 300}, {}, {64, 300}}}) {
    for (DType dtype : {DType::F32, DType::BF16, DType::I64, DType::U8}) {
      std::mt19937 generator(seed++);
      std::vector<float> condition((numElementsOf(c.condition) + 3) / 4);
      std::vector<uint8_t> flags(condition.size() * 4);
      for (uint8_t& flag : flags) flag = static_cast<uint8_t>(generator() % 2);
      std::memcpy(condition.data(), flags.data(), flags.size());
      auto setup = step("select", nlohmann::json::object());
      setup->in(c.condition, DType::Bool).in(c.onTrue, dtype).in(c.onFalse, dtype).out(c.y, dtype);
      std::vector<float> onTrue = randomFloats(numElementsOf(c.onTrue) * 2, seed++);
      std::vector<float> onFalse = randomFloats(numElementsOf(c.onFalse) * 2, seed++);
      rows.push_back({"Select",
                      "to " + shapeToString(c.y) + " in " + std::string(dtypeName(dtype)),
                      setup,
                      given({std::move(condition), std::move(onTrue), std::move(onFalse)}),
                      {bitsEqual()}});
    }
  }
}

// Host reference for the matmul scale: sum_k |a_ik| |b_kj| per output element.
std::vector<double> matmulScale(const std::vector<float>& a, const std::vector<float>& b, int64_t batch, int64_t m,
                                int64_t n, int64_t k, bool transposeA, bool transposeB, bool sharedB) {
  std::vector<double> scale(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t t = 0; t < batch; ++t) {
    const float* at = a.data() + t * m * k;
    const float* bt = b.data() + (sharedB ? 0 : t * k * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = transposeA ? at[p * m + i] : at[i * k + p];
          const double bv = transposeB ? bt[j * k + p] : bt[p * n + j];
          sum += std::fabs(av * bv);
        }
        scale[static_cast<size_t>((t * m + i) * n + j)] = sum;
      }
  }
  return scale;
}

struct MatmulCase {
  std::vector<int64_t> batch;
  int64_t m, n, k;
  bool sharedB;
};

// The shapes of a, b and c for one case and choice of transposes.
struct MatmulShapes {
  std::vector<int64_t> a, b, c;
};

MatmulShapes matmulShapes(const MatmulCase& c, bool transposeA, bool transposeB) {
  MatmulShapes shapes{c.batch, c.sharedB ? std::vector<int64_t>{} : c.batch, c.batch};
  shapes.a.push_back(transposeA ? c.k : c.m);
  shapes.a.push_back(transposeA ? c.m : c.k);
  shapes.b.push_back(transposeB ? c.n : c.k);
  shapes.b.push_back(transposeB ? c.k : c.n);
  shapes.c.push_back(c.m);
  shapes.c.push_back(c.n);
  return shapes;
}

// 1e-5 of sum_k |a_ik| |b_kj| of the inputs as f32 values (`bf16Inputs`: decoded from bf16), plus for a
// bf16 c one bf16 ulp of the reference. The scale is computed once, on the first element.
Tolerance matmulTolerance(const MatmulCase& c, bool transposeA, bool transposeB, bool bf16Inputs, bool bf16Output) {
  auto scale = std::make_shared<std::vector<double>>();
  return [=](size_t i, const std::vector<float>& expected, const Buffers& inputs) {
    if (scale->empty()) {
      const MatmulShapes shapes = matmulShapes(c, transposeA, transposeB);
      const std::vector<float> a = bf16Inputs ? bf16Values(inputs[0], numElementsOf(shapes.a)) : inputs[0];
      const std::vector<float> b = bf16Inputs ? bf16Values(inputs[1], numElementsOf(shapes.b)) : inputs[1];
      *scale = matmulScale(a, b, numElementsOf(c.batch), c.m, c.n, c.k, transposeA, transposeB, c.sharedB);
    }
    return bf16Output ? bf16Tolerance(expected[i], 1e-5 * (*scale)[i]) : 1e-5 * (*scale)[i];
  };
}

void addMatmulRows(std::vector<KernelCase>& rows) {
  const std::vector<MatmulCase> cases = {
      {{}, 17, 19, 33, true},     {{}, 1, 1, 1, true},         {{}, 64, 96, 128, true},  {{3}, 5, 7, 9, true},
      {{2, 3}, 17, 19, 33, true}, {{2, 3}, 17, 19, 33, false}, {{4}, 31, 1, 64, false},  {{5}, 128, 64, 200, false},
      {{2}, 3, 4, 0, true},       {{0}, 3, 4, 5, false},       {{}, 300, 257, 255, true},
  };
  uint32_t seed = 400;
  for (const MatmulCase& c : cases) {
    for (bool transposeA : {false, true}) {
      for (bool transposeB : {false, true}) {
        const auto [aShape, bShape, cShape] = matmulShapes(c, transposeA, transposeB);
        auto setup = step("matmul", {{"transpose_a", transposeA}, {"transpose_b", transposeB}});
        setup->in(aShape).in(bShape).out(cShape);
        Buffers inputs = {randomFloats(numElementsOf(aShape), seed), randomFloats(numElementsOf(bShape), seed + 1)};
        seed += 2;
        rows.push_back({"Matmul",
                        "a " + shapeToString(aShape) + (transposeA ? "^T" : "") + " b " + shapeToString(bShape) +
                            (transposeB ? "^T" : ""),
                        setup,
                        given(std::move(inputs)),
                        {within(matmulTolerance(c, transposeA, transposeB, false, false))}});
      }
    }
  }
}

// The bf16 matmul (cuBLASLt: bf16 a and b, f32 accumulation, a bf16 c rounded once, an f32 c as it
// is) against the CPU backend's bf16 matmul (a and b widened to f32, sgemm, a bf16 c rounded once) on
// the same bf16 inputs, for every transpose of: a plain product, an odd shape, a batch with a shared
// b (folded into M unless a is transposed, then a zero batch stride), strided batches of b, and the
// empty cases; c bf16 and f32. Tolerance: the f32 matmul's 1e-5 of sum_k |a_ik| |b_kj| (another
// summation order, on tensor cores), plus for a bf16 c one bf16 ulp of the CPU result (the two f32
// sums may straddle a rounding boundary).
void addMatmulBf16Rows(std::vector<KernelCase>& rows) {
  const std::vector<MatmulCase> cases = {
      {{}, 17, 19, 33, true},     {{}, 7, 13, 33, true},       {{}, 1, 1, 1, true},      {{}, 64, 96, 128, true},
      {{3}, 5, 7, 9, true},       {{2, 3}, 17, 19, 33, true},  {{2, 3}, 17, 19, 33, false}, {{4}, 31, 1, 64, false},
      {{5}, 128, 64, 200, false}, {{2}, 3, 4, 0, true},        {{0}, 3, 4, 5, false},    {{}, 300, 257, 255, true},
  };
  const DType bf16 = DType::BF16;
  uint32_t seed = 3400;
  for (const MatmulCase& c : cases) {
    for (const auto& [transposeA, transposeB, outputDType] :
         {std::tuple{false, false, bf16}, std::tuple{true, false, bf16}, std::tuple{false, true, bf16},
          std::tuple{true, true, bf16}, std::tuple{false, false, DType::F32}, std::tuple{true, true, DType::F32}}) {
      const auto [aShape, bShape, cShape] = matmulShapes(c, transposeA, transposeB);
      auto setup = step("matmul", {{"transpose_a", transposeA}, {"transpose_b", transposeB}});
      setup->in(aShape, bf16).in(bShape, bf16).out(cShape, outputDType);
      Buffers inputs = {bf16Bytes(roundedToBf16(randomFloats(numElementsOf(aShape), seed))),
                        bf16Bytes(roundedToBf16(randomFloats(numElementsOf(bShape), seed + 1)))};
      seed += 2;
      const bool bf16Output = outputDType == bf16;
      KernelCase row{"MatmulBf16",
                     "a " + shapeToString(aShape) + (transposeA ? "^T" : "") + " b " + shapeToString(bShape) +
                         (transposeB ? "^T" : "") + " -> " + std::string(dtypeName(outputDType)),
                     setup,
                     given(std::move(inputs)),
                     {{bf16Output ? OutputCheck::Kind::Bf16Floats : OutputCheck::Kind::Floats,
                       matmulTolerance(c, transposeA, transposeB, true, bf16Output), ""}}};
      row.cpuKernels = cpuWidenedRegistry;
      rows.push_back(std::move(row));
    }
  }
}

// ---- rows: the experts' routing and dispatch, the sampler, random numbers, the optimizer ---------

// (7 · route + 3) mod count: a permutation of [0, count) that mixes the rows, for counts 7 does not divide.
std::vector<int64_t> mixedSlots(int64_t count) {
  std::vector<int64_t> slots;
  for (int64_t route = 0; route < count; ++route) slots.push_back((route * 7 + 3) % count);
  return slots;
}

// Exactly. Same routes in the same order, no FMA contraction: the combine rounds exactly as on the CPU.
void addMoePermuteRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 300;
  for (const auto& [tokens, topK, width] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{5, 2, 9}, {64, 8, 33}, {12, 1, 1}}) {
    const std::string what = " of " + std::to_string(tokens) + " tokens, top-" + std::to_string(topK);
    const std::vector<float> slots = int64Bytes(mixedSlots(tokens * topK));
    auto permute = step("moe_permute", nlohmann::json::object());
    permute->in({tokens, width}).in({tokens, topK}, DType::I64).out({tokens * topK, width});
    rows.push_back({"MoePermuteAndCombine",
                    "moe_permute" + what,
                    permute,
                    given({randomFloats(tokens * width, seed++), slots}),
                    {relative(0.0)}});
    auto combine = step("moe_combine", nlohmann::json::object());
    combine->in({tokens * topK, width}).in({tokens, topK}, DType::I64).in({tokens, topK}).out({tokens, width});
    Buffers inputs = {randomFloats(tokens * topK * width, seed), slots, randomFloats(tokens * topK, seed + 1)};
    seed += 2;
    rows.push_back({"MoePermuteAndCombine", "moe_combine" + what, combine, given(std::move(inputs)), {relative(0.0)}});
  }
}

// The indices exactly (random logits, so no two probabilities tie within a few ulp, plus exact ties,
// which tie on both backends); the weights 1e-6 relative (libdevice's expf against libm's).
void addMoeRouteRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 1600;
  for (const auto& [tokens, experts, topK] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{37, 8, 2}, {1000, 128, 8}, {3, 4, 4}, {9, 1, 1}, {0, 8, 2}}) {
    std::vector<float> logits = randomFloats(tokens * experts, seed++, -3.0f, 3.0f);
    for (size_t i = 0; i < logits.size(); i += 3) logits[i] = 0.5f;
    auto setup = step("moe_route", {{"top_k", topK}});
    setup->in({tokens, experts}).in({experts}).out({tokens, topK}).out({tokens, topK}, DType::I64);
    rows.push_back({"MoeRoute",
                    "of " + std::to_string(tokens) + " tokens, " + std::to_string(experts) + " experts, top-" +
                        std::to_string(topK),
                    setup,
                    given({std::move(logits), randomFloats(experts, seed++, 0.5f, 1.5f)}),
                    {relative(1e-6, "weights"), bitsEqual("indices")}});
  }
}

// The same algebra on both (moe/RouteMath.h) over probabilities that differ in their last bits
// (expf): dlogits within 1e-5 of its token's Σ|dw| (which bounds the terms it is made of), dscale 1e-5
// of Σ|dw| over all routes; the indices are the CPU forward's.
void addMoeRouteBackwardRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 1700;
  for (const auto& [tokens, experts, topK] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{37, 8, 2}, {1000, 128, 8}, {3, 4, 4}, {9, 1, 1}}) {
    const std::vector<float> logits = randomFloats(tokens * experts, seed++, -3.0f, 3.0f);
    const std::vector<float> scale = randomFloats(experts, seed++, 0.5f, 1.5f);
    auto forward = step("moe_route", {{"top_k", topK}});
    forward->in({tokens, experts}).in({experts}).out({tokens, topK}).out({tokens, topK}, DType::I64);
    const std::vector<float> dWeights = randomFloats(tokens * topK, seed++);
    auto setup = step("moe_route_backward", {{"top_k", topK}});
    setup->in({tokens, experts}).in({experts}).in({tokens, topK}, DType::I64).in({tokens, topK});
    setup->out({tokens, experts}).out({experts});
    auto inputs = [forward, logits, scale, dWeights] {
      return Buffers{logits, scale, runCpu(*forward, {logits, scale})[1], dWeights};
    };
    // |P_e dP_e| and |P_e Σ P dP| are at most 3 Σ_j |dw_j| (scale <= 1.5, P/S <= 1): the size of the
    // terms whose last bits differ, whatever cancels between them.
    const Tolerance tokenWeights = [experts, topK](size_t i, const std::vector<float>&, const Buffers& in) {
      const size_t token = i / experts;
      double terms = 0.0;
      for (int64_t j = 0; j < topK; ++j) terms += std::fabs(in[3][token * topK + j]);
      return 1e-5 * terms + 1e-12;
    };
    const Tolerance allWeights = [](size_t, const std::vector<float>&, const Buffers& in) {
      double absoluteWeights = 0.0;
      for (float dw : in[3]) absoluteWeights += std::fabs(dw);
      return 1e-5 * absoluteWeights;
    };
    rows.push_back({"MoeRouteBackward",
                    "of " + std::to_string(tokens) + " tokens, " + std::to_string(experts) + " experts, top-" +
                        std::to_string(topK),
                    setup,
                    inputs,
                    {within(tokenWeights, "dlogits"), within(allWeights, "dscale")}});
  }
}

// The ids and the scaled logits bit for bit (the same IEEE division and the same portable Gumbel
// noise on both sides, runtime/kernels/canvas_sample/GumbelNoise.h); the entropy to 1e-6 relative
// (libdevice's expf against the CPU's fastExp, each within an ulp or two).
void addCanvasSampleRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 700;
  for (const auto& [batch, canvas, vocab] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 3, 1003}, {1, 256, 4096}, {3, 5, 1}, {2, 2, 70001}}) {
    for (DType scaled : {DType::F32, DType::BF16}) {
      auto setup = step("canvas_sample", {{"softcap", 0.0}});
      setup->in({batch, canvas, vocab}).in({batch}).in({batch, 2}, DType::I64);
      setup->out({batch, canvas}, DType::I64)
          .out({batch, canvas}, DType::I64)
          .out({batch, canvas})
          .out({batch, canvas, vocab}, scaled);
      std::vector<float> temperature;
      std::vector<int64_t> keys;
      for (int64_t b = 0; b < batch; ++b) {
        temperature.push_back(0.8f - 0.13f * static_cast<float>(b));
        keys.push_back(static_cast<int64_t>(seed) * 7919 + b);
        keys.push_back(b);
      }
      Buffers inputs = {randomFloats(batch * canvas * vocab, seed++, -8.0f, 8.0f), temperature, int64Bytes(keys)};
      rows.push_back({"CanvasSample",
                      "of " + shapeToString({batch, canvas, vocab}) + " to " + std::string(dtypeName(scaled)),
                      setup,
                      given(std::move(inputs)),
                      {bitsEqual("sampled"), bitsEqual("argmax"), relative(1e-6, "entropy"), bitsEqual("scaled")}});
    }
  }
}

// Bit for bit: both kernels call runtime/core/Philox.h. The shapes cover rows that end inside a
// Philox block, [2] and [N, 2] keys, and for random_int a power of two, a small bound and one just
// above 2^31, which rejects about half of the first words (the retries under offset + 1, ...).
void addRandomRows(std::vector<KernelCase>& rows) {
  const std::vector<int64_t> keys = {int64_t{0x1234567890abcdef}, 17, -5, int64_t{1} << 40, 42, 0, 7, 3};
  for (const auto& [shape, keyRows] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
           {{1003}, 0}, {{3, 517}, 3}, {{4, 2, 3}, 4}, {{1, 1}, 1}, {{1 << 20}, 0}}) {
    const std::vector<int64_t> keyShape = keyRows == 0 ? std::vector<int64_t>{2} : std::vector<int64_t>{keyRows, 2};
    const std::vector<float> key = int64Bytes(std::vector<int64_t>(keys.begin(), keys.begin() + numElementsOf(keyShape)));
    for (int64_t stream : {int64_t{0}, int64_t{3}, int64_t{0xffffffff}}) {
      const std::string what = " of " + shapeToString(shape) + " stream " + std::to_string(stream);
      auto uniform = step("random_uniform", {{"stream", stream}});
      uniform->in(keyShape, DType::I64).out(shape);
      rows.push_back({"RandomUniformAndInt", "random_uniform" + what, uniform, given({key}), {bitsEqual()}});
      for (int64_t high : {int64_t{1}, int64_t{262144}, int64_t{3}, int64_t{1000003}, (int64_t{1} << 31) + 1,
                           int64_t{1} << 32}) {
        auto integers = step("random_int", {{"stream", stream}, {"high", high}});
        integers->in(keyShape, DType::I64).out(shape, DType::I64);
        rows.push_back({"RandomUniformAndInt",
                        "random_int high " + std::to_string(high) + what,
                        integers,
                        given({key}),
                        {bitsEqual()}});
      }
    }
  }
}

// Bit for bit: both kernels evaluate runtime/kernels/optimizer/AdamwMath.h's adamwUpdate, IEEE
// operations only (no FMA contraction on the device).
void addAdamwRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 800;
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1 << 20} + 3}) {
    for (double weightDecay : {0.0, 0.1}) {
      auto setup = step("adamw", {{"beta1", 0.9}, {"beta2", 0.95}, {"epsilon", 1e-8}, {"weight_decay", weightDecay}});
      for (int i = 0; i < 4; ++i) setup->in({count});
      for (int i = 0; i < 4; ++i) setup->in({});
      setup->out({count}).out({count}).out({count});
      Buffers inputs = {randomFloats(count, seed),
                        randomFloats(count, seed + 1, -1e-2f, 1e-2f),
                        randomFloats(count, seed + 2, -1e-3f, 1e-3f),
                        randomFloats(count, seed + 3, 0.0f, 1e-5f),
                        {0.5f},
                        {3e-4f},
                        {0.4095f},
                        {0.0975f}};
      seed += 4;
      rows.push_back({"Adamw",
                      "of " + std::to_string(count) + " elements, weight decay " + std::to_string(weightDecay),
                      setup,
                      given(std::move(inputs)),
                      {bitsEqual("0"), bitsEqual("1"), bitsEqual("2")}});
    }
  }
}

// ---- rows: reductions, rope, gather and scatter_add, layout, cast, fill --------------------------

// Both sum in f64 and round once, in different orders: an output may differ by one f32 rounding step
// (2^-23 relative) plus the f64 order's error (1e-12 of Σ|x| covers a million terms); max exactly.
void addReduceRows(std::vector<KernelCase>& rows) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{1024, 4096}, {1}}, {{1024, 4096}, {0}}, {{3, 4, 5}, {0, 2}}, {{3, 4, 5}, {1}}, {{1 << 20}, {0}},
      {{2, 3, 4, 5, 6}, {1, 3}}, {{7, 1, 300}, {0, 1}}, {{4, 0, 3}, {1}}, {{0, 5}, {1}}, {{6}, {}}};
  uint32_t seed = 900;
  for (const auto& [shape, dims] : cases) {
    std::vector<float> x = randomFloats(numElementsOf(shape), seed++);
    if (x.size() > 10) x[10] = std::nanf("");
    ReduceContract contract;
    for (int64_t d = 0, next = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      const bool reduced = next < static_cast<int64_t>(dims.size()) && dims[next] == d;
      (reduced ? contract.reducedDims : contract.keptDims).push_back(d);
      next += reduced;
    }
    reduce::ReduceGeometry geometry;
    if (!reduce::makeReduceGeometry(shape, contract, geometry))
      throw std::logic_error("the reduce rows' shape " + shapeToString(shape) + " has no geometry");
    auto absoluteSums = std::make_shared<std::vector<double>>(static_cast<size_t>(geometry.kept.count), 0.0);
    for (int64_t o = 0; o < geometry.kept.count; ++o)
      for (int64_t r = 0; r < geometry.reduced.count; ++r) {
        const float value = x[reduce::offsetOf(geometry.kept, o) + reduce::offsetOf(geometry.reduced, r)];
        if (!std::isnan(value)) (*absoluteSums)[o] += std::fabs(value);
      }
    const double count = std::max<double>(1.0, static_cast<double>(geometry.reduced.count));
    for (bool keepDims : {false, true}) {
      std::vector<int64_t> yShape;
      for (size_t d = 0, next = 0; d < shape.size(); ++d) {
        const bool reduced = next < dims.size() && dims[next] == static_cast<int64_t>(d);
        if (!reduced || keepDims) yShape.push_back(reduced ? 1 : shape[d]);
        next += reduced;
      }
      for (const std::string op : {"reduce_sum", "reduce_max", "reduce_mean"}) {
        auto setup = step(op, {{"dims", dims}, {"keep_dims", keepDims}});
        setup->in(shape).out(yShape);
        const bool mean = op == "reduce_mean", max = op == "reduce_max";
        const Tolerance tolerance = [=](size_t i, const std::vector<float>& expected, const Buffers&) {
          if (max) return 0.0;
          return std::ldexp(std::fabs(expected[i]), -23) + 1e-12 * (*absoluteSums)[i] / (mean ? count : 1.0);
        };
        rows.push_back(
            {"Reduce",
             op + " of " + shapeToString(shape) + " over " + shapeToString(dims) + (keepDims ? " keeping dims" : ""),
             setup,
             given({x}),
             {within(tolerance)}});
      }
    }
  }
}

// The same frequencies and angles (computed alike on the host and the device) and the same rotation;
// only libdevice's cosf and sinf differ from libm's, by a couple of ulp: an output is within 1e-6 of
// |x_i| + |x_{i+D/2}| of its pair's inputs. Unrotated pairs are copied exactly.
void addRopeRows(std::vector<KernelCase>& rows) {
  struct Case {
    std::vector<int64_t> shape;  // [B, T, H, D]
    int64_t rotatedPairs, frequencyDim, positionStep;
    double theta;
    bool inverse;
  };
  const std::vector<Case> cases = {{{2, 5, 3, 8}, 4, 8, 1, 10000.0, false},   {{2, 5, 3, 8}, 4, 8, 1, 10000.0, true},
                                   {{1, 17, 2, 512}, 64, 512, 9973, 1e6, false}, {{3, 40, 8, 256}, 128, 256, 1, 10000.0, true},
                                   {{1, 3, 1, 2}, 1, 2, 100000, 10000.0, false}, {{0, 4, 2, 8}, 4, 8, 1, 10000.0, false}};
  uint32_t seed = 1000;
  for (const Case& c : cases) {
    auto setup = step("rope", {{"theta", c.theta},
                               {"rotated_pairs", c.rotatedPairs},
                               {"frequency_dim", c.frequencyDim},
                               {"inverse", c.inverse}});
    setup->in(c.shape).in({c.shape[0], c.shape[1]}, DType::I64).out(c.shape);
    std::vector<int64_t> positions;
    for (int64_t i = 0; i < c.shape[0] * c.shape[1]; ++i) positions.push_back((i * 7 % 23) * c.positionStep);
    const int64_t width = c.shape[3], half = width / 2, rotatedPairs = c.rotatedPairs;
    const Tolerance pairScale = [=](size_t at, const std::vector<float>&, const Buffers& inputs) {
      const std::vector<float>& x = inputs[0];
      const int64_t i = static_cast<int64_t>(at) % width;
      if (i % half >= rotatedPairs) return 0.0;
      const size_t partner = i < half ? at + half : at - half;
      return 1e-6 * (std::fabs(x[at]) + std::fabs(x[partner]));
    };
    rows.push_back(
        {"Rope",
         shapeToString(c.shape) + " rotating " + std::to_string(c.rotatedPairs) + (c.inverse ? " inverse" : ""),
         setup,
         given({randomFloats(numElementsOf(c.shape), seed++), int64Bytes(positions)}),
         {within(pairScale)}});
  }
}

std::vector<float> int32Bytes(const std::vector<int64_t>& values) {
  std::vector<int32_t> narrow(values.begin(), values.end());
  std::vector<float> bytes(narrow.size());  // one float per i32
  std::memcpy(bytes.data(), narrow.data(), narrow.size() * sizeof(int32_t));
  return bytes;
}

// Exactly: gather moves bits; scatter_add sums each row's updates from zero in id order on both
// backends (the CUDA kernel after a stable sort), so the f32 sums round alike.
void addGatherRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 1100;
  struct Case {
    int64_t vocabulary, width, count, rowOffset, idHigh;  // ids drawn from [0, idHigh)
  };
  for (const Case& c : std::vector<Case>{{50, 16, 300, 0, 50}, {1000, 64, 4096, 200, 1500}, {7, 3, 1, 2, 9},
                                          {3, 5, 20000, 0, 3}, {11, 1, 0, 0, 11}}) {
    std::mt19937 generator(seed++);
    std::uniform_int_distribution<int64_t> draw(0, c.idHigh - 1);
    std::vector<int64_t> ids(static_cast<size_t>(c.count));
    for (int64_t& id : ids) id = draw(generator);
    for (DType idsDtype : {DType::I64, DType::I32}) {
      const std::vector<float> idBytes = idsDtype == DType::I64 ? int64Bytes(ids) : int32Bytes(ids);
      const std::string what = " of " + std::to_string(c.count) + " ids into " + std::to_string(c.vocabulary) + " rows of " +
                               std::to_string(c.width) + " from row " + std::to_string(c.rowOffset) + ", " +
                               std::string(dtypeName(idsDtype)) + " ids";
      for (DType tableDtype : {DType::F32, DType::BF16}) {
        auto setup = step("gather", {{"row_offset", c.rowOffset}});
        setup->in({c.vocabulary, c.width}, tableDtype).in({c.count}, idsDtype).out({c.count, c.width}, tableDtype);
        rows.push_back({"GatherAndScatterAdd",
                        "gather" + what + " to " + std::string(dtypeName(tableDtype)),
                        setup,
                        given({randomFloats(c.vocabulary * c.width, seed++), idBytes}),
                        {bitsEqual()}});
      }
      for (bool skip : {false, true}) {
        nlohmann::json attrs = {{"row_offset", c.rowOffset}};
        if (skip) attrs["skip_id"] = c.rowOffset + 1;
        auto setup = step("scatter_add", attrs);
        setup->in({c.count}, idsDtype).in({c.count, c.width}).out({c.vocabulary, c.width});
        rows.push_back({"GatherAndScatterAdd",
                        "scatter_add" + what + (skip ? " skipping one" : ""),
                        setup,
                        given({idBytes, randomFloats(c.count * c.width, seed++)}),
                        {bitsEqual()}});
      }
    }
  }
}

// Exactly, in every element size: transpose, reshape, concat and slice only move bits.
void addLayoutRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 1200;
  for (DType dtype : {DType::F32, DType::BF16, DType::I64, DType::U8}) {
    const std::string in = std::string(" in ") + std::string(dtypeName(dtype));
    for (const auto& [shape, perm] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{256, 1000}, {1, 0}}, {{4, 33, 65}, {0, 2, 1}}, {{2, 3, 4, 5}, {3, 1, 2, 0}}, {{2, 1, 7}, {2, 1, 0}}, {{0, 3}, {1, 0}}}) {
      std::vector<int64_t> yShape;
      for (int64_t from : perm) yShape.push_back(shape[from]);
      auto setup = step("transpose", {{"perm", perm}});
      setup->in(shape, dtype).out(yShape, dtype);
      rows.push_back({"Layout",
                      "transpose " + shapeToString(shape) + " by " + shapeToString(perm) + in,
                      setup,
                      given({randomFloats(numElementsOf(shape) * 2, seed++)}),
                      {bitsEqual()}});
    }
    {
      auto setup = step("reshape", nlohmann::json::object());
      setup->in({6, 35}, dtype).out({2, 3, 5, 7}, dtype);
      rows.push_back({"Layout", "reshape" + in, setup, given({randomFloats(6 * 35 * 2, seed++)}), {bitsEqual()}});
    }
    for (int64_t dim : {0, 1, 2}) {
      const std::vector<int64_t> sizes = {3, 1, 5};
      auto setup = step("concat", {{"dim", dim}});
      Buffers inputs;
      std::vector<int64_t> yShape = {4, 6, 2};
      yShape[dim] = 9;
      for (int64_t size : sizes) {
        std::vector<int64_t> shape = {4, 6, 2};
        shape[dim] = size;
        setup->in(shape, dtype);
        inputs.push_back(randomFloats(numElementsOf(shape) * 2, seed++));
      }
      setup->out(yShape, dtype);
      rows.push_back(
          {"Layout", "concat along " + std::to_string(dim) + in, setup, given(std::move(inputs)), {bitsEqual()}});
    }
    for (const auto& [dim, start, size] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 1, 2}, {1, 3, 4}, {2, 0, 1}, {1, 7, 0}}) {
      std::vector<int64_t> yShape = {4, 11, 3};
      yShape[dim] = size;
      auto setup = step("slice", {{"dim", dim}, {"start", start}});
      setup->in({4, 11, 3}, dtype).out(yShape, dtype);
      rows.push_back({"Layout",
                      "slice " + std::to_string(dim) + " from " + std::to_string(start) + in,
                      setup,
                      given({randomFloats(4 * 11 * 3 * 2, seed++)}),
                      {bitsEqual()}});
    }
  }
}

// Exactly: the CUDA cast's conversions are runtime/kernels/elementwise/CastMath.h's, which equal the
// CPU's bit for bit. The inputs are random bytes (NaNs, infinities and subnormals among the floats),
// so every path runs.
void addCastRows(std::vector<KernelCase>& rows) {
  const std::vector<DType> floats = {DType::F32, DType::F64, DType::BF16, DType::F16};
  const std::vector<DType> integers = {DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool};
  std::mt19937 generator(1300);
  const int64_t count = 70001;
  for (DType from : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::I8, DType::U8,
                     DType::Bool}) {
    std::vector<float> bytes(static_cast<size_t>(count) * 2);  // 8 bytes an element at most
    std::vector<uint32_t> words(bytes.size());
    for (uint32_t& word : words) word = static_cast<uint32_t>(generator());
    if (from == DType::Bool)
      for (uint32_t& word : words) word &= 0x01010101u;
    if (from == DType::F32 || from == DType::F64)  // also ordinary magnitudes, not only huge and tiny ones
      for (size_t i = 0; i < words.size(); i += 3) {
        const float value = std::ldexp(static_cast<float>(words[i] % 100000) - 50000.0f, static_cast<int>(words[i] % 40) - 20);
        std::memcpy(&words[i], &value, sizeof value);
      }
    std::memcpy(bytes.data(), words.data(), words.size() * sizeof(uint32_t));
    const bool fromFloat = std::find(floats.begin(), floats.end(), from) != floats.end();
    for (const std::vector<DType>* targets : {&floats, &integers}) {
      if (fromFloat && targets == &integers) continue;  // float -> integer is not a cast
      for (DType to : *targets) {
        auto setup = step("cast", nlohmann::json::object());
        setup->in({count}, from).out({count}, to);
        rows.push_back({"Cast",
                        std::string(dtypeName(from)) + " to " + std::string(dtypeName(to)),
                        setup,
                        given({bytes}),
                        {bitsEqual()}});
      }
    }
  }
}

// Every byte pattern of the codes, scales of both signs and magnitudes: both backends form each element in f32
// the same way (runtime/kernels/dequantize/Element.h) and round it once, so they agree bit for bit.
void addDequantizeRows(std::vector<KernelCase>& rows) {
  struct Case {
    const char* format;
    std::vector<int64_t> shape;  // the weight's
  };
  uint32_t seed = 1350;
  for (const Case& c : std::vector<Case>{
           {"int8", {37, 100}}, {"int8", {3, 5, 64}}, {"nf4", {40, 128}}, {"nf4", {4, 6, 256}}, {"nf4", {1, 64}}}) {
    const bool nf4 = std::string(c.format) == "nf4";
    std::vector<int64_t> codesShape = c.shape, scalesShape = c.shape;
    if (nf4) {
      codesShape.back() /= 2;
      scalesShape.back() /= 64;
    } else {
      scalesShape.pop_back();
    }
    std::mt19937 generator(seed++);
    std::vector<uint8_t> codeBytes(static_cast<size_t>(numElementsOf(codesShape)));
    for (uint8_t& byte : codeBytes) byte = static_cast<uint8_t>(generator());
    std::vector<float> codes((codeBytes.size() + 3) / 4);
    std::memcpy(codes.data(), codeBytes.data(), codeBytes.size());
    for (DType out : {DType::F32, DType::BF16}) {
      auto setup = step("dequantize", {{"format", c.format}});
      setup->in(codesShape, nf4 ? DType::U8 : DType::I8).in(scalesShape).out(c.shape, out);
      rows.push_back({"Dequantize",
                      std::string(c.format) + " " + shapeToString(c.shape) + " to " + std::string(dtypeName(out)),
                      setup,
                      given({codes, randomFloats(numElementsOf(scalesShape), seed++, -0.5f, 0.5f)}),
                      {bitsEqual()}});
    }
  }
}

// Exactly: both fill FillPattern.h's bits, computed on the host.
void addFillRows(std::vector<KernelCase>& rows) {
  for (const auto& [dtype, value] : std::vector<std::pair<DType, double>>{
           {DType::F32, 0.1}, {DType::F64, -2.5}, {DType::BF16, 1.0 + 0x1p-8 + 0x1p-40}, {DType::F16, 65504.0},
           {DType::I64, -7.0}, {DType::I32, 123456.0}, {DType::I8, -3.0}, {DType::U8, 200.0}, {DType::Bool, 1.0},
           {DType::F32, 1e-40}, {DType::F16, 1e-7}}) {
    for (int64_t count : {int64_t{1}, int64_t{1001}, int64_t{1 << 20}}) {
      auto setup = step("fill", {{"value", value}});
      setup->out({count}, dtype);
      std::ostringstream what;
      what << value << " in " << dtypeName(dtype) << " of " << count;
      rows.push_back({"Fill", what.str(), setup, given({}), {bitsEqual()}});
    }
  }
}

// ---- rows: attention and cross-entropy in f32 and bf16 ---------------------------------------------
//
// f32: the CUDA kernel against the CPU kernel on the same inputs. bf16: the CUDA kernel on bf16
// buffers against the CPU kernel in f32 on the same (rounded) values, its results rounded to bf16.

// The bf16 row of an f32 row: its float inputs (`floatInputs`) as bf16 bytes on the device, the f32
// CPU kernel on their values as the reference, each output one bf16 ulp looser.
KernelCase bf16Twin(const KernelCase& f32, std::shared_ptr<const StepSetup> bf16Setup,
                    std::vector<size_t> floatInputs) {
  KernelCase row = f32;
  row.what += " (bf16)";
  row.setup = std::move(bf16Setup);
  row.inputs = [f32Inputs = f32.inputs, floatInputs] {
    Buffers inputs = f32Inputs();
    for (size_t i : floatInputs) inputs[i] = bf16Bytes(inputs[i]);
    return inputs;
  };
  row.reference = [f32Setup = f32.setup, floatInputs](const Buffers& bf16Inputs) {
    Buffers inputs = bf16Inputs;
    for (size_t i : floatInputs) inputs[i] = bf16Values(inputs[i], f32Setup->inputs[i]->numElements());
    return runCpu(*f32Setup, inputs);
  };
  for (OutputCheck& check : row.checks)
    check = {OutputCheck::Kind::Bf16AgainstF32,
             [f32Tolerance = check.tolerance](size_t i, const std::vector<float>& expected, const Buffers& inputs) {
               return bf16Tolerance(bf16BitsToF32(f32ToBf16Bits(expected[i])), f32Tolerance(i, expected, inputs));
             },
             check.name};
  return row;
}

struct AttentionGpuCase {
  int64_t batch, queries, keys, queryHeads, kvHeads, headDim, valueDim;
  std::string mask;
  int64_t window, prefixLen;
  bool segmented = false;  // with segment_ids (the causal mask's image overlay)
  bool documented = false;  // with document_ids (packed documents)
};

std::string describe(const AttentionGpuCase& c) {
  return c.mask + (c.segmented ? " segmented" : "") + (c.documented ? " documented" : "") +
         " B=" + std::to_string(c.batch) + " Tq=" + std::to_string(c.queries) + " Tk=" + std::to_string(c.keys) +
         " Hq=" + std::to_string(c.queryHeads) + " Hkv=" + std::to_string(c.kvHeads) +
         " D=" + std::to_string(c.headDim) + " Dv=" + std::to_string(c.valueDim) +
         " window=" + std::to_string(c.window) + " prefix=" + std::to_string(c.prefixLen);
}

const std::vector<AttentionGpuCase>& attentionGpuCases() {
  static const std::vector<AttentionGpuCase> cases = {
      {2, 9, 9, 4, 2, 8, 6, "causal", 0, 0},
      {2, 37, 70, 8, 2, 64, 64, "causal", 20, 0},
      {3, 5, 13, 2, 1, 16, 24, "causal", 3, 0},
      {2, 33, 33, 4, 4, 32, 32, "bidirectional", 0, 0},
      {2, 24, 88, 4, 2, 64, 64, "prefix", 16, 64},
      {2, 16, 40, 2, 2, 8, 8, "prefix", 0, 0},
      {1, 130, 300, 4, 1, 256, 256, "causal", 0, 0},  // 256-wide heads: shared memory past 48 KiB
      {1, 40, 40, 2, 1, 512, 512, "bidirectional", 0, 0},
      {2, 37, 70, 8, 2, 64, 64, "causal", 20, 0, true},
      {3, 5, 13, 2, 1, 16, 24, "causal", 3, 0, true},
      {1, 130, 300, 4, 1, 256, 256, "causal", 0, 0, true},
      // Packed documents: the causal and the symmetric bidirectional windows, and with the overlay.
      {2, 70, 70, 8, 2, 64, 64, "causal", 20, 0, false, true},
      {2, 70, 70, 4, 2, 64, 64, "bidirectional", 20, 0, false, true},
      {2, 37, 70, 4, 2, 32, 32, "bidirectional", 0, 0, false, true},
      {2, 37, 70, 8, 2, 64, 64, "causal", 20, 0, true, true},
      {2, 24, 88, 4, 2, 64, 64, "prefix", 16, 64, false, true},
  };
  return cases;
}

// key_valid with padded keys (every fifth key, and the last batch row's last third).
std::vector<float> keyValidBytes(const AttentionGpuCase& c) {
  std::vector<uint8_t> valid(c.batch * c.keys);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.keys; ++j)
      valid[b * c.keys + j] = !(j % 5 == 3 || (b == c.batch - 1 && j >= 2 * c.keys / 3));
  std::vector<float> bytes((valid.size() + 3) / 4);
  std::memcpy(bytes.data(), valid.data(), valid.size());
  return bytes;
}

// Segment ids in runs of 11 keys that alternate between text (0) and the next image (1, 2, ...), so
// that images reach past the windows and into the future; batch row b starts its runs b keys later.
std::vector<float> segmentIdBytes(const AttentionGpuCase& c) {
  std::vector<int64_t> segments(c.batch * c.keys);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.keys; ++j) {
      const int64_t run = (j + b) / 11;
      segments[b * c.keys + j] = run % 2 == 1 ? run / 2 + 1 : 0;
    }
  return int64Bytes(segments);
}

// Document ids of packed text: documents of 7, 13, 29, 4, ... keys (cycling), batch row b shifted by 3b.
std::vector<float> documentIdBytes(const AttentionGpuCase& c) {
  const int64_t lengths[] = {7, 13, 29, 4};
  std::vector<int64_t> documents(c.batch * c.keys);
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t document = 0, left = lengths[0] - 3 * b;
    for (int64_t j = 0; j < c.keys; ++j) {
      if (left <= 0) left = lengths[++document % 4];
      documents[b * c.keys + j] = document;
      --left;
    }
  }
  return int64Bytes(documents);
}

StepSetup attentionSetup(const AttentionGpuCase& c, DType dtype, bool backward) {
  StepSetup setup(backward ? "attention_backward" : "attention", {{"mask", c.mask},
                                                                  {"window", c.window},
                                                                  {"prefix_len", c.prefixLen},
                                                                  {"scale", 0.125},
                                                                  {"has_document_ids", c.documented}});
  setup.in({c.batch, c.queries, c.queryHeads, c.headDim}, dtype)
      .in({c.batch, c.keys, c.kvHeads, c.headDim}, dtype)
      .in({c.batch, c.keys, c.kvHeads, c.valueDim}, dtype)
      .in({c.batch, c.keys}, DType::U8);
  if (backward) setup.in({c.batch, c.queries, c.queryHeads, c.valueDim}, dtype);
  if (c.segmented) setup.in({c.batch, c.keys}, DType::I64);
  if (c.documented) setup.in({c.batch, c.keys}, DType::I64);
  if (backward) {
    setup.out({c.batch, c.queries, c.queryHeads, c.headDim}, dtype)
        .out({c.batch, c.keys, c.kvHeads, c.headDim}, dtype)
        .out({c.batch, c.keys, c.kvHeads, c.valueDim}, dtype);
  } else {
    setup.out({c.batch, c.queries, c.queryHeads, c.valueDim}, dtype);
  }
  return setup;
}

// o 1e-5, dq dk dv 2e-5 of max(1, |cpu|); bf16 one bf16 ulp more.
void addAttentionRows(std::vector<KernelCase>& rows, bool backward) {
  const double tolerance = backward ? 2e-5 : 1e-5;
  uint32_t seed = backward ? 1300 : 1200;
  for (const AttentionGpuCase& c : attentionGpuCases()) {
    // The values are bf16-rounded, so that the bf16 row's inputs hold the same values.
    Buffers inputs = {roundedToBf16(randomFloats(c.batch * c.queries * c.queryHeads * c.headDim, seed)),
                      roundedToBf16(randomFloats(c.batch * c.keys * c.kvHeads * c.headDim, seed + 1)),
                      roundedToBf16(randomFloats(c.batch * c.keys * c.kvHeads * c.valueDim, seed + 2)),
                      keyValidBytes(c)};
    seed += 3;
    if (backward)
      inputs.push_back(roundedToBf16(randomFloats(c.batch * c.queries * c.queryHeads * c.valueDim, seed++)));
    if (c.segmented) inputs.push_back(segmentIdBytes(c));
    if (c.documented) inputs.push_back(documentIdBytes(c));
    std::vector<OutputCheck> checks;
    for (const char* name : backward ? std::vector<const char*>{"dq", "dk", "dv"} : std::vector<const char*>{"o"})
      checks.push_back(relativeAboveOne(tolerance, name));
    const KernelCase f32{backward ? "AttentionBackward" : "Attention", describe(c),
                         std::make_shared<const StepSetup>(attentionSetup(c, DType::F32, backward)),
                         given(std::move(inputs)), std::move(checks)};
    rows.push_back(f32);
    std::vector<size_t> floatInputs = {0, 1, 2};
    if (backward) floatInputs.push_back(4);
    rows.push_back(
        bf16Twin(f32, std::make_shared<const StepSetup>(attentionSetup(c, DType::BF16, backward)), floatInputs));
  }
}

struct CrossEntropyGpuCase {
  int64_t rows, vocabulary;
  double softcap;
  bool bonus;
  bool wideIds;
};

std::string describe(const CrossEntropyGpuCase& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.vocabulary) + " softcap " + std::to_string(c.softcap) +
         (c.bonus ? " with bonus" : "") + (c.wideIds ? " i64 ids" : " i32 ids");
}

StepSetup crossEntropySetup(const CrossEntropyGpuCase& c, DType dtype, bool backward) {
  StepSetup setup(backward ? "cross_entropy_backward" : "cross_entropy", {{"softcap", c.softcap}});
  const DType ids = c.wideIds ? DType::I64 : DType::I32;
  setup.in({c.rows, c.vocabulary}, dtype).in({c.rows}, ids);
  if (c.bonus) setup.in({c.rows}, ids).in({c.rows}, dtype);
  if (backward) setup.in({c.rows}, dtype);
  setup.out(backward ? std::vector<int64_t>{c.rows, c.vocabulary} : std::vector<int64_t>{c.rows}, dtype);
  return setup;
}

// The loss 2e-6 of max(1, |cpu|), grad_logits 4e-6 of |cpu| (+1e-12); bf16 one bf16 ulp more.
void addCrossEntropyRows(std::vector<KernelCase>& rows, bool backward) {
  const std::vector<CrossEntropyGpuCase> cases = {
      {6, 1000, 0.0, false, true}, {6, 1000, 30.0, true, false}, {5, 7, 2.0, true, true},
      {300, 4099, 30.0, true, true}, {3, 262144, 30.0, true, false}, {2, 262144, 0.0, false, true},
  };
  uint32_t seed = backward ? 1500 : 1400;
  for (const CrossEntropyGpuCase& c : cases) {
    std::mt19937 generator(seed);
    std::vector<int64_t> targets, bonusIds;
    for (int64_t r = 0; r < c.rows; ++r) {
      targets.push_back(generator() % c.vocabulary);
      bonusIds.push_back(r % 3 == 0 ? targets.back() : static_cast<int64_t>(generator() % c.vocabulary));
    }
    std::vector<float> logits = roundedToBf16(randomFloats(c.rows * c.vocabulary, seed++, -8.0f, 8.0f));
    for (int64_t r = 1; r < c.rows; r += 4) logits[r * c.vocabulary + targets[r]] = 30.0f;  // p near 1
    const std::vector<float> bonus = roundedToBf16(randomFloats(c.rows, seed++, 0.0f, 3.0f));
    const std::vector<float> gradOutput = roundedToBf16(randomFloats(c.rows, seed++, -1.5f, 1.5f));
    auto idBytes = [&](const std::vector<int64_t>& ids) { return c.wideIds ? int64Bytes(ids) : int32Bytes(ids); };
    Buffers inputs = {logits, idBytes(targets)};
    std::vector<size_t> floatInputs = {0};
    if (c.bonus) {
      inputs.push_back(idBytes(bonusIds));
      inputs.push_back(bonus);
      floatInputs.push_back(3);
    }
    if (backward) {
      floatInputs.push_back(inputs.size());
      inputs.push_back(gradOutput);
    }
    const Tolerance tolerance = backward ? Tolerance([](size_t e, const std::vector<float>& cpu, const Buffers&) {
      return 4e-6 * std::fabs(cpu[e]) + 1e-12;
    })
                                         : Tolerance([](size_t e, const std::vector<float>& cpu, const Buffers&) {
                                             return 2e-6 * std::max(1.0f, std::fabs(cpu[e]));
                                           });
    const KernelCase f32{backward ? "CrossEntropyBackward" : "CrossEntropy",
                         describe(c),
                         std::make_shared<const StepSetup>(crossEntropySetup(c, DType::F32, backward)),
                         given(std::move(inputs)),
                         {within(tolerance, backward ? "grad_logits" : "loss")}};
    rows.push_back(f32);
    rows.push_back(
        bf16Twin(f32, std::make_shared<const StepSetup>(crossEntropySetup(c, DType::BF16, backward)), floatInputs));
  }
}

// moe_dispatch's expert indices: 37 tokens, top-3, over 4 peers of 2 experts.
std::vector<int64_t> dispatchIndices() {
  const int64_t tokens = 37, topK = 3, peers = 4, localExperts = 2;
  std::mt19937 generator(2260);
  std::vector<int64_t> indices(tokens * topK);
  for (int64_t& index : indices) index = static_cast<int64_t>(generator() % (peers * localExperts));
  return indices;
}

// ---- rows: the experts, fused_elementwise, bf16 through the backends' widening ---------------------

struct ExpertsGpuCase {
  int64_t tokens, hidden, topK, experts, inner, offset;
};

// Global expert ids for the case: repeated experts within a token, some outside the block.
std::vector<int64_t> expertIds(const ExpertsGpuCase& c, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<int64_t> ids(static_cast<size_t>(c.tokens * c.topK));
  for (int64_t& id : ids) id = static_cast<int64_t>(generator() % static_cast<uint32_t>(c.experts + 2 * c.offset + 1));
  return ids;
}

// With `gateUpRows`, the forward's optional output gate_up_rows [N·k, 2I], or the backward's input 6.
StepSetup expertsSetup(const ExpertsGpuCase& c, bool backward, bool gateUpRows = false) {
  StepSetup setup(backward ? "moe_experts_backward" : "moe_experts", {{"expert_offset", c.offset}});
  setup.in({c.tokens, c.hidden}).in({c.tokens, c.topK}).in({c.tokens, c.topK}, DType::I64);
  setup.in({c.experts, 2 * c.inner, c.hidden}).in({c.experts, c.hidden, c.inner});
  if (backward) {
    setup.in({c.tokens, c.hidden});
    if (gateUpRows) setup.in({c.tokens * c.topK, 2 * c.inner});
    setup.out({c.tokens, c.hidden}).out({c.tokens, c.topK}).out({c.experts, 2 * c.inner, c.hidden});
    setup.out({c.experts, c.hidden, c.inner});
  } else {
    setup.out({c.tokens, c.hidden});
    if (gateUpRows) setup.out({c.tokens * c.topK, 2 * c.inner});
  }
  return setup;
}

std::vector<OutputCheck> expertGradientChecks(const std::string& prefix) {
  std::vector<OutputCheck> checks;
  for (const char* name : {"dx", "dweights", "dgate_up", "ddown"})
    checks.push_back(relativeAboveOne(1e-5, prefix + name));
  return checks;
}

// One cuBLAS GEMM per used expert against OpenBLAS's, libdevice tanhf against the CPU's fastTanh:
// 1e-5 of max(1, |cpu|) for y and every gradient (the GEMMs' sums of at most max(H, 2I, N·k) terms of
// inputs in [-1, 1]). Also the forward keeping gate_up_rows (zero rows for the routes outside the
// block on both) and the backward reading them: the CPU forward's rows on both backends, and the GPU
// backward reading the GPU forward's rows against the CPU backward recomputing them.
void addMoeExpertsRows(std::vector<KernelCase>& rows) {
  uint32_t seed = 2200;
  for (const ExpertsGpuCase& c : std::vector<ExpertsGpuCase>{
           {9, 16, 2, 4, 8, 0}, {64, 64, 4, 8, 32, 0}, {33, 24, 2, 3, 16, 2}, {1, 8, 1, 1, 4, 0}, {0, 8, 2, 2, 4, 0}}) {
    const std::vector<float> ids = int64Bytes(expertIds(c, seed++));
    Buffers forwardInputs = {randomFloats(c.tokens * c.hidden, seed, -1.0f, 1.0f),
                             randomFloats(c.tokens * c.topK, seed + 1, 0.1f, 1.0f), ids,
                             randomFloats(c.experts * 2 * c.inner * c.hidden, seed + 2, -0.5f, 0.5f),
                             randomFloats(c.experts * c.hidden * c.inner, seed + 3, -0.5f, 0.5f)};
    seed += 4;
    Buffers backwardInputs = forwardInputs;
    backwardInputs.push_back(randomFloats(c.tokens * c.hidden, seed++, -1.0f, 1.0f));
    const std::string what = "(" + std::to_string(c.tokens) + " tokens, " + std::to_string(c.experts) +
                             " experts from " + std::to_string(c.offset) + ")";
    auto forward = std::make_shared<const StepSetup>(expertsSetup(c, false));
    auto backward = std::make_shared<const StepSetup>(expertsSetup(c, true));
    auto keeping = std::make_shared<const StepSetup>(expertsSetup(c, false, true));
    auto reading = std::make_shared<const StepSetup>(expertsSetup(c, true, true));
    rows.push_back(
        {"MoeExpertsAndBackward", "moe_experts " + what, forward, given(forwardInputs), {relativeAboveOne(1e-5, "y")}});
    rows.push_back({"MoeExpertsAndBackward", "moe_experts_backward " + what, backward, given(backwardInputs),
                    expertGradientChecks("")});
    rows.push_back({"MoeExpertsAndBackward",
                    "moe_experts keeping gate_up_rows " + what,
                    keeping,
                    given(forwardInputs),
                    {relativeAboveOne(1e-5, "y"), relativeAboveOne(1e-5, "gate_up_rows")}});
    // Both backends read the CPU forward's rows.
    auto withCpuRows = [keeping, forwardInputs, backwardInputs] {
      Buffers inputs = backwardInputs;
      inputs.push_back(runCpu(*keeping, forwardInputs)[1]);
      return inputs;
    };
    rows.push_back({"MoeExpertsAndBackward", "moe_experts_backward reading gate_up_rows " + what, reading, withCpuRows,
                    expertGradientChecks("")});
    // The GPU backward reading the GPU forward's rows against the CPU backward recomputing them.
    KernelCase own{"MoeExpertsAndBackward", "moe_experts_backward reading the GPU forward's gate_up_rows " + what,
                   backward, given(backwardInputs), expertGradientChecks("")};
    own.device = [keeping, reading, forwardInputs](const Buffers& inputs) {
      Buffers readingInputs = inputs;
      readingInputs.push_back(runGpu(*keeping, forwardInputs)[1]);
      return runGpu(*reading, readingInputs);
    };
    rows.push_back(std::move(own));
  }
}

// The experts with per-expert LoRA adapters (rank 3, scale 1.5): both pairs, one pair alone, a block
// of the experts (routes outside it), and a frozen base (the backward without the base gradients).
// The adapters' rank-3 GEMMs add terms of the base's size: the tolerance of moe_experts.
struct ExpertsLoraGpuCase {
  ExpertsGpuCase experts;
  bool gateUpPair, downPair, baseGradients;
};

StepSetup expertsLoraSetup(const ExpertsLoraGpuCase& l, int64_t rank, bool backward) {
  const ExpertsGpuCase& c = l.experts;
  nlohmann::json attrs = {
      {"expert_offset", c.offset}, {"lora_gate_up", l.gateUpPair}, {"lora_down", l.downPair}, {"lora_scale", 1.5}};
  if (backward) attrs.update({{"grad_gate_up", l.baseGradients}, {"grad_down", l.baseGradients}});
  StepSetup setup(backward ? "moe_experts_backward" : "moe_experts", attrs);
  setup.in({c.tokens, c.hidden}).in({c.tokens, c.topK}).in({c.tokens, c.topK}, DType::I64);
  setup.in({c.experts, 2 * c.inner, c.hidden}).in({c.experts, c.hidden, c.inner});
  if (backward) setup.in({c.tokens, c.hidden});
  if (l.gateUpPair) setup.in({c.experts, rank, c.hidden}).in({c.experts, 2 * c.inner, rank});
  if (l.downPair) setup.in({c.experts, rank, c.inner}).in({c.experts, c.hidden, rank});
  if (!backward) {
    setup.out({c.tokens, c.hidden});
    return setup;
  }
  setup.out({c.tokens, c.hidden}).out({c.tokens, c.topK});
  if (l.baseGradients) setup.out({c.experts, 2 * c.inner, c.hidden}).out({c.experts, c.hidden, c.inner});
  if (l.gateUpPair) setup.out({c.experts, rank, c.hidden}).out({c.experts, 2 * c.inner, rank});
  if (l.downPair) setup.out({c.experts, rank, c.inner}).out({c.experts, c.hidden, rank});
  return setup;
}

void addMoeExpertsLoraRows(std::vector<KernelCase>& rows) {
  const int64_t rank = 3;
  uint32_t seed = 2400;
  for (const ExpertsLoraGpuCase& l : std::vector<ExpertsLoraGpuCase>{{{9, 16, 2, 4, 8, 0}, true, true, true},
                                                                     {{64, 64, 4, 8, 32, 0}, true, true, false},
                                                                     {{33, 24, 2, 3, 16, 2}, true, true, false},
                                                                     {{17, 16, 2, 4, 8, 0}, false, true, true},
                                                                     {{17, 16, 2, 4, 8, 1}, true, false, false}}) {
    const ExpertsGpuCase& c = l.experts;
    Buffers common = {randomFloats(c.tokens * c.hidden, seed, -1.0f, 1.0f),
                      randomFloats(c.tokens * c.topK, seed + 1, 0.1f, 1.0f), int64Bytes(expertIds(c, seed + 2)),
                      randomFloats(c.experts * 2 * c.inner * c.hidden, seed + 3, -0.5f, 0.5f),
                      randomFloats(c.experts * c.hidden * c.inner, seed + 4, -0.5f, 0.5f)};
    Buffers adapters;
    if (l.gateUpPair) {
      adapters.push_back(randomFloats(c.experts * rank * c.hidden, seed + 5, -0.5f, 0.5f));
      adapters.push_back(randomFloats(c.experts * 2 * c.inner * rank, seed + 6, -0.5f, 0.5f));
    }
    if (l.downPair) {
      adapters.push_back(randomFloats(c.experts * rank * c.inner, seed + 7, -0.5f, 0.5f));
      adapters.push_back(randomFloats(c.experts * c.hidden * rank, seed + 8, -0.5f, 0.5f));
    }
    Buffers forwardInputs = common, backwardInputs = common;
    backwardInputs.push_back(randomFloats(c.tokens * c.hidden, seed + 9, -1.0f, 1.0f));
    forwardInputs.insert(forwardInputs.end(), adapters.begin(), adapters.end());
    backwardInputs.insert(backwardInputs.end(), adapters.begin(), adapters.end());
    seed += 10;
    const std::string what = "with adapters (" + std::string(l.gateUpPair ? "gate_up" : "") +
                             (l.gateUpPair && l.downPair ? ", " : "") + (l.downPair ? "down" : "") + "; " +
                             std::to_string(c.tokens) + " tokens, " + std::to_string(c.experts) + " experts from " +
                             std::to_string(c.offset) + (l.baseGradients ? "" : "; frozen base") + ")";
    std::vector<OutputCheck> gradients = {relativeAboveOne(1e-5, "dx"), relativeAboveOne(1e-5, "dweights")};
    if (l.baseGradients)
      gradients.insert(gradients.end(), {relativeAboveOne(1e-5, "dgate_up"), relativeAboveOne(1e-5, "ddown")});
    if (l.gateUpPair) gradients.insert(gradients.end(), {relativeAboveOne(1e-5, "dA1"), relativeAboveOne(1e-5, "dB1")});
    if (l.downPair) gradients.insert(gradients.end(), {relativeAboveOne(1e-5, "dA2"), relativeAboveOne(1e-5, "dB2")});
    rows.push_back({"MoeExpertsWithAdapters",
                    "moe_experts " + what,
                    std::make_shared<const StepSetup>(expertsLoraSetup(l, rank, false)),
                    given(forwardInputs),
                    {relativeAboveOne(1e-5, "y")}});
    rows.push_back({"MoeExpertsWithAdapters", "moe_experts_backward " + what,
                    std::make_shared<const StepSetup>(expertsLoraSetup(l, rank, true)), given(backwardInputs),
                    gradients});
  }
}

// The routing table exactly (DispatchTable.h on the host for both).
void addMoeDispatchRows(std::vector<KernelCase>& rows) {
  const int64_t tokens = 37, topK = 3, peers = 4, localExperts = 2;
  auto setup = step("moe_dispatch", {{"num_experts", peers * localExperts}});
  setup->in({tokens, topK}, DType::I64).out({tokens, topK}, DType::I64).out({peers}, DType::I64);
  setup->out({peers, localExperts}, DType::I64);
  rows.push_back({"MoeDispatch",
                  "of 37 tokens, top-3, 4 peers of 2 experts",
                  setup,
                  given({int64Bytes(dispatchIndices())}),
                  {bitsEqual("slots"), bitsEqual("send counts"), bitsEqual("expert counts")}});
}

// Expert parallelism's moe_local_experts and its backward: received rows from 3 sources with some
// capacity uncounted (zeros on both), the tolerance of moe_experts.
void addMoeLocalExpertsRows(std::vector<KernelCase>& rows) {
  const int64_t peers = 3, experts = 4, capacity = 90, hidden = 32, inner = 16;
  const std::vector<int64_t> counts = {5, 0, 7, 2, 9, 3, 0, 11, 6, 4, 8, 1};  // 56 rows counted
  uint32_t seed = 2250;
  const std::vector<float> rowsIn = randomFloats(capacity * hidden, seed++, -1.0f, 1.0f);
  const std::vector<float> gateUp = randomFloats(experts * 2 * inner * hidden, seed++, -0.5f, 0.5f);
  const std::vector<float> down = randomFloats(experts * hidden * inner, seed++, -0.5f, 0.5f);
  auto forward = step("moe_local_experts", nlohmann::json::object());
  forward->in({capacity, hidden})
      .in({peers, experts}, DType::I64)
      .in({experts, 2 * inner, hidden})
      .in({experts, hidden, inner});
  forward->out({capacity, hidden});
  rows.push_back({"MoeLocalExpertsAndBackward",
                  "moe_local_experts",
                  forward,
                  given({rowsIn, int64Bytes(counts), gateUp, down}),
                  {relativeAboveOne(1e-5)}});
  auto backward = step("moe_local_experts_backward", nlohmann::json::object());
  backward->in({capacity, hidden}).in({capacity}).in({capacity, hidden}).in({peers, experts}, DType::I64);
  backward->in({experts, 2 * inner, hidden}).in({experts, hidden, inner});
  backward->out({capacity, hidden}).out({capacity}).out({experts, 2 * inner, hidden}).out({experts, hidden, inner});
  Buffers inputs = {rowsIn,
                    randomFloats(capacity, seed, 0.1f, 1.0f),
                    randomFloats(capacity * hidden, seed + 1, -1.0f, 1.0f),
                    int64Bytes(counts),
                    gateUp,
                    down};
  std::vector<OutputCheck> checks;
  for (const char* name : {"grad_rows", "grad_weights", "grad_gate_up", "grad_down"})
    checks.push_back(relativeAboveOne(1e-5, name));
  rows.push_back({"MoeLocalExpertsAndBackward", "moe_local_experts_backward", backward, given(std::move(inputs)),
                  std::move(checks)});
}

// Programs of IEEE operations exactly (the same operations on both); with tanh, exp or gelu_tanh
// 4e-6 of max(1, |cpu|) (libdevice against the CPU's fastTanh / fastExp); a bf16 output one bf16
// ulp more.
void addFusedElementwiseRows(std::vector<KernelCase>& rows) {
  struct FusedCase {
    std::string program;
    std::vector<std::pair<std::vector<int64_t>, DType>> inputs;
    std::vector<int64_t> shape;
    DType output;
    bool exact;
  };
  const DType f32 = DType::F32, bf16 = DType::BF16;
  const std::vector<FusedCase> cases = {
      {"add f32 0 1; mul f32 2 3; sub f32 4 0", {{{3, 5, 70}, f32}, {{70}, f32}, {{}, f32}}, {3, 5, 70}, f32, true},
      {"maximum f32 0 1; minimum f32 2 1; div f32 3 0", {{{40, 9}, f32}, {{40, 1}, f32}}, {40, 9}, f32, true},
      {"div f32 0 1; tanh f32 2; mul f32 3 1", {{{16, 1000}, f32}, {{}, f32}}, {16, 1000}, f32, false},
      {"mul bf16 0 1; add bf16 2 0; cast f32 3", {{{6, 110}, bf16}, {{110}, bf16}}, {6, 110}, f32, true},
      {"gelu_tanh bf16 0; mul bf16 2 1", {{{70, 16}, bf16}, {{70, 16}, bf16}}, {70, 16}, bf16, false},
  };
  uint32_t seed = 2300;
  for (const FusedCase& c : cases) {
    auto setup = step("fused_elementwise", {{"program", c.program}});
    Buffers inputs;
    for (const auto& [shape, dtype] : c.inputs) {
      setup->in(shape, dtype);
      std::vector<float> values = randomFloats(numElementsOf(shape), seed++, -4.0f, 4.0f);
      if (shape.empty()) values[0] = 2.5f;  // a scale or cap away from zero
      inputs.push_back(dtype == bf16 ? bf16Bytes(values) : values);
    }
    setup->out(c.shape, c.output);
    const bool exact = c.exact, bf16Output = c.output == bf16;
    const Tolerance tolerance = [exact, bf16Output](size_t i, const std::vector<float>& cpu, const Buffers&) {
      if (exact) return 0.0;
      const double f32Tolerance = 4e-6 * std::max(1.0, std::fabs(static_cast<double>(cpu[i])));
      return bf16Output ? bf16Tolerance(cpu[i], f32Tolerance) : f32Tolerance;
    };
    rows.push_back({"FusedElementwise",
                    "'" + c.program + "'",
                    setup,
                    given(std::move(inputs)),
                    {{bf16Output ? OutputCheck::Kind::Bf16Floats : OutputCheck::Kind::Floats, tolerance, ""}}});
  }
}

// The CUDA backend's kernels (cudaBackendKernels()) on bf16 steps of f32-only kernels, widened as the
// CPU backend widens them: against the CPU backend's widened kernel on the same bf16 inputs, one bf16
// ulp of the CPU result plus the f32 tolerance (relative to max(1, |cpu|)).
void addBf16WideningRows(std::vector<KernelCase>& rows) {
  const DType bf16 = DType::BF16;
  uint32_t seed = 2400;
  auto add = [&](std::shared_ptr<StepSetup> setup, double f32Tolerance) {
    Buffers inputs;
    for (const Buffer* input : setup->inputs) inputs.push_back(bf16Bytes(randomFloats(input->numElements(), seed++)));
    std::vector<OutputCheck> checks(setup->outputs.size(),
                                    {OutputCheck::Kind::Bf16Floats,
                                     [f32Tolerance](size_t i, const std::vector<float>& expected, const Buffers&) {
                                       return bf16Tolerance(
                                           expected[i], f32Tolerance * std::max(1.0, std::fabs(double(expected[i]))));
                                     },
                                     ""});
    KernelCase row{"Bf16ThroughTheBackendsWidening", setup->step.op + " in bf16", setup, given(std::move(inputs)),
                   std::move(checks)};
    row.cpuKernels = cpuWidenedRegistry;
    row.cudaKernels = cudaBackendRegistry;
    rows.push_back(std::move(row));
  };
  auto addStep = step("add", nlohmann::json::object());
  addStep->in({7, 33}, bf16).in({33}, bf16).out({7, 33}, bf16);
  add(addStep, 0.0);
  auto gelu = step("gelu_tanh", nlohmann::json::object());
  gelu->in({500}, bf16).out({500}, bf16);
  add(gelu, 1e-6);
  auto norm = step("rms_norm", {{"eps", 1e-6}});
  norm->in({5, 96}, bf16).in({96}, bf16).out({5, 96}, bf16);
  add(norm, 2e-6);
  auto softmax = step("softmax", {{"axis", -1}});
  softmax->in({6, 40}, bf16).out({6, 40}, bf16);
  add(softmax, 1e-6);
  auto normBackward = step("rms_norm_backward", {{"eps", 1e-6}});
  normBackward->in({5, 96}, bf16).in({5, 96}, bf16).in({96}, bf16).out({5, 96}, bf16).out({96}, bf16);
  add(normBackward, 1e-6);
}

// Every row of every family, in the order the families are listed.
const std::vector<KernelCase>& kernelTable() {
  static const std::vector<KernelCase> rows = [] {
    std::vector<KernelCase> table;
    addRmsNormRows(table);
    addSoftmaxRows(table);
    addBinaryRows(table);
    addUnaryRows(table);
    addMatmulRows(table);
    addCompareRows(table);
    addSelectRows(table);
    addMoePermuteRows(table);
    addMoeRouteRows(table);
    addMoeRouteBackwardRows(table);
    addCanvasSampleRows(table);
    addRandomRows(table);
    addAdamwRows(table);
    addReduceRows(table);
    addRopeRows(table);
    addGatherRows(table);
    addLayoutRows(table);
    addCastRows(table);
    addDequantizeRows(table);
    addFillRows(table);
    addAttentionRows(table, false);
    addAttentionRows(table, true);
    addCrossEntropyRows(table, false);
    addCrossEntropyRows(table, true);
    addRmsNormBackwardRows(table);
    addMoeExpertsRows(table);
    addMoeExpertsLoraRows(table);
    addMoeDispatchRows(table);
    addMoeLocalExpertsRows(table);
    addFusedElementwiseRows(table);
    addBf16WideningRows(table);
    addMatmulBf16Rows(table);
    return table;
  }();
  return rows;
}

std::vector<std::string> tableFamilies() {
  std::vector<std::string> families;
  for (const KernelCase& row : kernelTable())
    if (std::find(families.begin(), families.end(), row.family) == families.end()) families.push_back(row.family);
  return families;
}

// ---- the harness on the table ------------------------------------------------------------------------

class CudaVsCpu : public testing::TestWithParam<std::string> {};

TEST_P(CudaVsCpu, Rows) {
  REQUIRE_CUDA_BACKEND();
  for (const KernelCase& row : kernelTable())
    if (row.family == GetParam()) runRow(row);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaVsCpu, testing::ValuesIn(tableFamilies()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// Without a device too, so that a mistake in the table shows on any machine: both registries accept
// every row's step, the inputs fill its buffers, and the reference run, compared with itself, passes
// every check (the tolerances evaluate, the outputs' encodings fit). Rows of more than 2^22 input
// elements only build their kernels and inputs.
class KernelTable : public testing::TestWithParam<std::string> {};

TEST_P(KernelTable, RowsAreWellFormed) {
  for (const KernelCase& row : kernelTable()) {
    if (row.family != GetParam()) continue;
    SCOPED_TRACE(row.what);
    // A row with its own reference run (a bf16 step against the f32 CPU kernel) checks its CPU
    // kernel by running it.
    if (!row.reference) {
      EXPECT_NO_THROW(makeKernel(row.cpuKernels(), *row.setup));
    }
    EXPECT_NO_THROW(makeKernel(row.cudaKernels(), *row.setup));
    const Buffers inputs = row.inputs();
    ASSERT_EQ(inputs.size(), row.setup->inputs.size());
    int64_t elements = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_GE(inputs[i].size() * sizeof(float), row.setup->inputs[i]->bytes()) << "input " << i;
      elements += static_cast<int64_t>(inputs[i].size());
    }
    if (elements > (int64_t{1} << 22)) continue;
    const Buffers expected = referenceRun(row, inputs);
    Buffers itself = expected;
    for (size_t k = 0; k < row.checks.size() && k < itself.size(); ++k)
      if (row.checks[k].kind == OutputCheck::Kind::Bf16AgainstF32) itself[k] = bf16Bytes(expected[k]);
    compareOutputs(row, inputs, expected, itself);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, KernelTable, testing::ValuesIn(tableFamilies()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// Every CUDA kernel has a CPU twin and rows in the table.
TEST(CudaKernelFactories, EveryCudaKernelHasACpuTwinAndTableRows) {
  std::set<std::string> covered;
  for (const KernelCase& row : kernelTable()) covered.insert(row.setup->step.op);
  for (const std::string& name : cudaRegistry().names()) {
    EXPECT_NE(cpuRegistry().find(name), nullptr) << name;
    EXPECT_TRUE(covered.contains(name)) << name << " has no row in the CUDA-against-CPU table";
  }
}

// The host arena's calls (--optimizer-offload): pinned host memory, copies across it on a stream,
// and the backend's host adamw (the CPU kernel), which equals its device adamw bit for bit.
TEST(CudaBackend, HostArenaRoundTripAndHostAdamw) {
  REQUIRE_CUDA_BACKEND();
  Backend& backend = *sharedBackend().backend;
  ASSERT_NE(backend.hostKernels(), nullptr);
  backend.prepareStreams(1, 0);
  const int64_t count = 100003;
  const uint64_t bytes = count * sizeof(float);
  EXPECT_THROW(backend.allocateHost(bytes, 8192), RuntimeError);  // past a page
  float* host = static_cast<float*>(backend.allocateHost(bytes, 64));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(host) % 64, 0u);
  void* device = backend.allocate(bytes, 256);
  const std::vector<float> source = randomFloats(count, 11);
  std::vector<float> back(count, -1.0f);
  ExecContext stream = backend.context(0);
  backend.copyToDevice(device, source.data(), bytes);
  backend.copyDeviceToHost(stream, host, device, bytes);
  backend.synchronize();
  EXPECT_EQ(std::memcmp(host, source.data(), bytes), 0) << "device -> pinned host";
  for (int64_t i = 0; i < count; ++i) host[i] = -host[i];
  backend.copyHostToDevice(stream, device, host, bytes);
  backend.synchronize();
  backend.copyToHost(back.data(), device, bytes);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(back[i], -source[i]) << "pinned host -> device, element " << i;
  backend.deallocate(device);
  backend.deallocateHost(host);
  EXPECT_THROW(backend.deallocateHost(host), RuntimeError);
  backend.deallocateHost(nullptr);

  // The host registry's adamw (the CPU kernel) on the same inputs equals the device's bit for bit.
  auto setup = step("adamw", {{"beta1", 0.9}, {"beta2", 0.95}, {"epsilon", 1e-8}, {"weight_decay", 0.1}});
  for (int i = 0; i < 4; ++i) setup->in({count});
  for (int i = 0; i < 4; ++i) setup->in({});
  setup->out({count}).out({count}).out({count});
  const Buffers inputs = {randomFloats(count, 1),
                          randomFloats(count, 2, -1e-2f, 1e-2f),
                          randomFloats(count, 3, -1e-3f, 1e-3f),
                          randomFloats(count, 4, 0.0f, 1e-5f),
                          {0.5f},
                          {3e-4f},
                          {0.4095f},
                          {0.0975f}};
  const Buffers onHost = runCpu(*setup, inputs, *backend.hostKernels());
  const Buffers onDevice = runGpu(*setup, inputs, backend.kernels());
  ASSERT_EQ(onHost.size(), 3u);
  for (size_t i = 0; i < onHost.size(); ++i)
    EXPECT_EQ(std::memcmp(onHost[i].data(), onDevice[i].data(), onHost[i].size() * sizeof(float)), 0) << "output " << i;
}

// ---- errors: the CUDA kernels raise the CPU kernels' run-time errors, word for word -------------------

// An id outside [0, V) is the CPU kernel's RuntimeError, word for word, before any output is written.
TEST(CudaKernelErrors, CrossEntropyIdsOutsideTheVocabulary) {
  REQUIRE_CUDA_BACKEND();
  const CrossEntropyGpuCase c{5, 10, 0.0, true, false};
  const std::vector<float> logits = randomFloats(c.rows * c.vocabulary, 9), bonus = randomFloats(c.rows, 10);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> idSets = {
      {{1, 2, 10, 3, -1}, {0, 0, 0, 0, 0}},   // targets 10 (row 2) and -1: the first is named
      {{1, 2, 3, 4, 5}, {0, 11, 0, -7, 0}},   // bonus ids
      {{1, 2, 3, 4, -3}, {0, 0, 12, 0, 0}},   // both: the targets are checked first
  };
  for (const auto& [targets, bonusIds] : idSets) {
    const std::vector<std::vector<float>> inputs = {logits, int32Bytes(targets), int32Bytes(bonusIds), bonus};
    const StepSetup setup = crossEntropySetup(c, DType::F32, false);
    std::string cpuMessage, gpuMessage;
    try {
      runCpu(setup, inputs);
    } catch (const RuntimeError& error) {
      cpuMessage = error.what();
    }
    try {
      runGpu(setup, inputs);
    } catch (const RuntimeError& error) {
      gpuMessage = error.what();
    }
    EXPECT_FALSE(cpuMessage.empty());
    EXPECT_EQ(gpuMessage, cpuMessage);
  }
}

// The CPU kernel's error for an index outside the experts, word for word.
TEST(CudaKernelErrors, MoeDispatchIndexOutsideTheExperts) {
  REQUIRE_CUDA_BACKEND();
  const int64_t tokens = 37, topK = 3, peers = 4, localExperts = 2;
  std::vector<int64_t> indices = dispatchIndices();
  StepSetup setup("moe_dispatch", {{"num_experts", peers * localExperts}});
  setup.in({tokens, topK}, DType::I64).out({tokens, topK}, DType::I64).out({peers}, DType::I64);
  setup.out({peers, localExperts}, DType::I64);
  indices[40] = peers * localExperts;
  std::string cpuMessage, gpuMessage;
  try {
    runCpu(setup, {int64Bytes(indices)});
  } catch (const RuntimeError& error) {
    cpuMessage = error.what();
  }
  try {
    runGpu(setup, {int64Bytes(indices)});
  } catch (const RuntimeError& error) {
    gpuMessage = error.what();
  }
  EXPECT_NE(cpuMessage.find("is outside [0, num_experts = 8)"), std::string::npos) << cpuMessage;
  EXPECT_EQ(gpuMessage, cpuMessage);
}

// A negative expert index: the CPU kernel's error, word for word, before y is written.
TEST(CudaKernelErrors, MoeExpertsNegativeIndex) {
  REQUIRE_CUDA_BACKEND();
  const ExpertsGpuCase c{3, 8, 2, 2, 4, 0};
  const std::vector<std::vector<float>> inputs = {randomFloats(24, 1), randomFloats(6, 2), int64Bytes({0, 1, 1, -3, 0, 0}),
                                                  randomFloats(2 * 8 * 8, 3), randomFloats(2 * 8 * 4, 4)};
  std::string cpuMessage, gpuMessage;
  try {
    runCpu(expertsSetup(c, false), inputs);
  } catch (const RuntimeError& error) {
    cpuMessage = error.what();
  }
  try {
    runGpu(expertsSetup(c, false), inputs);
  } catch (const RuntimeError& error) {
    gpuMessage = error.what();
  }
  EXPECT_NE(cpuMessage.find("is negative"), std::string::npos) << cpuMessage;
  EXPECT_EQ(gpuMessage, cpuMessage);
}

TEST(CudaKernelFactories, AttentionAndCrossEntropyTakeF32AndBf16) {
  const KernelRegistry& r = cudaRegistry();
  const AttentionGpuCase a{1, 4, 4, 2, 1, 8, 8, "causal", 0, 0};
  const CrossEntropyGpuCase ce{3, 17, 0.0, false, true};
  for (bool backward : {false, true}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      EXPECT_NO_THROW(makeKernel(r, attentionSetup(a, dtype, backward)));
      EXPECT_NO_THROW(makeKernel(r, crossEntropySetup(ce, dtype, backward)));
      EXPECT_TRUE(r.traits(backward ? "attention_backward" : "attention").handlesReducedFloats);
    }
    EXPECT_THROW(makeKernel(r, attentionSetup(a, DType::F64, backward)), InputError);
    EXPECT_THROW(makeKernel(r, crossEntropySetup(ce, DType::F16, backward)), InputError);
  }
  // Heads too wide for the shared memory of even one query and one key: a plan error, not a launch failure.
  EXPECT_THROW(makeKernel(r, attentionSetup({1, 4, 4, 1, 1, 1 << 14, 1 << 14, "causal", 0, 0}, DType::F32, false)),
               InputError);
}

// The backend's registry keeps the kernels that handle bf16 themselves and widens the others; bf16
// steps that the f32 factories reject are accepted there, f16 ones still are not.
TEST(CudaKernelFactories, BackendRegistryTakesBf16ForEveryArithmeticKernel) {
  const KernelRegistry backend = cudaBackendKernels();
  EXPECT_EQ(backend.names(), cudaRegistry().names());
  EXPECT_THROW(makeKernel(cudaRegistry(), StepSetup("gelu_tanh", {}).in({4}, DType::BF16).out({4}, DType::BF16)), InputError);
  EXPECT_NO_THROW(makeKernel(backend, StepSetup("gelu_tanh", {}).in({4}, DType::BF16).out({4}, DType::BF16)));
  EXPECT_NO_THROW(makeKernel(
      backend,
      StepSetup("matmul", kUntransposed).in({2, 3}, DType::BF16).in({3, 4}, DType::BF16).out({2, 4}, DType::BF16)));
  EXPECT_THROW(makeKernel(backend, StepSetup("gelu_tanh", {}).in({4}, DType::F16).out({4}, DType::F16)), InputError);
  EXPECT_TRUE(backend.traits("fused_elementwise").handlesReducedFloats);
  // matmul's bf16 steps go to its own cuBLASLt kernel, never to the widened sgemm.
  EXPECT_TRUE(backend.traits("matmul").handlesReducedFloats);
  EXPECT_NO_THROW(makeKernel(cudaRegistry(), StepSetup("matmul", {{"transpose_a", true}, {"transpose_b", false}})
                                                 .in({2, 3, 2}, DType::BF16)
                                                 .in({2, 3, 4}, DType::BF16)
                                                 .out({2, 2, 4}, DType::BF16)));
  EXPECT_THROW(
      makeKernel(
          backend,
          StepSetup("matmul", kUntransposed).in({2, 3}, DType::F16).in({3, 4}, DType::F16).out({2, 4}, DType::F16)),
      InputError);
  EXPECT_NO_THROW(makeKernel(
      backend, StepSetup("matmul", kUntransposed).in({2, 3}, DType::BF16).in({3, 4}, DType::BF16).out({2, 4})));
  EXPECT_THROW(
      makeKernel(backend,
                 StepSetup("matmul", kUntransposed).in({2, 3}, DType::BF16).in({3, 4}).out({2, 4}, DType::BF16)),
      InputError);  // a bf16, b f32
  EXPECT_THROW(makeKernel(backend, StepSetup("matmul", kUntransposed).in({2, 3}).in({3, 4}).out({2, 4}, DType::BF16)),
               InputError);  // f32 a and b, bf16 c
  EXPECT_NO_THROW(makeKernel(backend, StepSetup("fused_elementwise", {{"program", "gelu_tanh bf16 0; mul bf16 2 1"}})
                                          .in({3, 4}, DType::BF16)
                                          .in({3, 4}, DType::BF16)
                                          .out({3, 4}, DType::BF16)));
}

}  // namespace
}  // namespace dgemma
