// The contracts of cross_entropy and cross_entropy_backward (docs/kernels.md), parsed once for every
// backend: logits [..., V] of a float dtype, targets [...] of i32 or i64, optionally bonus_ids [...]
// (i32 or i64) and bonus [...] together, attribute `softcap` >= 0 (0: none); then
//   cross_entropy: -> loss [...]
//   cross_entropy_backward: grad_output [...] -> grad_logits [..., V]
// every float buffer of the logits' dtype.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// `rows` positions of `vocabulary` logits each.
struct CrossEntropyContract {
  DType dtype = DType::F32;  // of the logits
  int64_t rows = 0;
  int64_t vocabulary = 0;
  double softcap = 0;  // > 0: the logits are capped inside the kernel
  bool hasBonus = false;
  bool wideTargets = true;   // i64, else i32
  bool wideBonusIds = true;  // i64, else i32
};

// Both throw InputError for anything their contract does not admit; `dtypes` are the float types the
// calling backend implements.
CrossEntropyContract parseCrossEntropyContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
CrossEntropyContract parseCrossEntropyBackwardContract(const KernelSignature& signature,
                                                       std::initializer_list<DType> dtypes);

// The run-time error of a target or bonus id (`role`: "target", "bonus") outside [0, V) at flat
// index `index`, in the same words on every backend.
std::string idOutsideVocabularyMessage(const std::string& where, const std::string& role, int64_t id, int64_t index,
                                       int64_t vocabulary);

}  // namespace dgemma
