// RUN: dgemma-opt %s | dgemma-opt | FileCheck %s --check-prefix=ROUND

// dg.moe_experts and its backward with per-expert LoRA adapters (docs/training.md, "LoRA
// adapters"): the assembly form survives a round trip.

// ROUND-LABEL: func.func @both_pairs
// ROUND: dg.moe_experts %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} lora_gate_up(%{{.*}}, %{{.*}} : tensor<4x2x8xf32>, tensor<4x6x2xf32>) lora_down(%{{.*}}, %{{.*}} : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {lora_scale = 2.000000e+00 : f64}
// ROUND: dg.moe_experts_backward {{.*}} lora_down(%{{.*}}, %{{.*}} : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {expert_offset = 1 : i64, lora_scale = 5.000000e-01 : f64} : {{.*}} -> tensor<3x8xf32>, tensor<3x2xf32> grad_down tensor<4x8x3xf32> grad_lora_down(tensor<4x2x3xf32>, tensor<4x8x2xf32>)
func.func @both_pairs(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>,
                      %a1: tensor<4x2x8xf32>, %b1: tensor<4x6x2xf32>, %a2: tensor<4x2x3xf32>, %b2: tensor<4x8x2xf32>, %dy: tensor<3x8xf32>) {
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_gate_up(%a1, %b1 : tensor<4x2x8xf32>, tensor<4x6x2xf32>) lora_down(%a2, %b2 : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {lora_scale = 2.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  %dx, %dw, %dd, %da2, %db2 = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy lora_down(%a2, %b2 : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {expert_offset = 1 : i64, lora_scale = 0.5 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_down tensor<4x8x3xf32> grad_lora_down(tensor<4x2x3xf32>, tensor<4x8x2xf32>)
  return
}
