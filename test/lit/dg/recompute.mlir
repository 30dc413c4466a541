// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-recompute="policy=full" | FileCheck %s --check-prefix=FULL
// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-recompute="policy=full:2" | FileCheck %s --check-prefix=CHUNK
// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-recompute="policy=selective" | FileCheck %s --check-prefix=SELECTIVE
// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-plan-pipeline="recompute=full" | FileCheck %s --check-prefix=PLANNED
// RUN: dgemma-opt %s --split-input-file --dg-plan-pipeline | FileCheck %s --check-prefix=KEPT
// dg-recompute clones what a layer's backward reads right before its first backward reader, from
// the layer's (or the chunk's) input; the forward's copies then die in the forward.

// Two layers; the backward (after the loss) reads %a, %b and %d. Under full each layer's output is
// kept, everything else is recomputed before the first backward reader of its layer.
// FULL-LABEL: func.func @two_layers
// FULL: %[[X:.*]] = dg.input "x"
// FULL: %[[A:.*]] = dg.exp %[[X]] {dg.layer_begin = 0 : i64}
// FULL: %[[B:.*]] = dg.tanh %[[A]]
// FULL: %[[C:.*]] = dg.neg %[[B]] {dg.layer_end = 0 : i64}
// FULL: %[[D:.*]] = dg.exp %[[C]] {dg.layer_begin = 1 : i64}
// FULL: %[[E:.*]] = dg.neg %[[D]] {dg.layer_end = 1 : i64}
// FULL: dg.output "loss", %[[E]]
// FULL: %[[D2:.*]] = dg.exp %[[C]] {dg.recomputed}
// FULL: %[[G1:.*]] = dg.mul %[[D2]], %[[E]]
// FULL: %[[A2:.*]] = dg.exp %[[X]] {dg.recomputed}
// FULL: %[[B2:.*]] = dg.tanh %[[A2]] {dg.recomputed}
// FULL: %[[G2:.*]] = dg.mul %[[B2]], %[[G1]]
// FULL: %[[G3:.*]] = dg.mul %[[A2]], %[[G2]]
// FULL: dg.output "grad", %[[G3]]
// Under full:2 the two layers are one chunk: only its input %x and output %e are kept.
// CHUNK-LABEL: func.func @two_layers
// CHUNK: dg.output "loss"
// CHUNK-NEXT: %[[A2:.*]] = dg.exp %{{.*}} {dg.recomputed}
// CHUNK-NEXT: %[[B2:.*]] = dg.tanh %[[A2]] {dg.recomputed}
// CHUNK-NEXT: %[[C2:.*]] = dg.neg %[[B2]] {dg.recomputed}
// CHUNK-NEXT: %[[D2:.*]] = dg.exp %[[C2]] {dg.recomputed}
// CHUNK-NEXT: dg.mul %[[D2]]
// CHUNK-NEXT: dg.mul %[[B2]]
// CHUNK-NEXT: dg.mul %[[A2]]
// Selective recomputes neither (no attention, no experts).
// SELECTIVE-LABEL: func.func @two_layers
// SELECTIVE-NOT: dg.recomputed
func.func @two_layers() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<16xf32>
  %a = dg.exp %x {dg.layer_begin = 0 : i64} : tensor<16xf32>
  %b = dg.tanh %a : tensor<16xf32>
  %c = dg.neg %b {dg.layer_end = 0 : i64} : tensor<16xf32>
  %d = dg.exp %c {dg.layer_begin = 1 : i64} : tensor<16xf32>
  %e = dg.neg %d {dg.layer_end = 1 : i64} : tensor<16xf32>
  dg.output "loss", %e : tensor<16xf32>
  %g1 = dg.mul %d, %e : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %g2 = dg.mul %b, %g1 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %g3 = dg.mul %a, %g2 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  dg.output "grad", %g3 : tensor<16xf32>
  return
}

// -----

// Layers whose backward reads three values each: without recomputation all six are live when the
// backward starts (8 buffers of 64 bytes at the peak); with full only each layer's output is kept
// and one layer's clones are live at a time (6 buffers). The planner sees the clones as new values.
// KEPT-LABEL: func.func @wide_layers
// KEPT-SAME: dg.scratch_bytes = 512
// PLANNED-LABEL: func.func @wide_layers
// PLANNED-SAME: dg.scratch_bytes = 384
func.func @wide_layers() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<16xf32>
  %a1 = dg.exp %x {dg.layer_begin = 0 : i64} : tensor<16xf32>
  %a2 = dg.tanh %a1 : tensor<16xf32>
  %a3 = dg.exp %a2 : tensor<16xf32>
  %a = dg.tanh %a3 {dg.layer_end = 0 : i64} : tensor<16xf32>
  %b1 = dg.exp %a {dg.layer_begin = 1 : i64} : tensor<16xf32>
  %b2 = dg.tanh %b1 : tensor<16xf32>
  %b3 = dg.exp %b2 : tensor<16xf32>
  %b = dg.tanh %b3 {dg.layer_end = 1 : i64} : tensor<16xf32>
  %l = dg.reduce_sum %b dims = [0] : tensor<16xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  %g1 = dg.mul %b3, %b2 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %g2 = dg.mul %b1, %g1 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %g3 = dg.mul %a3, %g2 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %g4 = dg.mul %a2, %g3 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %g5 = dg.mul %a1, %g4 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  dg.output "grad", %g5 : tensor<16xf32>
  return
}

// -----

// A random draw inside a layer is replayed: the clone draws from the same key and stream, which the
// dialect accepts from a dg.recomputed copy. Parameters are read, not cloned.
// FULL-LABEL: func.func @replayed_draw
// FULL: %[[KEY:.*]] = dg.input "key"
// FULL: %[[W:.*]] = dg.param "w"
// FULL: %[[U:.*]] = dg.random_uniform %[[KEY]] stream = 3
// FULL: dg.output "loss"
// FULL-NEXT: %[[N2:.*]] = dg.rms_norm %{{.*}}, %[[W]] {dg.recomputed
// FULL-NEXT: %[[U2:.*]] = dg.random_uniform %[[KEY]] stream = 3 {dg.recomputed}
// FULL-NEXT: %[[M2:.*]] = dg.mul %[[N2]], %[[U2]] {dg.recomputed}
// FULL-NEXT: dg.mul %[[M2]], %[[W]]
// FULL-NOT: dg.param
func.func @replayed_draw() attributes {dg.entry = "train_step"} {
  %key = dg.input "key" : tensor<2xi64>
  %x = dg.input "x" : tensor<4xf32>
  %w = dg.param "w" : tensor<4xf32>
  %n = dg.rms_norm %x, %w {dg.layer_begin = 0 : i64, eps = 1.0e-6 : f64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %u = dg.random_uniform %key stream = 3 : tensor<2xi64> -> tensor<4xf32>
  %m = dg.mul %n, %u : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %y = dg.mul %m, %w {dg.layer_end = 0 : i64} : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  dg.output "loss", %y : tensor<4xf32>
  %g = dg.mul %m, %w : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  dg.output "grad", %g : tensor<4xf32>
  return
}

// -----

// Selective: the attention core and the experts' output, with the reshapes that view them, are
// recomputed from the kept q, k, v and the routed tokens; the rest of the layer is kept.
// SELECTIVE-LABEL: func.func @attention_and_experts
// SELECTIVE: dg.output "loss"
// SELECTIVE-NEXT: %[[O2:.*]] = dg.attention {{.*}} {dg.recomputed}
// SELECTIVE-NEXT: %[[H2:.*]] = dg.reshape %[[O2]] {dg.recomputed}
// SELECTIVE-NEXT: %[[Y2:.*]] = dg.moe_experts {{.*}} {dg.recomputed}
// SELECTIVE-NEXT: dg.neg %[[H2]]
// SELECTIVE-NEXT: dg.neg %[[Y2]]
// SELECTIVE-NOT: dg.recomputed
// Full recomputes the whole layer but its output, from its input.
// FULL-LABEL: func.func @attention_and_experts
// FULL: dg.output "loss"
// FULL-NEXT: %[[K2:.*]] = dg.exp {{.*}} {dg.recomputed}
// FULL-NEXT: dg.attention %{{.*}}, %[[K2]], %[[K2]], {{.*}} {dg.recomputed}
// FULL-NEXT: dg.reshape {{.*}} {dg.recomputed}
// FULL-NEXT: dg.slice {{.*}} {dg.recomputed}
// FULL-NEXT: dg.moe_experts {{.*}} {dg.recomputed}
// FULL-NEXT: dg.neg
func.func @attention_and_experts() attributes {dg.entry = "train_step"} {
  %q = dg.input "q" : tensor<1x4x2x8xf32>
  %m = dg.input "m" : tensor<1x4xi1>
  %w = dg.input "w" : tensor<4x2xf32>
  %i = dg.input "i" : tensor<4x2xi64>
  %gu = dg.param "gu" : tensor<2x6x8xf32>
  %dn = dg.param "dn" : tensor<2x8x3xf32>
  %k = dg.exp %q {dg.layer_begin = 0 : i64} : tensor<1x4x2x8xf32>
  %o = dg.attention %q, %k, %k, %m mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  %h = dg.reshape %o : tensor<1x4x2x8xf32> -> tensor<4x16xf32>
  %t = dg.slice %h dim = 1 start = 0 : tensor<4x16xf32> -> tensor<4x8xf32>
  %y = dg.moe_experts %t, %w, %i, %gu, %dn : tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32> -> tensor<4x8xf32>
  %s = dg.tanh %y {dg.layer_end = 0 : i64} : tensor<4x8xf32>
  dg.output "loss", %s : tensor<4x8xf32>
  %gh = dg.neg %h : tensor<4x16xf32>
  %gy = dg.neg %y : tensor<4x8xf32>
  %gk = dg.neg %k : tensor<1x4x2x8xf32>
  dg.output "grad_h", %gh : tensor<4x16xf32>
  dg.output "grad_y", %gy : tensor<4x8xf32>
  dg.output "grad_k", %gk : tensor<1x4x2x8xf32>
  return
}

// -----

// Without a loss there is no backward: nothing is recomputed.
// FULL-LABEL: func.func @forward_only
// FULL-NOT: dg.recomputed
func.func @forward_only() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4xf32>
  %a = dg.exp %x {dg.layer_begin = 0 : i64} : tensor<4xf32>
  %b = dg.neg %a {dg.layer_end = 0 : i64} : tensor<4xf32>
  dg.output "logits", %b : tensor<4xf32>
  %c = dg.tanh %a : tensor<4xf32>
  dg.output "other", %c : tensor<4xf32>
  return
}

// -----

// A layer whose output nothing reads lost its end to canonicalization: it is kept whole, and the
// next layer is recomputed as usual.
// FULL-LABEL: func.func @dead_output
// FULL: dg.output "loss"
// FULL-NEXT: %[[C2:.*]] = dg.exp %[[X:.*]] {dg.recomputed}
// FULL-NEXT: dg.mul %[[C2]]
// FULL-NEXT: dg.mul %[[A:.*]], %
// FULL-NOT: dg.recomputed
func.func @dead_output() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  %a = dg.exp %x {dg.layer_begin = 0 : i64} : tensor<4xf32>
  %c = dg.exp %x {dg.layer_begin = 0 : i64} : tensor<4xf32>
  %d = dg.neg %c {dg.layer_end = 0 : i64} : tensor<4xf32>
  dg.output "loss", %d : tensor<4xf32>
  %g1 = dg.mul %c, %d : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %g2 = dg.mul %a, %g1 : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  dg.output "grad", %g2 : tensor<4xf32>
  return
}

// -----

func.func @crossed() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  %a = dg.exp %x {dg.layer_begin = 0 : i64} : tensor<4xf32>
  // expected-error @+1 {{ends layer 1, but layer 0 is open}}
  %b = dg.neg %a {dg.layer_end = 1 : i64} : tensor<4xf32>
  dg.output "loss", %b : tensor<4xf32>
  return
}

// -----

func.func @unopened() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  // expected-error @+1 {{ends layer 0, but no layer is open}}
  %b = dg.neg %x {dg.layer_end = 0 : i64} : tensor<4xf32>
  dg.output "loss", %b : tensor<4xf32>
  return
}
