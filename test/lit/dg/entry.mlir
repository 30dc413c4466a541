// RUN: dgemma-opt %s --split-input-file --verify-diagnostics
// Entry-point rules, checked through the dialect's dg.* attributes.

// expected-error @+1 {{entry point must take no arguments and return nothing}}
func.func @with_args(%x: tensor<4xf32>) attributes {dg.entry = "forward"} {
  return
}

// -----

func.func @duplicate_output() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4xf32>
  dg.output "y", %x : tensor<4xf32>
  // expected-error @+1 {{output 'y' is already produced in this entry point}}
  dg.output "y", %x : tensor<4xf32>
  return
}

// -----

func.func @same_random_stream() attributes {dg.entry = "train_step"} {
  %key = dg.input "key" : tensor<2xi64>
  %a = dg.random_uniform %key stream = 1 : tensor<2xi64> -> tensor<4xf32>
  // expected-error @+1 {{draws the same numbers as an earlier random op (same key and stream 1)}}
  %b = dg.random_uniform %key stream = 1 : tensor<2xi64> -> tensor<4xf32>
  dg.output "a", %a : tensor<4xf32>
  dg.output "b", %b : tensor<4xf32>
  return
}

// -----

// random_int reads the Philox words random_uniform would: the two share one (key, stream) space.
func.func @same_stream_across_random_ops() attributes {dg.entry = "train_step"} {
  %keys = dg.input "keys" : tensor<3x2xi64>
  %u = dg.random_uniform %keys stream = 2 : tensor<3x2xi64> -> tensor<3x4xf32>
  // expected-error @+1 {{draws the same numbers as an earlier random op (same key and stream 2)}}
  %r = dg.random_int %keys stream = 2 high = 8 : tensor<3x2xi64> -> tensor<3x4xi64>
  dg.output "u", %u : tensor<3x4xf32>
  dg.output "r", %r : tensor<3x4xi64>
  return
}

// -----

func.func @one() attributes {dg.entry = "forward"} {
  %w = dg.param "w" : tensor<4xf32>
  dg.output "w", %w : tensor<4xf32>
  return
}
func.func @two() attributes {dg.entry = "forward"} {
  // expected-error @+1 {{parameter 'w' has type 'tensor<8xf32>' here but 'tensor<4xf32>' elsewhere in the module}}
  %w = dg.param "w" : tensor<8xf32>
  dg.output "w", %w : tensor<8xf32>
  return
}

// -----

// expected-error @+1 {{'dg.bucket' entry 'prompt_len' must be an integer >= 1}}
func.func @bad_bucket() attributes {dg.entry = "forward", dg.bucket = {prompt_len = 0 : i64}} {
  return
}

// -----

// expected-error @+1 {{'dg.bucket' belongs on an entry point}}
func.func @bucket_without_entry() attributes {dg.bucket = {prompt_len = 4 : i64}} {
  return
}

// -----

// expected-error @+1 {{'dg.mesh' belongs on the module}}
func.func @mesh_on_function() attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  return
}

// -----

// A dictionary has no order, so it cannot number the ranks.
// expected-error @+1 {{'dg.mesh' must be a #dg.mesh<[name = size (role), ...]>}}
module attributes {dg.mesh = {tp = 2 : i64}} {
}

// -----

// expected-error @+1 {{mesh axis 'tp' is listed twice}}
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor), tp = 2 (tensor)]>} {
}

// -----

// expected-error @+1 {{axis 'pp' has role 'pipeline', expected data, expert, tensor or context}}
module attributes {dg.mesh = #dg.mesh<[pp = 2 (pipeline)]>} {
}

// -----

// expected-error @+1 {{unknown dg attribute 'dg.sharding'}}
func.func @unknown_attribute() attributes {dg.sharding = 1 : i64} {
  return
}
