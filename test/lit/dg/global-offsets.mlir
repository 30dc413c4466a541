// RUN: dgemma-opt %s --split-input-file --verify-diagnostics | FileCheck %s
// The global-index offsets of a rank's block (docs/kernels.md): printed when non-zero, elided at their
// default 0, and rejected when negative.

// CHECK-LABEL: func.func @offsets_print
func.func @offsets_print(%table: tensor<4x8xf32>, %ids: tensor<3xi64>, %rows: tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<4x8xf32>) {
  // A padding_idx of another rank's block is a valid global row.
  // CHECK: dg.gather %{{.*}}[%{{.*}}] {padding_idx = 9 : i64, row_offset = 4 : i64} : tensor<4x8xf32>, tensor<3xi64> -> tensor<3x8xf32>
  %y = dg.gather %table[%ids] {padding_idx = 9 : i64, row_offset = 4 : i64} : tensor<4x8xf32>, tensor<3xi64> -> tensor<3x8xf32>
  // CHECK: dg.scatter_add %{{.*}} at %{{.*}} {row_offset = 4 : i64, skip_id = 9 : i64} : tensor<3x8xf32>, tensor<3xi64> -> tensor<4x8xf32>
  %t = dg.scatter_add %rows at %ids {skip_id = 9 : i64, row_offset = 4 : i64} : tensor<3x8xf32>, tensor<3xi64> -> tensor<4x8xf32>
  return %y, %t : tensor<3x8xf32>, tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @offsets_elided_at_zero
func.func @offsets_elided_at_zero(%table: tensor<4x8xf32>, %ids: tensor<3xi64>, %rows: tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<4x8xf32>) {
  // CHECK: dg.gather %{{.*}}[%{{.*}}] : tensor<4x8xf32>
  %y = dg.gather %table[%ids] {row_offset = 0 : i64} : tensor<4x8xf32>, tensor<3xi64> -> tensor<3x8xf32>
  // CHECK: dg.scatter_add %{{.*}} at %{{.*}} : tensor<3x8xf32>
  %t = dg.scatter_add %rows at %ids {row_offset = 0 : i64} : tensor<3x8xf32>, tensor<3xi64> -> tensor<4x8xf32>
  return %y, %t : tensor<3x8xf32>, tensor<4x8xf32>
}

// -----

// CHECK-LABEL: func.func @experts_offsets
func.func @experts_offsets(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<2x6x8xf32>, %d: tensor<2x8x3xf32>, %dy: tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>) {
  // CHECK: dg.moe_experts %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {expert_offset = 2 : i64} : tensor<3x8xf32>
  %y = dg.moe_experts %x, %w, %i, %gu, %d {expert_offset = 2 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32> -> tensor<3x8xf32>
  // CHECK: dg.moe_experts %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<3x8xf32>
  %whole = dg.moe_experts %x, %w, %i, %gu, %d {expert_offset = 0 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32> -> tensor<3x8xf32>
  // CHECK: dg.moe_experts_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {expert_offset = 2 : i64} : tensor<3x8xf32>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy {expert_offset = 2 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<2x6x8xf32> grad_down tensor<2x8x3xf32>
  return %y, %whole, %dx : tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>
}

// -----

func.func @gather_negative_row_offset(%table: tensor<4x8xf32>, %ids: tensor<3xi64>) {
  // expected-error @+1 {{row_offset -4 must be >= 0}}
  %y = dg.gather %table[%ids] {row_offset = -4 : i64} : tensor<4x8xf32>, tensor<3xi64> -> tensor<3x8xf32>
  return
}

// -----

func.func @scatter_add_negative_row_offset(%rows: tensor<3x8xf32>, %ids: tensor<3xi64>) {
  // expected-error @+1 {{row_offset -1 must be >= 0}}
  %t = dg.scatter_add %rows at %ids {row_offset = -1 : i64} : tensor<3x8xf32>, tensor<3xi64> -> tensor<4x8xf32>
  return
}

// -----

func.func @experts_negative_offset(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<2x6x8xf32>, %d: tensor<2x8x3xf32>) {
  // expected-error @+1 {{expert_offset -2 must be >= 0}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d {expert_offset = -2 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @experts_backward_negative_offset(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<2x6x8xf32>, %d: tensor<2x8x3xf32>, %dy: tensor<3x8xf32>) {
  // expected-error @+1 {{expert_offset -1 must be >= 0}}
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy {expert_offset = -1 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<2x6x8xf32> grad_down tensor<2x8x3xf32>
  return
}
