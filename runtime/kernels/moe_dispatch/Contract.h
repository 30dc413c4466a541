// The contracts of the expert-parallel dispatch kernels (docs/parallelism.md, "Expert
// parallelism"), parsed once for every backend:
//   moe_dispatch {num_experts}: indices [N, k] i64 -> slots [N, k], send_counts [G],
//       expert_counts [G, num_experts / G], all i64
//   moe_permute: (input [M, ...] of any dtype, slots [M, k] i64) -> [M·k, ...] of input's dtype
//   moe_combine: (rows [M·k, ...], slots [M, k] i64[, weights [M, k]]) -> [M, ...]
//   moe_local_experts: (rows [C, H], expert_counts [G, E] i64, gate_up [E, 2I, H], down [E, H, I])
//       -> [C, H]
//   moe_local_experts_backward: (rows [C, H], weights [C], grad_output [C, H], expert_counts,
//       gate_up, down) -> grad_rows [C, H], grad_weights [C], then grad_gate_up and grad_down where
//       the bool attributes `grad_gate_up` and `grad_down` say (absent: true; false for a frozen
//       base, whose gradients are then neither computed nor stored)
// Every float buffer of one kernel has one dtype.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct MoeDispatchContract {
  int64_t tokens = 0;        // N
  int64_t topK = 0;          // k
  int64_t peers = 0;         // G
  int64_t localExperts = 0;  // experts per peer, num_experts / G
};

// moe_permute and moe_combine: M rows of `rowElements` elements each on the token side, M·k on the
// permuted side.
struct MoePermutationContract {
  DType dtype = DType::F32;
  int64_t tokens = 0;       // M
  int64_t topK = 0;         // k
  int64_t rowElements = 0;  // the product of the trailing dims
  bool weighted = false;    // moe_combine with weights
};

struct MoeLocalExpertsContract {
  DType dtype = DType::F32;
  int64_t rows = 0;          // C, the receive capacity
  int64_t hidden = 0;        // H
  int64_t peers = 0;         // G
  int64_t experts = 0;       // E, the local experts
  int64_t expertHidden = 0;  // I
  // moe_local_experts_backward's outputs of the base gradients, or -1 where not computed.
  int gradGateUpOutput = -1;
  int gradDownOutput = -1;
};

// Each throws InputError for anything its contract does not admit; `dtypes` are the float types the
// calling backend implements.
MoeDispatchContract parseMoeDispatchContract(const KernelSignature& signature);
MoePermutationContract parseMoePermuteContract(const KernelSignature& signature);
MoePermutationContract parseMoeCombineContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
MoeLocalExpertsContract parseMoeLocalExpertsContract(const KernelSignature& signature,
                                                     std::initializer_list<DType> dtypes);
MoeLocalExpertsContract parseMoeLocalExpertsBackwardContract(const KernelSignature& signature,
                                                             std::initializer_list<DType> dtypes);

}  // namespace dgemma
