// RUN: dgemma-opt %s --dg-shard-partition=rank=0 --split-input-file --verify-diagnostics | FileCheck %s --check-prefixes=CHECK,R0
// RUN: dgemma-opt %s --dg-shard-partition=rank=1 --split-input-file --verify-diagnostics | FileCheck %s --check-prefixes=CHECK,R1
// dg-shard-partition: hand-annotated modules (every op with its result and operand shardings)
// turned into rank 0's and rank 1's programs. Ranks are row-major over the mesh's axes.

#whole = #dg.sharding<[[], []]>
#tp_partial = #dg.sharding<[[], []], partial = [tp]>
#rows_tp = #dg.sharding<[[tp], []]>
#cols_tp = #dg.sharding<[[], [tp]]>

// A pending sum consumed whole is all-reduced; the boundary ops record their boxes.
// CHECK-LABEL: func.func @partial_to_whole
// CHECK: %[[X:.*]] = dg.input "x" {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 0, 0>} : tensor<4x6xf32>
// CHECK: %[[R:.*]] = dg.all_reduce %{{.*}} axis = "tp" : tensor<4x6xf32> -> tensor<4x6xf32>
// CHECK: %[[E:.*]] = dg.exp %[[R]] : tensor<4x6xf32>
// CHECK: dg.output "y", %[[E]] {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 0, 0>} : tensor<4x6xf32>
// CHECK-NOT: dg.shardings
// CHECK-NOT: dg.operand_shardings
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @partial_to_whole() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x6xf32>
    %p = dg.neg %x {dg.shardings = [#tp_partial], dg.operand_shardings = [#tp_partial]} : tensor<4x6xf32>
    %e = dg.exp %p {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    dg.output "y", %e {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#tp_partial = #dg.sharding<[[], []], partial = [tp]>
#rows_tp = #dg.sharding<[[tp], []]>
#cols_tp = #dg.sharding<[[], [tp]]>

// A pending sum consumed split is reduce-scattered: on dim 0 directly, on dim 1 between transposes.
// CHECK-LABEL: func.func @partial_to_split
// CHECK: %[[RS:.*]] = dg.reduce_scatter %[[P:.*]] axis = "tp" : tensor<4x6xf32> -> tensor<2x6xf32>
// CHECK: dg.exp %[[RS]] : tensor<2x6xf32>
// CHECK: %[[T:.*]] = dg.transpose %[[P]] perm = [1, 0] : tensor<4x6xf32> -> tensor<6x4xf32>
// CHECK: %[[RS1:.*]] = dg.reduce_scatter %[[T]] axis = "tp" : tensor<6x4xf32> -> tensor<3x4xf32>
// CHECK: %[[B:.*]] = dg.transpose %[[RS1]] perm = [1, 0] : tensor<3x4xf32> -> tensor<4x3xf32>
// CHECK: dg.exp %[[B]] : tensor<4x3xf32>
// R0: dg.output "rows", %{{.*}} {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 0, 0>} : tensor<2x6xf32>
// R1: dg.output "rows", %{{.*}} {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 2, 0>} : tensor<2x6xf32>
// R1: dg.output "cols", %{{.*}} {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 0, 3>} : tensor<4x3xf32>
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @partial_to_split() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x6xf32>
    %p = dg.neg %x {dg.shardings = [#tp_partial], dg.operand_shardings = [#tp_partial]} : tensor<4x6xf32>
    %rows = dg.exp %p {dg.shardings = [#rows_tp], dg.operand_shardings = [#rows_tp]} : tensor<4x6xf32>
    %cols = dg.exp %p {dg.shardings = [#cols_tp], dg.operand_shardings = [#cols_tp]} : tensor<4x6xf32>
    dg.output "rows", %rows {dg.operand_shardings = [#rows_tp]} : tensor<4x6xf32>
    dg.output "cols", %cols {dg.operand_shardings = [#cols_tp]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#rows_tp = #dg.sharding<[[tp], []]>
#cols_tp = #dg.sharding<[[], [tp]]>

// A split value consumed whole is all-gathered (dim 1 between transposes); a whole value consumed
// split is this rank's slice, without communication. The input's box is this rank's rows.
// CHECK-LABEL: func.func @gather_and_slice
// R0: %[[X:.*]] = dg.input "x" {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 0, 0>} : tensor<2x6xf32>
// R1: %[[X:.*]] = dg.input "x" {dg.global_shape = array<i64: 4, 6>, dg.shard_offset = array<i64: 2, 0>} : tensor<2x6xf32>
// CHECK: %[[G:.*]] = dg.all_gather %[[X]] axis = "tp" : tensor<2x6xf32> -> tensor<4x6xf32>
// CHECK: %[[E:.*]] = dg.exp %[[G]] : tensor<4x6xf32>
// R0: %[[S:.*]] = dg.slice %[[E]] dim = 1 start = 0 : tensor<4x6xf32> -> tensor<4x3xf32>
// R1: %[[S:.*]] = dg.slice %[[E]] dim = 1 start = 3 : tensor<4x6xf32> -> tensor<4x3xf32>
// CHECK: %[[L:.*]] = dg.log %[[S]] : tensor<4x3xf32>
// CHECK: %[[T:.*]] = dg.transpose %[[L]] perm = [1, 0] : tensor<4x3xf32> -> tensor<3x4xf32>
// CHECK: %[[AG:.*]] = dg.all_gather %[[T]] axis = "tp" : tensor<3x4xf32> -> tensor<6x4xf32>
// CHECK: %[[W:.*]] = dg.transpose %[[AG]] perm = [1, 0] : tensor<6x4xf32> -> tensor<4x6xf32>
// CHECK: dg.output "y", %[[W]]
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @gather_and_slice() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#rows_tp]} : tensor<4x6xf32>
    %e = dg.exp %x {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    %l = dg.log %e {dg.shardings = [#cols_tp], dg.operand_shardings = [#cols_tp]} : tensor<4x6xf32>
    dg.output "y", %l {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#tp_partial = #dg.sharding<[[], []], partial = [tp]>

// A computed whole value consumed as a pending sum: the other ranks' zeros still read it (a select
// that never picks it), so every rank's program has the same dependencies.
// CHECK-LABEL: func.func @computed_whole_to_partial
// R0-NOT: dg.select
// R1: %[[E:.*]] = dg.exp
// R1: %[[NEVER:.*]] = dg.constant dense<false> : tensor<i1>
// R1: %[[ZERO:.*]] = dg.fill 0.000000e+00 : tensor<f32>
// R1: %[[Z:.*]] = dg.select %[[NEVER]], %[[E]], %[[ZERO]] : tensor<i1>, tensor<4x6xf32>, tensor<f32> -> tensor<4x6xf32>
// R1: dg.add %[[Z]], %[[E]]
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @computed_whole_to_partial() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x6xf32>
    %e = dg.exp %x {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    %s = dg.add %e, %e {dg.shardings = [#tp_partial], dg.operand_shardings = [#tp_partial, #whole]} : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
    %r = dg.exp %s {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    dg.output "y", %r {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#tp_partial = #dg.sharding<[[], []], partial = [tp]>

// A whole value consumed as a pending sum: rank 0 keeps it, the others add zeros.
// CHECK-LABEL: func.func @whole_to_partial
// R0-NOT: dg.fill
// R0: dg.add %[[X:.*]], %[[X]]
// R1: %[[Z:.*]] = dg.fill 0.000000e+00 : tensor<4x6xf32>
// R1: dg.add %[[Z]], %[[Y:.*]] : tensor<4x6xf32>, tensor<4x6xf32>
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @whole_to_partial() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x6xf32>
    %s = dg.add %x, %x {dg.shardings = [#tp_partial], dg.operand_shardings = [#tp_partial, #whole]} : tensor<4x6xf32>, tensor<4x6xf32> -> tensor<4x6xf32>
    %r = dg.exp %s {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    dg.output "y", %r {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#rows_dp_tp = #dg.sharding<[[dp, tp], []]>
#partial_both = #dg.sharding<[[], []], partial = [dp, tp]>

// Two axes on one dimension: the gather runs over the minor axis first (its blocks are adjacent),
// the reduce-scatter over the major axis first. Rank 1 is dp 0, tp 1.
// CHECK-LABEL: func.func @chain_over_two_axes
// CHECK: %[[G1:.*]] = dg.all_gather %{{.*}} axis = "tp" : tensor<2x6xf32> -> tensor<4x6xf32>
// CHECK: %[[G2:.*]] = dg.all_gather %[[G1]] axis = "dp" : tensor<4x6xf32> -> tensor<8x6xf32>
// CHECK: %[[RS1:.*]] = dg.reduce_scatter %{{.*}} axis = "dp" : tensor<8x6xf32> -> tensor<4x6xf32>
// CHECK: %[[RS2:.*]] = dg.reduce_scatter %[[RS1]] axis = "tp" : tensor<4x6xf32> -> tensor<2x6xf32>
// CHECK: %[[AR1:.*]] = dg.all_reduce %{{.*}} axis = "dp"
// CHECK: dg.all_reduce %[[AR1]] axis = "tp"
// R1: dg.output "rows", %{{.*}} {dg.global_shape = array<i64: 8, 6>, dg.shard_offset = array<i64: 2, 0>} : tensor<2x6xf32>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), tp = 2 (tensor)]>} {
  func.func @chain_over_two_axes() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#rows_dp_tp]} : tensor<8x6xf32>
    %e = dg.exp %x {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<8x6xf32>
    %p = dg.neg %e {dg.shardings = [#partial_both], dg.operand_shardings = [#partial_both]} : tensor<8x6xf32>
    %rows = dg.exp %p {dg.shardings = [#rows_dp_tp], dg.operand_shardings = [#rows_dp_tp]} : tensor<8x6xf32>
    %all = dg.exp %p {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<8x6xf32>
    dg.output "rows", %rows {dg.operand_shardings = [#rows_dp_tp]} : tensor<8x6xf32>
    dg.output "all", %all {dg.operand_shardings = [#whole]} : tensor<8x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#rows_tp = #dg.sharding<[[tp], []]>

// The same value resharded the same way twice is gathered once.
// CHECK-LABEL: func.func @reuse
// CHECK: %[[G:.*]] = dg.all_gather
// CHECK-NOT: dg.all_gather
// CHECK: dg.exp %[[G]]
// CHECK: dg.log %[[G]]
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @reuse() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#rows_tp]} : tensor<4x6xf32>
    %e = dg.exp %x {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    %l = dg.log %x {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    dg.output "e", %e {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    dg.output "l", %l {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#ids = #dg.sharding<[[], []]>
#vocab = #dg.sharding<[[tp], []]>
#looked_up = #dg.sharding<[[], [], []], partial = [tp]>
#rows3 = #dg.sharding<[[], [], []]>

// A lookup into a vocab-split table reads from this rank's first row; its adjoint adds into this
// rank's rows only. The table's box is its row block.
// CHECK-LABEL: func.func @vocab_split_table
// R1: dg.param "embed" {dg.global_shape = array<i64: 8, 4>, dg.shard_offset = array<i64: 4, 0>} : tensor<4x4xf32>
// R0: dg.gather %{{.*}}[%{{.*}}] : tensor<4x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
// R1: dg.gather %{{.*}}[%{{.*}}] {row_offset = 4 : i64} : tensor<4x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
// CHECK: dg.all_reduce %{{.*}} axis = "tp" : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
// R1: dg.scatter_add %{{.*}} at %{{.*}} {row_offset = 4 : i64} : tensor<2x3x4xf32>, tensor<2x3xi64> -> tensor<4x4xf32>
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @vocab_split_table() attributes {dg.entry = "forward"} {
    %table = dg.param "embed" {dg.shardings = [#vocab]} : tensor<8x4xf32>
    %ids = dg.input "ids" {dg.shardings = [#ids]} : tensor<2x3xi64>
    %rows = dg.gather %table[%ids] {dg.shardings = [#looked_up], dg.operand_shardings = [#vocab, #ids]} : tensor<8x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
    %whole = dg.exp %rows {dg.shardings = [#rows3], dg.operand_shardings = [#rows3]} : tensor<2x3x4xf32>
    %grad = dg.scatter_add %whole at %ids {dg.shardings = [#vocab], dg.operand_shardings = [#ids, #rows3]} : tensor<2x3x4xf32>, tensor<2x3xi64> -> tensor<8x4xf32>
    dg.output "rows", %whole {dg.operand_shardings = [#rows3]} : tensor<2x3x4xf32>
    dg.output "grad", %grad {dg.operand_shardings = [#vocab]} : tensor<8x4xf32>
    return
  }
}

// -----

#x = #dg.sharding<[[], []]>
#experts = #dg.sharding<[[ep], [], []]>
#y = #dg.sharding<[[], []], partial = [ep]>

// A split expert set: the rank's experts start at expert_offset.
// CHECK-LABEL: func.func @expert_split
// R1: dg.moe_experts {{.*}} {expert_offset = 4 : i64} : tensor<6x8xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32> -> tensor<6x8xf32>
// R0: dg.moe_experts %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}} : tensor<6x8xf32>
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @expert_split() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#x]} : tensor<6x8xf32>
    %w = dg.input "w" {dg.shardings = [#x]} : tensor<6x2xf32>
    %i = dg.input "i" {dg.shardings = [#x]} : tensor<6x2xi64>
    %gate_up = dg.param "gate_up" {dg.shardings = [#experts]} : tensor<8x12x8xf32>
    %down = dg.param "down" {dg.shardings = [#experts]} : tensor<8x8x6xf32>
    %y = dg.moe_experts %x, %w, %i, %gate_up, %down {dg.shardings = [#y], dg.operand_shardings = [#x, #x, #x, #experts, #experts]} : tensor<6x8xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<8x12x8xf32>, tensor<8x8x6xf32> -> tensor<6x8xf32>
    dg.output "y", %y {dg.operand_shardings = [#x]} : tensor<6x8xf32>
    return
  }
}

// -----

#cols = #dg.sharding<[[], [tp]]>
#partial = #dg.sharding<[[], []], partial = [tp]>

// A split constant is cut at compile time; a constant and a fill that are pending sums are zero
// on every rank but the first.
// CHECK-LABEL: func.func @constants
// R0: dg.constant dense<{{\[\[}}1.000000e+00, 2.000000e+00], [5.000000e+00, 6.000000e+00]]> : tensor<2x2xf32>
// R1: dg.constant dense<{{\[\[}}3.000000e+00, 4.000000e+00], [7.000000e+00, 8.000000e+00]]> : tensor<2x2xf32>
// R0: dg.constant dense<1.000000e+00> : tensor<2x4xf32>
// R1: dg.constant dense<0.000000e+00> : tensor<2x4xf32>
// R0: dg.fill 3.000000e+00 : tensor<2x4xf32>
// R1: dg.fill 0.000000e+00 : tensor<2x4xf32>
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @constants() attributes {dg.entry = "forward"} {
    %c = dg.constant {dg.shardings = [#cols]} dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]> : tensor<2x4xf32>
    %ones = dg.constant {dg.shardings = [#partial]} dense<1.0> : tensor<2x4xf32>
    %three = dg.fill 3.0 {dg.shardings = [#partial]} : tensor<2x4xf32>
    dg.output "c", %c {dg.operand_shardings = [#cols]} : tensor<2x4xf32>
    dg.output "ones", %ones {dg.operand_shardings = [#cols]} : tensor<2x4xf32>
    dg.output "three", %three {dg.operand_shardings = [#cols]} : tensor<2x4xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#rows_tp = #dg.sharding<[[tp], []]>

// An assign writes the parameter's own block: the value is resharded to the parameter's layout.
// CHECK-LABEL: func.func @assign
// CHECK: %[[P:.*]] = dg.param "w" {{.*}} : tensor<2x6xf32>
// CHECK: %[[G:.*]] = dg.all_gather %[[P]] axis = "tp" : tensor<2x6xf32> -> tensor<4x6xf32>
// CHECK: %[[E:.*]] = dg.exp %[[G]] : tensor<4x6xf32>
// R1: %[[S:.*]] = dg.slice %[[E]] dim = 0 start = 2 : tensor<4x6xf32> -> tensor<2x6xf32>
// R1: dg.assign %[[S]] to %[[P]] : tensor<2x6xf32>
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @assign() attributes {dg.entry = "optimizer_step"} {
    %w = dg.param "w" {dg.shardings = [#rows_tp]} : tensor<4x6xf32>
    %e = dg.exp %w {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    dg.assign %e to %w {dg.operand_shardings = [#rows_tp, #whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#batch = #dg.sharding<[[dp], []]>
#scalar = #dg.sharding<[], partial = [dp]>
#whole_scalar = #dg.sharding<[]>

// A mean over a split dimension is the rank's share of the global mean: the local mean over dp;
// a scalar is all-reduced as one element.
// CHECK-LABEL: func.func @mean_over_split_batch
// CHECK: %[[M:.*]] = dg.reduce_mean %{{.*}} dims = [0, 1] : tensor<2x3xf32> -> tensor<f32>
// CHECK: %[[Q:.*]] = dg.fill 5.000000e-01 : tensor<f32>
// CHECK: %[[S:.*]] = dg.mul %[[M]], %[[Q]] : tensor<f32>, tensor<f32> -> tensor<f32>
// CHECK: %[[O:.*]] = dg.reshape %[[S]] : tensor<f32> -> tensor<1xf32>
// CHECK: %[[R:.*]] = dg.all_reduce %[[O]] axis = "dp" : tensor<1xf32> -> tensor<1xf32>
// CHECK: %[[L:.*]] = dg.reshape %[[R]] : tensor<1xf32> -> tensor<f32>
// CHECK: dg.output "loss", %[[L]]
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
  func.func @mean_over_split_batch() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#batch]} : tensor<4x3xf32>
    %m = dg.reduce_mean %x dims = [0, 1] {dg.shardings = [#scalar], dg.operand_shardings = [#batch]} : tensor<4x3xf32> -> tensor<f32>
    dg.output "loss", %m {dg.operand_shardings = [#whole_scalar]} : tensor<f32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>
#tp_partial = #dg.sharding<[[], []], partial = [tp]>

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @partial_output() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x6xf32>
    %p = dg.neg %x {dg.shardings = [#tp_partial], dg.operand_shardings = [#tp_partial]} : tensor<4x6xf32>
    // expected-error @+1 {{hands out a pending sum}}
    dg.output "y", %p {dg.operand_shardings = [#tp_partial]} : tensor<4x6xf32>
    return
  }
}

// -----

#whole = #dg.sharding<[[], []]>

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @unannotated() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x6xf32>
    // expected-error @+1 {{has no dg.shardings entry for result 0: run dg-shard-propagate before dg-shard-partition}}
    %e = dg.exp %x {dg.operand_shardings = [#whole]} : tensor<4x6xf32>
    return
  }
}

// -----

#batch = #dg.sharding<[[dp], []]>
#scalar = #dg.sharding<[], partial = [dp]>

module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
  func.func @max_over_split() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#batch]} : tensor<4x3xf32>
    // expected-error @+1 {{takes the maximum over dimension 0}}
    %m = dg.reduce_max %x dims = [0, 1] {dg.shardings = [#scalar], dg.operand_shardings = [#batch]} : tensor<4x3xf32> -> tensor<f32>
    return
  }
}

// -----

#ids = #dg.sharding<[[dp], []]>
#whole = #dg.sharding<[[], []]>

// Integer values (expert routing indices) are gathered like floats: a gather moves bytes.
// CHECK-LABEL: func.func @integer_gather
// CHECK: dg.all_gather %{{.*}} axis = "dp" : tensor<2x3xi64> -> tensor<4x3xi64>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
  func.func @integer_gather() attributes {dg.entry = "forward"} {
    %ids = dg.input "ids" {dg.shardings = [#ids]} : tensor<4x3xi64>
    %c = dg.cast %ids {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x3xi64> -> tensor<4x3xf32>
    dg.output "c", %c {dg.operand_shardings = [#whole]} : tensor<4x3xf32>
    return
  }
}

// -----

#rows_dp = #dg.sharding<[[dp], []]>
#qkv_dp = #dg.sharding<[[dp], [], [], []]>

// The image overlay under data parallelism: each rank reads its own batch rows of the segment ids,
// as of key_valid, and the op keeps them.
// CHECK-LABEL: func.func @attention_segments
// R0: %[[SEG:.*]] = dg.input "segments" {dg.global_shape = array<i64: 2, 4>, dg.shard_offset = array<i64: 0, 0>} : tensor<1x4xi64>
// R1: %[[SEG:.*]] = dg.input "segments" {dg.global_shape = array<i64: 2, 4>, dg.shard_offset = array<i64: 1, 0>} : tensor<1x4xi64>
// CHECK: dg.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} segment_ids(%[[SEG]] : tensor<1x4xi64>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
  func.func @attention_segments() attributes {dg.entry = "forward"} {
    %q = dg.input "q" {dg.shardings = [#qkv_dp]} : tensor<2x4x2x8xf32>
    %m = dg.input "valid" {dg.shardings = [#rows_dp]} : tensor<2x4xi1>
    %s = dg.input "segments" {dg.shardings = [#rows_dp]} : tensor<2x4xi64>
    %o = dg.attention %q, %q, %q, %m segment_ids(%s : tensor<2x4xi64>) mask = causal {dg.shardings = [#qkv_dp], dg.operand_shardings = [#qkv_dp, #qkv_dp, #qkv_dp, #rows_dp, #rows_dp]} : tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4xi1> -> tensor<2x4x2x8xf32>
    dg.output "o", %o {dg.operand_shardings = [#qkv_dp]} : tensor<2x4x2x8xf32>
    return
  }
}

// -----

#rows_dp = #dg.sharding<[[dp], []]>
#qkv_dp = #dg.sharding<[[dp], [], [], []]>

// Packed documents under data parallelism: each rank reads its own batch rows of the document ids
// too, after the segment ids.
// CHECK-LABEL: func.func @attention_documents
// R0: %[[DOC:.*]] = dg.input "documents" {dg.global_shape = array<i64: 2, 4>, dg.shard_offset = array<i64: 0, 0>} : tensor<1x4xi64>
// R1: %[[DOC:.*]] = dg.input "documents" {dg.global_shape = array<i64: 2, 4>, dg.shard_offset = array<i64: 1, 0>} : tensor<1x4xi64>
// CHECK: dg.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} segment_ids(%{{.*}} : tensor<1x4xi64>) document_ids(%[[DOC]] : tensor<1x4xi64>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
  func.func @attention_documents() attributes {dg.entry = "forward"} {
    %q = dg.input "q" {dg.shardings = [#qkv_dp]} : tensor<2x4x2x8xf32>
    %m = dg.input "valid" {dg.shardings = [#rows_dp]} : tensor<2x4xi1>
    %s = dg.input "segments" {dg.shardings = [#rows_dp]} : tensor<2x4xi64>
    %d = dg.input "documents" {dg.shardings = [#rows_dp]} : tensor<2x4xi64>
    %o = dg.attention %q, %q, %q, %m segment_ids(%s : tensor<2x4xi64>) document_ids(%d : tensor<2x4xi64>) mask = causal {dg.shardings = [#qkv_dp], dg.operand_shardings = [#qkv_dp, #qkv_dp, #qkv_dp, #rows_dp, #rows_dp, #rows_dp]} : tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4xi1> -> tensor<2x4x2x8xf32>
    dg.output "o", %o {dg.operand_shardings = [#qkv_dp]} : tensor<2x4x2x8xf32>
    return
  }
}
