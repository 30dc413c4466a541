// RUN: dgemma-opt %s --split-input-file --verify-diagnostics

func.func @bad_broadcast(%a: tensor<2x3xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{shapes 'tensor<2x3xf32>' and 'tensor<4xf32>' do not broadcast}}
  %c = dg.add %a, %b : tensor<2x3xf32>, tensor<4xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @wrong_broadcast_result(%a: tensor<2x3xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{result shape must be the broadcast shape 'tensor<2x3xf32>'}}
  %c = dg.mul %a, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<3x3xf32>
  return
}

// -----

func.func @mixed_types(%a: tensor<3xf32>, %b: tensor<3xbf16>) {
  // expected-error @+1 {{operands and result must share the element type}}
  %c = dg.add %a, %b : tensor<3xf32>, tensor<3xbf16> -> tensor<3xf32>
  return
}

// -----

func.func @matmul_k_mismatch(%a: tensor<4x8xf32>, %b: tensor<6x16xf32>) {
  // expected-error @+1 {{contracting dimensions differ: 8 vs 6}}
  %c = dg.matmul %a, %b : tensor<4x8xf32>, tensor<6x16xf32> -> tensor<4x16xf32>
  return
}

// -----

func.func @matmul_batch_mismatch(%a: tensor<2x4x8xf32>, %b: tensor<3x8x16xf32>) {
  // expected-error @+1 {{rhs must be 2-D or have the lhs batch dimensions}}
  %c = dg.matmul %a, %b : tensor<2x4x8xf32>, tensor<3x8x16xf32> -> tensor<2x4x16xf32>
  return
}

// -----

func.func @matmul_wrong_result(%a: tensor<8x4xf32>, %b: tensor<8x16xf32>) {
  // expected-error @+1 {{result must be 'tensor<4x16xf32>'}}
  %c = dg.matmul %a, %b {transpose_a = true} : tensor<8x4xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return
}

// -----

func.func @norm_weight(%x: tensor<2x8xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{weight must be 'tensor<8xf32>'}}
  %y = dg.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<2x8xf32>, tensor<4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @norm_eps(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{eps must be >= 0}}
  %y = dg.rms_norm %x {eps = -1.0 : f64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @softmax_axis(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{axis -3 is outside rank 2}}
  %y = dg.softmax %x axis = -3 : tensor<2x8xf32>
  return
}

// -----

func.func @reduce_unsorted(%x: tensor<2x3x4xf32>) {
  // expected-error @+1 {{dims must be sorted and unique}}
  %y = dg.reduce_sum %x dims = [2, 0] : tensor<2x3x4xf32> -> tensor<3xf32>
  return
}

// -----

func.func @reduce_result(%x: tensor<2x3x4xf32>) {
  // expected-error @+1 {{result must be 'tensor<2x1x4xf32>'}}
  %y = dg.reduce_max %x dims = [1] {keep_dims = true} : tensor<2x3x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @transpose_perm(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{perm must be a permutation of 0..1}}
  %y = dg.transpose %x perm = [1, 1] : tensor<2x3xf32> -> tensor<3x3xf32>
  return
}

// -----

func.func @reshape_count(%x: tensor<2x3xf32>) {
  // expected-error @+1 {{cannot reshape 'tensor<2x3xf32>' to 'tensor<7xf32>'}}
  %y = dg.reshape %x : tensor<2x3xf32> -> tensor<7xf32>
  return
}

// -----

func.func @gather_table(%t: tensor<4x8x2xf32>, %ids: tensor<3xi64>) {
  // expected-error @+1 {{table must be 2-D}}
  %y = dg.gather %t[%ids] : tensor<4x8x2xf32>, tensor<3xi64> -> tensor<3x8xf32>
  return
}

// -----

func.func @gather_padding_idx(%t: tensor<4x8xf32>, %ids: tensor<3xi64>) {
  // expected-error @+1 {{padding_idx -1 must be a row of the table (>= 0)}}
  %y = dg.gather %t[%ids] {padding_idx = -1 : i64} : tensor<4x8xf32>, tensor<3xi64> -> tensor<3x8xf32>
  return
}

// -----

func.func @scatter_skip_id(%u: tensor<3x8xf32>, %ids: tensor<3xi64>) {
  // expected-error @+1 {{skip_id -1 must be a row of the table (>= 0)}}
  %t = dg.scatter_add %u at %ids {skip_id = -1 : i64} : tensor<3x8xf32>, tensor<3xi64> -> tensor<4x8xf32>
  return
}

// -----

func.func @compare_predicate(%a: tensor<3xf32>, %b: tensor<3xf32>) {
  // expected-error @+2 {{expected ::mlir::dg::ComparePredicate to be one of: lt, le, gt, ge, eq, ne}}
  // expected-error @+1 {{failed to parse Dg_ComparePredicateAttr parameter 'value'}}
  %c = dg.compare %a, %b predicate = less : tensor<3xf32>, tensor<3xf32> -> tensor<3xi1>
  return
}

// -----

func.func @compare_types(%a: tensor<3xf32>, %b: tensor<3xf64>) {
  // expected-error @+1 {{operands must share the element type, got 'f32' and 'f64'}}
  %c = dg.compare %a, %b predicate = lt : tensor<3xf32>, tensor<3xf64> -> tensor<3xi1>
  return
}

// -----

func.func @compare_shape(%a: tensor<2x3xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{result shape must be the broadcast shape 'tensor<2x3xi1>', got 'tensor<3xi1>'}}
  %c = dg.compare %a, %b predicate = ge : tensor<2x3xf32>, tensor<3xf32> -> tensor<3xi1>
  return
}

// -----

func.func @select_broadcast(%c: tensor<2x1xi1>, %a: tensor<3xi64>, %b: tensor<4xi64>) {
  // expected-error @+1 {{shapes 'tensor<2x1xi1>', 'tensor<3xi64>' and 'tensor<4xi64>' do not broadcast}}
  %y = dg.select %c, %a, %b : tensor<2x1xi1>, tensor<3xi64>, tensor<4xi64> -> tensor<2x3xi64>
  return
}

// -----

func.func @select_types(%c: tensor<3xi1>, %a: tensor<3xi64>, %b: tensor<3xf32>) {
  // expected-error @+1 {{on_true, on_false and result must share the element type, got 'i64', 'f32' -> 'i64'}}
  %y = dg.select %c, %a, %b : tensor<3xi1>, tensor<3xi64>, tensor<3xf32> -> tensor<3xi64>
  return
}

// -----

func.func @stop_gradient_type(%a: tensor<3xf32>) {
  // expected-error @+1 {{requires the same type for all operands and results}}
  %y = "dg.stop_gradient"(%a) : (tensor<3xf32>) -> tensor<3xf64>
  return
}

// -----

func.func @cross_entropy_targets(%l: tensor<2x5x8xf32>, %t: tensor<2x8xi64>) {
  // expected-error @+1 {{targets must have the logits' shape without the last dimension, 'tensor<2x5xi64>', got 'tensor<2x8xi64>'}}
  %ce = dg.cross_entropy %l, %t : (tensor<2x5x8xf32>, tensor<2x8xi64>) -> tensor<2x5xf32>
  return
}

// -----

func.func @cross_entropy_result(%l: tensor<2x5x8xf32>, %t: tensor<2x5xi64>) {
  // expected-error @+1 {{result must be 'tensor<2x5xf32>', got 'tensor<2x5xf64>'}}
  %ce = dg.cross_entropy %l, %t : (tensor<2x5x8xf32>, tensor<2x5xi64>) -> tensor<2x5xf64>
  return
}

// -----

func.func @cross_entropy_bonus_alone(%l: tensor<5x8xf32>, %t: tensor<5xi64>, %b: tensor<5xf32>) {
  // expected-error @+1 {{bonus_ids and bonus come together or not at all}}
  %ce = "dg.cross_entropy"(%l, %t, %b) <{operandSegmentSizes = array<i32: 1, 1, 0, 1>}> : (tensor<5x8xf32>, tensor<5xi64>, tensor<5xf32>) -> tensor<5xf32>
  return
}

// -----

func.func @cross_entropy_bonus_type(%l: tensor<5x8xf32>, %t: tensor<5xi64>, %b: tensor<5xf64>) {
  // expected-error @+1 {{bonus must be 'tensor<5xf32>', got 'tensor<5xf64>'}}
  %ce = dg.cross_entropy %l, %t bonus(%t, %b) : (tensor<5x8xf32>, tensor<5xi64>, tensor<5xi64>, tensor<5xf64>) -> tensor<5xf32>
  return
}

// -----

func.func @cross_entropy_bonus_ids(%l: tensor<5x8xf32>, %t: tensor<5xi64>, %i: tensor<4xi64>, %b: tensor<5xf32>) {
  // expected-error @+1 {{bonus_ids must have the targets' shape, got 'tensor<4xi64>'}}
  %ce = dg.cross_entropy %l, %t bonus(%i, %b) : (tensor<5x8xf32>, tensor<5xi64>, tensor<4xi64>, tensor<5xf32>) -> tensor<5xf32>
  return
}

// -----

func.func @cross_entropy_backward_grad(%l: tensor<5x8xf32>, %t: tensor<5xi64>, %g: tensor<5x1xf32>) {
  // expected-error @+1 {{grad_output must be 'tensor<5xf32>', got 'tensor<5x1xf32>'}}
  %d = dg.cross_entropy_backward %l, %t, %g : (tensor<5x8xf32>, tensor<5xi64>, tensor<5x1xf32>) -> tensor<5x8xf32>
  return
}

// -----

func.func @cross_entropy_backward_result(%l: tensor<5x8xf32>, %t: tensor<5xi64>, %g: tensor<5xf32>) {
  // expected-error @+1 {{grad_logits must have the logits' type}}
  %d = dg.cross_entropy_backward %l, %t, %g : (tensor<5x8xf32>, tensor<5xi64>, tensor<5xf32>) -> tensor<5x4xf32>
  return
}

// -----

func.func @cast_float_to_int(%x: tensor<3xf32>) {
  // expected-error @+1 {{cannot cast float 'f32' to integer 'i64'}}
  %y = dg.cast %x : tensor<3xf32> -> tensor<3xi64>
  return
}

// -----

func.func @random_key(%k: tensor<3xi64>) {
  // expected-error @+1 {{key must be tensor<2xi64> (seed, offset)}}
  %u = dg.random_uniform %k stream = 0 : tensor<3xi64> -> tensor<4xf32>
  return
}

// -----

func.func @random_key_per_row(%k: tensor<3x2xi64>) {
  // expected-error @+1 {{a key per row needs a result of shape [3, ...], got 'tensor<4x2xf32>'}}
  %u = dg.random_uniform %k stream = 0 : tensor<3x2xi64> -> tensor<4x2xf32>
  return
}

// -----

func.func @random_key_width(%k: tensor<3x3xi64>) {
  // expected-error @+1 {{key must be tensor<2xi64> (seed, offset) or tensor<Nx2xi64> (one per row), got 'tensor<3x3xi64>'}}
  %r = dg.random_int %k stream = 0 high = 4 : tensor<3x3xi64> -> tensor<3x4xi64>
  return
}

// -----

func.func @random_int_high_zero(%k: tensor<2xi64>) {
  // expected-error @+1 {{high 0 must be in [1, 2^32]}}
  %r = dg.random_int %k stream = 0 high = 0 : tensor<2xi64> -> tensor<4xi64>
  return
}

// -----

func.func @random_int_high_wide(%k: tensor<2xi64>) {
  // expected-error @+1 {{high 4294967297 must be in [1, 2^32]}}
  %r = dg.random_int %k stream = 0 high = 4294967297 : tensor<2xi64> -> tensor<4xi64>
  return
}

// -----

func.func @random_int_stream(%k: tensor<2x2xi64>) {
  // expected-error @+1 {{stream must be >= 0}}
  %r = dg.random_int %k stream = -1 high = 2 : tensor<2x2xi64> -> tensor<2xi64>
  return
}

// -----

func.func @param_dynamic() {
  // expected-error @+1 {{parameters must have a static shape}}
  %p = dg.param "w" : tensor<?x4xf32>
  return
}

// -----

func.func @param_init() {
  // expected-error @+1 {{init kind "normal" needs a float 'std'}}
  %p = dg.param "w" {init = {kind = "normal"}} : tensor<4xf32>
  return
}

// -----

func.func @collective_without_mesh(%x: tensor<4xf32>) {
  // expected-error @+1 {{mesh axis 'tp' is not declared in the module's dg.mesh}}
  %y = dg.all_reduce %x axis = "tp" : tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 4 (tensor)]>} {
  func.func @scatter_divisible(%x: tensor<6xf32>) {
    // expected-error @+1 {{dim 0 (6) is not divisible by the axis size 4}}
    %y = dg.reduce_scatter %x axis = "tp" : tensor<6xf32> -> tensor<1xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @gather_shape(%x: tensor<3x2xf32>) {
    // expected-error @+1 {{result must be 'tensor<6x2xf32>'}}
    %y = dg.all_gather %x axis = "tp" : tensor<3x2xf32> -> tensor<3x4xf32>
    return
  }
}

// -----

module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @bad_reduce(%x: tensor<4xf32>) {
    // expected-error @+2 {{expected ::mlir::dg::ReductionKind to be one of: sum, max, min}}
    // expected-error @+1 {{failed to parse Dg_ReductionKindAttr parameter 'value'}}
    %y = dg.all_reduce %x axis = "tp" reduce = mean : tensor<4xf32> -> tensor<4xf32>
    return
  }
}

// -----

func.func @rope_pairs(%x: tensor<1x2x2x8xf32>, %p: tensor<1x2xi64>) {
  // expected-error @+1 {{rotated_pairs 5 must be in [1, 4]}}
  %y = dg.rope %x, %p {theta = 10000.0 : f64, rotated_pairs = 5, frequency_dim = 8} : tensor<1x2x2x8xf32>, tensor<1x2xi64> -> tensor<1x2x2x8xf32>
  return
}

// -----

func.func @rope_positions(%x: tensor<1x2x2x8xf32>, %p: tensor<2x1xi64>) {
  // expected-error @+1 {{positions must be [1, 2]}}
  %y = dg.rope %x, %p {theta = 10000.0 : f64, rotated_pairs = 4, frequency_dim = 8} : tensor<1x2x2x8xf32>, tensor<2x1xi64> -> tensor<1x2x2x8xf32>
  return
}

// -----

func.func @attention_heads(%q: tensor<1x4x3x8xf32>, %k: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>) {
  // expected-error @+1 {{query heads (3) must be a multiple of key/value heads (2)}}
  %o = dg.attention %q, %k, %k, %m mask = causal : tensor<1x4x3x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x3x8xf32>
  return
}

// -----

func.func @attention_mask_kind(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>) {
  // expected-error @+2 {{expected ::mlir::dg::AttentionMask to be one of: causal, bidirectional, prefix}}
  // expected-error @+1 {{failed to parse Dg_AttentionMaskAttr parameter 'value'}}
  %o = dg.attention %q, %q, %q, %m mask = sliding : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_prefix(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>) {
  // expected-error @+1 {{prefix_len 5 must be in [0, 4]}}
  %o = dg.attention %q, %q, %q, %m mask = prefix {prefix_len = 5} : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_trailing_keys(%q: tensor<1x2x2x8xf32>, %k: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>) {
  // expected-error @+1 {{trailing_keys 3 must be in [0, 2] (the queries' positions lie inside the keys)}}
  %o = dg.attention %q, %k, %k, %m mask = causal {trailing_keys = 3} : tensor<1x2x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x2x2x8xf32>
  return
}

// -----

func.func @attention_key_valid(%q: tensor<1x4x2x8xf32>, %m: tensor<1x3xi1>) {
  // expected-error @+1 {{key_valid must be [1, 4]}}
  %o = dg.attention %q, %q, %q, %m mask = bidirectional : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x3xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_segments_need_causal(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %s: tensor<1x4xi64>) {
  // expected-error @+1 {{segment_ids overlay the causal mask only, got mask = bidirectional}}
  %o = dg.attention %q, %q, %q, %m segment_ids(%s : tensor<1x4xi64>) mask = bidirectional : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_segments_prefix(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %s: tensor<1x4xi64>) {
  // expected-error @+1 {{segment_ids overlay the causal mask only, got mask = prefix}}
  %o = dg.attention %q, %q, %q, %m segment_ids(%s : tensor<1x4xi64>) mask = prefix {prefix_len = 2} : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_segments_shape(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %s: tensor<1x3xi64>) {
  // expected-error @+1 {{segment_ids must be [1, 4], got 'tensor<1x3xi64>'}}
  %o = dg.attention %q, %q, %q, %m segment_ids(%s : tensor<1x3xi64>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_segments_type(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %s: tensor<1x4xi32>) {
  // expected-error @+1 {{operand #4 must be ranked tensor of 64-bit signless integer values, but got 'tensor<1x4xi32>'}}
  %o = dg.attention %q, %q, %q, %m segment_ids(%s : tensor<1x4xi32>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_documents_shape(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %d: tensor<1x3xi64>) {
  // expected-error @+1 {{document_ids must be [1, 4], got 'tensor<1x3xi64>'}}
  %o = dg.attention %q, %q, %q, %m document_ids(%d : tensor<1x3xi64>) mask = bidirectional : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_documents_type(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %d: tensor<1x4xi32>) {
  // expected-error @+1 {{operand #4 must be ranked tensor of 64-bit signless integer values, but got 'tensor<1x4xi32>'}}
  %o = dg.attention %q, %q, %q, %m document_ids(%d : tensor<1x4xi32>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_documents_more_queries(%q: tensor<1x4x2x8xf32>, %k: tensor<1x3x2x8xf32>, %m: tensor<1x3xi1>, %d: tensor<1x3xi64>) {
  // expected-error @+1 {{document_ids need at least as many keys as queries (a query's document is that of its key position)}}
  %o = dg.attention %q, %k, %k, %m document_ids(%d : tensor<1x3xi64>) mask = bidirectional : tensor<1x4x2x8xf32>, tensor<1x3x2x8xf32>, tensor<1x3x2x8xf32>, tensor<1x3xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_bidirectional_window_more_queries(%q: tensor<1x4x2x8xf32>, %k: tensor<1x3x2x8xf32>, %m: tensor<1x3xi1>) {
  // expected-error @+1 {{a bidirectional mask with a window needs at least as many keys as queries (the window is centred on the query's key position)}}
  %o = dg.attention %q, %k, %k, %m mask = bidirectional {window = 2} : tensor<1x4x2x8xf32>, tensor<1x3x2x8xf32>, tensor<1x3x2x8xf32>, tensor<1x3xi1> -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_backward_documents_shape(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %s: tensor<1x4xi64>, %d: tensor<2x4xi64>) {
  // expected-error @+1 {{document_ids must be [1, 4], got 'tensor<2x4xi64>'}}
  %dq, %dk, %dv = dg.attention_backward %q, %q, %q, %m, %q segment_ids(%s : tensor<1x4xi64>) document_ids(%d : tensor<2x4xi64>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1>, tensor<1x4x2x8xf32> -> tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>
  return
}

// -----

func.func @attention_backward_segments_shape(%q: tensor<1x4x2x8xf32>, %m: tensor<1x4xi1>, %s: tensor<2x4xi64>) {
  // expected-error @+1 {{segment_ids must be [1, 4], got 'tensor<2x4xi64>'}}
  %dq, %dk, %dv = dg.attention_backward %q, %q, %q, %m, %q segment_ids(%s : tensor<2x4xi64>) mask = causal : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4xi1>, tensor<1x4x2x8xf32> -> tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>
  return
}

// -----

func.func @route_top_k(%l: tensor<3x4xf32>, %s: tensor<4xf32>) {
  // expected-error @+1 {{top_k 5 must be in [1, 4]}}
  %w, %i = dg.moe_route %l, %s top_k = 5 : tensor<3x4xf32>, tensor<4xf32> -> tensor<3x5xf32>, tensor<3x5xi64>
  return
}

// -----

func.func @experts_down(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x4xf32>) {
  // expected-error @+1 {{down must be 'tensor<4x8x3xf32>'}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x4xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @experts_weights_f64(%x: tensor<3x8xbf16>, %w: tensor<3x2xf64>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xbf16>, %d: tensor<4x8x3xbf16>) {
  // expected-error @+1 {{weights must be f32 or have the input's element type, got 'f64'}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xbf16>, tensor<3x2xf64>, tensor<3x2xi64>, tensor<4x6x8xbf16>, tensor<4x8x3xbf16> -> tensor<3x8xbf16>
  return
}

// -----

func.func @experts_mixed_matrices(%x: tensor<3x8xbf16>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xbf16>) {
  // expected-error @+1 {{gate_up and down must have the input's element type}}
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xbf16>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xbf16> -> tensor<3x8xbf16>
  return
}

// -----

func.func @experts_rows_shape(%x: tensor<3x8xf32>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xf32>, %d: tensor<4x8x3xf32>) {
  // expected-error @+1 {{gate_up_rows must be 'tensor<6x6xf32>' (a row of gate and up per route), got 'tensor<3x6xf32>'}}
  %y, %rows = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>, tensor<3x6xf32>
  return
}

// -----

func.func @experts_backward_rows_type(%x: tensor<3x8xbf16>, %w: tensor<3x2xf32>, %i: tensor<3x2xi64>, %gu: tensor<4x6x8xbf16>, %d: tensor<4x8x3xbf16>, %dy: tensor<3x8xbf16>, %rows: tensor<6x6xbf16>) {
  // expected-error @+1 {{gate_up_rows must be 'tensor<6x6xf32>' (a row of gate and up per route), got 'tensor<6x6xbf16>'}}
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy rows %rows : tensor<3x8xbf16>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xbf16>, tensor<4x8x3xbf16>, tensor<3x8xbf16>, tensor<6x6xbf16> -> tensor<3x8xbf16>, tensor<3x2xf32> grad_gate_up tensor<4x6x8xf32> grad_down tensor<4x8x3xf32>
  return
}

// -----

func.func @concat_mismatch(%a: tensor<2x3xf32>, %b: tensor<3x3xf32>) {
  // expected-error @+1 {{input 'tensor<3x3xf32>' differs from the result 'tensor<2x6xf32>' outside dim 1}}
  %c = dg.concat %a, %b dim = 1 : tensor<2x3xf32>, tensor<3x3xf32> -> tensor<2x6xf32>
  return
}

// -----

func.func @slice_outside(%a: tensor<3x4xf32>) {
  // expected-error @+1 {{block [2, 5) leaves dim 1 of size 4}}
  %b = dg.slice %a dim = 1 start = 2 : tensor<3x4xf32> -> tensor<3x3xf32>
  return
}

// -----

func.func @assign_to_a_non_parameter() attributes {dg.entry = "optimizer_step"} {
  %x = dg.input "x" : tensor<2xf32>
  %y = dg.input "y" : tensor<2xf32>
  // expected-error @+1 {{'dg.assign' op target must be a dg.param}}
  dg.assign %y to %x : tensor<2xf32>
  return
}

// -----

func.func @read_after_assign() attributes {dg.entry = "optimizer_step"} {
  %w = dg.param "w" : tensor<2xf32>
  %y = dg.input "y" : tensor<2xf32>
  // expected-error @+1 {{'dg.assign' op parameter 'w' is read after it is assigned}}
  dg.assign %y to %w : tensor<2xf32>
  %z = dg.add %w, %y : tensor<2xf32>, tensor<2xf32> -> tensor<2xf32>
  dg.output "z", %z : tensor<2xf32>
  return
}

// -----

func.func @adamw_beta(%p: tensor<4xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{beta2 must be in [0, 1), got 1}}
  %a, %b, %c = dg.adamw %p, %p, %p, %p, %s, %s, %s, %s {beta1 = 0.9 : f64, beta2 = 1.0 : f64, epsilon = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>, tensor<f32>
  return
}

// -----

func.func @adamw_scalar(%p: tensor<4xf32>, %s: tensor<1xf32>) {
  // expected-error @+1 {{grad_scale, lr and the bias corrections must be 'tensor<f32>'}}
  %a, %b, %c = dg.adamw %p, %p, %p, %p, %s, %s, %s, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<4xf32>, tensor<1xf32>
  return
}

// -----

func.func @offset_minus_one_not_in_place(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dg.offsets' must hold offsets >= 0, or -1 for a result stored in a parameter}}
  %y = dg.exp %x {dg.offsets = array<i64: -1>} : tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @matmul_widening_only_to_f32(%a: tensor<2x3xbf16>, %b: tensor<3x4xbf16>) -> tensor<2x4xf64> {
  // expected-error @+1 {{operands and result must share the element type (or an f32 result for 16-bit operands)}}
  %c = dg.matmul %a, %b : tensor<2x3xbf16>, tensor<3x4xbf16> -> tensor<2x4xf64>
  return %c : tensor<2x4xf64>
}

// -----

func.func @rms_norm_backward_weight_without_gradient(%x: tensor<2x8xf32>, %w: tensor<8xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{grad_weight is produced exactly when there is a weight}}
  %dx = dg.rms_norm_backward %x, %x, %w {eps = 1.0e-6 : f64} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return %dx : tensor<2x8xf32>
}

// -----

func.func @dequantize_nf4_partial_block(%codes: tensor<4x48xui8>, %absmax: tensor<4x1xf32>) {
  // expected-error @+1 {{nf4: the last dimension 96 must be a multiple of 64}}
  %w = dg.dequantize %codes, %absmax format = "nf4" : tensor<4x48xui8>, tensor<4x1xf32> -> tensor<4x96xf32>
  return
}

// -----

func.func @dequantize_nf4_signed_codes(%codes: tensor<4x32xi8>, %absmax: tensor<4x1xf32>) {
  // expected-error @+1 {{nf4 codes must be 'tensor<4x32xui8>', got 'tensor<4x32xi8>'}}
  %w = dg.dequantize %codes, %absmax format = "nf4" : tensor<4x32xi8>, tensor<4x1xf32> -> tensor<4x64xf32>
  return
}

// -----

func.func @dequantize_int8_scales(%codes: tensor<4x8xi8>, %scales: tensor<8xf32>) {
  // expected-error @+1 {{int8 scales must be 'tensor<4xf32>', got 'tensor<8xf32>'}}
  %w = dg.dequantize %codes, %scales format = "int8" : tensor<4x8xi8>, tensor<8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @dequantize_format(%codes: tensor<4x8xi8>, %scales: tensor<4xf32>) {
  // expected-error @+1 {{format must be "int8" or "nf4", got "fp4"}}
  %w = dg.dequantize %codes, %scales format = "fp4" : tensor<4x8xi8>, tensor<4xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @heads_not_a_count() {
  // expected-error @+1 {{'dg.param' op 'dg.heads' must be a head count (an integer >= 1)}}
  %p = dg.param "k_proj.weight" {dg.heads = 0 : i64, dg.role = "column"} : tensor<4x2xf32>
  return
}

// -----

func.func @heads_off_a_param(%x: tensor<2xf32>) {
  // expected-error @+1 {{'dg.exp' op 'dg.heads' belongs on a dg.param}}
  %e = dg.exp %x {dg.heads = 2 : i64} : tensor<2xf32>
  return
}
