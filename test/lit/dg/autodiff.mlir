// RUN: dgemma-opt %s --dg-autodiff --canonicalize --split-input-file --verify-diagnostics | FileCheck %s

// loss = sum(x . w): dL/dw = x^T . 1, emitted as grad/w; the frozen parameter gets no gradient.
// CHECK-LABEL: func.func @linear
func.func @linear() attributes {dg.entry = "train_step"} {
  // CHECK: %[[X:.*]] = dg.input "x" : tensor<2x3xf32>
  %x = dg.input "x" : tensor<2x3xf32>
  %w = dg.param "w" : tensor<3x4xf32>
  %frozen = dg.param "frozen" {trainable = false} : tensor<4xf32>
  %y = dg.matmul %x, %w : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
  %z = dg.add %y, %frozen : tensor<2x4xf32>, tensor<4xf32> -> tensor<2x4xf32>
  %l = dg.reduce_sum %z dims = [0, 1] : tensor<2x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[ONE:.*]] = dg.fill 1.000000e+00 : tensor<f32>
  // CHECK: %[[SEED:.*]] = dg.reshape %[[ONE]] : tensor<f32> -> tensor<1x1xf32>
  // CHECK: %[[ZERO:.*]] = dg.fill 0.000000e+00 : tensor<2x4xf32>
  // CHECK: %[[G:.*]] = dg.add %[[ZERO]], %[[SEED]] : tensor<2x4xf32>, tensor<1x1xf32> -> tensor<2x4xf32>
  // CHECK: %[[GW:.*]] = dg.matmul %[[X]], %[[G]] {transpose_a = true} : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
  // CHECK: dg.output "grad/w", %[[GW]] : tensor<3x4xf32>
  // CHECK-NOT: grad/frozen
  return
}

// -----

// A parameter used twice receives the sum of both paths; broadcasting is undone by a reduction.
// CHECK-LABEL: func.func @fan_out
func.func @fan_out() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<2x3xf32>
  // CHECK: %[[B:.*]] = dg.param "b" : tensor<3xf32>
  %b = dg.param "b" : tensor<3xf32>
  %s = dg.add %x, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %p = dg.mul %s, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %l = dg.reduce_mean %p dims = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[S:.*]] = dg.add %{{.*}}, %[[B]]
  // CHECK-DAG: dg.mul %{{.*}}, %[[S]]
  // CHECK-DAG: dg.mul %{{.*}}, %[[B]]
  // CHECK: %[[R1:.*]] = dg.reduce_sum %{{.*}} dims = [0] {keep_dims = true} : tensor<2x3xf32> -> tensor<1x3xf32>
  // CHECK: %[[V1:.*]] = dg.reshape %[[R1]] : tensor<1x3xf32> -> tensor<3xf32>
  // CHECK: %[[R2:.*]] = dg.reduce_sum %{{.*}} dims = [0] {keep_dims = true} : tensor<2x3xf32> -> tensor<1x3xf32>
  // CHECK: %[[V2:.*]] = dg.reshape %[[R2]] : tensor<1x3xf32> -> tensor<3xf32>
  // CHECK: %[[SUM:.*]] = dg.add %{{.*}}, %{{.*}} : tensor<3xf32>, tensor<3xf32> -> tensor<3xf32>
  // CHECK: dg.output "grad/b", %[[SUM]]
  return
}

// -----

// The loss does not depend on the parameter: its gradient is zeros, nothing is differentiated.
// CHECK-LABEL: func.func @unused
func.func @unused() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  %w = dg.param "w" : tensor<4xf32>
  %l = dg.reduce_sum %x dims = [0] : tensor<4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  dg.output "w", %w : tensor<4xf32>
  // CHECK: %[[Z:.*]] = dg.fill 0.000000e+00 : tensor<4xf32>
  // CHECK: dg.output "grad/w", %[[Z]]
  return
}

// -----

// Through concat, each input gets its block of the cotangent; through RoPE, the inverse rotation.
// CHECK-LABEL: func.func @concat_and_rope
func.func @concat_and_rope() attributes {dg.entry = "train_step"} {
  %a = dg.param "a" : tensor<1x2x1x4xf32>
  %b = dg.param "b" : tensor<1x3x1x4xf32>
  %pos = dg.input "positions" : tensor<1x5xi64>
  %c = dg.concat %a, %b dim = 1 : tensor<1x2x1x4xf32>, tensor<1x3x1x4xf32> -> tensor<1x5x1x4xf32>
  %r = dg.rope %c, %pos {theta = 10000.0 : f64, rotated_pairs = 2, frequency_dim = 4} : tensor<1x5x1x4xf32>, tensor<1x5xi64> -> tensor<1x5x1x4xf32>
  %l = dg.reduce_sum %r dims = [0, 1, 2, 3] : tensor<1x5x1x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[G:.*]] = dg.rope %{{.*}}, %{{.*}} {frequency_dim = 4 : i64, inverse = true, rotated_pairs = 2 : i64, theta = 1.000000e+04 : f64}
  // CHECK-DAG: %[[GA:.*]] = dg.slice %[[G]] dim = 1 start = 0 : tensor<1x5x1x4xf32> -> tensor<1x2x1x4xf32>
  // CHECK-DAG: %[[GB:.*]] = dg.slice %[[G]] dim = 1 start = 2 : tensor<1x5x1x4xf32> -> tensor<1x3x1x4xf32>
  // CHECK-DAG: dg.output "grad/a", %[[GA]]
  // CHECK-DAG: dg.output "grad/b", %[[GB]]
  return
}

// -----

// A parameter reached only through stop_gradient gets a zero gradient, and nothing upstream of the
// barrier is differentiated (reduce_max has no rule, yet no error).
// CHECK-LABEL: func.func @detached_only
func.func @detached_only() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<4xf32>
  %w = dg.param "w" : tensor<4xf32>
  %m = dg.reduce_max %w dims = [0] : tensor<4xf32> -> tensor<f32>
  %d = dg.stop_gradient %m : tensor<f32>
  %y = dg.mul %x, %d : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %l = dg.reduce_sum %y dims = [0] : tensor<4xf32> -> tensor<f32>
  // CHECK: dg.output "loss"
  dg.output "loss", %l : tensor<f32>
  // CHECK-NEXT: %[[Z:.*]] = dg.fill 0.000000e+00 : tensor<4xf32>
  // CHECK-NEXT: dg.output "grad/w", %[[Z]]
  return
}

// -----

// A parameter used directly and through stop_gradient gets only the direct contribution:
// d/dw sum(w * sg(w)) = sg(w), one product and no sum of two paths.
// CHECK-LABEL: func.func @direct_and_detached
func.func @direct_and_detached() attributes {dg.entry = "train_step"} {
  // CHECK: %[[W:.*]] = dg.param "w" : tensor<4xf32>
  %w = dg.param "w" : tensor<4xf32>
  // CHECK: %[[D:.*]] = dg.stop_gradient %[[W]] : tensor<4xf32>
  %d = dg.stop_gradient %w : tensor<4xf32>
  // CHECK: dg.mul %[[W]], %[[D]]
  %y = dg.mul %w, %d : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  %l = dg.reduce_sum %y dims = [0] : tensor<4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[G:.*]] = dg.mul %{{.*}}, %[[D]] : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  // CHECK-NOT: dg.add
  // CHECK-NOT: dg.mul
  // CHECK: dg.output "grad/w", %[[G]]
  return
}

// -----

// Cross-entropy differentiates to its backward op (with the bonus, a constant), then the head.
// CHECK-LABEL: func.func @cross_entropy_head
func.func @cross_entropy_head() attributes {dg.entry = "train_step"} {
  // CHECK: %[[X:.*]] = dg.input "x" : tensor<3x4xf32>
  %x = dg.input "x" : tensor<3x4xf32>
  // CHECK: %[[T:.*]] = dg.input "targets" : tensor<3xi64>
  %t = dg.input "targets" : tensor<3xi64>
  // CHECK: %[[N:.*]] = dg.input "noisy" : tensor<3xi64>
  %n = dg.input "noisy" : tensor<3xi64>
  // CHECK: %[[B:.*]] = dg.input "bonus" : tensor<3xf32>
  %b = dg.input "bonus" : tensor<3xf32>
  %w = dg.param "head" : tensor<4x8xf32>
  // CHECK: %[[Z:.*]] = dg.matmul %[[X]], %{{.*}} : tensor<3x4xf32>, tensor<4x8xf32> -> tensor<3x8xf32>
  %z = dg.matmul %x, %w : tensor<3x4xf32>, tensor<4x8xf32> -> tensor<3x8xf32>
  %ce = dg.cross_entropy %z, %t bonus(%n, %b) : (tensor<3x8xf32>, tensor<3xi64>, tensor<3xi64>, tensor<3xf32>) -> tensor<3xf32>
  %l = dg.reduce_mean %ce dims = [0] : tensor<3xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[DZ:.*]] = dg.cross_entropy_backward %[[Z]], %[[T]] bonus(%[[N]], %[[B]]), %{{.*}} : (tensor<3x8xf32>, tensor<3xi64>, tensor<3xi64>, tensor<3xf32>, tensor<3xf32>) -> tensor<3x8xf32>
  // CHECK: %[[GW:.*]] = dg.matmul %[[X]], %[[DZ]] {transpose_a = true} : tensor<3x4xf32>, tensor<3x8xf32> -> tensor<4x8xf32>
  // CHECK: dg.output "grad/head", %[[GW]]
  return
}

// -----

// An embedding with padding_idx: the scatter_add of its rule skips the pad row.
// CHECK-LABEL: func.func @padded_embedding
func.func @padded_embedding() attributes {dg.entry = "train_step"} {
  // CHECK: %[[IDS:.*]] = dg.input "ids" : tensor<2x3xi64>
  %ids = dg.input "ids" : tensor<2x3xi64>
  %e = dg.param "embed" : tensor<5x4xf32>
  %rows = dg.gather %e[%ids] {padding_idx = 0 : i64} : tensor<5x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
  %l = dg.reduce_sum %rows dims = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[G:.*]] = dg.scatter_add %{{.*}} at %[[IDS]] {skip_id = 0 : i64} : tensor<2x3x4xf32>, tensor<2x3xi64> -> tensor<5x4xf32>
  // CHECK: dg.output "grad/embed", %[[G]]
  return
}

// -----

// A rank's block of the table (global rows [5, 10)) and of the experts (global experts [2, 4)): the
// rules hand the offsets on, so the gradients land in the same blocks.
// CHECK-LABEL: func.func @blocks_keep_their_offsets
func.func @blocks_keep_their_offsets() attributes {dg.entry = "train_step"} {
  // CHECK: %[[IDS:.*]] = dg.input "ids" : tensor<3xi64>
  %ids = dg.input "ids" : tensor<3xi64>
  %w = dg.input "weights" : tensor<3x2xf32>
  %i = dg.input "indices" : tensor<3x2xi64>
  %e = dg.param "embed" : tensor<5x8xf32>
  %gu = dg.param "gate_up" : tensor<2x6x8xf32>
  %d = dg.param "down" : tensor<2x8x3xf32>
  %x = dg.gather %e[%ids] {padding_idx = 0 : i64, row_offset = 5 : i64} : tensor<5x8xf32>, tensor<3xi64> -> tensor<3x8xf32>
  %y = dg.moe_experts %x, %w, %i, %gu, %d {expert_offset = 2 : i64} : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<2x6x8xf32>, tensor<2x8x3xf32> -> tensor<3x8xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<3x8xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[DX:.*]], %{{.*}}, %[[DGU:.*]], %[[DD:.*]] = dg.moe_experts_backward {{.*}} {expert_offset = 2 : i64} : tensor<3x8xf32>
  // CHECK: %[[DE:.*]] = dg.scatter_add %[[DX]] at %[[IDS]] {row_offset = 5 : i64, skip_id = 0 : i64} : tensor<3x8xf32>, tensor<3xi64> -> tensor<5x8xf32>
  // CHECK-DAG: dg.output "grad/embed", %[[DE]]
  // CHECK-DAG: dg.output "grad/gate_up", %[[DGU]]
  // CHECK-DAG: dg.output "grad/down", %[[DD]]
  return
}

// -----

// Through slice, the block's cotangent goes back in place between zeros.
// CHECK-LABEL: func.func @slice_block
func.func @slice_block() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<2x5xf32>
  %b = dg.slice %w dim = 1 start = 1 : tensor<2x5xf32> -> tensor<2x3xf32>
  %l = dg.reduce_sum %b dims = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %[[G:.*]] = dg.add
  // CHECK-DAG: %[[BEFORE:.*]] = dg.fill 0.000000e+00 : tensor<2x1xf32>
  // CHECK-DAG: %[[AFTER:.*]] = dg.fill 0.000000e+00 : tensor<2x1xf32>
  // CHECK: %[[GW:.*]] = dg.concat %[[BEFORE]], %[[G]], %[[AFTER]] dim = 1 : tensor<2x1xf32>, tensor<2x3xf32>, tensor<2x1xf32> -> tensor<2x5xf32>
  // CHECK: dg.output "grad/w", %[[GW]]
  return
}

// -----

// Ops between the parameters and the loss must have a derivative rule.
func.func @no_rule() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4xf32>
  // expected-error @+1 {{'dg.reduce_max' op has no derivative rule, but lies between the trainable parameters and 'loss'}}
  %m = dg.reduce_max %w dims = [0] : tensor<4xf32> -> tensor<f32>
  dg.output "loss", %m : tensor<f32>
  return
}

// -----

// The experts' pre-activations are for their backward alone, added after differentiation.
func.func @experts_rows() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x8xf32>
  %w = dg.input "w" : tensor<3x2xf32>
  %i = dg.input "i" : tensor<3x2xi64>
  %gu = dg.param "gate_up" : tensor<4x6x8xf32>
  %d = dg.param "down" : tensor<4x8x3xf32>
  // expected-error @+1 {{'dg.moe_experts' op has gate_up_rows, which dg-keep-expert-activations adds after differentiation; they have no derivative}}
  %y, %rows = dg.moe_experts %x, %w, %i, %gu, %d : tensor<3x8xf32>, tensor<3x2xf32>, tensor<3x2xi64>, tensor<4x6x8xf32>, tensor<4x8x3xf32> -> tensor<3x8xf32>, tensor<6x6xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<3x8xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}

// -----

// Only a single-element loss has a gradient.
func.func @non_scalar_loss() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4xf32>
  // expected-error @+1 {{can only differentiate a single-element float output, got 'tensor<4xf32>'}}
  dg.output "loss", %w : tensor<4xf32>
  return
}

// -----

// rms_norm differentiates into one fused rms_norm_backward: the input's and the weight's gradients.
// CHECK-LABEL: func.func @rms_norm
func.func @rms_norm() attributes {dg.entry = "train_step"} {
  // CHECK: %[[X:.*]] = dg.input "x" : tensor<2x8xf32>
  // CHECK: %[[W:.*]] = dg.param "w" : tensor<8xf32>
  %x = dg.input "x" : tensor<2x8xf32>
  %w = dg.param "w" : tensor<8xf32>
  %y = dg.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %l = dg.reduce_sum %y dims = [0, 1] : tensor<2x8xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: %{{.*}}, %[[GW:.*]] = dg.rms_norm_backward %[[X]], %{{.*}}, %[[W]] {eps = 9.9999999999999995E-7 : f64}
  // CHECK: dg.output "grad/w", %[[GW]] : tensor<8xf32>
  return
}

// -----

// The image overlay: the backward recomputes the probabilities with the same segment ids, which (like
// key_valid) get no gradient.
// CHECK-LABEL: func.func @attention_segments
func.func @attention_segments() attributes {dg.entry = "train_step"} {
  %q = dg.param "q" : tensor<1x4x2x8xf32>
  %k = dg.param "k" : tensor<1x4x1x8xf32>
  %valid = dg.input "valid" : tensor<1x4xi1>
  // CHECK: %[[SEG:.*]] = dg.input "segments" : tensor<1x4xi64>
  %seg = dg.input "segments" : tensor<1x4xi64>
  %o = dg.attention %q, %k, %k, %valid segment_ids(%seg : tensor<1x4xi64>) mask = causal {window = 2} : tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  %l = dg.reduce_sum %o dims = [0, 1, 2, 3] : tensor<1x4x2x8xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: dg.attention_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} segment_ids(%[[SEG]] : tensor<1x4xi64>) mask = causal {window = 2 : i64}
  // CHECK-DAG: dg.output "grad/q"
  // CHECK-DAG: dg.output "grad/k"
  // CHECK-NOT: grad/segments
  return
}

// -----

// Packed documents: the backward recomputes the probabilities with the same document ids (after the
// segment ids), which get no gradient either.
// CHECK-LABEL: func.func @attention_documents
func.func @attention_documents() attributes {dg.entry = "train_step"} {
  %q = dg.param "q" : tensor<1x4x2x8xf32>
  %k = dg.param "k" : tensor<1x4x1x8xf32>
  %valid = dg.input "valid" : tensor<1x4xi1>
  // CHECK: %[[DOC:.*]] = dg.input "documents" : tensor<1x4xi64>
  %doc = dg.input "documents" : tensor<1x4xi64>
  %o = dg.attention %q, %k, %k, %valid document_ids(%doc : tensor<1x4xi64>) mask = bidirectional {window = 2} : tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4xi1> -> tensor<1x4x2x8xf32>
  %l = dg.reduce_sum %o dims = [0, 1, 2, 3] : tensor<1x4x2x8xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  // CHECK: dg.attention_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} document_ids(%[[DOC]] : tensor<1x4xi64>) mask = bidirectional {window = 2 : i64}
  // CHECK-DAG: dg.output "grad/q"
  // CHECK-DAG: dg.output "grad/k"
  // CHECK-NOT: grad/documents
  return
}
