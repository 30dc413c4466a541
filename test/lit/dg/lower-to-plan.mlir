// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-memory-plan --dg-test-lower-to-plan | FileCheck %s
// The plan lowering writes every attribute of an op into its step, those left at their default
// included (docs/plan-format.md, "Header"), and fails at the op on an attribute it cannot encode.

// CHECK-LABEL: step matmul {"transpose_a":false,"transpose_b":false}
// CHECK-NEXT:  step matmul {"transpose_a":false,"transpose_b":true}
// CHECK-NEXT:  step gather {"row_offset":0}
// CHECK-NEXT:  step gather {"padding_idx":0,"row_offset":0}
// CHECK-NEXT:  step scatter_add {"row_offset":0}
func.func @defaults() attributes {dg.entry = "defaults"} {
  %x = dg.input "x" : tensor<2x8xf32>
  %w = dg.input "w" : tensor<8x8xf32>
  %ids = dg.input "ids" : tensor<2xi64>
  %y = dg.matmul %x, %w : tensor<2x8xf32>, tensor<8x8xf32> -> tensor<2x8xf32>
  %z = dg.matmul %x, %w {transpose_b = true} : tensor<2x8xf32>, tensor<8x8xf32> -> tensor<2x8xf32>
  %rows = dg.gather %w[%ids] : tensor<8x8xf32>, tensor<2xi64> -> tensor<2x8xf32>
  %padded = dg.gather %w[%ids] {padding_idx = 0 : i64} : tensor<8x8xf32>, tensor<2xi64> -> tensor<2x8xf32>
  %table = dg.scatter_add %rows at %ids : tensor<2x8xf32>, tensor<2xi64> -> tensor<8x8xf32>
  dg.output "y", %y : tensor<2x8xf32>
  dg.output "z", %z : tensor<2x8xf32>
  dg.output "padded", %padded : tensor<2x8xf32>
  dg.output "table", %table : tensor<8x8xf32>
  return
}

// -----

// Which optional operands an op has (operandSegmentSizes) is no step attribute: the inputs say it.
// CHECK-LABEL: step cross_entropy {"softcap":0.0}
func.func @optional_operands() attributes {dg.entry = "optional_operands"} {
  %l = dg.input "logits" : tensor<3x8xf32>
  %t = dg.input "targets" : tensor<3xi64>
  %ce = dg.cross_entropy %l, %t : (tensor<3x8xf32>, tensor<3xi64>) -> tensor<3xf32>
  dg.output "loss", %ce : tensor<3xf32>
  return
}

// -----

func.func @unknown_attribute_kind() attributes {dg.entry = "unknown_attribute_kind"} {
  %x = dg.input "x" : tensor<2x8xf32>
  %w = dg.input "w" : tensor<8x8xf32>
  // expected-error @+1 {{'dg.matmul' op attribute 'note' = [1, 2] has no plan encoding (expected a bool, integer, float, string, dense i64 array or dg enum attribute)}}
  %y = dg.matmul %x, %w {note = [1, 2]} : tensor<2x8xf32>, tensor<8x8xf32> -> tensor<2x8xf32>
  dg.output "y", %y : tensor<2x8xf32>
  return
}
