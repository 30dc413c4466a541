// RUN: dgemma-opt %s --dg-lora="rank=2 alpha=2 targets=q_proj dropout=0.25 dropout-keys=noise_keys dropout-entries=train_step" | FileCheck %s

// Dropout on the adapter's input in the train step only: a keep mask (u >= p) scaled by 1/(1-p),
// u drawn from the example's noise key on stream 16 (the objective's draws use 0-3). The train step
// does not read the keys yet, so it gets them as an input, typed like the corruption's.
func.func @corrupt() attributes {dg.entry = "corrupt", dg.bucket = {}} {
  %keys = dg.input "noise_keys" : tensor<3x2xi64>
  %u = dg.random_uniform %keys stream = 0 : tensor<3x2xi64> -> tensor<3xf32>
  dg.output "t", %u : tensor<3xf32>
  return
}
func.func @train_step() attributes {dg.entry = "train_step", dg.bucket = {}} {
  %x = dg.input "x" : tensor<3x4x8xf32>
  %qw = dg.param "model.decoder.layers.0.self_attn.q_proj.weight" {dg.role = "column"} : tensor<6x8xf32>
  %q = dg.matmul %x, %qw {transpose_b = true} : tensor<3x4x8xf32>, tensor<6x8xf32> -> tensor<3x4x6xf32>
  dg.output "q", %q : tensor<3x4x6xf32>
  return
}
func.func @forward() attributes {dg.entry = "forward", dg.bucket = {}} {
  %x = dg.input "x" : tensor<3x4x8xf32>
  %qw = dg.param "model.decoder.layers.0.self_attn.q_proj.weight" {dg.role = "column"} : tensor<6x8xf32>
  %q = dg.matmul %x, %qw {transpose_b = true} : tensor<3x4x8xf32>, tensor<6x8xf32> -> tensor<3x4x6xf32>
  dg.output "q", %q : tensor<3x4x6xf32>
  return
}
// CHECK-LABEL: func.func @train_step()
// CHECK: %[[KEYS:.*]] = dg.input "noise_keys" : tensor<3x2xi64>
// CHECK: %[[X:.*]] = dg.input "x"
// CHECK: %[[U:.*]] = dg.random_uniform %[[KEYS]] stream = 16 : tensor<3x2xi64> -> tensor<3x4x8xf32>
// CHECK: %[[P:.*]] = dg.fill 2.500000e-01 : tensor<f32>
// CHECK: %[[KEEP:.*]] = dg.compare %[[U]], %[[P]] predicate = ge
// CHECK: %[[ZERO:.*]] = dg.fill 0.000000e+00 : tensor<f32>
// CHECK: %[[SCALE:.*]] = dg.fill 1.3333333333333333 : tensor<f32>
// CHECK: %[[MASK:.*]] = dg.select %[[KEEP]], %[[SCALE]], %[[ZERO]]
// CHECK: %[[DROPPED:.*]] = dg.mul %[[X]], %[[MASK]]
// CHECK: dg.matmul %[[DROPPED]], %{{.*}} {transpose_b = true} : tensor<3x4x8xf32>, tensor<2x8xf32> -> tensor<3x4x2xf32>
// CHECK-LABEL: func.func @forward()
// CHECK-NOT: dg.random_uniform
// CHECK-NOT: dg.input "noise_keys"
// CHECK: return
