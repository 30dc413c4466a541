// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-shard-annotate="tp=2 dp=2 ep=2 sp=true"
// dg-shard-annotate refuses a parameter or a batch its layout cannot split, naming it.

module {
  func.func @step() attributes {dg.bucket = {micro_batch = 2 : i64}, dg.entry = "train_step"} {
    // expected-error @+1 {{parameter 'odd' (role "column") cannot split dim 0 over 2 ranks: its shape is 'tensor<3x8xf32>'}}
    %odd = dg.param "odd" {dg.role = "column"} : tensor<3x8xf32>
    return
  }
}

// -----

module {
  func.func @step() attributes {dg.bucket = {micro_batch = 3 : i64}, dg.entry = "train_step"} {
    // expected-error @+1 {{input 'input_ids': the bucket's micro_batch 3 is not divisible by the data-parallel size 2}}
    %ids = dg.input "input_ids" : tensor<3x8xi64>
    return
  }
}

// -----

module {
  func.func @step() attributes {dg.entry = "train_step"} {
    // expected-error @+1 {{'dg.param' op 'dg.role' must be one of}}
    %w = dg.param "w" {dg.role = "diagonal"} : tensor<8x8xf32>
    return
  }
}
