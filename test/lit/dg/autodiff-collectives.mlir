// RUN: dgemma-opt %s --dg-autodiff --canonicalize --split-input-file --verify-diagnostics | FileCheck %s
// The derivative rules of the collectives: each emits the adjoint collective on the same axis.

// all_gather ⇄ reduce_scatter(sum), all_reduce(sum) → all_reduce(sum), broadcast → reduce_to_root.
// CHECK-LABEL: func.func @chain
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
func.func @chain() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<2x3xf32>
  %g = dg.all_gather %w axis = "tp" : tensor<2x3xf32> -> tensor<4x3xf32>
  %r = dg.all_reduce %g axis = "tp" : tensor<4x3xf32> -> tensor<4x3xf32>
  %s = dg.reduce_scatter %r axis = "tp" : tensor<4x3xf32> -> tensor<2x3xf32>
  %b = dg.broadcast %s axis = "tp" root = 1 : tensor<2x3xf32> -> tensor<2x3xf32>
  %e = dg.exp %b : tensor<2x3xf32>
  %l = dg.reduce_sum %e dims = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[E:.*]] = dg.exp
  // CHECK: %[[GE:.*]] = dg.mul %{{.*}}, %[[E]]
  // CHECK: %[[GB:.*]] = dg.reduce_to_root %[[GE]] axis = "tp" root = 1 : tensor<2x3xf32> -> tensor<2x3xf32>
  // CHECK: %[[GS:.*]] = dg.all_gather %[[GB]] axis = "tp" : tensor<2x3xf32> -> tensor<4x3xf32>
  // CHECK: %[[GR:.*]] = dg.all_reduce %[[GS]] axis = "tp" : tensor<4x3xf32> -> tensor<4x3xf32>
  // CHECK: %[[GW:.*]] = dg.reduce_scatter %[[GR]] axis = "tp" : tensor<4x3xf32> -> tensor<2x3xf32>
  // CHECK: dg.output "grad/w", %[[GW]] : tensor<2x3xf32>
  return
}
}

// -----

// reduce_to_root → broadcast from the same root.
// CHECK-LABEL: func.func @reduce_to_root
module attributes {dg.mesh = #dg.mesh<[dp = 3 (data)]>} {
func.func @reduce_to_root() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4xf32>
  %r = dg.reduce_to_root %w axis = "dp" root = 2 : tensor<4xf32> -> tensor<4xf32>
  %l = dg.reduce_sum %r dims = [0] : tensor<4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[G:.*]] = dg.broadcast %{{.*}} axis = "dp" root = 2 : tensor<4xf32> -> tensor<4xf32>
  // CHECK: dg.output "grad/w", %[[G]] : tensor<4xf32>
  return
}
}

// -----

// all_to_all → the reverse exchange: the cotangent's rows go back with the received counts, into
// the input's capacity; the counts get no cotangent.
// CHECK-LABEL: func.func @all_to_all
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
func.func @all_to_all() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<6x4xf32>
  %counts = dg.input "counts" : tensor<2xi64>
  %y, %n = dg.all_to_all %w, %counts axis = "ep" : tensor<6x4xf32>, tensor<2xi64> -> tensor<10x4xf32>, tensor<2xi64>
  %e = dg.exp %y : tensor<10x4xf32>
  %l = dg.reduce_sum %e dims = [0, 1] : tensor<10x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[Y:.*]], %[[N:.*]] = dg.all_to_all %{{.*}}, %{{.*}} axis = "ep" : tensor<6x4xf32>, tensor<2xi64> -> tensor<10x4xf32>, tensor<2xi64>
  // CHECK: %[[GE:.*]] = dg.mul %{{.*}}, %{{.*}} : tensor<10x4xf32>
  // CHECK: %[[GW:.*]], %{{.*}} = dg.all_to_all %[[GE]], %[[N]] axis = "ep" : tensor<10x4xf32>, tensor<2xi64> -> tensor<6x4xf32>, tensor<2xi64>
  // CHECK: dg.output "grad/w", %[[GW]] : tensor<6x4xf32>
  return
}
}

// -----

// Max and min select one rank's value: no derivative rule, and autodiff names the op.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
func.func @all_reduce_max() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4xf32>
  // expected-error @+1 {{'dg.all_reduce' op has no derivative rule for reduce = max (only sum is differentiable)}}
  %r = dg.all_reduce %w axis = "tp" reduce = max : tensor<4xf32> -> tensor<4xf32>
  %l = dg.reduce_sum %r dims = [0] : tensor<4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
func.func @reduce_scatter_min() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4xf32>
  // expected-error @+1 {{'dg.reduce_scatter' op has no derivative rule for reduce = min (only sum is differentiable)}}
  %r = dg.reduce_scatter %w axis = "tp" reduce = min : tensor<4xf32> -> tensor<2xf32>
  %l = dg.reduce_sum %r dims = [0] : tensor<2xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}
}
