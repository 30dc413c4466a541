// RUN: dgemma-opt %s --split-input-file --dg-base-dtype=dtype=nf4 --verify-diagnostics | FileCheck %s
// NF4 blocks of 64 lie within a row: a weight whose rows are not whole blocks stays bf16, with a
// warning naming it.
// expected-warning @below {{dg-base-dtype: 1 weight(s) stay bf16: nf4 quantizes blocks of 64 elements within a row, and their rows are not whole blocks: 'model.decoder.layers.0.mlp.up_proj.weight' (rows of 96)}}
module {

func.func @partial_block() attributes {dg.entry = "partial_block"} {
  %x = dg.input "x" : tensor<2x96xf32>
  %w = dg.param "model.decoder.layers.0.mlp.up_proj.weight" {dg.frozen_base, trainable = false} : tensor<8x96xf32>
  %y = dg.matmul %x, %w {transpose_b = true} : tensor<2x96xf32>, tensor<8x96xf32> -> tensor<2x8xf32>
  dg.output "y", %y : tensor<2x8xf32>
  return
}
}
// CHECK-LABEL: func.func @partial_block()
// CHECK: dg.param "model.decoder.layers.0.mlp.up_proj.weight" {dg.frozen_base, trainable = false} : tensor<8x96xbf16>
