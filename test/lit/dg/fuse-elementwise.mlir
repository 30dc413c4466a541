// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-fuse-elementwise | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-plan-pipeline="fusion=true" | FileCheck %s --check-prefix=PLANNED
// dg-fuse-elementwise: a chain of elementwise ops whose intermediate values have no other reader
// becomes one dg.fused_elementwise; its program lists the members in block order.

// A bias add and a GELU: the bias broadcasts, the sum's only reader is the GELU.
// CHECK-LABEL: func.func @bias_gelu
// CHECK: %[[X:.*]] = dg.input "x"
// CHECK: %[[B:.*]] = dg.param "b"
// CHECK-NEXT: %[[Y:.*]] = dg.fused_elementwise "add f32 0 1; gelu_tanh f32 2"(%[[X]], %[[B]]) : (tensor<2x8x48xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
// CHECK-NEXT: dg.output "y", %[[Y]]
// PLANNED-LABEL: func.func @bias_gelu
// PLANNED: dg.fused_elementwise "add f32 0 1; gelu_tanh f32 2"{{.*}}dg.offsets
func.func @bias_gelu() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<2x8x48xf32>
  %b = dg.param "b" : tensor<48xf32>
  %s = dg.add %x, %b : tensor<2x8x48xf32>, tensor<48xf32> -> tensor<2x8x48xf32>
  %y = dg.gelu_tanh %s : tensor<2x8x48xf32>
  dg.output "y", %y : tensor<2x8x48xf32>
  return
}

// -----

// The logit soft-cap: divide, tanh, multiply, the cap read twice as one input.
// CHECK-LABEL: func.func @soft_cap
// CHECK: %[[C:.*]] = dg.constant
// CHECK-NEXT: %[[Y:.*]] = dg.fused_elementwise "div f32 0 1; tanh f32 2; mul f32 3 1"(%{{.*}}, %[[C]])
// CHECK-NOT: dg.tanh
func.func @soft_cap() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4x64xf32>
  %c = dg.constant dense<30.0> : tensor<1xf32>
  %d = dg.div %x, %c : tensor<4x64xf32>, tensor<1xf32> -> tensor<4x64xf32>
  %t = dg.tanh %d : tensor<4x64xf32>
  %y = dg.mul %t, %c : tensor<4x64xf32>, tensor<1xf32> -> tensor<4x64xf32>
  dg.output "y", %y : tensor<4x64xf32>
  return
}

// -----

// bf16: casts join the chain, each value keeps its dtype in the program.
// CHECK-LABEL: func.func @bf16_scale
// CHECK: dg.fused_elementwise "cast bf16 0; mul bf16 2 1; cast f32 3"
func.func @bf16_scale() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4x8xf32>
  %s = dg.param "s" : tensor<8xbf16>
  %h = dg.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
  %m = dg.mul %h, %s : tensor<4x8xbf16>, tensor<8xbf16> -> tensor<4x8xbf16>
  %y = dg.cast %m : tensor<4x8xbf16> -> tensor<4x8xf32>
  dg.output "y", %y : tensor<4x8xf32>
  return
}

// -----

// A residual add whose sum is also an output keeps the sum; the GELU of the sum then has no
// partner and stays too. A select of floats fuses with its producers.
// CHECK-LABEL: func.func @other_uses
// CHECK: %[[S:.*]] = dg.add
// CHECK: dg.output "s", %[[S]]
// CHECK: dg.gelu_tanh %[[S]]
// CHECK: dg.fused_elementwise "exp f32 0; select f32 1 3 2"
func.func @other_uses() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4x8xf32>
  %r = dg.input "r" : tensor<4x8xf32>
  %k = dg.input "k" : tensor<4x1xi1>
  %s = dg.add %x, %r : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  dg.output "s", %s : tensor<4x8xf32>
  %g = dg.gelu_tanh %s : tensor<4x8xf32>
  dg.output "g", %g : tensor<4x8xf32>
  %e = dg.exp %x : tensor<4x8xf32>
  %y = dg.select %k, %e, %r : tensor<4x1xi1>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  dg.output "y", %y : tensor<4x8xf32>
  return
}

// -----

// A group is a contiguous run of ops ending at its root: nothing moves across a collective or an
// assignment. A producer of another shape (a per-row value) and an f32-to-f64 cast stay outside.
// CHECK-LABEL: func.func @barriers
// CHECK: dg.exp
// CHECK: dg.all_reduce
// CHECK: dg.tanh
// CHECK: dg.neg
// CHECK: dg.assign
// CHECK: dg.sqrt
// CHECK: dg.exp {{.*}}tensor<4x1xf32>
// CHECK: dg.add
// CHECK: dg.cast
// CHECK: dg.exp {{.*}}tensor<4x8xf64>
// CHECK-NOT: dg.fused_elementwise
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
func.func @barriers() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4x8xf32>
  %p = dg.param "p" : tensor<4x8xf32>
  %e = dg.exp %x : tensor<4x8xf32>
  %a = dg.all_reduce %x axis = "tp" : tensor<4x8xf32> -> tensor<4x8xf32>
  %t = dg.tanh %e : tensor<4x8xf32>
  dg.output "t", %t : tensor<4x8xf32>
  dg.output "a", %a : tensor<4x8xf32>
  %n = dg.neg %x : tensor<4x8xf32>
  dg.assign %x to %p : tensor<4x8xf32>
  %q = dg.sqrt %n : tensor<4x8xf32>
  dg.output "q", %q : tensor<4x8xf32>
  %v = dg.input "v" : tensor<4x1xf32>
  %ev = dg.exp %v : tensor<4x1xf32>
  %w = dg.add %x, %ev : tensor<4x8xf32>, tensor<4x1xf32> -> tensor<4x8xf32>
  dg.output "w", %w : tensor<4x8xf32>
  %d = dg.cast %x : tensor<4x8xf32> -> tensor<4x8xf64>
  %ed = dg.exp %d : tensor<4x8xf64>
  dg.output "ed", %ed : tensor<4x8xf64>
  return
}
}

// -----

func.func @bad_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dg.fused_elementwise' op program: instruction 0 ('frob f32 0'): unknown op 'frob'}}
  %y = dg.fused_elementwise "frob f32 0"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @bad_dtype(%x: tensor<4xf32>) -> tensor<4xbf16> {
  // expected-error @+1 {{'dg.fused_elementwise' op program: instruction 0 (exp bf16): expected bf16 values, got f32}}
  %y = dg.fused_elementwise "exp bf16 0"(%x) : (tensor<4xf32>) -> tensor<4xbf16>
  return %y : tensor<4xbf16>
}

// -----

func.func @bad_broadcast(%x: tensor<3xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dg.fused_elementwise' op input 0 of type 'tensor<3xf32>' does not broadcast to the result shape}}
  %y = dg.fused_elementwise "exp f32 0"(%x) : (tensor<3xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @bad_result(%x: tensor<4xf32>) -> tensor<4xf16> {
  // expected-error @+1 {{'dg.fused_elementwise' op program: the last value's dtype f32 is not the result's 'f16'}}
  %y = dg.fused_elementwise "exp f32 0"(%x) : (tensor<4xf32>) -> tensor<4xf16>
  return %y : tensor<4xf16>
}

// -----

func.func @unread_input(%x: tensor<4xf32>, %z: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dg.fused_elementwise' op program: value 1 is never read}}
  %y = dg.fused_elementwise "exp f32 0"(%x, %z) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
