// RUN: dgemma-opt %s --split-input-file --verify-diagnostics | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --verify-diagnostics | dgemma-opt --split-input-file | FileCheck %s
// #dg.sharding and the dg.shardings op attribute: they parse, print and parse again; a sharding
// must fit the value's type and the module's mesh.

// CHECK-LABEL: func.func @split_and_partial
// CHECK: dg.param "w" {dg.shardings = [#dg.sharding<{{\[\[}}dp], [], [ep, tp]]>]} : tensor<4x3x8xf32>
// CHECK: dg.fill 1.000000e+00 {dg.shardings = [#dg.sharding<{{\[\[}}], []], partial = [tp]>]} : tensor<2x2xf32>
// CHECK: dg.fill 2.000000e+00 {dg.shardings = [#dg.sharding<[]>]} : tensor<f32>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), ep = 2 (expert), tp = 2 (tensor)]>} {
  func.func @split_and_partial() {
    %0 = dg.param "w" {dg.shardings = [#dg.sharding<[[dp], [], [ep, tp]]>]} : tensor<4x3x8xf32>
    %1 = dg.fill 1.0 {dg.shardings = [#dg.sharding<[[], []], partial = [tp]>]} : tensor<2x2xf32>
    %2 = dg.fill 2.0 {dg.shardings = [#dg.sharding<[]>]} : tensor<f32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @axis_twice() {
    // expected-error @+1 {{sharding uses mesh axis 'tp' twice}}
    %0 = dg.fill 1.0 {dg.shardings = [#dg.sharding<[[tp], []], partial = [tp]>]} : tensor<2x2xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @unknown_axis() {
    // expected-error @+1 {{names mesh axis 'dp', which the module's dg.mesh does not declare}}
    %0 = dg.fill 1.0 {dg.shardings = [#dg.sharding<[[dp], []]>]} : tensor<2x2xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @not_divisible() {
    // expected-error @+1 {{splits dimension 0 of 'tensor<3x2xf32>' 2 ways, which does not divide it}}
    %0 = dg.fill 1.0 {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<3x2xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @wrong_rank() {
    // expected-error @+1 {{has rank 1, the value's type is 'tensor<3x2xf32>'}}
    %0 = dg.fill 1.0 {dg.shardings = [#dg.sharding<[[]]>]} : tensor<3x2xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @count() {
    // expected-error @+1 {{'dg.shardings' must hold one #dg.sharding per result}}
    %0 = dg.fill 1.0 {dg.shardings = []} : tensor<3x2xf32>
    return
  }
}
