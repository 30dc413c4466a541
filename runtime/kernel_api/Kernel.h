// The kernel API shared by every backend. A kernel is looked up by the step's name in the backend's
// registry; its factory checks the step's attributes, dtypes and shapes once, when the plan is loaded
// (errors there are plan errors, exit 2), through the op's contract (runtime/kernels/<op>/Contract.h),
// and returns an object that runs the step many times.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plan/Plan.h"

namespace dgemma {

class ThreadPool;

// A buffer as a kernel sees it: device (or host, for the CPU backend) pointer plus its plan metadata.
struct TensorRef {
  void* data = nullptr;
  const Buffer* buffer = nullptr;

  DType dtype() const { return buffer->dtype; }
  const std::vector<int64_t>& shape() const { return buffer->shape; }
  int64_t numElements() const { return buffer->numElements(); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

// What a kernel may use while it runs: the stream it was scheduled on (a cudaStream_t for CUDA,
// unused on CPU) and the backend's worker threads.
struct ExecContext {
  int64_t stream = 0;
  void* streamHandle = nullptr;
  ThreadPool* threads = nullptr;
  void* backendState = nullptr;  // backend-specific handles (e.g. the cuBLAS handle)
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(ExecContext& context, const std::vector<TensorRef>& inputs,
                   const std::vector<TensorRef>& outputs) = 0;
};

// What a factory sees at plan-load time. `where` prefixes error messages ("plan.dgplan: entry
// forward: step 3 (matmul at demo.mlir:4:8)").
struct KernelSignature {
  const Step* step = nullptr;
  std::vector<const Buffer*> inputs;
  std::vector<const Buffer*> outputs;
  std::string where;
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(const KernelSignature&)>;

// What code other than a kernel's own factory needs to know about the kernel, stated where the kernel
// is registered (docs/kernels.md) rather than kept as lists of kernel names.
struct KernelTraits {
  // The kernel copies, rearranges or converts element bits without arithmetic on them, so it is exact
  // for every dtype: the CPU backend runs it on 16-bit floats as they are instead of widening to f32.
  bool movesBitsOnly = false;
  // The kernel reads and writes its 16-bit float buffers itself (rounding once, to nearest even), so
  // the CPU backend hands them over as they are: widening would allocate the f32 twin that a fused
  // kernel exists to avoid (canvas_sample's [B, L, V] scaled logits).
  bool handlesReducedFloats = false;
};

class KernelRegistry {
 public:
  void add(const std::string& name, KernelFactory factory, KernelTraits traits = {});
  const KernelFactory* find(const std::string& name) const;
  // The traits `name` was registered with; a name that is not registered is a programming error.
  const KernelTraits& traits(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  struct Registration {
    KernelFactory factory;
    KernelTraits traits;
  };
  std::map<std::string, Registration> kernels_;
};

// Helpers for factories: throw InputError prefixed with signature.where.
[[noreturn]] void failSignature(const KernelSignature& signature, const std::string& message);
void expectArity(const KernelSignature& signature, size_t inputs, size_t outputs);
void expectArityRange(const KernelSignature& signature, size_t minInputs, size_t maxInputs, size_t outputs);
void expectDType(const KernelSignature& signature, const Buffer& buffer, std::initializer_list<DType> allowed,
                 const std::string& role);
void expectShape(const KernelSignature& signature, const Buffer& buffer, const std::vector<int64_t>& expected,
                 const std::string& role);
// A buffer of `rank` dims; `layout` ("[N, E]") names them in the error.
void expectRank(const KernelSignature& signature, const Buffer& buffer, size_t rank, const std::string& role,
                const std::string& layout);
// Buffers that share one dtype, checked in order: the first of one of `dtypes`, the others of its
// dtype. Returns that dtype.
DType expectSharedDType(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                        std::initializer_list<std::pair<const Buffer*, std::string>> buffers);
// The opening most contracts share, checked in this order: the arity, input x (a) of one of
// `dtypes`, then the others of x's (a's) dtype. The buffers are named "input x", "output y" (and
// "input a", "input b", "output c") in errors.
struct UnaryOperands {
  const Buffer& x;
  const Buffer& y;
};
enum class OutputShape { Free, SameAsInput };
// x -> y; y of x's shape when `shape` says so.
UnaryOperands expectUnaryOperands(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                  OutputShape shape);
// The same for kernels that move elements of any dtype.
UnaryOperands expectUnaryOperands(const KernelSignature& signature, OutputShape shape);

struct BinaryOperands {
  const Buffer& a;
  const Buffer& b;
  const Buffer& c;
};
// (a, b) -> c; c of `outputDType`, or of a's when unset.
BinaryOperands expectBinaryOperands(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                    std::optional<DType> outputDType = std::nullopt);

// Whether the step carries the attribute (for optional attributes without a default).
bool hasAttr(const KernelSignature& signature, const std::string& key);
// The step's attributes, each required: the plan carries every attribute of the op, defaults
// included, so no kernel holds a copy of a default (docs/plan-format.md, "Header").
double attrDouble(const KernelSignature& signature, const std::string& key);
int64_t attrInt(const KernelSignature& signature, const std::string& key);
bool attrBool(const KernelSignature& signature, const std::string& key);
std::vector<int64_t> attrInts(const KernelSignature& signature, const std::string& key);
// A mode's name ("predicate", "reduction").
std::string attrString(const KernelSignature& signature, const std::string& key);

}  // namespace dgemma
