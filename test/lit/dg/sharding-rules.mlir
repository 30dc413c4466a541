// RUN: dgemma-opt %s --split-input-file --dg-test-sharding-rules --verify-diagnostics

// Sources: every result dimension is its own pass-through factor; a key operand has none.
func.func @sources() attributes {dg.entry = "sources"} {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<() -> ([i, j]) {i=2, j=4}>}}
  %x = dg.input "x" : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<() -> ([i]) {i=8}>}}
  %w = dg.param "w" : tensor<8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<() -> ([]) {}>}}
  %c = dg.constant dense<2.0> : tensor<f32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<() -> ([i, j]) {i=3, j=5}>}}
  %f = dg.fill 0.5 : tensor<3x5xf32>
  return
}

// -----

// Elementwise ops with broadcasting: operands align on the right, a stretched size-1 dim is 1.
func.func @elementwise(%a: tensor<2x4xf32>, %t: tensor<2x1xf32>, %row: tensor<4xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [j]) -> ([i, j]) {i=2, j=4}>}}
  %add = dg.add %a, %row : tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, 1]) -> ([i, j]) {i=2, j=4}>}}
  %sub = dg.sub %a, %t : tensor<2x4xf32>, tensor<2x1xf32> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, j]) -> ([i, j]) {i=2, j=4}>}}
  %mul = dg.mul %a, %a : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, 1], [j]) -> ([i, j]) {i=2, j=4}>}}
  %div = dg.div %t, %row : tensor<2x1xf32>, tensor<4xf32> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [j]) -> ([i, j]) {i=2, j=4}>}}
  %max = dg.maximum %a, %row : tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [j]) -> ([i, j]) {i=2, j=4}>}}
  %min = dg.minimum %a, %row : tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, 1]) -> ([i, j]) {i=2, j=4}>}}
  %lt = dg.compare %a, %t predicate = lt : tensor<2x4xf32>, tensor<2x1xf32> -> tensor<2x4xi1>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, j], [j]) -> ([i, j]) {i=2, j=4}>}}
  %s = dg.select %lt, %a, %row : tensor<2x4xi1>, tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  return
}

// -----

// Unary ops, the cast and the autodiff barrier: the same factor on both sides of every dimension.
func.func @unary(%a: tensor<2x4xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %neg = dg.neg %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %exp = dg.exp %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %log = dg.log %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %tanh = dg.tanh %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %sqrt = dg.sqrt %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %rsqrt = dg.rsqrt %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %gelu = dg.gelu_tanh %a : tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %cast = dg.cast %a : tensor<2x4xf32> -> tensor<2x4xbf16>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=2, j=4}>}}
  %sg = dg.stop_gradient %a : tensor<2x4xf32>
  return
}

// -----

// Contractions, norms and reductions: contracted and reduced dims are reduction factors, a norm or
// softmax axis must be whole.
func.func @contractions(%a: tensor<2x4x8xf32>, %b: tensor<8x16xf32>, %w: tensor<8xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, l], [l, k]) -> ([i, j, k]) {i=2, j=4, k=16, l=8} reduction={l}>}}
  %m = dg.matmul %a, %b : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, l, j], [i, l, k]) -> ([i, j, k]) {i=2, j=8, k=8, l=4} reduction={l}>}}
  %bm = dg.matmul %a, %a {transpose_a = true} : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k], [k]) -> ([i, j, k]) {i=2, j=4, k=8} need_replication={k}>}}
  %n = dg.rms_norm %a, %w {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([i, j, k]) {i=2, j=4, k=8} need_replication={k}>}}
  %vn = dg.rms_norm %a {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([i, j, k]) {i=2, j=4, k=8} need_replication={j}>}}
  %s = dg.softmax %a axis = 1 : tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([i, 1, k]) {i=2, j=4, k=8} reduction={j}>}}
  %r = dg.reduce_sum %a dims = [1] {keep_dims = true} : tensor<2x4x8xf32> -> tensor<2x1x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([j]) {i=2, j=4, k=8} reduction={i, k}>}}
  %mean = dg.reduce_mean %a dims = [0, 2] : tensor<2x4x8xf32> -> tensor<4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([i, j]) {i=2, j=4, k=8} reduction={k}>}}
  %max = dg.reduce_max %a dims = [2] : tensor<2x4x8xf32> -> tensor<2x4xf32>
  return
}

// -----

// The fused rms_norm gradient: grad_weight sums over every row, so split rows leave it partial.
func.func @rms_norm_backward(%x: tensor<2x8xf32>, %w: tensor<8xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, j], [j]) -> ([i, j], [j]) {i=2, j=8} reduction={i} need_replication={j}>}}
  %dx, %dw = dg.rms_norm_backward %x, %x, %w {eps = 1.0e-6 : f64} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  return
}

// -----

// Layout: a transpose permutes the factors; a reshape factors both shapes into common factors.
func.func @layout(%a: tensor<2x4x8xf32>, %m: tensor<2x32xf32>, %six: tensor<6x4xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([i, k, j]) {i=2, j=4, k=8}>}}
  %t = dg.transpose %a perm = [0, 2, 1] : tensor<2x4x8xf32> -> tensor<2x8x4xf32>
  // Merging dims: the merged dim is the product (j k), so splitting j splits both sides alike.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k]) -> ([i, (j k)]) {i=2, j=4, k=8}>}}
  %merged = dg.reshape %a : tensor<2x4x8xf32> -> tensor<2x32xf32>
  // Splitting a dim, with a size-1 dim inserted.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, (j k)]) -> ([i, j, 1, k]) {i=2, j=4, k=8}>}}
  %split = dg.reshape %m : tensor<2x32xf32> -> tensor<2x4x1x8xf32>
  // 6x4 -> 4x6: 4 does not divide 6, so no factor is shared and both sides are whole.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([k, l]) {i=6, j=4, k=4, l=6} need_replication={i, j, k, l}>}}
  %swapped = dg.reshape %six : tensor<6x4xf32> -> tensor<4x6xf32>
  // Merging all dims into one.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([(i j)]) {i=2, j=32}>}}
  %lead = dg.reshape %m : tensor<2x32xf32> -> tensor<64xf32>
  return
}

// -----

func.func @concat_slice(%a: tensor<2x3xf32>, %b: tensor<2x5xf32>) {
  // The joined dimension is whole; each input's part of it is its own factor.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k], [i, l]) -> ([i, j]) {i=2, j=8, k=3, l=5} need_replication={j, k, l}>}}
  %c = dg.concat %a, %b dim = 1 : tensor<2x3xf32>, tensor<2x5xf32> -> tensor<2x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k]) -> ([i, j]) {i=2, j=3, k=5} need_replication={j, k}>}}
  %s = dg.slice %b dim = 1 start = 2 : tensor<2x5xf32> -> tensor<2x3xf32>
  return
}

// -----

// Lookups: a table's rows are addressed by value, so they are whole; split ids leave the
// scatter's table partial.
func.func @gather_scatter(%table: tensor<32x8xf32>, %ids: tensor<2x4xi64>, %rows: tensor<3x8xf32>, %row_ids: tensor<3xi64>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, l], [j, k]) -> ([j, k, l]) {i=32, j=2, k=4, l=8} need_replication={i}>}}
  %g = dg.gather %table[%ids] : tensor<32x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i], [i, k]) -> ([j, k]) {i=3, j=4, k=8} reduction={i} need_replication={j}>}}
  %t = dg.scatter_add %rows at %row_ids : tensor<3x8xf32>, tensor<3xi64> -> tensor<4x8xf32>
  return
}

// -----

// Random draws: a stream is drawn whole; rows with their own keys split with them.
func.func @random(%key: tensor<2xi64>, %keys: tensor<2x2xi64>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([k]) -> ([i, j]) {i=3, j=5, k=2} need_replication={i, j, k}>}}
  %u = dg.random_uniform %key stream = 0 : tensor<2xi64> -> tensor<3x5xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k]) -> ([i, j]) {i=2, j=4, k=2} need_replication={j, k}>}}
  %ur = dg.random_uniform %keys stream = 1 : tensor<2x2xi64> -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k]) -> ([i, j]) {i=2, j=4, k=2} need_replication={j, k}>}}
  %r = dg.random_int %keys stream = 2 high = 7 : tensor<2x2xi64> -> tensor<2x4xi64>
  return
}

// -----

func.func @rope(%q: tensor<2x6x4x16xf32>, %pos: tensor<2x6xi64>) {
  // The head dimension's pairs mix its two halves: it is whole.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k, l], [i, j]) -> ([i, j, k, l]) {i=2, j=6, k=4, l=16} need_replication={l}>}}
  %r = dg.rope %q, %pos {theta = 10000.0 : f64, rotated_pairs = 8, frequency_dim = 16} : tensor<2x6x4x16xf32>, tensor<2x6xi64> -> tensor<2x6x4x16xf32>
  return
}

// -----

// Grouped-query attention: 4 query heads read 2 KV heads, so the query-head dim is (k l), KV heads
// k times group l. Splitting k splits the query heads and the KV heads they read alike; splitting l
// too (TP beyond the KV heads) replicates each KV head over the ranks of its group.
func.func @attention(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %v: tensor<2x6x2x8xf32>, %valid: tensor<2x6xi1>,
                     %dy: tensor<2x6x4x8xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l), m], [i, n, k, m], [i, n, k, o], [i, n]) -> ([i, j, (k l), o]) {i=2, j=6, k=2, l=2, m=16, n=6, o=8} need_replication={m, n}>}}
  %o = dg.attention %q, %k, %v, %valid mask = causal : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>, tensor<2x6xi1> -> tensor<2x6x4x8xf32>
  // The key and value gradients sum over the queries and the group's query heads: split queries or
  // a split group leave them partial.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l), m], [i, n, k, m], [i, n, k, o], [i, n], [i, j, (k l), o]) -> ([i, j, (k l), m], [i, n, k, m], [i, n, k, o]) {i=2, j=6, k=2, l=2, m=16, n=6, o=8} reduction={j, l} need_replication={m, n}>}}
  %dq, %dk, %dv = dg.attention_backward %q, %k, %v, %valid, %dy mask = causal : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>, tensor<2x6xi1>, tensor<2x6x4x8xf32> -> tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>
  return
}

// -----

// The image overlay's segment ids take key_valid's factors: batch rows split, keys whole.
func.func @attention_segments(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %v: tensor<2x6x2x8xf32>, %valid: tensor<2x6xi1>,
                              %seg: tensor<2x6xi64>, %dy: tensor<2x6x4x8xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l), m], [i, n, k, m], [i, n, k, o], [i, n], [i, n]) -> ([i, j, (k l), o]) {i=2, j=6, k=2, l=2, m=16, n=6, o=8} need_replication={m, n}>}}
  %o = dg.attention %q, %k, %v, %valid segment_ids(%seg : tensor<2x6xi64>) mask = causal : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>, tensor<2x6xi1> -> tensor<2x6x4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l), m], [i, n, k, m], [i, n, k, o], [i, n], [i, j, (k l), o], [i, n]) -> ([i, j, (k l), m], [i, n, k, m], [i, n, k, o]) {i=2, j=6, k=2, l=2, m=16, n=6, o=8} reduction={j, l} need_replication={m, n}>}}
  %dq, %dk, %dv = dg.attention_backward %q, %k, %v, %valid, %dy segment_ids(%seg : tensor<2x6xi64>) mask = causal : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>, tensor<2x6xi1>, tensor<2x6x4x8xf32> -> tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>
  return
}

// -----

// The document ids take key_valid's factors too, after the segment ids.
func.func @attention_documents(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %v: tensor<2x6x2x8xf32>, %valid: tensor<2x6xi1>,
                               %seg: tensor<2x6xi64>, %doc: tensor<2x6xi64>, %dy: tensor<2x6x4x8xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l), m], [i, n, k, m], [i, n, k, o], [i, n], [i, n]) -> ([i, j, (k l), o]) {i=2, j=6, k=2, l=2, m=16, n=6, o=8} need_replication={m, n}>}}
  %o = dg.attention %q, %k, %v, %valid document_ids(%doc : tensor<2x6xi64>) mask = bidirectional {window = 2} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>, tensor<2x6xi1> -> tensor<2x6x4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l), m], [i, n, k, m], [i, n, k, o], [i, n], [i, j, (k l), o], [i, n], [i, n]) -> ([i, j, (k l), m], [i, n, k, m], [i, n, k, o]) {i=2, j=6, k=2, l=2, m=16, n=6, o=8} reduction={j, l} need_replication={m, n}>}}
  %dq, %dk, %dv = dg.attention_backward %q, %k, %v, %valid, %dy segment_ids(%seg : tensor<2x6xi64>) document_ids(%doc : tensor<2x6xi64>) mask = causal : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>, tensor<2x6xi1>, tensor<2x6x4x8xf32> -> tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x8xf32>
  return
}

// -----

// MoE: gate_up's rows are (halves inner); split experts or inner rows leave per-token sums partial.
func.func @moe(%logits: tensor<12x8xf32>, %scale: tensor<8xf32>, %x: tensor<12x48xf32>,
               %gate_up: tensor<8x32x48xf32>, %down: tensor<8x48x16xf32>, %dy: tensor<12x48xf32>, %dw: tensor<12x2xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [j]) -> ([i, k], [i, k]) {i=12, j=8, k=2} need_replication={j, k}>}}
  %w, %idx = dg.moe_route %logits, %scale top_k = 2 : tensor<12x8xf32>, tensor<8xf32> -> tensor<12x2xf32>, tensor<12x2xi64>
  // The scale's gradient sums over the tokens.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [j], [i, k], [i, k]) -> ([i, j], [j]) {i=12, j=8, k=2} reduction={i} need_replication={j, k}>}}
  %dl, %ds = dg.moe_route_backward %logits, %scale, %idx, %dw top_k = 2 : tensor<12x8xf32>, tensor<8xf32>, tensor<12x2xi64>, tensor<12x2xf32> -> tensor<12x8xf32>, tensor<8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, k], [i, k], [l, (m n), j], [l, j, n]) -> ([i, j]) {i=12, j=48, k=2, l=8, m=2, n=16} reduction={l, n} need_replication={j, k, m}>}}
  %y = dg.moe_experts %x, %w, %idx, %gate_up, %down : tensor<12x48xf32>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xf32>, tensor<8x48x16xf32> -> tensor<12x48xf32>
  // The experts' weight gradients sum over the tokens and stay with their experts' rank.
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, k], [i, k], [l, (m n), j], [l, j, n], [i, j]) -> ([i, j], [i, k], [l, (m n), j], [l, j, n]) {i=12, j=48, k=2, l=8, m=2, n=16} reduction={i, l, n} need_replication={j, k, m}>}}
  %dx, %dwt, %dgu, %dd = dg.moe_experts_backward %x, %w, %idx, %gate_up, %down, %dy : tensor<12x48xf32>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xf32>, tensor<8x48x16xf32>, tensor<12x48xf32> -> tensor<12x48xf32>, tensor<12x2xf32> grad_gate_up tensor<8x32x48xf32> grad_down tensor<8x48x16xf32>
  return
}

// -----

// Losses: positions pass through, the vocabulary is reduced inside the op.
func.func @cross_entropy(%logits: tensor<2x4x16xf32>, %ids: tensor<2x4xi64>, %bonus: tensor<2x4xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k], [i, j], [i, j], [i, j]) -> ([i, j]) {i=2, j=4, k=16} need_replication={k}>}}
  %ce = dg.cross_entropy %logits, %ids bonus(%ids, %bonus) : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, k], [i, j], [i, j]) -> ([i, j, k]) {i=2, j=4, k=16} need_replication={k}>}}
  %d = dg.cross_entropy_backward %logits, %ids, %ce : (tensor<2x4x16xf32>, tensor<2x4xi64>, tensor<2x4xf32>) -> tensor<2x4x16xf32>
  return
}

// -----

// The optimizer update is elementwise over the tensors; the four scalars have no dimensions.
func.func @adamw(%p: tensor<4x2xf32>, %s: tensor<f32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i, j], [i, j], [i, j], [], [], [], []) -> ([i, j], [i, j], [i, j]) {i=4, j=2}>}}
  %a, %b, %c = dg.adamw %p, %p, %p, %p, %s, %s, %s, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4x2xf32>, tensor<f32>
  return
}

// -----

// Collectives. The elementwise ones shard like elementwise ops. Dim 0 of a gather, a scatter or an
// all-to-all holds the ranks' blocks or the peers' rows: whole, its own factor on each side; the
// counts of an all-to-all are whole too.
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert), tp = 2 (tensor)]>} {
func.func @collectives(%x: tensor<8x16xf32>, %rows: tensor<6x4xbf16>, %counts: tensor<2xi64>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=8, j=16}>}}
  %ar = dg.all_reduce %x axis = "tp" : tensor<8x16xf32> -> tensor<8x16xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k]) -> ([j, k]) {i=8, j=16, k=16} need_replication={i, j}>}}
  %ag = dg.all_gather %x axis = "tp" : tensor<8x16xf32> -> tensor<16x16xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k]) -> ([j, k]) {i=8, j=4, k=16} need_replication={i, j}>}}
  %rs = dg.reduce_scatter %x axis = "tp" : tensor<8x16xf32> -> tensor<4x16xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=8, j=16}>}}
  %bc = dg.broadcast %x axis = "tp" root = 1 : tensor<8x16xf32> -> tensor<8x16xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j]) -> ([i, j]) {i=8, j=16}>}}
  %rr = dg.reduce_to_root %x axis = "tp" root = 1 : tensor<8x16xf32> -> tensor<8x16xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, k], [l]) -> ([j, k], [l]) {i=6, j=10, k=4, l=2} need_replication={i, j, l}>}}
  %y, %n = dg.all_to_all %rows, %counts axis = "ep" : tensor<6x4xbf16>, tensor<2xi64> -> tensor<10x4xbf16>, tensor<2xi64>
  return
}
}

// -----

// Dequantize: the leading dims shard alike in codes, scales and result; an nf4 row is (blocks, within a
// block), so a split of it keeps whole blocks; an int8 row's scale is whole on every rank.
func.func @dequantize(%q8: tensor<4x8xi8>, %s8: tensor<4xf32>, %q4: tensor<2x4x64xui8>, %a4: tensor<2x4x2xf32>) {
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j], [i]) -> ([i, j]) {i=4, j=8}>}}
  %w8 = dg.dequantize %q8, %s8 format = "int8" : tensor<4x8xi8>, tensor<4xf32> -> tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule: #dg.sharding_rule<([i, j, (k l)], [i, j, k]) -> ([i, j, (k m)]) {i=2, j=4, k=2, l=32, m=64} need_replication={l, m}>}}
  %w4 = dg.dequantize %q4, %a4 format = "nf4" : tensor<2x4x64xui8>, tensor<2x4x2xf32> -> tensor<2x4x128xbf16>
  return
}
