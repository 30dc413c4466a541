// RUN: dgemma-opt %s --dg-plan-pipeline | FileCheck %s
// The planner gives each of dg.canvas_sample's four results its own scratch bytes; the plan lowering
// turns the op into one kernel step with three inputs and these four outputs (checked end to end in
// test/unit/sampler/CanvasSamplePlanTest.cpp).

// CHECK-LABEL: func.func @denoise_tail
func.func @denoise_tail() attributes {dg.entry = "denoise"} {
  %logits = dg.input "logits" : tensor<2x4x8xf32>
  %t = dg.input "temperature" : tensor<2xf32>
  %key = dg.input "sample_keys" : tensor<2x2xi64>
  // CHECK: dg.canvas_sample {{.*}} {dg.offsets = array<i64: [[S:[0-9]+]], [[A:[0-9]+]], [[H:[0-9]+]], [[Z:[0-9]+]]>}
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x4x8xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>, tensor<2x4x8xbf16>
  dg.output "sampled_ids", %s : tensor<2x4xi64>
  dg.output "argmax_ids", %a : tensor<2x4xi64>
  dg.output "entropy", %h : tensor<2x4xf32>
  dg.output "scaled", %z : tensor<2x4x8xbf16>
  return
}
