// RUN: dgemma-opt %s | dgemma-opt | FileCheck %s
// Every collective parses, prints and parses again.

module attributes {dg.mesh = #dg.mesh<[ep = 3 (expert), tp = 2 (tensor)]>} {
// CHECK-LABEL: func.func @collectives
func.func @collectives(%x: tensor<8x16xf32>, %ids: tensor<4xi64>, %rows: tensor<6x4xbf16>, %counts: tensor<3xi64>) {
  // CHECK: dg.all_reduce %{{.*}} axis = "tp" : tensor<8x16xf32> -> tensor<8x16xf32>
  %ar = dg.all_reduce %x axis = "tp" : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: dg.all_reduce %{{.*}} axis = "tp" reduce = min : tensor<8x16xf32> -> tensor<8x16xf32>
  %armin = dg.all_reduce %x axis = "tp" reduce = min : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: dg.all_gather %{{.*}} axis = "ep" : tensor<8x16xf32> -> tensor<24x16xf32>
  %ag = dg.all_gather %x axis = "ep" : tensor<8x16xf32> -> tensor<24x16xf32>
  // CHECK: dg.reduce_scatter %{{.*}} axis = "tp" : tensor<8x16xf32> -> tensor<4x16xf32>
  %rs = dg.reduce_scatter %x axis = "tp" : tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: dg.broadcast %{{.*}} axis = "ep" root = 2 : tensor<8x16xf32> -> tensor<8x16xf32>
  %bc = dg.broadcast %x axis = "ep" root = 2 : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: dg.broadcast %{{.*}} axis = "tp" root = 0 : tensor<4xi64> -> tensor<4xi64>
  %bcids = dg.broadcast %ids axis = "tp" root = 0 : tensor<4xi64> -> tensor<4xi64>
  // CHECK: dg.reduce_to_root %{{.*}} axis = "ep" root = 1 : tensor<8x16xf32> -> tensor<8x16xf32>
  %rr = dg.reduce_to_root %x axis = "ep" root = 1 : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: %{{.*}}, %{{.*}} = dg.all_to_all %{{.*}}, %{{.*}} axis = "ep" : tensor<6x4xbf16>, tensor<3xi64> -> tensor<10x4xbf16>, tensor<3xi64>
  %received, %received_counts = dg.all_to_all %rows, %counts axis = "ep" : tensor<6x4xbf16>, tensor<3xi64> -> tensor<10x4xbf16>, tensor<3xi64>
  return
}
}
