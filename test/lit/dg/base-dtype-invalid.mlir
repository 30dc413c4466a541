// RUN: dgemma-opt %s --split-input-file --dg-base-dtype=dtype=nf4 --verify-diagnostics
// NF4 blocks of 64 lie within a row: a weight whose rows are not whole blocks is an error naming it.

func.func @partial_block() attributes {dg.entry = "partial_block"} {
  %x = dg.input "x" : tensor<2x96xf32>
  // expected-error @+1 {{the last dimension of 'model.decoder.layers.0.mlp.up_proj.weight' must be a multiple of 64}}
  %w = dg.param "model.decoder.layers.0.mlp.up_proj.weight" {dg.frozen_base, trainable = false} : tensor<8x96xf32>
  %y = dg.matmul %x, %w {transpose_b = true} : tensor<2x96xf32>, tensor<8x96xf32> -> tensor<2x8xf32>
  dg.output "y", %y : tensor<2x8xf32>
  return
}
