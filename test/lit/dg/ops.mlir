// RUN: dgemma-opt %s | dgemma-opt | FileCheck %s
// Every op parses, prints and parses again.

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
// CHECK-LABEL: func.func @all_ops
// CHECK-SAME: dg.bucket = {micro_batch = 2 : i64, prompt_len = 4 : i64}
// CHECK-SAME: dg.entry = "forward"
func.func @all_ops() attributes {dg.entry = "forward", dg.bucket = {micro_batch = 2 : i64, prompt_len = 4 : i64}} {
  // CHECK: %[[X:.*]] = dg.input "x" : tensor<2x4x8xf32>
  %x = dg.input "x" : tensor<2x4x8xf32>
  // CHECK: %[[IDS:.*]] = dg.input "ids" : tensor<2x4xi64>
  %ids = dg.input "ids" : tensor<2x4xi64>
  // CHECK: %[[BONUS:.*]] = dg.input "bonus" : tensor<2x4xf32>
  %bonus = dg.input "bonus" : tensor<2x4xf32>
  // CHECK: %[[KEY:.*]] = dg.input "key" : tensor<2xi64>
  %key = dg.input "key" : tensor<2xi64>
  // CHECK: %[[KEYS:.*]] = dg.input "keys" : tensor<2x2xi64>
  %keys = dg.input "keys" : tensor<2x2xi64>
  // CHECK: %[[W:.*]] = dg.param "norm.weight" {init = {kind = "ones"}} : tensor<8xf32>
  %w = dg.param "norm.weight" {init = {kind = "ones"}} : tensor<8xf32>
  // CHECK: %[[P:.*]] = dg.param "proj.weight" {init = {kind = "normal", std = 2.000000e-02 : f64}, trainable = false} : tensor<8x16xf32>
  %p = dg.param "proj.weight" {init = {kind = "normal", std = 0.02 : f64}, trainable = false} : tensor<8x16xf32>
  // CHECK: %[[E:.*]] = dg.param "embed" : tensor<32x8xf32>
  %e = dg.param "embed" : tensor<32x8xf32>
  // CHECK: dg.constant dense<2.000000e+00> : tensor<f32>
  %c = dg.constant dense<2.0> : tensor<f32>
  // CHECK: dg.fill 5.000000e-01 : tensor<2x4x8xf32>
  %half = dg.fill 0.5 : tensor<2x4x8xf32>
  // CHECK: dg.gather %[[E]][%[[IDS]]] {padding_idx = 0 : i64} : tensor<32x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %emb = dg.gather %e[%ids] {padding_idx = 0 : i64} : tensor<32x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  // CHECK: dg.scatter_add %{{.*}} at %[[IDS]] {skip_id = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<32x8xf32>
  %grad_e = dg.scatter_add %emb at %ids {skip_id = 0 : i64} : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<32x8xf32>
  dg.output "grad_e", %grad_e : tensor<32x8xf32>
  // CHECK: dg.add %[[X]], %{{.*}} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %a = dg.add %x, %emb : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: dg.sub {{.*}} : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  %s = dg.sub %a, %w : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  // CHECK: dg.mul {{.*}} : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  %m = dg.mul %s, %c : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
  // CHECK: dg.div
  %d = dg.div %m, %half : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: dg.maximum
  %mx = dg.maximum %d, %half : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: dg.minimum
  %mn = dg.minimum %mx, %half : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: dg.neg {{.*}} : tensor<2x4x8xf32>
  %n0 = dg.neg %mn : tensor<2x4x8xf32>
  // CHECK: dg.exp
  %n1 = dg.exp %n0 : tensor<2x4x8xf32>
  // CHECK: dg.log
  %n2 = dg.log %n1 : tensor<2x4x8xf32>
  // CHECK: dg.tanh
  %n3 = dg.tanh %n2 : tensor<2x4x8xf32>
  // CHECK: dg.sqrt
  %n4 = dg.sqrt %n1 : tensor<2x4x8xf32>
  // CHECK: dg.rsqrt
  %n5 = dg.rsqrt %n4 : tensor<2x4x8xf32>
  // CHECK: dg.gelu_tanh
  %g = dg.gelu_tanh %n5 : tensor<2x4x8xf32>
  // CHECK: %[[N:.*]] = dg.rms_norm %{{.*}}, %[[W]] {eps = 9.9999999999999995E-7 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %norm = dg.rms_norm %g, %w {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: dg.rms_norm %{{.*}} {eps = 0.000000e+00 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %weightless = dg.rms_norm %norm {eps = 0.0 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  // CHECK: dg.matmul %{{.*}}, %[[P]] : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  %logits = dg.matmul %weightless, %p : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  // CHECK: dg.matmul {{.*}} {transpose_b = true} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x4xf32>
  %scores = dg.matmul %norm, %norm {transpose_b = true} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x4xf32>
  // CHECK: dg.softmax {{.*}} axis = -1 : tensor<2x4x16xf32>
  %probs = dg.softmax %logits axis = -1 : tensor<2x4x16xf32>
  // CHECK: %[[CE:.*]] = dg.cross_entropy %[[LOGITS:.*]], %[[IDS]] : (tensor<2x4x16xf32>, tensor<2x4xi64>) -> tensor<2x4xf32>
  %ce = dg.cross_entropy %logits, %ids : (tensor<2x4x16xf32>, tensor<2x4xi64>) -> tensor<2x4xf32>
  // CHECK: dg.cross_entropy %[[LOGITS]], %[[IDS]] bonus(%[[IDS]], %[[BONUS]]) : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %loo = dg.cross_entropy %logits, %ids bonus(%ids, %bonus) : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4xf32>
  // CHECK: dg.cross_entropy_backward %[[LOGITS]], %[[IDS]], %[[CE]] : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4x16xf32>
  %dce = dg.cross_entropy_backward %logits, %ids, %ce : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4x16xf32>
  // CHECK: dg.cross_entropy_backward %[[LOGITS]], %[[IDS]] bonus(%[[IDS]], %[[BONUS]]), %{{.*}} : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4x16xf32>
  %dloo = dg.cross_entropy_backward %logits, %ids bonus(%ids, %bonus), %loo : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4x16xf32>
  dg.output "dce", %dce : tensor<2x4x16xf32>
  dg.output "dloo", %dloo : tensor<2x4x16xf32>
  // CHECK: dg.reduce_sum {{.*}} dims = [2] {keep_dims = true} : tensor<2x4x16xf32> -> tensor<2x4x1xf32>
  %rs = dg.reduce_sum %probs dims = [2] {keep_dims = true} : tensor<2x4x16xf32> -> tensor<2x4x1xf32>
  // CHECK: dg.reduce_mean {{.*}} dims = [0, 1] : tensor<2x4x16xf32> -> tensor<16xf32>
  %rm = dg.reduce_mean %probs dims = [0, 1] : tensor<2x4x16xf32> -> tensor<16xf32>
  // CHECK: dg.reduce_max {{.*}} dims = [1]
  %rx = dg.reduce_max %scores dims = [1] : tensor<2x4x4xf32> -> tensor<2x4xf32>
  // CHECK: dg.transpose {{.*}} perm = [0, 2, 1] : tensor<2x4x16xf32> -> tensor<2x16x4xf32>
  %t = dg.transpose %probs perm = [0, 2, 1] : tensor<2x4x16xf32> -> tensor<2x16x4xf32>
  // CHECK: dg.stop_gradient %{{.*}} : tensor<2x16x4xf32>
  %detached = dg.stop_gradient %t : tensor<2x16x4xf32>
  dg.output "detached", %detached : tensor<2x16x4xf32>
  // CHECK: dg.reshape {{.*}} : tensor<2x16x4xf32> -> tensor<8x16xf32>
  %r = dg.reshape %t : tensor<2x16x4xf32> -> tensor<8x16xf32>
  // CHECK: dg.concat %{{.*}}, %{{.*}} dim = 0 : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<16x16xf32>
  %cat = dg.concat %r, %r dim = 0 : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<16x16xf32>
  dg.output "cat", %cat : tensor<16x16xf32>
  // CHECK: dg.cast {{.*}} : tensor<8x16xf32> -> tensor<8x16xbf16>
  %bf = dg.cast %r : tensor<8x16xf32> -> tensor<8x16xbf16>
  // CHECK: %[[Q8:.*]] = dg.param "q.weight" {trainable = false} : tensor<8x16xi8>
  %q8 = dg.param "q.weight" {trainable = false} : tensor<8x16xi8>
  // CHECK: %[[S8:.*]] = dg.param "q.weight.scale" {trainable = false} : tensor<8xf32>
  %s8 = dg.param "q.weight.scale" {trainable = false} : tensor<8xf32>
  // CHECK: dg.dequantize %[[Q8]], %[[S8]] format = "int8" : tensor<8x16xi8>, tensor<8xf32> -> tensor<8x16xbf16>
  %w8 = dg.dequantize %q8, %s8 format = "int8" : tensor<8x16xi8>, tensor<8xf32> -> tensor<8x16xbf16>
  dg.output "w8", %w8 : tensor<8x16xbf16>
  // CHECK: %[[Q4:.*]] = dg.param "e.weight" {trainable = false} : tensor<2x8x64xui8>
  %q4 = dg.param "e.weight" {trainable = false} : tensor<2x8x64xui8>
  // CHECK: %[[A4:.*]] = dg.param "e.weight.absmax" {trainable = false} : tensor<2x8x2xf32>
  %a4 = dg.param "e.weight.absmax" {trainable = false} : tensor<2x8x2xf32>
  // CHECK: dg.dequantize %[[Q4]], %[[A4]] format = "nf4" : tensor<2x8x64xui8>, tensor<2x8x2xf32> -> tensor<2x8x128xf32>
  %w4 = dg.dequantize %q4, %a4 format = "nf4" : tensor<2x8x64xui8>, tensor<2x8x2xf32> -> tensor<2x8x128xf32>
  dg.output "w4", %w4 : tensor<2x8x128xf32>
  // CHECK: dg.random_uniform %[[KEY]] stream = 3 : tensor<2xi64> -> tensor<2x4xf32>
  %u = dg.random_uniform %key stream = 3 : tensor<2xi64> -> tensor<2x4xf32>
  // CHECK: dg.random_uniform %[[KEYS]] stream = 0 : tensor<2x2xi64> -> tensor<2x4xf32>
  %rows = dg.random_uniform %keys stream = 0 : tensor<2x2xi64> -> tensor<2x4xf32>
  dg.output "rows", %rows : tensor<2x4xf32>
  // CHECK: %[[INTS:.*]] = dg.random_int %[[KEY]] stream = 4 high = 5 : tensor<2xi64> -> tensor<4xi64>
  %ints = dg.random_int %key stream = 4 high = 5 : tensor<2xi64> -> tensor<4xi64>
  // CHECK: dg.random_int %[[KEYS]] stream = 1 high = 262144 : tensor<2x2xi64> -> tensor<2x4xi64>
  %row_ints = dg.random_int %keys stream = 1 high = 262144 : tensor<2x2xi64> -> tensor<2x4xi64>
  dg.output "row_ints", %row_ints : tensor<2x4xi64>
  // CHECK: %[[LT:.*]] = dg.compare %[[U:.*]], %{{.*}} predicate = lt : tensor<2x4xf32>, tensor<f32> -> tensor<2x4xi1>
  %lt = dg.compare %u, %c predicate = lt : tensor<2x4xf32>, tensor<f32> -> tensor<2x4xi1>
  // CHECK: dg.select %[[LT]], %[[IDS]], %[[INTS]] : tensor<2x4xi1>, tensor<2x4xi64>, tensor<4xi64> -> tensor<2x4xi64>
  %picked = dg.select %lt, %ids, %ints : tensor<2x4xi1>, tensor<2x4xi64>, tensor<4xi64> -> tensor<2x4xi64>
  dg.output "picked", %picked : tensor<2x4xi64>
  // CHECK: dg.select %[[LT]], %[[U]], %{{.*}} : tensor<2x4xi1>, tensor<2x4xf32>, tensor<f32> -> tensor<2x4xf32>
  %clamped = dg.select %lt, %u, %c : tensor<2x4xi1>, tensor<2x4xf32>, tensor<f32> -> tensor<2x4xf32>
  dg.output "clamped", %clamped : tensor<2x4xf32>
  // CHECK: dg.all_reduce {{.*}} axis = "tp" : tensor<8x16xf32> -> tensor<8x16xf32>
  %ar = dg.all_reduce %r axis = "tp" : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: dg.all_gather {{.*}} axis = "tp" : tensor<8x16xf32> -> tensor<16x16xf32>
  %ag = dg.all_gather %ar axis = "tp" : tensor<8x16xf32> -> tensor<16x16xf32>
  // CHECK: dg.reduce_scatter {{.*}} axis = "tp" reduce = max : tensor<16x16xf32> -> tensor<8x16xf32>
  %rsc = dg.reduce_scatter %ag axis = "tp" reduce = max : tensor<16x16xf32> -> tensor<8x16xf32>
  // CHECK: dg.output "probs", %{{.*}} : tensor<2x4x16xf32>
  dg.output "probs", %probs : tensor<2x4x16xf32>
  dg.output "bf", %bf : tensor<8x16xbf16>
  dg.output "u", %u : tensor<2x4xf32>
  dg.output "rsc", %rsc : tensor<8x16xf32>
  dg.output "rs", %rs : tensor<2x4x1xf32>
  dg.output "rm", %rm : tensor<16xf32>
  dg.output "rx", %rx : tensor<2x4xf32>
  return
}
}

// CHECK-LABEL: func.func @adamw
func.func @adamw(%p: tensor<2x3xf32>, %g: tensor<2x3xf32>, %m: tensor<2x3xf32>, %v: tensor<2x3xf32>, %s: tensor<f32>) -> tensor<2x3xf32> {
  // CHECK: dg.adamw %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta1 = 9.000000e-01 : f64, beta2 = 0.998{{[0-9]*}} : f64, epsilon = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64} : tensor<2x3xf32>, tensor<f32>
  %np, %nm, %nv = dg.adamw %p, %g, %m, %v, %s, %s, %s, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<2x3xf32>, tensor<f32>
  return %np : tensor<2x3xf32>
}

// CHECK-LABEL: func.func @rms_norm_backward
func.func @rms_norm_backward(%x: tensor<2x8xf32>, %dy: tensor<2x8xf32>, %w: tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>, tensor<2x8xf32>) {
  // CHECK: dg.rms_norm_backward %{{.*}}, %{{.*}}, %{{.*}} {eps = 9.9999999999999995E-7 : f64} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  %dx, %dw = dg.rms_norm_backward %x, %dy, %w {eps = 1.0e-6 : f64} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  // CHECK: dg.rms_norm_backward %{{.*}}, %{{.*}} {eps = 9.9999999999999995E-7 : f64} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %dv = dg.rms_norm_backward %x, %dy {eps = 1.0e-6 : f64} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %dx, %dw, %dv : tensor<2x8xf32>, tensor<8xf32>, tensor<2x8xf32>
}
