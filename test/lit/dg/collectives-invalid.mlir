// RUN: dgemma-opt %s --split-input-file --verify-diagnostics
// The verifiers of the collectives (all_reduce, all_gather and reduce_scatter also in invalid.mlir).

func.func @broadcast_without_mesh(%x: tensor<4xf32>) {
  // expected-error @+1 {{mesh axis 'tp' is not declared in the module's dg.mesh}}
  %y = dg.broadcast %x axis = "tp" root = 0 : tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @gather_reduces_nothing(%x: tensor<4xf32>) {
    // expected-error @+1 {{reduces nothing: reduce must be omitted (sum)}}
    %y = dg.all_gather %x axis = "tp" reduce = max : tensor<4xf32> -> tensor<8xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @broadcast_root(%x: tensor<4xf32>) {
    // expected-error @+1 {{root 2 must be a rank of the axis, in [0, 2)}}
    %y = dg.broadcast %x axis = "tp" root = 2 : tensor<4xf32> -> tensor<4xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @broadcast_negative_root(%x: tensor<4xf32>) {
    // expected-error @+1 {{root -1 must be a rank of the axis, in [0, 2)}}
    %y = dg.broadcast %x axis = "tp" root = -1 : tensor<4xf32> -> tensor<4xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @broadcast_type(%x: tensor<4xf32>) {
    // expected-error @+1 {{all of {input, result} have same type}}
    %y = "dg.broadcast"(%x) {axis = "tp", root = 0 : i64} : (tensor<4xf32>) -> tensor<4xf16>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @reduce_to_root_root(%x: tensor<4xf32>) {
    // expected-error @+1 {{root 3 must be a rank of the axis, in [0, 2)}}
    %y = dg.reduce_to_root %x axis = "tp" root = 3 : tensor<4xf32> -> tensor<4xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_without_axis(%x: tensor<4x8xf32>, %c: tensor<2xi64>) {
    // expected-error @+1 {{mesh axis 'tp' is not declared in the module's dg.mesh}}
    %y, %n = dg.all_to_all %x, %c axis = "tp" : tensor<4x8xf32>, tensor<2xi64> -> tensor<6x8xf32>, tensor<2xi64>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_row_shape(%x: tensor<4x8xf32>, %c: tensor<2xi64>) {
    // expected-error @+1 {{result must be 'tensor<6x8xf32>' (the input's rows and element type, any capacity), got 'tensor<6x4xf32>'}}
    %y, %n = dg.all_to_all %x, %c axis = "ep" : tensor<4x8xf32>, tensor<2xi64> -> tensor<6x4xf32>, tensor<2xi64>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_element_type(%x: tensor<4x8xf32>, %c: tensor<2xi64>) {
    // expected-error @+1 {{result must be 'tensor<6x8xf32>' (the input's rows and element type, any capacity), got 'tensor<6x8xbf16>'}}
    %y, %n = dg.all_to_all %x, %c axis = "ep" : tensor<4x8xf32>, tensor<2xi64> -> tensor<6x8xbf16>, tensor<2xi64>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_scalar(%x: tensor<f32>, %c: tensor<2xi64>) {
    // expected-error @+1 {{input must have rank >= 1 (rows grouped by destination peer)}}
    %y, %n = dg.all_to_all %x, %c axis = "ep" : tensor<f32>, tensor<2xi64> -> tensor<f32>, tensor<2xi64>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_send_counts(%x: tensor<4x8xf32>, %c: tensor<3xi64>) {
    // expected-error @+1 {{send_counts must be 'tensor<2xi64>' (one count per rank of the axis), got 'tensor<3xi64>'}}
    %y, %n = dg.all_to_all %x, %c axis = "ep" : tensor<4x8xf32>, tensor<3xi64> -> tensor<6x8xf32>, tensor<2xi64>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_recv_counts(%x: tensor<4x8xf32>, %c: tensor<2xi64>) {
    // expected-error @+1 {{recv_counts must be 'tensor<2xi64>' (one count per rank of the axis), got 'tensor<2x1xi64>'}}
    %y, %n = dg.all_to_all %x, %c axis = "ep" : tensor<4x8xf32>, tensor<2xi64> -> tensor<6x8xf32>, tensor<2x1xi64>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @all_to_all_count_type(%x: tensor<4x8xf32>, %c: tensor<2xi32>) {
    // expected-error @+1 {{operand #1 must be ranked tensor of 64-bit signless integer values}}
    %y, %n = "dg.all_to_all"(%x, %c) {axis = "ep"} : (tensor<4x8xf32>, tensor<2xi32>) -> (tensor<6x8xf32>, tensor<2xi64>)
    return
  }
}
