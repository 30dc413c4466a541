// RUN: dgemma-opt %s --dg-lora="rank=2 alpha=4 targets=experts" --split-input-file --verify-diagnostics | FileCheck %s
// RUN: dgemma-opt %s --dg-lora="rank=2 alpha=4 targets=experts.down_proj" --split-input-file --verify-diagnostics | FileCheck %s --check-prefix=DOWN
// RUN: not dgemma-opt %s --dg-lora="rank=2 alpha=4 targets=experts dropout=0.1" 2>&1 | FileCheck %s --check-prefix=DROPOUT

// The routed experts (target `experts`): per-expert A and B for gate_up_proj ([E, r, H] uniform
// over ±1/√H, [E, 2I, r] zeros) and down_proj ([E, r, I] uniform over ±1/√I, [E, H, r] zeros), cast
// to the step's dtype and handed to dg.moe_experts with lora_scale = alpha / r; the base is frozen.
func.func @experts() attributes {dg.entry = "forward", dg.bucket = {}} {
  %x = dg.input "x" : tensor<3x8xbf16>
  %w = dg.input "weights" : tensor<3x2xf32>
  %i = dg.input "indices" : tensor<3x2xi64>
  %gu = dg.param "model.decoder.layers.1.experts.gate_up_proj" {dg.role = "experts"} : tensor<4x6x8xf32>
  %gu16 = dg.cast %gu : tensor<4x6x8xf32> -> tensor<4x6x8xbf16>
  %d = dg.param "model.decoder.layers.1.experts.down_proj" {dg.role = "experts"} : tensor<4x8x3xf32>
  %d16 = dg.cast %d : tensor<4x8x3xf32> -> tensor<4x8x3xbf16>
  %y = dg.moe_experts %x, %w, %i, %gu16, %d16 : tensor<3x8xbf16>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xbf16>, tensor<4x8x3xbf16> -> tensor<3x8xbf16>
  dg.output "y", %y : tensor<3x8xbf16>
  return
}
// CHECK-LABEL: func.func @experts()
// CHECK: dg.param "model.decoder.layers.1.experts.gate_up_proj" {dg.frozen_base, dg.role = "experts", trainable = false}
// CHECK: dg.param "model.decoder.layers.1.experts.down_proj" {dg.frozen_base, dg.role = "experts", trainable = false}
// CHECK: %[[A1:.*]] = dg.param "model.decoder.layers.1.experts.gate_up_proj.lora_A" {dg.role = "experts", init = {bound = 0.35355339059327373 : f64, kind = "uniform"}} : tensor<4x2x8xf32>
// CHECK: %[[B1:.*]] = dg.param "model.decoder.layers.1.experts.gate_up_proj.lora_B" {dg.role = "experts", init = {kind = "zeros"}} : tensor<4x6x2xf32>
// CHECK: %[[A1C:.*]] = dg.cast %[[A1]] : tensor<4x2x8xf32> -> tensor<4x2x8xbf16>
// CHECK: %[[B1C:.*]] = dg.cast %[[B1]] : tensor<4x6x2xf32> -> tensor<4x6x2xbf16>
// CHECK: %[[A2:.*]] = dg.param "model.decoder.layers.1.experts.down_proj.lora_A" {dg.role = "experts", init = {bound = 0.57735026918962584 : f64, kind = "uniform"}} : tensor<4x2x3xf32>
// CHECK: %[[B2:.*]] = dg.param "model.decoder.layers.1.experts.down_proj.lora_B" {dg.role = "experts", init = {kind = "zeros"}} : tensor<4x8x2xf32>
// CHECK: %[[A2C:.*]] = dg.cast %[[A2]]
// CHECK: %[[B2C:.*]] = dg.cast %[[B2]]
// CHECK: dg.moe_experts %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} lora_gate_up(%[[A1C]], %[[B1C]] : tensor<4x2x8xbf16>, tensor<4x6x2xbf16>) lora_down(%[[A2C]], %[[B2C]] : tensor<4x2x3xbf16>, tensor<4x8x2xbf16>) {lora_scale = 2.000000e+00 : f64}
// DOWN-LABEL: func.func @experts()
// DOWN-NOT: gate_up_proj.lora
// DOWN: dg.param "model.decoder.layers.1.experts.down_proj.lora_A"
// DOWN: dg.moe_experts %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} lora_down(%{{.*}}, %{{.*}} : tensor<4x2x3xbf16>, tensor<4x8x2xbf16>) {lora_scale = 2.000000e+00 : f64}

// The routed experts' adapters take no dropout, as PEFT's parameter targets do not.
// DROPOUT: dg-lora: target 'experts.down_proj': the routed experts' adapters take no dropout
