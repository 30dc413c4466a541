// RUN: dgemma-opt %s --split-input-file --dg-autodiff | FileCheck %s
// The derivative rules of the expert-dispatch ops: a permutation's is its adjoint (the unweighted
// combine), the local experts' is their backward with weight 1 per row, and the combine's scales
// the permuted cotangent per route and takes each route's dot product, in the weights' f32 for bf16
// rows.

// CHECK-LABEL: func.func @permute_and_local_experts
func.func @permute_and_local_experts() attributes {dg.entry = "train_step"} {
  // CHECK-DAG: %[[X:.*]] = dg.param "x"
  // CHECK-DAG: %[[S:.*]] = dg.input "s"
  // CHECK-DAG: %[[C:.*]] = dg.input "counts"
  // CHECK-DAG: %[[GU:.*]] = dg.param "gate_up"
  // CHECK-DAG: %[[D:.*]] = dg.param "down"
  %x = dg.param "x" : tensor<3x4xf32>
  %s = dg.input "s" : tensor<3x2xi64>
  %c = dg.input "counts" : tensor<1x2xi64>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  // CHECK: %[[XS:.*]] = dg.moe_permute %[[X]], %[[S]]
  %xs = dg.moe_permute %x, %s : tensor<3x4xf32>, tensor<3x2xi64> -> tensor<6x4xf32>
  %y = dg.moe_local_experts %xs, %c, %gu, %d : tensor<6x4xf32>, tensor<1x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<6x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[ONES:.*]] = dg.fill 1.000000e+00 : tensor<6xf32>
  // CHECK: %[[GRAD_ROWS:.*]], %{{.*}}, %[[GRAD_GU:.*]], %[[GRAD_D:.*]] = dg.moe_local_experts_backward %[[XS]], %[[ONES]], %{{.*}}, %[[C]], %[[GU]], %[[D]]
  // CHECK: %[[GRAD_X:.*]] = dg.moe_combine %[[GRAD_ROWS]], %[[S]] : (tensor<6x4xf32>, tensor<3x2xi64>) -> tensor<3x4xf32>
  // CHECK-DAG: dg.output "grad/x", %[[GRAD_X]]
  // CHECK-DAG: dg.output "grad/gate_up", %[[GRAD_GU]]
  // CHECK-DAG: dg.output "grad/down", %[[GRAD_D]]
  return
}

// -----

// CHECK-LABEL: func.func @combine
func.func @combine() attributes {dg.entry = "train_step"} {
  // CHECK-DAG: %[[ROWS:.*]] = dg.param "rows"
  // CHECK-DAG: %[[W:.*]] = dg.param "w"
  // CHECK-DAG: %[[S:.*]] = dg.input "s"
  %rows = dg.param "rows" : tensor<6x4xbf16>
  %w = dg.param "w" : tensor<3x2xf32>
  %s = dg.input "s" : tensor<3x2xi64>
  %y = dg.moe_combine %rows, %s weights %w : (tensor<6x4xbf16>, tensor<3x2xi64>, tensor<3x2xf32>) -> tensor<3x4xbf16>
  %f = dg.cast %y : tensor<3x4xbf16> -> tensor<3x4xf32>
  %l = dg.reduce_sum %f dims = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[DY:.*]] = dg.moe_permute %{{.*}}, %[[S]] : tensor<3x4xbf16>, tensor<3x2xi64> -> tensor<6x4xbf16>
  // CHECK: %[[ROUTE_SLOTS:.*]] = dg.reshape %[[S]] : tensor<3x2xi64> -> tensor<6x1xi64>
  // CHECK: %[[ROUTE_W:.*]] = dg.reshape %[[W]] : tensor<3x2xf32> -> tensor<6xf32>
  // CHECK: %[[WS:.*]] = dg.moe_permute %[[ROUTE_W]], %[[ROUTE_SLOTS]] : tensor<6xf32>, tensor<6x1xi64> -> tensor<6xf32>
  // CHECK: %[[DY32:.*]] = dg.cast %[[DY]] : tensor<6x4xbf16> -> tensor<6x4xf32>
  // CHECK: %[[WCOL:.*]] = dg.reshape %[[WS]] : tensor<6xf32> -> tensor<6x1xf32>
  // CHECK: %[[SCALED:.*]] = dg.mul %[[DY32]], %[[WCOL]] : tensor<6x4xf32>, tensor<6x1xf32> -> tensor<6x4xf32>
  // CHECK: %[[GRAD_ROWS:.*]] = dg.cast %[[SCALED]] : tensor<6x4xf32> -> tensor<6x4xbf16>
  // CHECK: %[[ROWS32:.*]] = dg.cast %[[ROWS]] : tensor<6x4xbf16> -> tensor<6x4xf32>
  // CHECK: %[[PRODUCTS:.*]] = dg.mul %[[DY32]], %[[ROWS32]]
  // CHECK: %[[DOTS:.*]] = dg.reduce_sum %[[PRODUCTS]] dims = [1] : tensor<6x4xf32> -> tensor<6xf32>
  // CHECK: %[[BACK:.*]] = dg.moe_combine %[[DOTS]], %[[ROUTE_SLOTS]] : (tensor<6xf32>, tensor<6x1xi64>) -> tensor<6xf32>
  // CHECK: %[[GRAD_W:.*]] = dg.reshape %[[BACK]] : tensor<6xf32> -> tensor<3x2xf32>
  // CHECK: dg.output "grad/rows", %[[GRAD_ROWS]]
  // CHECK: dg.output "grad/w", %[[GRAD_W]]
  return
}
