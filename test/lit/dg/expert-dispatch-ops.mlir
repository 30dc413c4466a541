// RUN: dgemma-opt %s --split-input-file --dg-test-sharding-rules --verify-diagnostics
// The expert-dispatch ops: their sharding rules (per-rank ops: rows, slots and counts stay whole,
// the experts' inner dim may split into a pending sum) and their verifiers.

func.func @rules(%i: tensor<3x2xi64>, %x: tensor<3x4xf32>, %s: tensor<3x2xi64>, %rows: tensor<6x4xf32>, %w: tensor<3x2xf32>,
                 %r: tensor<12x4xf32>, %c: tensor<2x2xi64>, %gu: tensor<2x6x4xf32>, %d: tensor<2x4x3xf32>, %rw: tensor<12xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j], [k], [k, l]) {i=3, j=2, k=2, l=2} need_replication={i, j, k, l}>}}
  %slots, %send, %counts = dg.moe_dispatch %i num_experts = 4 : tensor<3x2xi64> -> tensor<3x2xi64>, tensor<2xi64>, tensor<2x2xi64>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k], [l, m]) -> ([j, k]) {i=3, j=6, k=4, l=3, m=2} need_replication={i, j, l, m}>}}
  %p = dg.moe_permute %x, %s : tensor<3x4xf32>, tensor<3x2xi64> -> tensor<6x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k], [l, m], [l, m]) -> ([j, k]) {i=6, j=3, k=4, l=3, m=2} need_replication={i, j, l, m}>}}
  %y = dg.moe_combine %rows, %s weights %w : (tensor<6x4xf32>, tensor<3x2xi64>, tensor<3x2xf32>) -> tensor<3x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [k, l], [l, (m n), j], [l, j, n]) -> ([i, j]) {i=12, j=4, k=2, l=2, m=2, n=3} reduction={n} need_replication={i, j, k, l, m}>}}
  %o = dg.moe_local_experts %r, %c, %gu, %d : tensor<12x4xf32>, tensor<2x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<12x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i], [i, j], [k, l], [l, (m n), j], [l, j, n]) -> ([i, j], [i], [l, (m n), j], [l, j, n]) {i=12, j=4, k=2, l=2, m=2, n=3} reduction={n} need_replication={i, j, k, l, m}>}}
  %a, %b, %e, %f = dg.moe_local_experts_backward %r, %rw, %r, %c, %gu, %d : tensor<12x4xf32>, tensor<12xf32>, tensor<12x4xf32>, tensor<2x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<12x4xf32>, tensor<12xf32> grad_gate_up tensor<2x6x4xf32> grad_down tensor<2x4x3xf32>
  return
}

// -----

func.func @dispatch_experts_per_peer(%i: tensor<3x2xi64>) {
  // expected-error @+1 {{num_experts 5 must be a positive multiple of the 2 peers}}
  %slots, %send, %counts = dg.moe_dispatch %i num_experts = 5 : tensor<3x2xi64> -> tensor<3x2xi64>, tensor<2xi64>, tensor<2x2xi64>
  return
}

// -----

func.func @dispatch_counts(%i: tensor<3x2xi64>) {
  // expected-error @+1 {{expert_counts must be 'tensor<2x3xi64>' (peers, experts per peer)}}
  %slots, %send, %counts = dg.moe_dispatch %i num_experts = 6 : tensor<3x2xi64> -> tensor<3x2xi64>, tensor<2xi64>, tensor<2x2xi64>
  return
}

// -----

func.func @dispatch_slots(%i: tensor<3x2xi64>) {
  // expected-error @+1 {{slots must be 'tensor<3x2xi64>' (one per route)}}
  %slots, %send, %counts = dg.moe_dispatch %i num_experts = 4 : tensor<3x2xi64> -> tensor<6xi64>, tensor<2xi64>, tensor<2x2xi64>
  return
}

// -----

func.func @permute_rows(%x: tensor<4x4xf32>, %s: tensor<3x2xi64>) {
  // expected-error @+1 {{input must have 3 rows (one per row of slots)}}
  %p = dg.moe_permute %x, %s : tensor<4x4xf32>, tensor<3x2xi64> -> tensor<6x4xf32>
  return
}

// -----

func.func @permute_result(%x: tensor<3x4xf32>, %s: tensor<3x2xi64>) {
  // expected-error @+1 {{result must be 'tensor<6x4xf32>'}}
  %p = dg.moe_permute %x, %s : tensor<3x4xf32>, tensor<3x2xi64> -> tensor<6x4xbf16>
  return
}

// -----

func.func @combine_rows(%rows: tensor<5x4xf32>, %s: tensor<3x2xi64>) {
  // expected-error @+1 {{rows must have 6 rows (one per slot)}}
  %y = dg.moe_combine %rows, %s : (tensor<5x4xf32>, tensor<3x2xi64>) -> tensor<3x4xf32>
  return
}

// -----

func.func @combine_weights(%rows: tensor<6x4xf64>, %s: tensor<3x2xi64>, %w: tensor<3x2xf32>) {
  // expected-error @+1 {{weights must be [3, 2] of the rows' element type (or f32 for 16-bit rows)}}
  %y = dg.moe_combine %rows, %s weights %w : (tensor<6x4xf64>, tensor<3x2xi64>, tensor<3x2xf32>) -> tensor<3x4xf64>
  return
}

// -----

// Routing weights may stay f32 under bf16 rows.
func.func @combine_f32_weights(%rows: tensor<6x4xbf16>, %s: tensor<3x2xi64>, %w: tensor<3x2xf32>) {
  // expected-remark @+1 {{sharding rule}}
  %y = dg.moe_combine %rows, %s weights %w : (tensor<6x4xbf16>, tensor<3x2xi64>, tensor<3x2xf32>) -> tensor<3x4xbf16>
  return
}

// -----

func.func @local_experts_counts(%r: tensor<12x4xf32>, %c: tensor<2x3xi64>, %gu: tensor<2x6x4xf32>, %d: tensor<2x4x3xf32>) {
  // expected-error @+1 {{expert_counts must be [peers, 2] (one count per source peer and local expert)}}
  %o = dg.moe_local_experts %r, %c, %gu, %d : tensor<12x4xf32>, tensor<2x3xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<12x4xf32>
  return
}

// -----

func.func @local_experts_down(%r: tensor<12x4xf32>, %c: tensor<2x2xi64>, %gu: tensor<2x6x4xf32>, %d: tensor<2x3x4xf32>) {
  // expected-error @+1 {{down must be 'tensor<2x4x3xf32>'}}
  %o = dg.moe_local_experts %r, %c, %gu, %d : tensor<12x4xf32>, tensor<2x2xi64>, tensor<2x6x4xf32>, tensor<2x3x4xf32> -> tensor<12x4xf32>
  return
}

// -----

func.func @local_experts_backward_weights(%r: tensor<12x4xf32>, %w: tensor<12x1xf32>, %c: tensor<2x2xi64>, %gu: tensor<2x6x4xf32>,
                                          %d: tensor<2x4x3xf32>) {
  // expected-error @+1 {{weights must be [12] (one per row)}}
  %a, %b, %e, %f = dg.moe_local_experts_backward %r, %w, %r, %c, %gu, %d : tensor<12x4xf32>, tensor<12x1xf32>, tensor<12x4xf32>, tensor<2x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<12x4xf32>, tensor<12x1xf32> grad_gate_up tensor<2x6x4xf32> grad_down tensor<2x4x3xf32>
  return
}

// -----

func.func @local_experts_backward_gradients(%r: tensor<12x4xf32>, %w: tensor<12xf32>, %c: tensor<2x2xi64>, %gu: tensor<2x6x4xf32>,
                                            %d: tensor<2x4x3xf32>) {
  // expected-error @+1 {{expert weight gradients must have their weights' shape, in their element type or f32}}
  %a, %b, %e, %f = dg.moe_local_experts_backward %r, %w, %r, %c, %gu, %d : tensor<12x4xf32>, tensor<12xf32>, tensor<12x4xf32>, tensor<2x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<12x4xf32>, tensor<12xf32> grad_gate_up tensor<2x6x4xf32> grad_down tensor<2x4x3xf64>
  return
}
