// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-recompute="policy=full:0"
// dg-recompute refuses a policy it does not know, naming the accepted forms; the dialect refuses a
// layer marker that is not a layer index (before the pass runs).

module {
  // expected-error @+1 {{dg-recompute: policy 'full:0': expected none, full, full:N (N >= 1) or selective}}
  func.func @step() attributes {dg.entry = "train_step"} {
    return
  }
}

// -----

func.func @negative_layer() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  // expected-error @+1 {{'dg.layer_begin' must be a layer index (an i64 >= 0)}}
  %a = dg.exp %x {dg.layer_begin = -1 : i64} : tensor<4xf32>
  dg.output "loss", %a : tensor<4xf32>
  return
}
