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
