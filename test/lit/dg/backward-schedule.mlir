// RUN: dgemma-opt %s --split-input-file --dg-backward-schedule=depth-band=1 | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --dg-backward-schedule | FileCheck %s --check-prefix=BANDED
// RUN: dgemma-opt %s --split-input-file --dg-plan-pipeline | FileCheck %s --check-prefix=BANDED
// RUN: not dgemma-opt %s --split-input-file --dg-backward-schedule=depth-band=0 2>&1 | FileCheck %s --check-prefix=BAD-BAND
// BAD-BAND: dg-backward-schedule: depth-band must be at least 1, got 0

// Two passes share the stack: the decoder's backward runs down d1, d2, d3, and the encoder's
// backward of a layer (e1, e2) needs the decoder's gradient of that layer. Autodiff wrote the whole
// decoder backward first; by depth the encoder's e1 and e2 run before d3, each as soon as it can.
// The forward (up to the loss output) keeps its order, and %g, which reads only the forward, runs
// just before its first user.
// CHECK-LABEL: func.func @interleave
// CHECK: %[[X:.*]] = dg.input "x"
// CHECK-NEXT: %[[Y:.*]] = dg.neg %[[X]]
// CHECK-NEXT: dg.output "loss", %[[Y]]
// CHECK-NEXT: %[[G:.*]] = dg.exp %[[Y]]
// CHECK-NEXT: %[[D1:.*]] = dg.tanh %[[G]]
// CHECK-NEXT: %[[D2:.*]] = dg.tanh %[[D1]]
// CHECK-NEXT: %[[E1:.*]] = dg.neg %[[D1]]
// CHECK-NEXT: %[[E2:.*]] = dg.add %[[E1]], %[[D2]]
// CHECK-NEXT: %[[D3:.*]] = dg.tanh %[[D2]]
// CHECK-NEXT: %[[E3:.*]] = dg.add %[[E2]], %[[D3]]
// CHECK-NEXT: dg.output "grad", %[[E3]]
// With the default band of 16 depths all these ops count as equally deep: autodiff's order stands.
// BANDED-LABEL: func.func @interleave
// BANDED: dg.exp
// BANDED-NEXT: dg.tanh
// BANDED-NEXT: dg.tanh
// BANDED-NEXT: dg.tanh
// BANDED-NEXT: dg.neg
func.func @interleave() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  %y = dg.neg %x : tensor<4xf32>
  dg.output "loss", %y : tensor<4xf32>
  %g = dg.exp %y : tensor<4xf32>
  %d1 = dg.tanh %g : tensor<4xf32>
  %d2 = dg.tanh %d1 : tensor<4xf32>
  %d3 = dg.tanh %d2 : tensor<4xf32>
  %e1 = dg.neg %d1 : tensor<4xf32>
  %e2 = dg.add %e1, %d2 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %e3 = dg.add %e2, %d3 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  dg.output "grad", %e3 : tensor<4xf32>
  return
}

// -----

// The same stack on a context rank whose share of a gradient is zeros that still read it
// (Reshard.cpp): a select with a compile-time condition is deferred like a view, so it runs just
// before its first user and adds no depth to the chain behind it. Its reader %e1 is then as deep as
// %d2 and runs before %d3; as an ordered op the select would have made %e1 as deep as %d3, after it.
// CHECK-LABEL: func.func @interleave_with_zeros
// CHECK: %[[D1:.*]] = dg.tanh
// CHECK-NEXT: %[[D2:.*]] = dg.tanh %[[D1]]
// CHECK-NEXT: %[[NEVER:.*]] = dg.constant dense<false>
// CHECK-NEXT: %[[ZERO:.*]] = dg.fill
// CHECK-NEXT: %[[S:.*]] = dg.select %[[NEVER]], %[[D1]], %[[ZERO]]
// CHECK-NEXT: %[[E1:.*]] = dg.reduce_sum %[[S]]
// CHECK-NEXT: %[[D3:.*]] = dg.tanh %[[D2]]
func.func @interleave_with_zeros() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  %y = dg.neg %x : tensor<4xf32>
  dg.output "loss", %y : tensor<4xf32>
  %g = dg.exp %y : tensor<4xf32>
  %d1 = dg.tanh %g : tensor<4xf32>
  %never = dg.constant dense<false> : tensor<i1>
  %zero = dg.fill 0.0 : tensor<f32>
  %s = dg.select %never, %d1, %zero : tensor<i1>, tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %d2 = dg.tanh %d1 : tensor<4xf32>
  %d3 = dg.tanh %d2 : tensor<4xf32>
  %e1 = dg.reduce_sum %s dims = [0] : tensor<4xf32> -> tensor<f32>
  %e2 = dg.add %d2, %d3 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  dg.output "sum", %e1 : tensor<f32>
  dg.output "grad", %e2 : tensor<4xf32>
  return
}

// -----

// A cast of a parameter read by the forward and the backward: the backward gets its own copy, made
// just before its first backward user (the same bits), so the forward's copy dies in the forward.
// A cast of a parameter the entry assigns is left shared.
// CHECK-LABEL: func.func @recast
// CHECK: %[[W:.*]] = dg.param "w"
// CHECK: %[[WB:.*]] = dg.cast %[[W]]
// CHECK: dg.matmul %{{.*}}, %[[WB]]
// CHECK: %[[B:.*]] = dg.param "b"
// CHECK: %[[BB:.*]] = dg.cast %[[B]]
// CHECK: dg.output "loss"
// CHECK: %[[COPY:.*]] = dg.cast %[[W]]
// CHECK-NEXT: dg.matmul %{{.*}}, %[[COPY]] {transpose_b = true}
// CHECK-NOT: dg.cast %[[B]]
// CHECK: dg.add %{{.*}}, %[[BB]]
// CHECK-NOT: dg.cast %[[B]]
// CHECK: dg.assign
func.func @recast() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<2x3xbf16>
  %w = dg.param "w" : tensor<3x4xf32>
  %wb = dg.cast %w : tensor<3x4xf32> -> tensor<3x4xbf16>
  %y = dg.matmul %x, %wb : tensor<2x3xbf16>, tensor<3x4xbf16> -> tensor<2x4xbf16>
  %b = dg.param "b" : tensor<2x4xf32>
  %bb = dg.cast %b : tensor<2x4xf32> -> tensor<2x4xbf16>
  %z = dg.add %y, %bb : tensor<2x4xbf16>, tensor<2x4xbf16> -> tensor<2x4xbf16>
  dg.output "loss", %z : tensor<2x4xbf16>
  %dz = dg.exp %z : tensor<2x4xbf16>
  %dx = dg.matmul %dz, %wb {transpose_b = true} : tensor<2x4xbf16>, tensor<3x4xbf16> -> tensor<2x3xbf16>
  dg.output "dx", %dx : tensor<2x3xbf16>
  %db = dg.add %dz, %bb : tensor<2x4xbf16>, tensor<2x4xbf16> -> tensor<2x4xbf16>
  %dbf = dg.cast %db : tensor<2x4xbf16> -> tensor<2x4xf32>
  %sum = dg.add %b, %dbf : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  dg.assign %sum to %b : tensor<2x4xf32>
  return
}

// -----

// A dequantized frozen weight (dg-base-dtype) read by the forward and the backward: the backward decodes
// its own copy just before it reads it, so the forward's decoded weight dies in the forward.
// CHECK-LABEL: func.func @redecode
// CHECK: %[[C:.*]] = dg.param "w" {{.*}} : tensor<4x32xui8>
// CHECK: %[[A:.*]] = dg.param "w.absmax"
// CHECK: %[[W:.*]] = dg.dequantize %[[C]], %[[A]]
// CHECK: dg.matmul %{{.*}}, %[[W]] {transpose_b = true}
// CHECK: dg.output "loss"
// CHECK: %[[COPY:.*]] = dg.dequantize %[[C]], %[[A]]
// CHECK-NEXT: dg.matmul %{{.*}}, %[[COPY]] :
func.func @redecode() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<2x64xbf16>
  %c = dg.param "w" {trainable = false} : tensor<4x32xui8>
  %a = dg.param "w.absmax" {trainable = false} : tensor<4x1xf32>
  %w = dg.dequantize %c, %a format = "nf4" : tensor<4x32xui8>, tensor<4x1xf32> -> tensor<4x64xbf16>
  %y = dg.matmul %x, %w {transpose_b = true} : tensor<2x64xbf16>, tensor<4x64xbf16> -> tensor<2x4xbf16>
  dg.output "loss", %y : tensor<2x4xbf16>
  %dy = dg.exp %y : tensor<2x4xbf16>
  %dx = dg.matmul %dy, %w : tensor<2x4xbf16>, tensor<4x64xbf16> -> tensor<2x64xbf16>
  dg.output "dx", %dx : tensor<2x64xbf16>
  return
}

// -----

// Two weight-gradient contributions, each far larger than what it reads, run just before their
// sum (%dw was written right after %a1, whose last use it then was). The outputs keep their order
// though "second" is ready first. Collectives move like other ops (every rank schedules alike).
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
// CHECK-LABEL: func.func @deferred
// CHECK: dg.output "loss"
// CHECK: dg.all_reduce
// CHECK: dg.neg
// CHECK-NEXT: dg.neg
// CHECK-NEXT: %[[N3:.*]] = dg.neg
// CHECK-NEXT: %[[DW:.*]] = dg.matmul %[[A1:.*]], %[[A1]] {transpose_a = true}
// CHECK-NEXT: %[[DW2:.*]] = dg.matmul %[[N3]], %[[N3]] {transpose_a = true}
// CHECK-NEXT: dg.add %[[DW]], %[[DW2]]
// CHECK-NEXT: dg.output "first"
// CHECK-NEXT: dg.output "second"
func.func @deferred() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<1x8xf32>
  %y = dg.exp %x : tensor<1x8xf32>
  dg.output "loss", %y : tensor<1x8xf32>
  %s = dg.tanh %y : tensor<1x8xf32>
  %a1 = dg.tanh %s : tensor<1x8xf32>
  %dw = dg.matmul %a1, %a1 {transpose_a = true} : tensor<1x8xf32>, tensor<1x8xf32> -> tensor<8x8xf32>
  %c = dg.all_reduce %s axis = "tp" : tensor<1x8xf32> -> tensor<1x8xf32>
  %n1 = dg.neg %c : tensor<1x8xf32>
  %n2 = dg.neg %n1 : tensor<1x8xf32>
  %n3 = dg.neg %n2 : tensor<1x8xf32>
  dg.output "first", %n1 : tensor<1x8xf32>
  dg.output "second", %s : tensor<1x8xf32>
  %dw2 = dg.matmul %n3, %n3 {transpose_a = true} : tensor<1x8xf32>, tensor<1x8xf32> -> tensor<8x8xf32>
  %sum = dg.add %dw, %dw2 : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  dg.output "dw", %sum : tensor<8x8xf32>
  return
}
}

// -----

// An entry point without the loss output keeps its order.
// CHECK-LABEL: func.func @no_loss
// CHECK: dg.tanh
// CHECK-NEXT: dg.exp
func.func @no_loss() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4xf32>
  %a = dg.tanh %x : tensor<4xf32>
  %b = dg.exp %x : tensor<4xf32>
  dg.output "a", %a : tensor<4xf32>
  dg.output "b", %b : tensor<4xf32>
  return
}
