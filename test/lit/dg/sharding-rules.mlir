// RUN: dgemma-opt %s --dg-test-sharding-rules --verify-diagnostics

func.func @rules(%a: tensor<2x4x8xf32>, %b: tensor<8x16xf32>, %w: tensor<8xf32>, %ids: tensor<2x4xi64>,
                 %table: tensor<32x8xf32>, %key: tensor<2xi64>) {
  // expected-remark @+1 {{sharding rule: ([i, j, l], [l, k]) -> ([i, j, k]) reduction={l}}}
  %m = dg.matmul %a, %b : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, l, j], [i, l, k]) -> ([i, j, k]) reduction={l}}}
  %bm = dg.matmul %a, %a {transpose_a = true} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [k]) -> ([i, j, k])}}
  %add = dg.add %a, %w : tensor<2x4x8xf32>, tensor<8xf32> -> tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [k]) -> ([i, j, k]) need_replication={k}}}
  %n = dg.rms_norm %a, %w {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, j, k]) need_replication={j}}}
  %s = dg.softmax %a axis = 1 : tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, 1, k]) reduction={j}}}
  %r = dg.reduce_sum %a dims = [1] {keep_dims = true} : tensor<2x4x8xf32> -> tensor<2x1x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, k, j])}}
  %t = dg.transpose %a perm = [0, 2, 1] : tensor<2x4x8xf32> -> tensor<2x8x4xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, l]) need_replication={j, k, l}}}
  %re = dg.reshape %a : tensor<2x4x8xf32> -> tensor<2x32xf32>
  // expected-remark @+1 {{sharding rule: ([i, l], [j, k]) -> ([j, k, l]) need_replication={i}}}
  %g = dg.gather %table[%ids] : tensor<32x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: ([1]) -> ([i, j]) need_replication={i, j}}}
  %u = dg.random_uniform %key stream = 0 : tensor<2xi64> -> tensor<3x5xf32>
  return
}

func.func @model_rules(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %pos: tensor<2x6xi64>, %valid: tensor<2x6xi1>,
                       %logits: tensor<12x8xf32>, %scale: tensor<8xf32>, %x: tensor<12x48xf32>,
                       %gate_up: tensor<8x32x48xf32>, %down: tensor<8x48x16xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, j, k, l], [i, j]) -> ([i, j, k, l]) need_replication={l}}}
  %r = dg.rope %q, %pos {theta = 10000.0 : f64, rotated_pairs = 8, frequency_dim = 16} : tensor<2x6x4x16xf32>, tensor<2x6xi64> -> tensor<2x6x4x16xf32>
  // Query and KV heads share the head factor k (grouped-query attention splits both alike).
  // expected-remark @+1 {{sharding rule: ([i, j, k, l], [i, m, k, l], [i, m, k, n], [i, m]) -> ([i, j, k, n]) need_replication={l, m}}}
  %o = dg.attention %q, %k, %k, %valid mask = "causal" : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j], [j]) -> ([i, k], [i, k]) need_replication={j, k}}}
  %w, %idx = dg.moe_route %logits, %scale top_k = 2 : tensor<12x8xf32>, tensor<8xf32> -> tensor<12x2xf32>, tensor<12x2xi64>
  // Experts split across ranks leave a partial sum per token (expert parallelism).
  // expected-remark @+1 {{sharding rule: ([i, j], [i, k], [i, k], [l, m, j], [l, j, n]) -> ([i, j]) reduction={l} need_replication={j, k, m, n}}}
  %y = dg.moe_experts %x, %w, %idx, %gate_up, %down : tensor<12x48xf32>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xf32>, tensor<8x48x16xf32> -> tensor<12x48xf32>
  return
}

// Rows with their own keys split with them; a row's stream is drawn whole.
func.func @random_rules(%keys: tensor<2x2xi64>) {
  // expected-remark @+1 {{sharding rule: ([i, 1]) -> ([i, j]) need_replication={j}}}
  %u = dg.random_uniform %keys stream = 0 : tensor<2x2xi64> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: ([i, 1]) -> ([i, j]) need_replication={j}}}
  %r = dg.random_int %keys stream = 1 high = 7 : tensor<2x2xi64> -> tensor<2x4xi64>
  return
}

func.func @stop_gradient_rules(%a: tensor<2x4xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, j]) -> ([i, j])}}
  %sg = dg.stop_gradient %a : tensor<2x4xf32>
  return
}

func.func @compare_select_rules(%a: tensor<2x4xf32>, %t: tensor<2x1xf32>, %row: tensor<4xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, j], [i, 1]) -> ([i, j])}}
  %lt = dg.compare %a, %t predicate = "lt" : tensor<2x4xf32>, tensor<2x1xf32> -> tensor<2x4xi1>
  // expected-remark @+1 {{sharding rule: ([i, j], [i, j], [j]) -> ([i, j])}}
  %s = dg.select %lt, %a, %row : tensor<2x4xi1>, tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  return
}

// Positions pass through; the vocabulary is reduced inside the op.
func.func @cross_entropy_rules(%logits: tensor<2x4x16xf32>, %ids: tensor<2x4xi64>, %bonus: tensor<2x4xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, j], [i, j], [i, j]) -> ([i, j]) need_replication={k}}}
  %ce = dg.cross_entropy %logits, %ids bonus(%ids, %bonus) : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, j], [i, j]) -> ([i, j, k]) need_replication={k}}}
  %d = dg.cross_entropy_backward %logits, %ids, %ce : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4x16xf32>
  return
}
