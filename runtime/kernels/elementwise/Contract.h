// The contracts of the elementwise kernels (docs/kernels.md), parsed once for every backend:
//   binary (add sub mul div maximum minimum): (a, b) -> c, NumPy broadcasting, one float dtype
//   compare {predicate}: (a, b) -> c of bool, broadcasting
//   select: (condition of bool, on_true, on_false) -> y of on_true's dtype, broadcasting
//   unary maps (neg exp log tanh sqrt rsqrt gelu_tanh): x -> y, same shape and float dtype
//   copy: x -> y, same shape and dtype (any)
//   fill {value}: () -> y, value representable in y's dtype
//   cast: x -> y, same shape, any dtypes except float to integer
// The parse functions throw InputError for anything their contract does not admit; `dtypes` are the
// float types the calling backend implements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct BinaryContract {
  DType dtype = DType::F32;    // of a and b
  std::vector<int64_t> shape;  // the broadcast of the inputs: c's shape
  bool sameShapes = false;     // no input broadcasts
};

// c has dtype `output`, or a's when unset.
BinaryContract parseBinaryContract(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                   std::optional<DType> output = std::nullopt);

enum class ComparePredicate { Less, LessEqual, Greater, GreaterEqual, Equal, NotEqual };

struct CompareContract {
  ComparePredicate predicate = ComparePredicate::Equal;
  BinaryContract operands;
};

CompareContract parseCompareContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

struct SelectContract {
  DType dtype = DType::F32;    // of on_true, on_false and y
  std::vector<int64_t> shape;  // the broadcast of the inputs: y's shape
};

SelectContract parseSelectContract(const KernelSignature& signature);

struct UnaryContract {
  DType dtype = DType::F32;
  int64_t count = 0;  // elements of x
};

UnaryContract parseUnaryContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

struct CopyContract {
  uint64_t bytes = 0;
};

CopyContract parseCopyContract(const KernelSignature& signature);

struct FillContract {
  DType dtype = DType::F32;  // y's
  double value = 0;          // representable in dtype (integers and bool exactly)
};

FillContract parseFillContract(const KernelSignature& signature);

struct CastContract {
  DType from = DType::F32, to = DType::F32;
};

CastContract parseCastContract(const KernelSignature& signature);

// The names of the binary and unary maps that every backend implements, kept in one place: a backend
// passes its functors for them, in this order, to registerMapKernels.
inline constexpr const char* kBinaryMapNames[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
inline constexpr const char* kUnaryMapNames[] = {"neg", "exp", "log", "tanh", "sqrt", "rsqrt", "gelu_tanh"};

// Registers factoryOf(Op{}), a KernelFactory, under names[i] for the i-th functor type of `Ops`.
template <typename... Ops, size_t N, typename FactoryOf>
void registerMapKernels(KernelRegistry& registry, const char* const (&names)[N], FactoryOf factoryOf) {
  static_assert(sizeof...(Ops) == N, "one functor per map name");
  size_t next = 0;
  (registry.add(names[next++], factoryOf(Ops{})), ...);
}

}  // namespace dgemma
