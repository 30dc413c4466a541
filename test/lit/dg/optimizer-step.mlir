// RUN: dgemma-opt %s --dg-optimizer-step="beta1=0.8 beta2=0.95 weight-decay=0.1 max-grad-norm=2.0" --split-input-file --verify-diagnostics | FileCheck %s

// One trainable weight and one frozen one: the optimizer entry takes the step scalars and the
// weight's gradient, outputs the global norm, clips as Megatron does, and assigns the weight and
// both moments; the frozen parameter is left alone.
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<3x4xf32>
  %frozen = dg.param "frozen" {trainable = false} : tensor<4xf32>
  %y = dg.add %w, %frozen : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x4xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}
// CHECK-LABEL: func.func @optimizer_step()
// CHECK-SAME: dg.bucket = {}, dg.entry = "optimizer_step"
// CHECK-DAG: %[[LR:.*]] = dg.input "lr" : tensor<f32>
// CHECK-DAG: %[[BC1:.*]] = dg.input "bias_correction1" : tensor<f32>
// CHECK-DAG: %[[BC2:.*]] = dg.input "bias_correction2" : tensor<f32>
// CHECK-DAG: %[[SCALE:.*]] = dg.input "gradient_scale" : tensor<f32>
// CHECK: %[[G:.*]] = dg.input "grad/w" : tensor<3x4xf32>
// CHECK: %[[SQUARES:.*]] = dg.mul %[[G]], %[[G]]
// CHECK: dg.reduce_sum %[[SQUARES]] dims = [0, 1]
// CHECK: %[[ROOT:.*]] = dg.sqrt
// CHECK: %[[NORM:.*]] = dg.mul %[[ROOT]], %[[SCALE]]
// CHECK: dg.output "grad_norm", %[[NORM]]
// CHECK: dg.fill 2.000000e+00 : tensor<f32>
// CHECK: %[[CLIP:.*]] = dg.minimum
// CHECK: %[[COMBINED:.*]] = dg.mul %[[SCALE]], %[[CLIP]]
// CHECK: %[[W:.*]] = dg.param "w" : tensor<3x4xf32>
// CHECK: %[[M:.*]] = dg.param "optimizer/exp_avg/w" {init = {kind = "zeros"}, trainable = false} : tensor<3x4xf32>
// CHECK: %[[V:.*]] = dg.param "optimizer/exp_avg_sq/w" {init = {kind = "zeros"}, trainable = false} : tensor<3x4xf32>
// CHECK: %[[NEW:.*]], %[[NEWM:.*]], %[[NEWV:.*]] = dg.adamw %[[W]], %[[G]], %[[M]], %[[V]], %[[COMBINED]], %[[LR]], %[[BC1]], %[[BC2]]
// CHECK-SAME: beta1 = 8.000000e-01 : f64, beta2 = 0.94999{{[0-9]*}} : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64
// CHECK: dg.assign %[[NEW]] to %[[W]] : tensor<3x4xf32>
// CHECK: dg.assign %[[NEWM]] to %[[M]] : tensor<3x4xf32>
// CHECK: dg.assign %[[NEWV]] to %[[V]] : tensor<3x4xf32>
// CHECK-NOT: frozen
// CHECK: return

// -----

// expected-error @+1 {{dg-optimizer-step: the module has no trainable parameter}}
module {
  func.func @forward() attributes {dg.entry = "forward"} {
    %w = dg.param "w" {trainable = false} : tensor<2xf32>
    dg.output "y", %w : tensor<2xf32>
    return
  }
}
