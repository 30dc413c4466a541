// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-shard-verify
// dg-shard-verify: the consistency conditions between an op's shardings and its sharding rule.

// A consistent column GEMM passes.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @column() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    %w = dg.param "w" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<8x8xf32>
    %y = dg.matmul %x, %w {transpose_b = true, dg.operand_shardings = [#dg.sharding<[[], []]>, #dg.sharding<[[tp], []]>], dg.shardings = [#dg.sharding<[[], [tp]]>]} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    dg.output "y", %y {dg.operand_shardings = [#dg.sharding<[[], [tp]]>]} : tensor<4x8xf32>
    return
  }
}

// -----

// The same factor split two ways.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @disagree() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    // expected-error @+1 {{operand 1 dim 0 splits its factor over [] but operand 0 dim 0 splits it over [tp]}}
    %y = dg.add %x, %x {dg.operand_shardings = [#dg.sharding<[[tp], []]>, #dg.sharding<[[], []]>], dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
    return
  }
}

// -----

// A split contraction makes the result partial.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @missing_partial() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    %w = dg.input "w" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<8x4xf32>
    // expected-error @+1 {{result 0 must be partial over [tp] (its missing reduction factors and its linear operands' pending sums), but is partial over []}}
    %y = dg.matmul %x, %w {dg.operand_shardings = [#dg.sharding<[[], [tp]]>, #dg.sharding<[[tp], []]>], dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
    return
  }
}

// -----

// A pending sum into an op that is not linear in it.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @nonlinear() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    // expected-error @+1 {{operand 0 is partial over [tp], but the op is not linear in it}}
    %y = dg.exp %x {dg.operand_shardings = [#dg.sharding<[[], []], partial = [tp]>], dg.shardings = [#dg.sharding<[[], []], partial = [tp]>]} : tensor<4x8xf32>
    return
  }
}

// -----

// Both factors of a product partial.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @two_partial() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    // expected-error @+1 {{operand 1 is partial over [tp], but only one operand of a product may be partial}}
    %y = dg.mul %x, %x {dg.operand_shardings = [#dg.sharding<[[], []], partial = [tp]>, #dg.sharding<[[], []], partial = [tp]>], dg.shardings = [#dg.sharding<[[], []], partial = [tp]>]} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
    return
  }
}

// -----

// A sum's operands partial differently.
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), tp = 2 (tensor)]>} {
  func.func @unlike() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    // expected-error @+1 {{operand 1 is partial over [dp] but operand 0 over [tp] (a sum's operands must be partial alike)}}
    %y = dg.add %x, %x {dg.operand_shardings = [#dg.sharding<[[], []], partial = [tp]>, #dg.sharding<[[], []], partial = [dp]>], dg.shardings = [#dg.sharding<[[], []], partial = [tp]>]} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
    return
  }
}

// -----

// The softmax axis must stay whole.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @softmax_axis() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    // expected-error @+1 {{operand 0 dim 1 splits a factor that must stay whole over [tp]}}
    %y = dg.softmax %x axis = 1 {dg.operand_shardings = [#dg.sharding<[[], [tp]]>], dg.shardings = [#dg.sharding<[[], [tp]]>]} : tensor<4x8xf32>
    return
  }
}

// -----

// A batch split over dp and a sequence split over tp do not merge into a block split of the tokens:
// the merged dimension's axes go to its major factor first.
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), tp = 2 (tensor)]>} {
  func.func @merged_splits() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], [], []]>]} : tensor<4x4x8xf32>
    // expected-error @+1 {{result 0 dim 0 splits its factor over [dp, tp] but operand 0 dim 0 splits it over [dp]}}
    %y = dg.reshape %x {dg.operand_shardings = [#dg.sharding<[[dp], [tp], []]>], dg.shardings = [#dg.sharding<[[dp, tp], []]>]} : tensor<4x4x8xf32> -> tensor<16x8xf32>
    return
  }
}

// -----

// A vocab-split lookup is a pending sum over the table's row axes.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @gather_rows() attributes {dg.entry = "forward"} {
    %table = dg.param "embed" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<16x8xf32>
    %ids = dg.input "ids" {dg.shardings = [#dg.sharding<[[]]>]} : tensor<4xi64>
    // expected-error @+1 {{result 0 must be partial over [tp]}}
    %e = dg.gather %table[%ids] {dg.operand_shardings = [#dg.sharding<[[tp], []]>, #dg.sharding<[[]]>], dg.shardings = [#dg.sharding<[[], []]>]} : tensor<16x8xf32>, tensor<4xi64> -> tensor<4x8xf32>
    return
  }
}

// -----

// An assign consumes its value in the target's sharding; an output is never partial.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @assign() attributes {dg.entry = "optimizer_step"} {
    %w = dg.param "w" {dg.shardings = [#dg.sharding<[[tp]]>]} : tensor<8xf32>
    %z = dg.fill 0.0 {dg.shardings = [#dg.sharding<[[]]>]} : tensor<8xf32>
    // expected-error @+1 {{operand 1 must be consumed as the target parameter's sharding #dg.sharding<[[tp]]>}}
    dg.assign %z to %w {dg.operand_shardings = [#dg.sharding<[[tp]]>, #dg.sharding<[[]]>]} : tensor<8xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @output() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<4x8xf32>
    %w = dg.input "w" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<8x4xf32>
    %y = dg.matmul %x, %w {dg.operand_shardings = [#dg.sharding<[[], [tp]]>, #dg.sharding<[[tp], []]>], dg.shardings = [#dg.sharding<[[], []], partial = [tp]>]} : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
    // expected-error @+1 {{an output must not be partial}}
    dg.output "y", %y {dg.operand_shardings = [#dg.sharding<[[], []], partial = [tp]>]} : tensor<4x4xf32>
    return
  }
}

// -----

// Every op is annotated, and a parameter has one sharding across the module.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @unannotated() attributes {dg.entry = "forward"} {
    // expected-error @+1 {{has no 'dg.shardings'}}
    %z = dg.fill 0.0 : tensor<8xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @first() attributes {dg.entry = "forward"} {
    %w = dg.param "w" {dg.shardings = [#dg.sharding<[[tp]]>]} : tensor<8xf32>
    return
  }
  func.func @second() attributes {dg.entry = "backward"} {
    // expected-error @+1 {{parameter 'w' is sharded #dg.sharding<[[]]> here but #dg.sharding<[[tp]]> elsewhere in the module}}
    %w = dg.param "w" {dg.shardings = [#dg.sharding<[[]]>]} : tensor<8xf32>
    return
  }
}
