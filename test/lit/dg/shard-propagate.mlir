// RUN: dgemma-opt %s --split-input-file --dg-shard-propagate --dg-shard-verify | FileCheck %s
// RUN: dgemma-opt %s --split-input-file --dg-shard-propagate=sp=true --dg-shard-verify | FileCheck %s --check-prefix=SP
// dg-shard-propagate per op family, from sources annotated as dg-shard-annotate would: the shardings
// each op gets and consumes in (the partitioner inserts the collectives between them).

// CHECK-LABEL: func.func @mlp
// CHECK: dg.matmul {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>, #dg.sharding<{{\[\[}}tp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp]]>]
// CHECK: dg.gelu_tanh {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp]]>]
// CHECK: dg.matmul {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], [tp]]>, #dg.sharding<{{\[\[}}], [tp]]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [tp]>]
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], []]>]
// CHECK: dg.add {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], []]>]

// Megatron's MLP at TP=2: the column GEMM takes the whole activation and splits its output, the row
// GEMM leaves a pending sum, which the residual add passes on and the norm resolves.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @mlp() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], [], []]>]} : tensor<2x4x8xf32>
    %up = dg.param "up" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<16x8xf32>
    %down = dg.param "down" {dg.shardings = [#dg.sharding<[[], [tp]]>]} : tensor<8x16xf32>
    %h = dg.matmul %x, %up {transpose_b = true} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    %g = dg.gelu_tanh %h : tensor<2x4x16xf32>
    %y = dg.matmul %g, %down {transpose_b = true} : tensor<2x4x16xf32>, tensor<8x16xf32> -> tensor<2x4x8xf32>
    %n = dg.rms_norm %y {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %r = dg.add %x, %n : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
    dg.output "y", %r : tensor<2x4x8xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @attention
// CHECK: dg.reshape {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp], []]>]} : tensor<2x4x16xf32> -> tensor<2x4x4x4xf32>
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], [tp], []]>, #dg.sharding<{{\[\[}}]]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp], []]>]
// CHECK: dg.reshape {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp], []]>]} : tensor<2x4x8xf32> -> tensor<2x4x2x4xf32>
// CHECK: dg.attention {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], [tp], []]>, #dg.sharding<{{\[\[}}], [], [tp], []]>, #dg.sharding<{{\[\[}}], [], [tp], []]>, #dg.sharding<{{\[\[}}], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp], []]>]
// CHECK: dg.matmul {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [tp]>]
// CHECK: dg.output "o", %{{.*}} {dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>]}

// Head-parallel attention: q/k/v split by heads after the column GEMM's reshape.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @attention() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], [], []]>]} : tensor<2x4x8xf32>
    %valid = dg.input "valid" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<2x4xi1>
    %wq = dg.param "q" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<16x8xf32>
    %wk = dg.param "k" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<8x8xf32>
    %wo = dg.param "o" {dg.shardings = [#dg.sharding<[[], [tp]]>]} : tensor<8x16xf32>
    %qn = dg.param "q_norm" {dg.shardings = [#dg.sharding<[[]]>]} : tensor<4xf32>
    %q0 = dg.matmul %x, %wq {transpose_b = true} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    %q1 = dg.reshape %q0 : tensor<2x4x16xf32> -> tensor<2x4x4x4xf32>
    %q = dg.rms_norm %q1, %qn {eps = 1.0e-6 : f64} : (tensor<2x4x4x4xf32>, tensor<4xf32>) -> tensor<2x4x4x4xf32>
    %k0 = dg.matmul %x, %wk {transpose_b = true} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
    %k = dg.reshape %k0 : tensor<2x4x8xf32> -> tensor<2x4x2x4xf32>
    %a = dg.attention %q, %k, %k, %valid mask = causal : tensor<2x4x4x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4xi1> -> tensor<2x4x4x4xf32>
    %a1 = dg.reshape %a : tensor<2x4x4x4xf32> -> tensor<2x4x16xf32>
    %o = dg.matmul %a1, %wo {transpose_b = true} : tensor<2x4x16xf32>, tensor<8x16xf32> -> tensor<2x4x8xf32>
    dg.output "o", %o : tensor<2x4x8xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @attention_segments
// CHECK: dg.attention {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp], [], [tp], []]>, #dg.sharding<{{\[\[}}dp], [], [tp], []]>, #dg.sharding<{{\[\[}}dp], [], [tp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}dp], [], [tp], []]>]

// The image overlay's segment ids are split like key_valid: by batch rows over dp, whole keys.
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), tp = 2 (tensor)]>} {
  func.func @attention_segments() attributes {dg.entry = "forward"} {
    %q = dg.input "q" {dg.shardings = [#dg.sharding<[[dp], [], [tp], []]>]} : tensor<2x4x4x4xf32>
    %k = dg.input "k" {dg.shardings = [#dg.sharding<[[dp], [], [tp], []]>]} : tensor<2x4x2x4xf32>
    %valid = dg.input "valid" {dg.shardings = [#dg.sharding<[[dp], []]>]} : tensor<2x4xi1>
    %seg = dg.input "segments" {dg.shardings = [#dg.sharding<[[dp], []]>]} : tensor<2x4xi64>
    %a = dg.attention %q, %k, %k, %valid segment_ids(%seg : tensor<2x4xi64>) mask = causal : tensor<2x4x4x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4xi1> -> tensor<2x4x4x4xf32>
    dg.output "a", %a : tensor<2x4x4x4xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @embed_head
// CHECK: dg.gather {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}tp], []]>, #dg.sharding<{{\[\[}}], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [tp]>]
// CHECK: dg.mul {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [tp]>, #dg.sharding<[]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [tp]>]
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>]
// CHECK: dg.matmul {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp]]>]
// CHECK: dg.cross_entropy {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>, #dg.sharding<{{\[\[}}], []]>]

// A vocab-split embedding: the lookup is a pending sum (row offsets), the tied head splits the
// logits by vocabulary and the cross-entropy takes them whole.
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @embed_head() attributes {dg.entry = "forward"} {
    %ids = dg.input "ids" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<2x4xi64>
    %table = dg.param "embed" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<16x8xf32>
    %e = dg.gather %table[%ids] : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
    %scale = dg.fill 2.0 : tensor<f32>
    %s = dg.mul %e, %scale : tensor<2x4x8xf32>, tensor<f32> -> tensor<2x4x8xf32>
    %n = dg.rms_norm %s {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %logits = dg.matmul %n, %table {transpose_b = true} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    %loss = dg.cross_entropy %logits, %ids : (tensor<2x4x16xf32>, tensor<2x4xi64>) -> tensor<2x4xf32>
    dg.output "loss", %loss : tensor<2x4xf32>
    return
  }
}

// -----

// Without sp the pending sum becomes whole; with sp a sequence split.
// CHECK-LABEL: func.func @sequence_parallel
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>]
// SP-LABEL: func.func @sequence_parallel
// SP: dg.matmul {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [tp]>]
// SP: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [tp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [tp], []]>]
// SP: dg.add {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [tp], []]>, #dg.sharding<{{\[\[}}], [tp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [tp], []]>]
// SP: dg.matmul {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], [], []]>, #dg.sharding<{{\[\[}}tp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], [], [tp]]>]

// Sequence parallelism: the row GEMM's pending sum resolves into a sequence split (reduce-scatter),
// the residual stream stays split, and the column GEMM gathers it back (all-gather).
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
  func.func @sequence_parallel() attributes {dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[], [], []]>]} : tensor<2x4x8xf32>
    %up = dg.param "up" {dg.shardings = [#dg.sharding<[[tp], []]>]} : tensor<16x8xf32>
    %down = dg.param "down" {dg.shardings = [#dg.sharding<[[], [tp]]>]} : tensor<8x16xf32>
    %h = dg.matmul %x, %up {transpose_b = true} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    %y = dg.matmul %h, %down {transpose_b = true} : tensor<2x4x16xf32>, tensor<8x16xf32> -> tensor<2x4x8xf32>
    %n = dg.rms_norm %y {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %r = dg.add %x, %n : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x8xf32>
    %h2 = dg.matmul %r, %up {transpose_b = true} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    dg.output "h", %h2 : tensor<2x4x16xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @train_step
// CHECK: dg.matmul {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], []], partial = [dp]>]
// CHECK: dg.add {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], []], partial = [dp]>]
// CHECK: dg.assign {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], []], partial = [dp]>, #dg.sharding<{{\[\[}}], []], partial = [dp]>]
// CHECK-LABEL: func.func @optimizer_step
// CHECK: dg.mul {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>], dg.shardings = [#dg.sharding<{{\[\[}}dp], []]>]
// CHECK: dg.reduce_sum {{.*}}dg.shardings = [#dg.sharding<[], partial = [dp]>]
// CHECK: dg.sqrt {{.*}}dg.operand_shardings = [#dg.sharding<[]>], dg.shardings = [#dg.sharding<[]>]
// CHECK: dg.adamw {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<[]>, #dg.sharding<[]>, #dg.sharding<[]>, #dg.sharding<[]>], dg.shardings = [#dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>]
// CHECK: dg.assign %new_param to {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], []]>, #dg.sharding<{{\[\[}}], []]>]
// CHECK: dg.assign %new_exp_avg to {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>]

// Data parallelism with ZeRO-1: the weight gradient is a pending sum over dp, accumulated as one
// into the gradient buffer; the optimizer squares and updates the moments' shard of it.
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
  func.func @train_step() attributes {dg.bucket = {micro_batch = 2 : i64}, dg.entry = "train_step"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[dp], [], []]>]} : tensor<2x4x8xf32>
    %dy = dg.input "dy" {dg.shardings = [#dg.sharding<[[dp], [], []]>]} : tensor<2x4x8xf32>
    %xr = dg.reshape %x : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %dyr = dg.reshape %dy : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %dw = dg.matmul %dyr, %xr {transpose_a = true} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
    %buffer = dg.param "grad/w" {dg.shardings = [#dg.sharding<[[], []], partial = [dp]>], trainable = false} : tensor<8x8xf32>
    %sum = dg.add %buffer, %dw : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
    dg.assign %sum to %buffer : tensor<8x8xf32>
    return
  }
  func.func @optimizer_step() attributes {dg.bucket = {}, dg.entry = "optimizer_step"} {
    %g = dg.param "grad/w" {dg.shardings = [#dg.sharding<[[], []], partial = [dp]>], trainable = false} : tensor<8x8xf32>
    %w = dg.param "w" {dg.shardings = [#dg.sharding<[[], []]>]} : tensor<8x8xf32>
    %m = dg.param "optimizer/exp_avg/w" {dg.shardings = [#dg.sharding<[[dp], []]>], trainable = false} : tensor<8x8xf32>
    %v = dg.param "optimizer/exp_avg_sq/w" {dg.shardings = [#dg.sharding<[[dp], []]>], trainable = false} : tensor<8x8xf32>
    %lr = dg.input "lr" {dg.shardings = [#dg.sharding<[]>]} : tensor<f32>
    %square = dg.mul %g, %g : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
    %sumsq = dg.reduce_sum %square dims = [0, 1] : tensor<8x8xf32> -> tensor<f32>
    %norm = dg.sqrt %sumsq : tensor<f32>
    dg.output "grad_norm", %norm : tensor<f32>
    %w1, %m1, %v1 = dg.adamw %w, %g, %m, %v, %lr, %lr, %lr, %lr {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-8 : f64, weight_decay = 0.0 : f64} : tensor<8x8xf32>, tensor<f32>
    dg.assign %w1 to %w : tensor<8x8xf32>
    dg.assign %m1 to %m : tensor<8x8xf32>
    dg.assign %v1 to %v : tensor<8x8xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @experts
// CHECK: dg.reshape {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}ep], []]>]
// CHECK: dg.moe_experts {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}], []]>, #dg.sharding<{{\[\[}}], []]>, #dg.sharding<{{\[\[}}], []]>, #dg.sharding<{{\[\[}}ep], [], []]>, #dg.sharding<{{\[\[}}ep], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}], []], partial = [ep]>]
// CHECK: dg.reshape {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}], [], []], partial = [ep]>]
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}ep], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}ep], [], []]>]

// Expert parallelism in the all-gather form: the tokens are whole over ep at the experts, the
// experts split, the result a pending sum over ep that resolves back into the tokens' batch split.
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
  func.func @experts() attributes {dg.bucket = {micro_batch = 2 : i64}, dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[ep], [], []]>]} : tensor<2x4x8xf32>
    %w = dg.input "w" {dg.shardings = [#dg.sharding<[[ep], []]>]} : tensor<8x2xf32>
    %i = dg.input "i" {dg.shardings = [#dg.sharding<[[ep], []]>]} : tensor<8x2xi64>
    %gate_up = dg.param "experts.gate_up_proj" {dg.shardings = [#dg.sharding<[[ep], [], []]>]} : tensor<4x8x8xf32>
    %down = dg.param "experts.down_proj" {dg.shardings = [#dg.sharding<[[ep], [], []]>]} : tensor<4x8x4xf32>
    %tokens = dg.reshape %x : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %y = dg.moe_experts %tokens, %w, %i, %gate_up, %down : tensor<8x8xf32>, tensor<8x2xf32>, tensor<8x2xi64>, tensor<4x8x8xf32>, tensor<4x8x4xf32> -> tensor<8x8xf32>
    %y1 = dg.reshape %y : tensor<8x8xf32> -> tensor<2x4x8xf32>
    %n = dg.rms_norm %y1 {eps = 1.0e-6 : f64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    dg.output "y", %n : tensor<2x4x8xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @experts_ep_below_dp
// CHECK: dg.moe_experts {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}dp], []]>, #dg.sharding<{{\[\[}}ep], [], []]>, #dg.sharding<{{\[\[}}ep], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}dp], []], partial = [ep]>]
// CHECK: dg.reshape {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}dp], [], []], partial = [ep]>]
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}dp, ep], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}dp, ep], [], []]>]

// EP < DP: the tokens split over {dp, ep} meet experts split over ep. They keep the dp split (the
// partitioner gathers them over ep only, which dg-expert-dispatch turns into the all-to-all), and
// the pending sum over ep resolves onto the minor end of the batch split.
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), ep = 2 (expert)]>} {
  func.func @experts_ep_below_dp() attributes {dg.bucket = {micro_batch = 4 : i64}, dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[dp, ep], [], []]>]} : tensor<4x4x8xf32>
    %w = dg.input "w" {dg.shardings = [#dg.sharding<[[dp, ep], []]>]} : tensor<16x2xf32>
    %i = dg.input "i" {dg.shardings = [#dg.sharding<[[dp, ep], []]>]} : tensor<16x2xi64>
    %gate_up = dg.param "experts.gate_up_proj" {dg.shardings = [#dg.sharding<[[ep], [], []]>]} : tensor<4x8x8xf32>
    %down = dg.param "experts.down_proj" {dg.shardings = [#dg.sharding<[[ep], [], []]>]} : tensor<4x8x4xf32>
    %tokens = dg.reshape %x : tensor<4x4x8xf32> -> tensor<16x8xf32>
    %y = dg.moe_experts %tokens, %w, %i, %gate_up, %down : tensor<16x8xf32>, tensor<16x2xf32>, tensor<16x2xi64>, tensor<4x8x8xf32>, tensor<4x8x4xf32> -> tensor<16x8xf32>
    %y1 = dg.reshape %y : tensor<16x8xf32> -> tensor<4x4x8xf32>
    %n = dg.rms_norm %y1 {eps = 1.0e-6 : f64} : (tensor<4x4x8xf32>) -> tensor<4x4x8xf32>
    dg.output "y", %n : tensor<4x4x8xf32>
    return
  }
}

// -----

// CHECK-LABEL: func.func @experts_renamed_axes
// CHECK: dg.moe_experts {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}replica], []]>, #dg.sharding<{{\[\[}}replica], []]>, #dg.sharding<{{\[\[}}replica], []]>, #dg.sharding<{{\[\[}}experts], [], []]>, #dg.sharding<{{\[\[}}experts], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}replica], []], partial = [experts]>]
// CHECK: dg.reshape {{.*}}dg.shardings = [#dg.sharding<{{\[\[}}replica], [], []], partial = [experts]>]
// CHECK: dg.rms_norm {{.*}}dg.operand_shardings = [#dg.sharding<{{\[\[}}replica, experts], [], []]>], dg.shardings = [#dg.sharding<{{\[\[}}replica, experts], [], []]>]

// @experts_ep_below_dp with its axes renamed (and so no longer in alphabetical order): the pass
// finds the data group by the axes' roles, so the shardings are the same up to the names.
module attributes {dg.mesh = #dg.mesh<[replica = 2 (data), experts = 2 (expert)]>} {
  func.func @experts_renamed_axes() attributes {dg.bucket = {micro_batch = 4 : i64}, dg.entry = "forward"} {
    %x = dg.input "x" {dg.shardings = [#dg.sharding<[[replica, experts], [], []]>]} : tensor<4x4x8xf32>
    %w = dg.input "w" {dg.shardings = [#dg.sharding<[[replica, experts], []]>]} : tensor<16x2xf32>
    %i = dg.input "i" {dg.shardings = [#dg.sharding<[[replica, experts], []]>]} : tensor<16x2xi64>
    %gate_up = dg.param "experts.gate_up_proj" {dg.shardings = [#dg.sharding<[[experts], [], []]>]} : tensor<4x8x8xf32>
    %down = dg.param "experts.down_proj" {dg.shardings = [#dg.sharding<[[experts], [], []]>]} : tensor<4x8x4xf32>
    %tokens = dg.reshape %x : tensor<4x4x8xf32> -> tensor<16x8xf32>
    %y = dg.moe_experts %tokens, %w, %i, %gate_up, %down : tensor<16x8xf32>, tensor<16x2xf32>, tensor<16x2xi64>, tensor<4x8x8xf32>, tensor<4x8x4xf32> -> tensor<16x8xf32>
    %y1 = dg.reshape %y : tensor<16x8xf32> -> tensor<4x4x8xf32>
    %n = dg.rms_norm %y1 {eps = 1.0e-6 : f64} : (tensor<4x4x8xf32>) -> tensor<4x4x8xf32>
    dg.output "y", %n : tensor<4x4x8xf32>
    return
  }
}
