// RUN: dgemma-opt %s --dg-autodiff --canonicalize | FileCheck %s

// Autodiff over a frozen base (non-trainable gate_up and down) with per-expert adapters: after
// canonicalization the backward computes only the adapters' gradients, the input's and the routing
// weights', never the base's (docs/training.md, "LoRA adapters").


// CHECK-LABEL: func.func @frozen_base
// CHECK: %[[Y:.*]] = dg.moe_experts {{.*}} lora_gate_up({{.*}}) lora_down({{.*}}) {lora_scale = 2.000000e+00 : f64}
// CHECK: %[[DX:.*]], %{{.*}}, %[[DA1:.*]], %[[DB1:.*]], %[[DA2:.*]], %[[DB2:.*]] = dg.moe_experts_backward
// CHECK-SAME: -> tensor<3x8xf32>, tensor<3x2xf32> grad_lora_gate_up(tensor<4x2x8xf32>, tensor<4x6x2xf32>) grad_lora_down(tensor<4x2x3xf32>, tensor<4x8x2xf32>)
// CHECK-NOT: grad_gate_up tensor
// CHECK-DAG: dg.output "grad/experts.gate_up_proj.lora_A", %[[DA1]]
// CHECK-DAG: dg.output "grad/experts.gate_up_proj.lora_B", %[[DB1]]
// CHECK-DAG: dg.output "grad/experts.down_proj.lora_A", %[[DA2]]
// CHECK-DAG: dg.output "grad/experts.down_proj.lora_B", %[[DB2]]
// CHECK-NOT: "grad/experts.gate_up_proj"
// CHECK-NOT: "grad/experts.down_proj"
func.func @frozen_base() attributes {dg.entry = "train_step"} {
  %x = dg.param "x" : tensor<3x8xf32>
  %w = dg.input "weights" : tensor<3x2xf32>
  %i = dg.input "indices" : tensor<3x2xi64>
  %gu = dg.param "experts.gate_up_proj" {trainable = false} : tensor<4x6x8xf32>
  %d = dg.param "experts.down_proj" {trainable = false} : tensor<4x8x3xf32>
  %a1 = dg.param "experts.gate_up_proj.lora_A" : tensor<4x2x8xf32>
  %b1 = dg.param "experts.gate_up_proj.lora_B" : tensor<4x6x2xf32>
  %a2 = dg.param "experts.down_proj.lora_A" : tensor<4x2x3xf32>
  %b2 = dg.param "experts.down_proj.lora_B" : tensor<4x8x2xf32>
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_gate_up(%a1, %b1 : tensor<4x2x8xf32>, tensor<4x6x2xf32>) lora_down(%a2, %b2 : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {lora_scale = 2.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<3x8xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}
