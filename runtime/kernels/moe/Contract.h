// The contracts of the mixture-of-experts kernels (docs/kernels.md), parsed once for every backend:
//   moe_route {top_k}: (logits [N, E], per_expert_scale [E]) -> weights [N, k], indices [N, k] of i64
//   moe_route_backward {top_k}: (logits, per_expert_scale, indices, dweights [N, k]) -> dlogits [N, E],
//       dscale [E]
//   moe_experts: (x [N, H], weights [N, k], indices [N, k] of i64, gate_up [E, 2I, H], down [E, H, I])
//       -> y [N, H] and optionally gate_up_rows [N·k, 2I]: row n·k + j holds route (n, j)'s gate and up
//       pre-activations x[n] · gate_up[indices[n, j] − expert_offset]ᵀ (gate in columns [0, I), up in
//       [I, 2I), before the GELU), the values the forward's own product computed; a route to an expert
//       this block does not hold gets a zero row
//   moe_experts_backward: moe_experts' inputs, dy [N, H] and optionally gate_up_rows [N·k, 2I] as the
//       forward wrote them (then read instead of recomputed) -> dx, dweights, dgate_up, ddown of the
//       shapes of x, weights, gate_up and down
//   Both experts kernels take the optional attribute `expert_offset` >= 0 (default 0): gate_up and down
//   hold the global experts [expert_offset, expert_offset + E).
//   Per-expert LoRA adapters (docs/kernels.md, "Expert adapters"): the bool attributes `lora_gate_up`
//   and `lora_down` (absent: false) say which pairs follow the inputs above (after gate_up_rows in
//   the backward): A1 [E, r, H], B1 [E, 2I, r] and A2 [E, r, I], B2 [E, H, r], one rank r, with
//   `lora_scale` s (required with a pair). The backward's outputs are dx, dweights, then dgate_up
//   and ddown where the bool attributes `grad_gate_up` and `grad_down` say (absent: true; false for
//   a frozen base, whose gradients are then neither computed nor stored), then dA, dB per pair.
// Every buffer but the indices has the float dtype of the first input.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct MoeRouteContract {
  DType dtype = DType::F32;
  int64_t tokens = 0;   // N
  int64_t experts = 0;  // E
  int64_t topK = 0;     // k, in [1, E]
};

struct MoeExpertsContract {
  DType dtype = DType::F32;
  int64_t tokens = 0;        // N
  int64_t hidden = 0;        // H
  int64_t topK = 0;          // k
  int64_t experts = 0;       // E, the experts this block holds
  int64_t expertHidden = 0;  // I
  int64_t expertOffset = 0;  // the global index of local expert 0
  // moe_experts writes gate_up_rows (its output 1); moe_experts_backward reads them (its input 6).
  bool gateUpRows = false;
  // The adapters: each pair's first input (A, then B), or -1 without it.
  int64_t loraRank = 0;  // r
  double loraScale = 0;  // s = alpha / r
  int loraGateUpInput = -1;
  int loraDownInput = -1;
  // The backward's outputs: each gradient's position, or -1 where it is not computed.
  int gradGateUpOutput = -1;
  int gradDownOutput = -1;
  int gradLoraGateUpOutput = -1;  // dA1, then dB1
  int gradLoraDownOutput = -1;    // dA2, then dB2
};

// Each throws InputError for anything its contract does not admit; `dtypes` are the float types the
// calling backend implements.
MoeRouteContract parseMoeRouteContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
MoeRouteContract parseMoeRouteBackwardContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
MoeExpertsContract parseMoeExpertsContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
MoeExpertsContract parseMoeExpertsBackwardContract(const KernelSignature& signature,
                                                   std::initializer_list<DType> dtypes);

}  // namespace dgemma
