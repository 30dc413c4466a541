// RUN: dgemma-opt %s --split-input-file --verify-diagnostics --dg-keep-expert-activations | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --dg-recompute="policy=selective" --dg-keep-expert-activations | FileCheck %s --check-prefix=SELECTIVE
// dg-keep-expert-activations: a dg.moe_experts_backward reads its forward's gate/up pre-activations
// (the forward's second result, [N·k, 2I]) instead of computing them again.

// The forward gets the rows and the backward reads them; everything else stays.
// CHECK-LABEL: func.func @forward_hands_over
// CHECK: %[[W:.*]], %[[I:.*]] = dg.moe_route
// CHECK: %[[Y:.*]], %[[ROWS:.*]] = dg.moe_experts %[[X:.*]], %[[W]], %[[I]], %[[GU:.*]], %[[D:.*]] : {{.*}} -> tensor<3x8xf32>, tensor<6x12xf32>
// CHECK: dg.output "loss", %[[Y]]
// CHECK: dg.moe_experts_backward %[[X]], %[[W]], %[[I]], %[[GU]], %[[D]], %{{.*}} rows %[[ROWS]] : {{.*}}, tensor<3x8xf32>, tensor<6x12xf32> -> 
// SELECTIVE-LABEL: func.func @forward_hands_over
// SELECTIVE: dg.moe_experts_backward {{.*}} rows
func.func @forward_hands_over() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x8xf32>
  %logits = dg.input "logits" : tensor<3x4xf32>
  %scale = dg.param "scale" : tensor<4xf32>
  %gu = dg.param "gate_up" : tensor<4x12x8xf32>
  %d = dg.param "down" : tensor<4x8x6xf32>
  %w, %i = dg.moe_route %logits, %scale top_k = 2 : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x2xf32>, tensor<3x2xi64>
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32> -> tensor<3x8xf32>
  dg.output "loss", %y : tensor<3x8xf32>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %y : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<4x12x8xf32> grad_down tensor<4x8x6xf32>
  dg.output "grad/gate_up", %dgu : tensor<4x12x8xf32>
  dg.output "grad/down", %dd : tensor<4x8x6xf32>
  return
}

// -----

// Two forwards compute the same experts (the second a dg-recompute clone): the backward reads the
// closer one's rows, so they live from the clone to the backward; the first forward is unchanged.
// CHECK-LABEL: func.func @clone_is_closer
// CHECK: %[[Y:.*]] = dg.moe_experts {{.*}} -> tensor<3x8xf32>
// CHECK-NEXT: dg.output "loss", %[[Y]]
// CHECK-NEXT: %{{.*}}, %[[ROWS:.*]] = dg.moe_experts {{.*}} {dg.recomputed} : {{.*}} -> tensor<3x8xf32>, tensor<6x12xf32>
// CHECK-NEXT: dg.moe_experts_backward {{.*}} rows %[[ROWS]]
func.func @clone_is_closer() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x8xf32>
  %logits = dg.input "logits" : tensor<3x4xf32>
  %scale = dg.param "scale" : tensor<4xf32>
  %gu = dg.param "gate_up" : tensor<4x12x8xf32>
  %d = dg.param "down" : tensor<4x8x6xf32>
  %w, %i = dg.moe_route %logits, %scale top_k = 2 : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x2xf32>, tensor<3x2xi64>
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32> -> tensor<3x8xf32>
  dg.output "loss", %y : tensor<3x8xf32>
  %y2 = dg.moe_experts %x, %w, %i, %gu, %d {dg.recomputed} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32> -> tensor<3x8xf32>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %y2 : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<4x12x8xf32> grad_down tensor<4x8x6xf32>
  dg.output "grad/gate_up", %dgu : tensor<4x12x8xf32>
  return
}

// -----

// A block of two of the router's four experts (expert parallelism's all-gather form): most rows
// would be zeros, so nothing is kept. Nor where the indices are no router's choice, or where the
// forward differs in an operand or the offset.
// CHECK-LABEL: func.func @left_alone
// CHECK-NOT: rows
// CHECK: return
func.func @left_alone() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x8xf32>
  %logits = dg.input "logits" : tensor<3x4xf32>
  %scale = dg.param "scale" : tensor<4xf32>
  %gu = dg.param "gate_up" : tensor<2x12x8xf32>
  %d = dg.param "down" : tensor<2x8x6xf32>
  %w, %i = dg.moe_route %logits, %scale top_k = 2 : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x2xf32>, tensor<3x2xi64>
  %y = dg.moe_experts %x, %w, %i, %gu, %d {expert_offset = 2 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x12x8xf32>, tensor<2x8x6xf32> -> tensor<3x8xf32>
  dg.output "loss", %y : tensor<3x8xf32>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %y {expert_offset = 2 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x12x8xf32>, tensor<2x8x6xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<2x12x8xf32> grad_down tensor<2x8x6xf32>
  dg.output "grad/gate_up", %dgu : tensor<2x12x8xf32>
  %ids = dg.input "ids" : tensor<3x2xi64>
  %y3 = dg.moe_experts %x, %w, %ids, %gu, %d : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x12x8xf32>, tensor<2x8x6xf32> -> tensor<3x8xf32>
  %dx3, %dw3, %dgu3, %dd3 = dg.moe_experts_backward %x, %w, %ids, %gu, %d, %y3 : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x12x8xf32>, tensor<2x8x6xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<2x12x8xf32> grad_down tensor<2x8x6xf32>
  dg.output "grad/gate_up3", %dgu3 : tensor<2x12x8xf32>
  %dx4, %dw4, %dgu4, %dd4 = dg.moe_experts_backward %x, %w, %i, %gu, %d, %y3 : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x12x8xf32>, tensor<2x8x6xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<2x12x8xf32> grad_down tensor<2x8x6xf32>
  dg.output "grad/gate_up4", %dgu4 : tensor<2x12x8xf32>
  return
}

// -----

// A layer whose backward reads the experts' output (the post-norm's input): selective recomputation
// clones the experts before the backward, and the clone hands over the rows.
// SELECTIVE-LABEL: func.func @selective_layer
// SELECTIVE: dg.moe_experts {{.*}} {dg.layer_end = 0 : i64} : {{.*}} -> tensor<3x8xf32>{{$}}
// SELECTIVE: dg.output "loss"
// SELECTIVE: %[[Y2:.*]], %[[ROWS:.*]] = dg.moe_experts {{.*}} {dg.recomputed} : {{.*}} -> tensor<3x8xf32>, tensor<6x12xf32>
// SELECTIVE: dg.mul %[[Y2]]
// SELECTIVE: dg.moe_experts_backward {{.*}} rows %[[ROWS]]
func.func @selective_layer() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x8xf32>
  %logits = dg.input "logits" : tensor<3x4xf32>
  %scale = dg.param "scale" : tensor<4xf32>
  %gu = dg.param "gate_up" : tensor<4x12x8xf32>
  %d = dg.param "down" : tensor<4x8x6xf32>
  %w, %i = dg.moe_route %logits, %scale top_k = 2 {dg.layer_begin = 0 : i64} : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x2xf32>, tensor<3x2xi64>
  %y = dg.moe_experts %x, %w, %i, %gu, %d {dg.layer_end = 0 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32> -> tensor<3x8xf32>
  dg.output "loss", %y : tensor<3x8xf32>
  %g = dg.mul %y, %y : tensor<3x8xf32>, tensor<3x8xf32> -> tensor<3x8xf32>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %g : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xf32>, tensor<4x8x6xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_gate_up tensor<4x12x8xf32> grad_down tensor<4x8x6xf32>
  dg.output "grad/gate_up", %dgu : tensor<4x12x8xf32>
  return
}

// -----

// A bf16 forward keeps its rows in f32, the precision the experts compute in.
// CHECK-LABEL: func.func @bf16_rows_are_f32
// CHECK: dg.moe_experts {{.*}} -> tensor<3x8xbf16>, tensor<6x12xf32>
// CHECK: dg.moe_experts_backward {{.*}} rows
func.func @bf16_rows_are_f32() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x8xbf16>
  %logits = dg.input "logits" : tensor<3x4xf32>
  %scale = dg.param "scale" : tensor<4xf32>
  %gu = dg.param "gate_up" : tensor<4x12x8xbf16>
  %d = dg.param "down" : tensor<4x8x6xbf16>
  %w, %i = dg.moe_route %logits, %scale top_k = 2 : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x2xf32>, tensor<3x2xi64>
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xbf16>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xbf16>, tensor<4x8x6xbf16> -> tensor<3x8xbf16>
  dg.output "loss", %y : tensor<3x8xbf16>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %y : tensor<3x8xbf16>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x12x8xbf16>, tensor<4x8x6xbf16>, tensor<3x8xbf16> -> tensor<3x8xbf16>, tensor<3x2xf32> grad_gate_up tensor<4x12x8xf32> grad_down tensor<4x8x6xf32>
  dg.output "grad/gate_up", %dgu : tensor<4x12x8xf32>
  return
}
