// RUN: dgemma-opt %s --dg-shard-annotate="tp=2 dp=4 ep=2 sp=true zero1=true" | FileCheck %s --check-prefix=TP2
// RUN: dgemma-opt %s --dg-shard-annotate="dp=2 ep=2" | FileCheck %s --check-prefix=EP2
// RUN: dgemma-opt %s --dg-shard-annotate="dp=4 ep=2 zero1=true" | FileCheck %s --check-prefix=DP4
// RUN: not dgemma-opt %s --dg-shard-annotate="dp=3 ep=2" 2>&1 | FileCheck %s --check-prefix=NOMESH
// RUN: not dgemma-opt %s --dg-shard-annotate="sp=true" 2>&1 | FileCheck %s --check-prefix=NOTP
// dg-shard-annotate: the mesh of a layout, parameters by role, gradient buffers as pending sums over
// the ranks that contribute to them, Adam moments (ZeRO-1: split over the data group), batch inputs
// split over the data group.

// TP=2, DP=4, EP=2: base axes dp (4) and tp (2); the expert group is {tp}, expert data {dp}.
// TP2: module attributes {dg.mesh = #dg.mesh<[dp = 4 (data), tp = 2 (tensor)]>}
// TP2-LABEL: func.func @step
// TP2: dg.input "input_ids" {dg.shardings = [#dg.sharding<{{\[\[}}dp], []]>]} : tensor<4x8xi64>
// TP2: dg.input "lr" {dg.shardings = [#dg.sharding<[]>]} : tensor<f32>
// TP2: dg.param "embed" {dg.role = "vocab", dg.shardings = [#dg.sharding<{{\[\[}}tp], []]>]}
// TP2: dg.param "q" {dg.role = "column", dg.shardings = [#dg.sharding<{{\[\[}}tp], []]>]}
// TP2: dg.param "o" {dg.role = "row", dg.shardings = [#dg.sharding<{{\[\[}}], [tp]]>]}
// TP2: dg.param "experts" {dg.role = "experts", dg.shardings = [#dg.sharding<{{\[\[}}tp], [], []]>]}
// TP2: dg.param "norm" {dg.role = "replicated", dg.shardings = [#dg.sharding<{{\[\[}}]]>]}
// TP2: dg.param "scalar" {dg.role = "replicated", dg.shardings = [#dg.sharding<{{\[\[}}]]>], trainable = false}
// A frozen base (dg-lora) splits by its role as the trainable weights do.
// TP2: dg.param "frozen_q" {dg.frozen_base, dg.role = "column", dg.shardings = [#dg.sharding<{{\[\[}}tp], []]>], trainable = false}
// TP2: dg.param "frozen_experts" {dg.frozen_base, dg.role = "experts", dg.shardings = [#dg.sharding<{{\[\[}}tp], [], []]>], trainable = false}
// TP2: dg.param "grad/q" {dg.shardings = [#dg.sharding<{{\[\[}}tp], []], partial = [dp]>], trainable = false}
// TP2: dg.param "grad/norm" {dg.shardings = [#dg.sharding<{{\[\[}}]], partial = [dp, tp]>], trainable = false}
// TP2: dg.param "grad/experts" {dg.shardings = [#dg.sharding<{{\[\[}}tp], [], []], partial = [dp]>], trainable = false}
// The moments add the data group to the first dimension whose local block it divides.
// TP2: dg.param "optimizer/exp_avg/q" {dg.shardings = [#dg.sharding<{{\[\[}}tp, dp], []]>], trainable = false}
// TP2: dg.param "optimizer/exp_avg_sq/experts" {dg.shardings = [#dg.sharding<{{\[\[}}tp], [dp], []]>], trainable = false}
// TP2: dg.param "optimizer/exp_avg/norm" {dg.shardings = [#dg.sharding<{{\[\[}}dp]]>], trainable = false}
// TP2: dg.param "optimizer/exp_avg/scalar" {dg.shardings = [#dg.sharding<{{\[\[}}]]>], trainable = false}

// TP=1, DP=2, EP=2: one base axis ep, which is both the data and the expert group; expert data is empty.
// EP2: module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>}
// EP2: dg.input "input_ids" {dg.shardings = [#dg.sharding<{{\[\[}}ep], []]>]}
// EP2: dg.param "embed" {dg.role = "vocab", dg.shardings = [#dg.sharding<{{\[\[}}], []]>]}
// EP2: dg.param "experts" {dg.role = "experts", dg.shardings = [#dg.sharding<{{\[\[}}ep], [], []]>]}
// EP2: dg.param "frozen_experts" {dg.frozen_base, dg.role = "experts", dg.shardings = [#dg.sharding<{{\[\[}}ep], [], []]>], trainable = false}
// EP2: dg.param "grad/q" {dg.shardings = [#dg.sharding<{{\[\[}}], []], partial = [ep]>], trainable = false}
// EP2: dg.param "grad/norm" {dg.shardings = [#dg.sharding<{{\[\[}}]], partial = [ep]>], trainable = false}
// EP2: dg.param "grad/experts" {dg.shardings = [#dg.sharding<{{\[\[}}ep], [], []]>], trainable = false}
// EP2: dg.param "optimizer/exp_avg/q" {dg.shardings = [#dg.sharding<{{\[\[}}], []]>], trainable = false}

// TP=1, DP=4, EP=2: dense data parallelism is {dp, ep}, the experts' data group {dp}.
// DP4: module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), ep = 2 (expert)]>}
// DP4: dg.input "input_ids" {dg.shardings = [#dg.sharding<{{\[\[}}dp, ep], []]>]}
// DP4: dg.param "grad/q" {dg.shardings = [#dg.sharding<{{\[\[}}], []], partial = [dp, ep]>], trainable = false}
// DP4: dg.param "grad/experts" {dg.shardings = [#dg.sharding<{{\[\[}}ep], [], []], partial = [dp]>], trainable = false}
// DP4: dg.param "optimizer/exp_avg/q" {dg.shardings = [#dg.sharding<{{\[\[}}dp, ep], []]>], trainable = false}
// DP4: dg.param "optimizer/exp_avg_sq/experts" {dg.shardings = [#dg.sharding<{{\[\[}}ep, dp], [], []]>], trainable = false}

// NOMESH: error: dg-shard-annotate: the layout tp=1 dp=3 ep=2 has no mesh
// NOTP: error: dg-shard-annotate: sp needs tp > 1
module {
  func.func @step() attributes {dg.bucket = {micro_batch = 4 : i64}, dg.entry = "train_step"} {
    %ids = dg.input "input_ids" : tensor<4x8xi64>
    %lr = dg.input "lr" : tensor<f32>
    %embed = dg.param "embed" {dg.role = "vocab"} : tensor<16x8xf32>
    %q = dg.param "q" {dg.role = "column"} : tensor<8x8xf32>
    %o = dg.param "o" {dg.role = "row"} : tensor<8x8xf32>
    %experts = dg.param "experts" {dg.role = "experts"} : tensor<4x8x8xf32>
    %norm = dg.param "norm" {dg.role = "replicated"} : tensor<8xf32>
    %scalar = dg.param "scalar" {dg.role = "replicated", trainable = false} : tensor<1xf32>
    %frozen_q = dg.param "frozen_q" {dg.frozen_base, dg.role = "column", trainable = false} : tensor<8x8xf32>
    %frozen_experts = dg.param "frozen_experts" {dg.frozen_base, dg.role = "experts", trainable = false} : tensor<4x8x8xf32>
    %gq = dg.param "grad/q" {trainable = false} : tensor<8x8xf32>
    %gnorm = dg.param "grad/norm" {trainable = false} : tensor<8xf32>
    %gexperts = dg.param "grad/experts" {trainable = false} : tensor<4x8x8xf32>
    %mq = dg.param "optimizer/exp_avg/q" {trainable = false} : tensor<8x8xf32>
    %mexperts = dg.param "optimizer/exp_avg_sq/experts" {trainable = false} : tensor<4x8x8xf32>
    %mnorm = dg.param "optimizer/exp_avg/norm" {trainable = false} : tensor<8xf32>
    %mscalar = dg.param "optimizer/exp_avg/scalar" {trainable = false} : tensor<1xf32>
    return
  }
}
