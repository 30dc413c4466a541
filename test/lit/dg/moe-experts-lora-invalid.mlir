// RUN: dgemma-opt %s --split-input-file --verify-diagnostics

// The verifiers of dg.moe_experts' and dg.moe_experts_backward's per-expert adapters: shapes that
// do not fit gate_up and down, ranks that differ, lora_scale without adapters or adapters without
// it, and gradients that do not match their adapters.

func.func @gate_up_a_hidden(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %a: tensor<4x2x7xf32>, %b: tensor<4x6x2xf32>) {
  // expected-error @+1 {{lora_gate_up A must be [4, rank, 8], got 'tensor<4x2x7xf32>'}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_gate_up(%a, %b : tensor<4x2x7xf32>, tensor<4x6x2xf32>) {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @down_b_shape(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %a: tensor<4x2x3xf32>, %b: tensor<4x2x8xf32>) {
  // expected-error @+1 {{lora_down B must be 'tensor<4x8x2xf32>', got 'tensor<4x2x8xf32>'}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_down(%a, %b : tensor<4x2x3xf32>, tensor<4x2x8xf32>) {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @adapter_experts(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %a: tensor<2x2x3xf32>, %b: tensor<2x8x2xf32>) {
  // expected-error @+1 {{lora_down A must be [4, rank, 3], got 'tensor<2x2x3xf32>'}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_down(%a, %b : tensor<2x2x3xf32>, tensor<2x8x2xf32>) {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @ranks_differ(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %a1: tensor<4x2x8xf32>, %b1: tensor<4x6x2xf32>, %a2: tensor<4x4x3xf32>, %b2: tensor<4x8x4xf32>) {
  // expected-error @+1 {{lora_gate_up and lora_down must share one rank, got 2 and 4}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_gate_up(%a1, %b1 : tensor<4x2x8xf32>, tensor<4x6x2xf32>) lora_down(%a2, %b2 : tensor<4x4x3xf32>, tensor<4x8x4xf32>) {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @adapter_element_type(%x: tensor<3x8xbf16>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xbf16>, %d: tensor<4x8x3xbf16>, %a: tensor<4x2x3xf32>, %b: tensor<4x8x2xbf16>) {
  // expected-error @+1 {{lora_down A must have the input's element type 'bf16', got 'tensor<4x2x3xf32>'}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_down(%a, %b : tensor<4x2x3xf32>, tensor<4x8x2xbf16>) {lora_scale = 1.0 : f64} : tensor<3x8xbf16>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xbf16>, tensor<4x8x3xbf16> -> tensor<3x8xbf16>
  return
}

// -----

func.func @missing_scale(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %a: tensor<4x2x3xf32>, %b: tensor<4x8x2xf32>) {
  // expected-error @+1 {{adapters need lora_scale (alpha / rank)}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d lora_down(%a, %b : tensor<4x2x3xf32>, tensor<4x8x2xf32>) : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @scale_without_adapter(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>) {
  // expected-error @+1 {{lora_scale is given without an adapter}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @backward_adapter_gradient_missing(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %dy: tensor<3x8xf32>, %a: tensor<4x2x3xf32>, %b: tensor<4x8x2xf32>) {
  // expected-error @+1 {{grad_lora_down must come exactly with the lora_down adapter}}
  %dx, %dw = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy lora_down(%a, %b : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32>
  return
}

// -----

func.func @backward_adapter_gradient_shape(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %dy: tensor<3x8xf32>, %a: tensor<4x2x3xf32>, %b: tensor<4x8x2xf32>) {
  // expected-error @+1 {{grad_lora_down B must be 'tensor<4x8x2xf32>' (or its f32 form), got 'tensor<4x2x8xf32>'}}
  %dx, %dw, %da, %db = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy lora_down(%a, %b : tensor<4x2x3xf32>, tensor<4x8x2xf32>) {lora_scale = 1.0 : f64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_lora_down(tensor<4x2x3xf32>, tensor<4x2x8xf32>)
  return
}

// -----

func.func @backward_base_gradient_shape(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>, %dy: tensor<3x8xf32>) {
  // expected-error @+1 {{grad_down must be 'tensor<4x8x3xf32>' (or its f32 form), got 'tensor<4x3x8xf32>'}}
  %dx, %dw, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32>, tensor<3x8xf32> -> tensor<3x8xf32>, tensor<3x2xf32> grad_down tensor<4x3x8xf32>
  return
}
