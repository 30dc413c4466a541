// RUN: dgemma-opt %s --dg-f32-gradient-accumulation --split-input-file | FileCheck %s

// The tail of a bf16 weight gradient: two uses' GEMMs (one transposed), summed in bf16, widened
// for grad/w. The sum moves to f32 and both GEMMs write f32; the forward's widening of the logits
// (a rounding HF makes too) stays.
// CHECK-LABEL: func.func @train_step
func.func @train_step() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4x8xbf16>
  %dy = dg.input "dy" : tensor<4x6xbf16>
  %dyt = dg.input "dyt" : tensor<4x8xbf16>
  %h = dg.input "h" : tensor<4x6xbf16>
  // CHECK: %[[LOGITS:.*]] = dg.matmul %{{.*}}, %{{.*}} : tensor<4x8xbf16>, tensor<8x6xbf16> -> tensor<4x6xbf16>
  // CHECK: dg.cast %[[LOGITS]] : tensor<4x6xbf16> -> tensor<4x6xf32>
  %w = dg.param "w" : tensor<8x6xf32>
  %w16 = dg.cast %w : tensor<8x6xf32> -> tensor<8x6xbf16>
  %logits = dg.matmul %x, %w16 : tensor<4x8xbf16>, tensor<8x6xbf16> -> tensor<4x6xbf16>
  %logits32 = dg.cast %logits : tensor<4x6xbf16> -> tensor<4x6xf32>
  dg.output "logits", %logits32 : tensor<4x6xf32>
  // CHECK: %[[G1:.*]] = dg.matmul %{{.*}}, %{{.*}} {transpose_a = true} : tensor<4x8xbf16>, tensor<4x6xbf16> -> tensor<8x6xf32>
  // CHECK: %[[G2T:.*]] = dg.matmul %{{.*}}, %{{.*}} {transpose_a = true} : tensor<4x6xbf16>, tensor<4x8xbf16> -> tensor<6x8xf32>
  // CHECK: %[[G2:.*]] = dg.transpose %[[G2T]] perm = [1, 0] : tensor<6x8xf32> -> tensor<8x6xf32>
  // CHECK: %[[SUM:.*]] = dg.add %[[G1]], %[[G2]] : tensor<8x6xf32>, tensor<8x6xf32> -> tensor<8x6xf32>
  // CHECK: dg.output "grad/w", %[[SUM]] : tensor<8x6xf32>
  %g1 = dg.matmul %x, %dy {transpose_a = true} : tensor<4x8xbf16>, tensor<4x6xbf16> -> tensor<8x6xbf16>
  %g2t = dg.matmul %h, %dyt {transpose_a = true} : tensor<4x6xbf16>, tensor<4x8xbf16> -> tensor<6x8xbf16>
  %g2 = dg.transpose %g2t perm = [1, 0] : tensor<6x8xbf16> -> tensor<8x6xbf16>
  %sum = dg.add %g1, %g2 : tensor<8x6xbf16>, tensor<8x6xbf16> -> tensor<8x6xbf16>
  %grad = dg.cast %sum : tensor<8x6xbf16> -> tensor<8x6xf32>
  dg.output "grad/w", %grad : tensor<8x6xf32>
  return
}

// -----

// A gradient term that is also read elsewhere keeps its bf16 value; an op that does not accumulate
// (here a mul) keeps its rounding.
// CHECK-LABEL: func.func @shared_term
func.func @shared_term() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4x8xbf16>
  %dy = dg.input "dy" : tensor<4x8xbf16>
  // CHECK: %[[R:.*]] = dg.reduce_sum %{{.*}} dims = [0] : tensor<4x8xbf16> -> tensor<8xbf16>
  // CHECK: dg.output "other", %[[R]]
  // CHECK: dg.cast %[[R]] : tensor<8xbf16> -> tensor<8xf32>
  // CHECK: %[[M:.*]] = dg.mul %{{.*}}, %{{.*}} : tensor<8xbf16>, tensor<8xbf16> -> tensor<8xbf16>
  // CHECK: dg.cast %[[M]] : tensor<8xbf16> -> tensor<8xf32>
  %r = dg.reduce_sum %dy dims = [0] : tensor<4x8xbf16> -> tensor<8xbf16>
  dg.output "other", %r : tensor<8xbf16>
  %a = dg.cast %r : tensor<8xbf16> -> tensor<8xf32>
  dg.output "grad/a", %a : tensor<8xf32>
  %s = dg.reduce_sum %x dims = [0] : tensor<4x8xbf16> -> tensor<8xbf16>
  %m = dg.mul %s, %s : tensor<8xbf16>, tensor<8xbf16> -> tensor<8xbf16>
  %b = dg.cast %m : tensor<8xbf16> -> tensor<8xf32>
  dg.output "grad/b", %b : tensor<8xf32>
  return
}
