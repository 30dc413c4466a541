// RUN: dgemma-opt %s --split-input-file --dg-base-dtype=dtype=bf16 | FileCheck %s --check-prefix=BF16
// RUN: dgemma-opt %s --split-input-file --dg-base-dtype=dtype=int8 | FileCheck %s --check-prefix=INT8
// RUN: dgemma-opt %s --split-input-file --dg-base-dtype=dtype=nf4 | FileCheck %s --check-prefix=NF4
// RUN: dgemma-opt %s --dg-base-dtype=dtype=nf4 --dg-autodiff | FileCheck %s --check-prefix=GRAD
// dg-base-dtype converts exactly the dg.frozen_base parameters: matmul and expert weights to codes and
// scales read through dg.dequantize (int8, nf4), everything else (the embedding, a norm weight) to bf16.

// BF16-LABEL: func.func @step
// BF16-DAG: %[[EMB:.*]] = dg.param "embed.weight" {dg.frozen_base, dg.role = "vocab", trainable = false} : tensor<32x64xbf16>
// BF16-DAG: %[[Q:.*]] = dg.param "q.weight" {dg.frozen_base, dg.role = "column", init = {kind = "normal", std = 2.000000e-02 : f64}, trainable = false} : tensor<128x64xbf16>
// BF16-DAG: %[[NORM:.*]] = dg.param "norm.weight" {dg.frozen_base, init = {kind = "ones"}, trainable = false} : tensor<64xbf16>
// BF16-DAG: %[[NORM32:.*]] = dg.cast %[[NORM]] : tensor<64xbf16> -> tensor<64xf32>
// BF16-DAG: dg.param "lora.weight" : tensor<128x64xf32>
// BF16: dg.gather %[[EMB]]
// BF16: dg.rms_norm %{{.*}}, %[[NORM32]]
// BF16: dg.matmul %{{.*}}, %[[Q]] {transpose_b = true} : tensor<4x64xbf16>, tensor<128x64xbf16>
// BF16: dg.matmul %{{.*}}, %[[EMB]] {transpose_b = true} : tensor<4x64xbf16>, tensor<32x64xbf16>
// BF16-NOT: dg.dequantize

// INT8-LABEL: func.func @step
// INT8-DAG: dg.param "embed.weight" {dg.frozen_base, dg.role = "vocab", trainable = false} : tensor<32x64xbf16>
// INT8-DAG: %[[C:.*]] = dg.param "q.weight" {dg.frozen_base, dg.role = "column", init = {base = {kind = "normal", std = 2.000000e-02 : f64}, format = "int8", kind = "quantized", part = "codes", shape = array<i64: 128, 64>, weight = "q.weight"}, trainable = false} : tensor<128x64xi8>
// INT8-DAG: %[[S:.*]] = dg.param "q.weight.scale" {dg.frozen_base, dg.role = "column", init = {{{.*}}part = "scale", shape = array<i64: 128, 64>, weight = "q.weight"}, trainable = false} : tensor<128xf32>
// INT8: %[[W:.*]] = dg.dequantize %[[C]], %[[S]] format = "int8" : tensor<128x64xi8>, tensor<128xf32> -> tensor<128x64xbf16>
// INT8-NEXT: dg.matmul %{{.*}}, %[[W]] {transpose_b = true} : tensor<4x64xbf16>, tensor<128x64xbf16>

// NF4-LABEL: func.func @step
// NF4-DAG: dg.param "embed.weight" {{.*}} : tensor<32x64xbf16>
// NF4-DAG: dg.param "norm.weight" {{.*}} : tensor<64xbf16>
// NF4-DAG: %[[C:.*]] = dg.param "q.weight" {{.*}}part = "codes"{{.*}} : tensor<128x32xui8>
// NF4-DAG: %[[A:.*]] = dg.param "q.weight.absmax" {{.*}}part = "absmax"{{.*}} : tensor<128x1xf32>
// NF4: %[[W:.*]] = dg.dequantize %[[C]], %[[A]] format = "nf4" : tensor<128x32xui8>, tensor<128x1xf32> -> tensor<128x64xbf16>
// NF4-NEXT: dg.matmul %{{.*}}, %[[W]] {transpose_b = true}

// The adapter is differentiated through the dequantized weight's matmul; the codes get no gradient.
// GRAD-LABEL: func.func @step
// GRAD-DAG: dg.output "grad/lora.weight"
// GRAD-NOT: dg.output "grad/q.weight"
func.func @step() attributes {dg.entry = "step"} {
  %ids = dg.input "ids" : tensor<4xi64>
  %emb = dg.param "embed.weight" {dg.frozen_base, dg.role = "vocab", trainable = false} : tensor<32x64xf32>
  %norm = dg.param "norm.weight" {dg.frozen_base, init = {kind = "ones"}, trainable = false} : tensor<64xf32>
  %q = dg.param "q.weight" {dg.frozen_base, dg.role = "column", init = {kind = "normal", std = 0.02 : f64}, trainable = false} : tensor<128x64xf32>
  %lora = dg.param "lora.weight" : tensor<128x64xf32>
  %emb16 = dg.cast %emb : tensor<32x64xf32> -> tensor<32x64xbf16>
  %x = dg.gather %emb16[%ids] : tensor<32x64xbf16>, tensor<4xi64> -> tensor<4x64xbf16>
  %x32 = dg.cast %x : tensor<4x64xbf16> -> tensor<4x64xf32>
  %n = dg.rms_norm %x32, %norm {eps = 1.0e-6 : f64} : (tensor<4x64xf32>, tensor<64xf32>) -> tensor<4x64xf32>
  %n16 = dg.cast %n : tensor<4x64xf32> -> tensor<4x64xbf16>
  %q16 = dg.cast %q : tensor<128x64xf32> -> tensor<128x64xbf16>
  %h = dg.matmul %n16, %q16 {transpose_b = true} : tensor<4x64xbf16>, tensor<128x64xbf16> -> tensor<4x128xbf16>
  %lora16 = dg.cast %lora : tensor<128x64xf32> -> tensor<128x64xbf16>
  %hl = dg.matmul %n16, %lora16 {transpose_b = true} : tensor<4x64xbf16>, tensor<128x64xbf16> -> tensor<4x128xbf16>
  %sum = dg.add %h, %hl : tensor<4x128xbf16>, tensor<4x128xbf16> -> tensor<4x128xbf16>
  %logits = dg.matmul %n16, %emb16 {transpose_b = true} : tensor<4x64xbf16>, tensor<32x64xbf16> -> tensor<4x32xbf16>
  %s = dg.reduce_sum %sum dims = [0, 1] : tensor<4x128xbf16> -> tensor<bf16>
  %t = dg.reduce_sum %logits dims = [0, 1] : tensor<4x32xbf16> -> tensor<bf16>
  %all = dg.add %s, %t : tensor<bf16>, tensor<bf16> -> tensor<bf16>
  %loss = dg.cast %all : tensor<bf16> -> tensor<f32>
  dg.output "loss", %loss : tensor<f32>
  return
}

// -----

// Expert weights [E, out, in] quantize per expert row; an f32 reader gets an f32 dequantize.
// NF4-LABEL: func.func @experts
// NF4-DAG: %[[GU:.*]] = dg.param "experts.gate_up_proj" {{.*}} : tensor<2x128x32xui8>
// NF4-DAG: %[[GUA:.*]] = dg.param "experts.gate_up_proj.absmax" {{.*}} : tensor<2x128x1xf32>
// NF4-DAG: %[[GUW:.*]] = dg.dequantize %[[GU]], %[[GUA]] format = "nf4" : tensor<2x128x32xui8>, tensor<2x128x1xf32> -> tensor<2x128x64xf32>
// NF4-DAG: %[[DW:.*]] = dg.dequantize %{{.*}}, %{{.*}} format = "nf4" : tensor<2x64x32xui8>, tensor<2x64x1xf32> -> tensor<2x64x64xf32>
// NF4: dg.moe_experts %{{.*}}, %{{.*}}, %{{.*}}, %[[GUW]], %[[DW]]
// INT8-LABEL: func.func @experts
// INT8-DAG: dg.param "experts.down_proj.scale" {{.*}} : tensor<2x64xf32>
func.func @experts() attributes {dg.entry = "experts"} {
  %x = dg.input "x" : tensor<3x64xf32>
  %w = dg.input "w" : tensor<3x2xf32>
  %i = dg.input "i" : tensor<3x2xi64>
  %gate_up = dg.param "experts.gate_up_proj" {dg.frozen_base, dg.role = "experts", trainable = false} : tensor<2x128x64xf32>
  %down = dg.param "experts.down_proj" {dg.frozen_base, dg.role = "experts", trainable = false} : tensor<2x64x64xf32>
  %y = dg.moe_experts %x, %w, %i, %gate_up, %down : tensor<3x64xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x128x64xf32>, tensor<2x64x64xf32> -> tensor<3x64xf32>
  dg.output "y", %y : tensor<3x64xf32>
  return
}
