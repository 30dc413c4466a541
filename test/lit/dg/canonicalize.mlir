// RUN: dgemma-opt %s --canonicalize --split-input-file | FileCheck %s

// CHECK-LABEL: func.func @identity_folds
func.func @identity_folds() attributes {dg.entry = "forward"} {
  // CHECK: %[[X:.*]] = dg.input "x"
  %x = dg.input "x" : tensor<2x3xf32>
  %same = dg.reshape %x : tensor<2x3xf32> -> tensor<2x3xf32>
  %t = dg.transpose %same perm = [0, 1] : tensor<2x3xf32> -> tensor<2x3xf32>
  %c = dg.cast %t : tensor<2x3xf32> -> tensor<2x3xf32>
  // CHECK-NOT: dg.reshape
  // CHECK-NOT: dg.transpose
  // CHECK-NOT: dg.cast
  // CHECK: dg.output "y", %[[X]]
  dg.output "y", %c : tensor<2x3xf32>
  return
}

// -----

// CHECK-LABEL: func.func @transpose_pairs
func.func @transpose_pairs() attributes {dg.entry = "forward"} {
  // CHECK: %[[X:.*]] = dg.input "x"
  %x = dg.input "x" : tensor<2x3x4xf32>
  %a = dg.transpose %x perm = [1, 2, 0] : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
  %b = dg.transpose %a perm = [2, 0, 1] : tensor<3x4x2xf32> -> tensor<2x3x4xf32>
  // A composition that is not the identity stays.
  // CHECK: %[[C:.*]] = dg.transpose %[[X]] perm = [1, 0, 2]
  %c = dg.transpose %b perm = [1, 0, 2] : tensor<2x3x4xf32> -> tensor<3x2x4xf32>
  // CHECK: dg.output "y", %[[C]]
  dg.output "y", %c : tensor<3x2x4xf32>
  return
}

// -----

// CHECK-LABEL: func.func @reshape_chains
func.func @reshape_chains() attributes {dg.entry = "forward"} {
  // CHECK: %[[X:.*]] = dg.input "x"
  %x = dg.input "x" : tensor<2x6xf32>
  %a = dg.reshape %x : tensor<2x6xf32> -> tensor<12xf32>
  %b = dg.reshape %a : tensor<12xf32> -> tensor<3x4xf32>
  // CHECK: %[[B:.*]] = dg.reshape %[[X]] : tensor<2x6xf32> -> tensor<3x4xf32>
  %c = dg.reshape %b : tensor<3x4xf32> -> tensor<2x6xf32>
  // CHECK: dg.output "b", %[[B]]
  dg.output "b", %b : tensor<3x4xf32>
  // CHECK: dg.output "c", %[[X]]
  dg.output "c", %c : tensor<2x6xf32>
  return
}

// -----

// Unused pure ops disappear; outputs and their producers stay.
// CHECK-LABEL: func.func @dead_code
func.func @dead_code() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4xf32>
  // CHECK-NOT: dg.exp
  %dead = dg.exp %x : tensor<4xf32>
  // CHECK: dg.tanh
  %y = dg.tanh %x : tensor<4xf32>
  dg.output "y", %y : tensor<4xf32>
  return
}

// -----

// A transposed product is the product of the swapped operands with their transposes flipped.
// CHECK-LABEL: func.func @transposed_matmul
func.func @transposed_matmul() attributes {dg.entry = "forward"} {
  // CHECK: %[[X:.*]] = dg.input "x"
  // CHECK: %[[DY:.*]] = dg.input "dy"
  %x = dg.input "x" : tensor<6x4xf32>
  %dy = dg.input "dy" : tensor<6x5xf32>
  %wt = dg.matmul %x, %dy {transpose_a = true} : tensor<6x4xf32>, tensor<6x5xf32> -> tensor<4x5xf32>
  // CHECK-NOT: dg.transpose
  // CHECK: %[[W:.*]] = dg.matmul %[[DY]], %[[X]] {transpose_a = true} : tensor<6x5xf32>, tensor<6x4xf32> -> tensor<5x4xf32>
  %w = dg.transpose %wt perm = [1, 0] : tensor<4x5xf32> -> tensor<5x4xf32>
  // CHECK: dg.output "w", %[[W]]
  dg.output "w", %w : tensor<5x4xf32>
  // A batched lhs with a shared rhs cannot swap (the new lhs would lose the batch): it stays.
  %a = dg.input "a" : tensor<2x3x4xf32>
  %b = dg.input "b" : tensor<4x5xf32>
  %ab = dg.matmul %a, %b : tensor<2x3x4xf32>, tensor<4x5xf32> -> tensor<2x3x5xf32>
  // CHECK: dg.transpose %{{.*}} perm = [0, 2, 1]
  %abt = dg.transpose %ab perm = [0, 2, 1] : tensor<2x3x5xf32> -> tensor<2x5x3xf32>
  dg.output "abt", %abt : tensor<2x5x3xf32>
  return
}
