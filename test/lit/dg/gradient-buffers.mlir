// RUN: dgemma-opt %s --dg-gradient-buffers --split-input-file --verify-diagnostics | FileCheck %s

// Two buckets of train_step add their gradient into the f32 buffer grad/w (a bf16 gradient widened
// first); optimizer_step reads the buffer where it took the input, and zeroes it after the update.
func.func @train_step_p4() attributes {dg.entry = "train_step", dg.bucket = {prompt_len = 4}} {
  %g = dg.input "g4" : tensor<3xf32>
  %h = dg.input "h4" : tensor<2xbf16>
  dg.output "grad/w", %g : tensor<3xf32>
  dg.output "grad/v", %h : tensor<2xbf16>
  dg.output "loss", %g : tensor<3xf32>
  return
}
func.func @train_step_p8() attributes {dg.entry = "train_step", dg.bucket = {prompt_len = 8}} {
  %g = dg.input "g8" : tensor<3xf32>
  %h = dg.input "h8" : tensor<2xbf16>
  dg.output "grad/w", %g : tensor<3xf32>
  dg.output "grad/v", %h : tensor<2xbf16>
  return
}
func.func @optimizer_step() attributes {dg.entry = "optimizer_step", dg.bucket = {}} {
  %g = dg.input "grad/w" : tensor<3xf32>
  %h = dg.input "grad/v" : tensor<2xbf16>
  %w = dg.param "w" : tensor<3xf32>
  %v = dg.param "v" : tensor<2xbf16>
  %nw = dg.sub %w, %g : tensor<3xf32>, tensor<3xf32> -> tensor<3xf32>
  %nv = dg.sub %v, %h : tensor<2xbf16>, tensor<2xbf16> -> tensor<2xbf16>
  dg.assign %nw to %w : tensor<3xf32>
  dg.assign %nv to %v : tensor<2xbf16>
  return
}
// CHECK-LABEL: func.func @train_step_p4()
// CHECK: %[[G:.*]] = dg.input "g4"
// CHECK: %[[H:.*]] = dg.input "h4"
// CHECK: %[[W:.*]] = dg.param "grad/w" {init = {kind = "zeros"}, trainable = false} : tensor<3xf32>
// CHECK: %[[SUMW:.*]] = dg.add %[[W]], %[[G]] : tensor<3xf32>, tensor<3xf32> -> tensor<3xf32>
// CHECK: dg.assign %[[SUMW]] to %[[W]] : tensor<3xf32>
// CHECK: %[[V:.*]] = dg.param "grad/v" {init = {kind = "zeros"}, trainable = false} : tensor<2xf32>
// CHECK: %[[WIDE:.*]] = dg.cast %[[H]] : tensor<2xbf16> -> tensor<2xf32>
// CHECK: %[[SUMV:.*]] = dg.add %[[V]], %[[WIDE]]
// CHECK: dg.assign %[[SUMV]] to %[[V]] : tensor<2xf32>
// CHECK-NOT: dg.output "grad/
// CHECK: dg.output "loss"
// CHECK-LABEL: func.func @train_step_p8()
// CHECK: dg.param "grad/w"
// CHECK: dg.assign
// CHECK-NOT: dg.output
// CHECK: return

// CHECK-LABEL: func.func @optimizer_step()
// CHECK-NOT: dg.input
// CHECK: %[[BW:.*]] = dg.param "grad/w" {init = {kind = "zeros"}, trainable = false} : tensor<3xf32>
// CHECK: %[[BV:.*]] = dg.param "grad/v" {init = {kind = "zeros"}, trainable = false} : tensor<2xf32>
// CHECK: %[[NARROW:.*]] = dg.cast %[[BV]] : tensor<2xf32> -> tensor<2xbf16>
// CHECK: dg.sub %{{.*}}, %[[BW]]
// CHECK: dg.sub %{{.*}}, %[[NARROW]]
// CHECK: %[[ZW:.*]] = dg.fill 0.000000e+00 : tensor<3xf32>
// CHECK: dg.assign %[[ZW]] to %[[BW]] : tensor<3xf32>
// CHECK: %[[ZV:.*]] = dg.fill 0.000000e+00 : tensor<2xf32>
// CHECK: dg.assign %[[ZV]] to %[[BV]] : tensor<2xf32>
// CHECK-NEXT: return

// The NaN/Inf guard's entry: sum(g - g) is 0 for a finite buffer and NaN otherwise.
// CHECK-LABEL: func.func @gradient_check()
// CHECK-SAME: dg.bucket = {}, dg.entry = "gradient_check"
// CHECK: %[[CW:.*]] = dg.param "grad/w"
// CHECK: %[[DW:.*]] = dg.sub %[[CW]], %[[CW]]
// CHECK: %[[SW:.*]] = dg.reduce_sum %[[DW]] dims = [0] : tensor<3xf32> -> tensor<f32>
// CHECK: dg.output "nonfinite/grad/w", %[[SW]] : tensor<f32>
// CHECK: dg.output "nonfinite/grad/v"

// CHECK-LABEL: func.func @zero_gradients()
// CHECK-SAME: dg.bucket = {}, dg.entry = "zero_gradients"
// CHECK: %[[ZB:.*]] = dg.param "grad/w"
// CHECK: %[[Z:.*]] = dg.fill 0.000000e+00 : tensor<3xf32>
// CHECK: dg.assign %[[Z]] to %[[ZB]]
// CHECK: dg.param "grad/v"

// -----

// A gradient the optimizer does not take is an error naming it.
func.func @train_step() attributes {dg.entry = "train_step"} {
  %g = dg.input "g" : tensor<3xf32>
  // expected-error @+1 {{dg-gradient-buffers: optimizer_step takes no grad/u of type 'tensor<3xf32>'}}
  dg.output "grad/u", %g : tensor<3xf32>
  return
}
func.func @optimizer_step() attributes {dg.entry = "optimizer_step", dg.bucket = {}} {
  %g = dg.input "grad/w" : tensor<3xf32>
  return
}

// -----

// expected-error @+1 {{dg-gradient-buffers: no optimizer_step entry point (run dg-optimizer-step first)}}
module {
  func.func @train_step() attributes {dg.entry = "train_step"} {
    return
  }
}
