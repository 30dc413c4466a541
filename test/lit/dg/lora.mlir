// RUN: dgemma-opt %s --dg-lora="rank=2 alpha=4 targets=q_proj,o_proj" --split-input-file --verify-diagnostics | FileCheck %s

// q_proj (column-parallel) gets A [2, 8] (replicated) and B [6, 2] (split like the weight's rows); the
// bf16 step reads both through casts of their f32 masters and adds (x A^T) B^T * 2 to the matmul.
// o_proj (row-parallel) gets A split like its input. Every other weight is frozen.
func.func @forward() attributes {dg.entry = "forward", dg.bucket = {}} {
  %x = dg.input "x" : tensor<3x8xbf16>
  %qw = dg.param "model.decoder.layers.0.self_attn.q_proj.weight" {dg.role = "column"} : tensor<6x8xf32>
  %q16 = dg.cast %qw : tensor<6x8xf32> -> tensor<6x8xbf16>
  %q = dg.matmul %x, %q16 {transpose_b = true} : tensor<3x8xbf16>, tensor<6x8xbf16> -> tensor<3x6xbf16>
  %ow = dg.param "model.decoder.layers.0.self_attn.o_proj.weight" {dg.role = "row"} : tensor<8x6xf32>
  %o16 = dg.cast %ow : tensor<8x6xf32> -> tensor<8x6xbf16>
  %o = dg.matmul %q, %o16 {transpose_b = true} : tensor<3x6xbf16>, tensor<8x6xbf16> -> tensor<3x8xbf16>
  %nw = dg.param "model.decoder.norm.weight" {dg.role = "replicated"} : tensor<8xf32>
  %n16 = dg.cast %nw : tensor<8xf32> -> tensor<8xbf16>
  %y = dg.mul %o, %n16 : tensor<3x8xbf16>, tensor<8xbf16> -> tensor<3x8xbf16>
  dg.output "y", %y : tensor<3x8xbf16>
  return
}
// CHECK-LABEL: func.func @forward()
// CHECK: %[[X:.*]] = dg.input "x"
// CHECK: %[[QW:.*]] = dg.param "model.decoder.layers.0.self_attn.q_proj.weight" {dg.frozen_base, dg.role = "column", trainable = false}
// CHECK: %[[QA:.*]] = dg.param "model.decoder.layers.0.self_attn.q_proj.lora_A.weight" {dg.role = "replicated", init = {bound = 0.35355339059327373 : f64, kind = "uniform"}} : tensor<2x8xf32>
// CHECK: %[[QB:.*]] = dg.param "model.decoder.layers.0.self_attn.q_proj.lora_B.weight" {dg.role = "column", init = {kind = "zeros"}} : tensor<6x2xf32>
// CHECK: %[[QA16:.*]] = dg.cast %[[QA]] : tensor<2x8xf32> -> tensor<2x8xbf16>
// CHECK: %[[QB16:.*]] = dg.cast %[[QB]] : tensor<6x2xf32> -> tensor<6x2xbf16>
// CHECK: %[[Q:.*]] = dg.matmul %[[X]], %{{.*}} {transpose_b = true}
// CHECK: %[[T:.*]] = dg.matmul %[[X]], %[[QA16]] {transpose_b = true} : tensor<3x8xbf16>, tensor<2x8xbf16> -> tensor<3x2xbf16>
// CHECK: %[[U:.*]] = dg.matmul %[[T]], %[[QB16]] {transpose_b = true} : tensor<3x2xbf16>, tensor<6x2xbf16> -> tensor<3x6xbf16>
// CHECK: %[[S:.*]] = dg.fill 2.000000e+00 : tensor<bf16>
// CHECK: %[[SU:.*]] = dg.mul %[[U]], %[[S]]
// CHECK: %[[QSUM:.*]] = dg.add %[[Q]], %[[SU]]
// CHECK: dg.param "model.decoder.layers.0.self_attn.o_proj.lora_A.weight" {dg.role = "row"
// CHECK: dg.param "model.decoder.layers.0.self_attn.o_proj.lora_B.weight" {dg.role = "replicated"
// CHECK: dg.matmul %[[QSUM]], %{{.*}} {transpose_b = true}
// CHECK: dg.matmul %[[QSUM]], %{{.*}} {transpose_b = true} : tensor<3x6xbf16>, tensor<2x6xbf16> -> tensor<3x2xbf16>
// CHECK: dg.param "model.decoder.norm.weight" {dg.frozen_base, dg.role = "replicated", trainable = false}

// -----

// A target that matches no weight of the model is an error, not a plan without adapters.
// expected-error @+1 {{dg-lora: target 'o_proj' matches no weight of the model}}
module {
func.func @forward() attributes {dg.entry = "forward", dg.bucket = {}} {
  %x = dg.input "x" : tensor<3x8xf32>
  %qw = dg.param "model.decoder.layers.0.self_attn.q_proj.weight" {dg.role = "column"} : tensor<6x8xf32>
  %q = dg.matmul %x, %qw {transpose_b = true} : tensor<3x8xf32>, tensor<6x8xf32> -> tensor<3x6xf32>
  dg.output "q", %q : tensor<3x6xf32>
  return
}
}

