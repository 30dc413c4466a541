// RUN: dgemma-opt %s --split-input-file | dgemma-opt --split-input-file | FileCheck %s
// The model-level ops of one Gemma 4 layer round-trip.

// CHECK-LABEL: func.func @sliding_layer_attention
func.func @sliding_layer_attention(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %pos: tensor<2x6xi64>,
                                   %valid: tensor<2x6xi1>) -> tensor<2x6x4x16xf32> {
  // CHECK: dg.rope %{{.*}}, %{{.*}} {frequency_dim = 16 : i64, rotated_pairs = 8 : i64, theta = 1.000000e+04 : f64}
  %qr = dg.rope %q, %pos {theta = 10000.0 : f64, rotated_pairs = 8, frequency_dim = 16} : tensor<2x6x4x16xf32>, tensor<2x6xi64> -> tensor<2x6x4x16xf32>
  %kr = dg.rope %k, %pos {theta = 10000.0 : f64, rotated_pairs = 8, frequency_dim = 16} : tensor<2x6x2x16xf32>, tensor<2x6xi64> -> tensor<2x6x2x16xf32>
  // CHECK: dg.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} mask = causal {window = 4 : i64}
  // CHECK-SAME: tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  %o = dg.attention %qr, %kr, %k, %valid mask = causal {window = 4} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  return %o : tensor<2x6x4x16xf32>
}

// -----

// The decoder's prefix attention: 6 prefix keys of the encoder, then 4 canvas keys; a sliding layer
// sees the last 3 prefix slots.
// CHECK-LABEL: func.func @decoder_prefix_attention
func.func @decoder_prefix_attention(%q: tensor<1x4x4x32xf32>, %kv: tensor<1x10x2x32xf32>, %valid: tensor<1x10xi1>) -> tensor<1x4x4x32xf32> {
  // CHECK: dg.attention {{.*}} mask = prefix {prefix_len = 6 : i64, window = 3 : i64}
  %o = dg.attention %q, %kv, %kv, %valid mask = prefix {prefix_len = 6, window = 3} : tensor<1x4x4x32xf32>, tensor<1x10x2x32xf32>, tensor<1x10x2x32xf32>, tensor<1x10xi1> -> tensor<1x4x4x32xf32>
  return %o : tensor<1x4x4x32xf32>
}

// -----

// Packed documents: document ids on the overlay's causal attention, and on a bidirectional attention
// with a symmetric window, and their backward.
// CHECK-LABEL: func.func @document_attention
func.func @document_attention(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %valid: tensor<2x6xi1>,
                              %seg: tensor<2x6xi64>, %doc: tensor<2x6xi64>, %dy: tensor<2x6x4x16xf32>) -> tensor<2x6x4x16xf32> {
  // CHECK: dg.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} segment_ids(%{{.*}} : tensor<2x6xi64>) document_ids(%{{.*}} : tensor<2x6xi64>) mask = causal {window = 4 : i64}
  %o = dg.attention %q, %k, %k, %valid segment_ids(%seg : tensor<2x6xi64>) document_ids(%doc : tensor<2x6xi64>) mask = causal {window = 4} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  // CHECK: dg.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} document_ids(%{{.*}} : tensor<2x6xi64>) mask = bidirectional {window = 3 : i64}
  %b = dg.attention %q, %k, %k, %valid document_ids(%doc : tensor<2x6xi64>) mask = bidirectional {window = 3} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  // CHECK: dg.attention_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} document_ids(%{{.*}} : tensor<2x6xi64>) mask = bidirectional {window = 3 : i64}
  %dq, %dk, %dv = dg.attention_backward %q, %k, %k, %valid, %dy document_ids(%doc : tensor<2x6xi64>) mask = bidirectional {window = 3} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1>, tensor<2x6x4x16xf32> -> tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>
  return %o : tensor<2x6x4x16xf32>
}

// -----

// The encoder's image overlay: segment ids on a windowed causal attention and its backward.
// CHECK-LABEL: func.func @image_overlay_attention
func.func @image_overlay_attention(%q: tensor<2x6x4x16xf32>, %k: tensor<2x6x2x16xf32>, %valid: tensor<2x6xi1>,
                                   %seg: tensor<2x6xi64>, %dy: tensor<2x6x4x16xf32>) -> tensor<2x6x4x16xf32> {
  // CHECK: dg.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} segment_ids(%{{.*}} : tensor<2x6xi64>) mask = causal {window = 4 : i64}
  // CHECK-SAME: tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  %o = dg.attention %q, %k, %k, %valid segment_ids(%seg : tensor<2x6xi64>) mask = causal {window = 4} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1> -> tensor<2x6x4x16xf32>
  // CHECK: dg.attention_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} segment_ids(%{{.*}} : tensor<2x6xi64>) mask = causal {window = 4 : i64}
  %dq, %dk, %dv = dg.attention_backward %q, %k, %k, %valid, %dy segment_ids(%seg : tensor<2x6xi64>) mask = causal {window = 4} : tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6xi1>, tensor<2x6x4x16xf32> -> tensor<2x6x4x16xf32>, tensor<2x6x2x16xf32>, tensor<2x6x2x16xf32>
  return %o : tensor<2x6x4x16xf32>
}

// -----

// CHECK-LABEL: func.func @moe
func.func @moe(%r: tensor<12x48xf32>, %router: tensor<8x48xf32>, %scale: tensor<8xf32>, %gate_up: tensor<8x32x48xf32>,
               %down: tensor<8x48x16xf32>) -> tensor<12x48xf32> {
  %logits = dg.matmul %r, %router {transpose_b = true} : tensor<12x48xf32>, tensor<8x48xf32> -> tensor<12x8xf32>
  // CHECK: %[[W:.*]], %[[I:.*]] = dg.moe_route %{{.*}}, %{{.*}} top_k = 2 : tensor<12x8xf32>, tensor<8xf32> -> tensor<12x2xf32>, tensor<12x2xi64>
  %w, %i = dg.moe_route %logits, %scale top_k = 2 : tensor<12x8xf32>, tensor<8xf32> -> tensor<12x2xf32>, tensor<12x2xi64>
  // CHECK: dg.moe_experts %{{.*}}, %[[W]], %[[I]], %{{.*}}, %{{.*}} : tensor<12x48xf32>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xf32>, tensor<8x48x16xf32> -> tensor<12x48xf32>
  %y = dg.moe_experts %r, %w, %i, %gate_up, %down : tensor<12x48xf32>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xf32>, tensor<8x48x16xf32> -> tensor<12x48xf32>
  return %y : tensor<12x48xf32>
}

// -----

// bf16 activations with the f32 routing weights of an fp32 router island.
// CHECK-LABEL: func.func @moe_bf16_experts_f32_weights
func.func @moe_bf16_experts_f32_weights(%x: tensor<12x48xbf16>, %w: tensor<12x2xf32>, %i: tensor<12x2xi64>,
                                        %gate_up: tensor<8x32x48xbf16>, %down: tensor<8x48x16xbf16>) -> tensor<12x48xbf16> {
  // CHECK: dg.moe_experts {{.*}} : tensor<12x48xbf16>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xbf16>, tensor<8x48x16xbf16> -> tensor<12x48xbf16>
  %y = dg.moe_experts %x, %w, %i, %gate_up, %down : tensor<12x48xbf16>, tensor<12x2xf32>, tensor<12x2xi64>, tensor<8x32x48xbf16>, tensor<8x48x16xbf16> -> tensor<12x48xbf16>
  return %y : tensor<12x48xbf16>
}
