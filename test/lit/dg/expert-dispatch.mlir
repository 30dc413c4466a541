// RUN: dgemma-opt %s --split-input-file --dg-expert-dispatch | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --dg-expert-dispatch --dg-cost-report 2>&1 >/dev/null | FileCheck %s --check-prefix=COST
// dg-expert-dispatch: the all-gather form of expert parallelism (per-rank IR of rank 1 of
// ep = 2: experts 2 and 3 of 4 local, 3 local tokens, top-2) becomes the ragged all-to-all form.

// The costs count the 12 rows of capacity: local experts 12 (6·4·3 + 9·3 + 2·4) = 1284 FLOPs, their
// backward 12 (14·12 + 16·3 + 4·4) = 2784, the combines 2·24 + 2·24 + 2·6; the exchanges receive
// their capacity plus a count from the other rank: 32 + 192 + 96 forward, 192 + 48 + 96 + 24
// backward, and 7·8 bytes of counts.
// COST: cost: flops=4176 parameters=2 parameter_bytes=288 communication_bytes=736
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
// CHECK-LABEL: func.func @train_step
func.func @train_step() attributes {dg.entry = "train_step"} {
  // CHECK-DAG: %[[X:.*]] = dg.input "x"
  // CHECK-DAG: %[[W:.*]] = dg.input "w"
  // CHECK-DAG: %[[I:.*]] = dg.input "i"
  // CHECK-DAG: %[[DY:.*]] = dg.input "dy"
  // CHECK-DAG: %[[GU:.*]] = dg.param "gate_up"
  // CHECK-DAG: %[[D:.*]] = dg.param "down"
  %x = dg.input "x" : tensor<3x4xf32>
  %w = dg.input "w" : tensor<3x2xf32>
  %i = dg.input "i" : tensor<6x2xi64>
  %dy = dg.input "dy" : tensor<3x4xf32>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  // The gathers are gone; the indices every rank holds whole are cut to this rank's block.
  // CHECK-NOT: dg.all_gather
  // CHECK: %[[LOCAL_I:.*]] = dg.slice %[[I]] dim = 0 start = 3 : tensor<6x2xi64> -> tensor<3x2xi64>
  // CHECK: %[[SLOTS:.*]], %[[SEND:.*]], %[[COUNTS:.*]] = dg.moe_dispatch %[[LOCAL_I]] num_experts = 4 : tensor<3x2xi64> -> tensor<3x2xi64>, tensor<2xi64>, tensor<2x2xi64>
  // CHECK: %[[ONES:.*]] = dg.constant dense<1> : tensor<2xi64>
  // CHECK: %[[RECV_COUNTS:.*]], %{{.*}} = dg.all_to_all %[[COUNTS]], %[[ONES]] axis = "ep" : tensor<2x2xi64>, tensor<2xi64> -> tensor<2x2xi64>, tensor<2xi64>
  // CHECK: %[[XS:.*]] = dg.moe_permute %[[X]], %[[SLOTS]] : tensor<3x4xf32>, tensor<3x2xi64> -> tensor<6x4xf32>
  // Capacity: both ranks' 3 tokens times 2 routes.
  // CHECK: %[[XR:.*]], %[[RECV:.*]] = dg.all_to_all %[[XS]], %[[SEND]] axis = "ep" : tensor<6x4xf32>, tensor<2xi64> -> tensor<12x4xf32>, tensor<2xi64>
  // CHECK: %[[YR:.*]] = dg.moe_local_experts %[[XR]], %[[RECV_COUNTS]], %[[GU]], %[[D]]
  // CHECK: %[[YS:.*]], %{{.*}} = dg.all_to_all %[[YR]], %[[RECV]] axis = "ep" : tensor<12x4xf32>, tensor<2xi64> -> tensor<6x4xf32>, tensor<2xi64>
  // CHECK: %[[Y:.*]] = dg.moe_combine %[[YS]], %[[SLOTS]] weights %[[W]] : (tensor<6x4xf32>, tensor<3x2xi64>, tensor<3x2xf32>) -> tensor<3x4xf32>
  // CHECK: dg.output "y", %[[Y]]
  %xg = dg.all_gather %x axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %wg = dg.all_gather %w axis = "ep" : tensor<3x2xf32> -> tensor<6x2xf32>
  %yg = dg.moe_experts %xg, %wg, %i, %gu, %d {expert_offset = 2 : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %y = dg.reduce_scatter %yg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  dg.output "y", %y : tensor<3x4xf32>

  // The backward reuses the forward's slots and received rows: only the output gradient and the
  // routing weights go out, and the two gradients come back.
  // CHECK-NOT: dg.moe_dispatch
  // CHECK: %[[DYS:.*]] = dg.moe_permute %[[DY]], %[[SLOTS]]
  // CHECK: %[[DYR:.*]], %{{.*}} = dg.all_to_all %[[DYS]], %[[SEND]] axis = "ep" : tensor<6x4xf32>, tensor<2xi64> -> tensor<12x4xf32>, tensor<2xi64>
  // CHECK: %[[ROUTE_W:.*]] = dg.reshape %[[W]] : tensor<3x2xf32> -> tensor<6xf32>
  // CHECK: %[[ROUTE_SLOTS:.*]] = dg.reshape %[[SLOTS]] : tensor<3x2xi64> -> tensor<6x1xi64>
  // CHECK: %[[WS:.*]] = dg.moe_permute %[[ROUTE_W]], %[[ROUTE_SLOTS]] : tensor<6xf32>, tensor<6x1xi64> -> tensor<6xf32>
  // CHECK: %[[WR:.*]], %{{.*}} = dg.all_to_all %[[WS]], %[[SEND]] axis = "ep" : tensor<6xf32>, tensor<2xi64> -> tensor<12xf32>, tensor<2xi64>
  // CHECK: %[[GRAD_ROWS:.*]], %[[GRAD_W:.*]], %[[GRAD_GU:.*]], %[[GRAD_D:.*]] = dg.moe_local_experts_backward %[[XR]], %[[WR]], %[[DYR]], %[[RECV_COUNTS]], %[[GU]], %[[D]]
  // CHECK: %[[DXS:.*]], %{{.*}} = dg.all_to_all %[[GRAD_ROWS]], %[[RECV]] axis = "ep" : tensor<12x4xf32>, tensor<2xi64> -> tensor<6x4xf32>, tensor<2xi64>
  // CHECK: %[[DX:.*]] = dg.moe_combine %[[DXS]], %[[SLOTS]] : (tensor<6x4xf32>, tensor<3x2xi64>) -> tensor<3x4xf32>
  // CHECK: %[[DWS:.*]], %{{.*}} = dg.all_to_all %[[GRAD_W]], %[[RECV]] axis = "ep" : tensor<12xf32>, tensor<2xi64> -> tensor<6xf32>, tensor<2xi64>
  // CHECK: %[[DW_ROUTES:.*]] = dg.moe_combine %[[DWS]], %[[ROUTE_SLOTS]] : (tensor<6xf32>, tensor<6x1xi64>) -> tensor<6xf32>
  // CHECK: %[[DW:.*]] = dg.reshape %[[DW_ROUTES]] : tensor<6xf32> -> tensor<3x2xf32>
  // CHECK: dg.output "dx", %[[DX]]
  // CHECK: dg.output "dw", %[[DW]]
  // CHECK: dg.output "dgu", %[[GRAD_GU]]
  // CHECK: dg.output "dd", %[[GRAD_D]]
  // CHECK-NOT: dg.reduce_scatter
  %dyg = dg.all_gather %dy axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %dxg, %dwg, %dgu, %dd = dg.moe_experts_backward %xg, %wg, %i, %gu, %d, %dyg {expert_offset = 2 : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32>, tensor<6x4xf32> -> tensor<6x4xf32>, tensor<6x2xf32> grad_gate_up tensor<2x6x4xf32> grad_down tensor<2x4x3xf32>
  %dx = dg.reduce_scatter %dxg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  %dw = dg.reduce_scatter %dwg axis = "ep" : tensor<6x2xf32> -> tensor<3x2xf32>
  dg.output "dx", %dx : tensor<3x4xf32>
  dg.output "dw", %dw : tensor<3x2xf32>
  dg.output "dgu", %dgu : tensor<2x6x4xf32>
  dg.output "dd", %dd : tensor<2x4x3xf32>
  return
}
}

// -----

// A backward on its own (no rewritten forward of its tokens) dispatches the rows itself; an unused
// weight gradient is not sent back. Rank 0: its block of the replicated weights starts at row 0.
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
// CHECK-LABEL: func.func @backward_only
func.func @backward_only() attributes {dg.entry = "backward_only"} {
  // CHECK: dg.slice %{{.*}} dim = 0 start = 0 : tensor<4x1xf32> -> tensor<2x1xf32>
  // CHECK: dg.slice %{{.*}} dim = 0 start = 0 : tensor<4x1xi64> -> tensor<2x1xi64>
  // CHECK: dg.moe_dispatch %{{.*}} num_experts = 2 : tensor<2x1xi64> -> tensor<2x1xi64>, tensor<2xi64>, tensor<2x1xi64>
  // CHECK-COUNT-4: dg.all_to_all
  // CHECK: dg.moe_local_experts_backward
  // CHECK: dg.all_to_all
  // CHECK-NOT: dg.all_to_all
  // CHECK: dg.moe_combine
  // CHECK-NOT: dg.reduce_scatter
  %x = dg.input "x" : tensor<2x4xf32>
  %w = dg.input "w" : tensor<4x1xf32>
  %i = dg.input "i" : tensor<4x1xi64>
  %dy = dg.input "dy" : tensor<2x4xf32>
  %gu = dg.param "gate_up" : tensor<1x6x4xf32>
  %d = dg.param "down" : tensor<1x4x3xf32>
  %xg = dg.all_gather %x axis = "ep" : tensor<2x4xf32> -> tensor<4x4xf32>
  %dyg = dg.all_gather %dy axis = "ep" : tensor<2x4xf32> -> tensor<4x4xf32>
  %dxg, %dwg, %dgu, %dd = dg.moe_experts_backward %xg, %w, %i, %gu, %d, %dyg {expert_offset = 0 : i64} : tensor<4x4xf32>, tensor<4x1xf32>, tensor<4x1xi64>, tensor<1x6x4xf32>, tensor<1x4x3xf32>, tensor<4x4xf32> -> tensor<4x4xf32>, tensor<4x1xf32> grad_gate_up tensor<1x6x4xf32> grad_down tensor<1x4x3xf32>
  %dx = dg.reduce_scatter %dxg axis = "ep" : tensor<4x4xf32> -> tensor<2x4xf32>
  dg.output "dx", %dx : tensor<2x4xf32>
  dg.output "dgu", %dgu : tensor<1x6x4xf32>
  dg.output "dd", %dd : tensor<1x4x3xf32>
  return
}
}

// -----

// The model's layout: [B, S, H] activations flattened to the experts' rows, and each partial sum
// reshaped back to [B, S, H] before its reduce-scatter (as dg-shard-partition writes a train step).
// A reduce-scatter keeps a contiguous block of the row-major elements, so the rank's combined rows
// reshaped are that block: the reshapes before the reduce-scatters go with them, and the combined
// rows are reshaped to the reduce-scatter's shape.
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
// CHECK-LABEL: func.func @reshaped_partials
func.func @reshaped_partials() attributes {dg.entry = "train_step"} {
  // CHECK-NOT: dg.all_gather
  // CHECK: %[[SLOTS:.*]], %{{.*}}, %{{.*}} = dg.moe_dispatch
  // CHECK: %[[YS:.*]], %{{.*}} = dg.all_to_all %{{.*}}, %{{.*}} axis = "ep" : tensor<8x4xf32>, tensor<2xi64> -> tensor<4x4xf32>, tensor<2xi64>
  // CHECK: %[[Y:.*]] = dg.moe_combine %[[YS]], %[[SLOTS]] weights %{{.*}} : (tensor<4x4xf32>, tensor<2x2xi64>, tensor<2x2xf32>) -> tensor<2x4xf32>
  // CHECK: %[[Y3:.*]] = dg.reshape %[[Y]] : tensor<2x4xf32> -> tensor<1x2x4xf32>
  // CHECK: dg.output "y", %[[Y3]]
  // CHECK: dg.moe_local_experts_backward
  // CHECK: %[[DXS:.*]], %{{.*}} = dg.all_to_all
  // CHECK: %[[DX:.*]] = dg.moe_combine %[[DXS]], %[[SLOTS]] : (tensor<4x4xf32>, tensor<2x2xi64>) -> tensor<2x4xf32>
  // CHECK: %[[DX3:.*]] = dg.reshape %[[DX]] : tensor<2x4xf32> -> tensor<1x2x4xf32>
  // CHECK: dg.output "dx", %[[DX3]]
  // CHECK-NOT: dg.reduce_scatter
  // CHECK-NOT: dg.all_gather
  %x3 = dg.input "x" : tensor<1x2x4xf32>
  %w = dg.input "w" : tensor<2x2xf32>
  %i = dg.input "i" : tensor<2x2xi64>
  %dy3 = dg.input "dy" : tensor<1x2x4xf32>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  %x = dg.reshape %x3 : tensor<1x2x4xf32> -> tensor<2x4xf32>
  %xg = dg.all_gather %x axis = "ep" : tensor<2x4xf32> -> tensor<4x4xf32>
  %wg = dg.all_gather %w axis = "ep" : tensor<2x2xf32> -> tensor<4x2xf32>
  %ig = dg.all_gather %i axis = "ep" : tensor<2x2xi64> -> tensor<4x2xi64>
  %yg = dg.moe_experts %xg, %wg, %ig, %gu, %d {expert_offset = 0 : i64} : tensor<4x4xf32>, tensor<4x2xf32>, tensor<4x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<4x4xf32>
  %yg3 = dg.reshape %yg : tensor<4x4xf32> -> tensor<2x2x4xf32>
  %y = dg.reduce_scatter %yg3 axis = "ep" : tensor<2x2x4xf32> -> tensor<1x2x4xf32>
  dg.output "y", %y : tensor<1x2x4xf32>
  %dy = dg.reshape %dy3 : tensor<1x2x4xf32> -> tensor<2x4xf32>
  %dyg = dg.all_gather %dy axis = "ep" : tensor<2x4xf32> -> tensor<4x4xf32>
  %dxg, %dwg, %dgu, %dd = dg.moe_experts_backward %xg, %wg, %ig, %gu, %d, %dyg {expert_offset = 0 : i64} : tensor<4x4xf32>, tensor<4x2xf32>, tensor<4x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32>, tensor<4x4xf32> -> tensor<4x4xf32>, tensor<4x2xf32> grad_gate_up tensor<2x6x4xf32> grad_down tensor<2x4x3xf32>
  %dxg3 = dg.reshape %dxg : tensor<4x4xf32> -> tensor<2x2x4xf32>
  %dx = dg.reduce_scatter %dxg3 axis = "ep" : tensor<2x2x4xf32> -> tensor<1x2x4xf32>
  %dw = dg.reduce_scatter %dwg axis = "ep" : tensor<4x2xf32> -> tensor<2x2xf32>
  dg.output "dx", %dx : tensor<1x2x4xf32>
  dg.output "dw", %dw : tensor<2x2xf32>
  dg.output "dgu", %dgu : tensor<2x6x4xf32>
  dg.output "dd", %dd : tensor<2x4x3xf32>
  return
}
}

// -----

// What is not the all-gather form stays: experts without an offset (all of them local), a partial
// result read before its reduce-scatter, and a reduce-scatter over another axis.
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert), tp = 2 (tensor)]>} {
// CHECK-LABEL: func.func @unmatched
func.func @unmatched() attributes {dg.entry = "unmatched"} {
  // CHECK-NOT: dg.moe_dispatch
  // CHECK-COUNT-3: dg.moe_experts
  // CHECK-NOT: dg.moe_dispatch
  %x = dg.input "x" : tensor<3x4xf32>
  %w = dg.input "w" : tensor<6x2xf32>
  %i = dg.input "i" : tensor<6x2xi64>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  %xg = dg.all_gather %x axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %no_offset = dg.moe_experts %xg, %w, %i, %gu, %d : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %a = dg.reduce_scatter %no_offset axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  %read = dg.moe_experts %xg, %w, %i, %gu, %d {expert_offset = 2 : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %b = dg.reduce_scatter %read axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  dg.output "partial", %read : tensor<6x4xf32>
  %other_axis = dg.moe_experts %xg, %w, %i, %gu, %d {expert_offset = 2 : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %c = dg.reduce_scatter %other_axis axis = "tp" : tensor<6x4xf32> -> tensor<3x4xf32>
  dg.output "a", %a : tensor<3x4xf32>
  dg.output "b", %b : tensor<3x4xf32>
  dg.output "c", %c : tensor<3x4xf32>
  return
}
}

// -----

// An op with per-expert adapters keeps the all-gather form (dg.moe_local_experts has none); a
// backward without the frozen base's gradients is rewritten, its local backward's base gradients
// left unused.
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
// CHECK-LABEL: func.func @adapters_and_frozen_base
func.func @adapters_and_frozen_base() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x4xf32>
  %w = dg.input "w" : tensor<3x2xf32>
  %i = dg.input "i" : tensor<6x2xi64>
  %dy = dg.input "dy" : tensor<3x4xf32>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  %a = dg.param "a" : tensor<2x2x3xf32>
  %b = dg.param "b" : tensor<2x4x2xf32>
  // CHECK: dg.all_gather
  // CHECK: dg.moe_experts {{.*}} lora_down
  // CHECK: dg.reduce_scatter
  %xg = dg.all_gather %x axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %wg = dg.all_gather %w axis = "ep" : tensor<3x2xf32> -> tensor<6x2xf32>
  %yg = dg.moe_experts %xg, %wg, %i, %gu, %d lora_down(%a, %b : tensor<2x2x3xf32>, tensor<2x4x2xf32>) {expert_offset = 2 : i64, lora_scale = 2.0 : f64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %y = dg.reduce_scatter %yg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  dg.output "y", %y : tensor<3x4xf32>
  // CHECK: dg.moe_dispatch
  // CHECK: dg.moe_local_experts_backward
  // CHECK-NOT: dg.moe_experts_backward
  %dyg = dg.all_gather %dy axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %dxg, %dwg = dg.moe_experts_backward %xg, %wg, %i, %gu, %d, %dyg {expert_offset = 2 : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32>, tensor<6x4xf32> -> tensor<6x4xf32>, tensor<6x2xf32>
  %dx = dg.reduce_scatter %dxg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  %dw = dg.reduce_scatter %dwg axis = "ep" : tensor<6x2xf32> -> tensor<3x2xf32>
  dg.output "dx", %dx : tensor<3x4xf32>
  dg.output "dw", %dw : tensor<3x2xf32>
  return
}
}
