// The passes of the dgemma compiler. Op-local rewrites (folders, canonicalization patterns) stay
// with the ops in dialects/dg/IR. A pass that looks at one entry point at a time runs on a
// func.func (the pipeline nests it under the module); one that adds entry points, relates them or
// reads and writes the module's mesh runs on the module (docs/architecture.md, "Passes").
#ifndef DGEMMA_COMPILER_PASSES_TD
#define DGEMMA_COMPILER_PASSES_TD

include "mlir/Pass/PassBase.td"

def DgAutodiff : Pass<"dg-autodiff", "::mlir::ModuleOp"> {
  let summary = "Reverse-mode autodiff: appends the gradient of a scalar output to each entry point";
  let description = [{
    For every entry point that produces the output named by `loss` (a single-element tensor), walks
    the ops that lie between the trainable parameters and the loss in reverse order, asks each for
    its vector-Jacobian product (DerivativeOpInterface), sums cotangents that meet, and hands out
    `grad/<parameter name>` for every trainable parameter (zeros when the loss does not depend on it).
    Ops off that path are never differentiated; an op on it without a derivative rule is an error
    naming it.
  }];
  let options = [
    Option<"lossName", "loss", "std::string", /*default=*/"\"loss\"", "Name of the dg.output to differentiate">,
  ];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

def DgLora : Pass<"dg-lora", "::mlir::ModuleOp"> {
  let summary = "Freezes the model's weights and adds trainable low-rank adapters to the targeted ones";
  let description = [{
    LoRA (docs/training.md, "LoRA adapters"). Every trainable parameter becomes frozen (trainable =
    false, the unit attribute `dg.frozen_base`): it gets no gradient, no optimizer state, and
    dg-base-dtype may store it in a low-precision format. For each targeted linear weight `P.weight`
    [out, in] read by a matmul `x W^T` (through casts), the pass adds the trainable f32 parameters
    `P.lora_A.weight` [r, in] (PEFT's kaiming-uniform init: U(-1/sqrt(in), 1/sqrt(in))) and
    `P.lora_B.weight` [out, r] (zeros), and adds `((x A^T) B^T) * alpha/r` to the matmul's result in
    its dtype; A and B split like the weight's input and output dimensions. Under `dropout` > 0 the
    adapters of the `dropout-entries` read x times a keep mask scaled by 1/(1-p), drawn from the
    entry's `dropout-keys` input per example, one random stream per adapter use. Every entry
    point that reads a targeted weight reads its adapter, so the encoder and decoder passes that share
    the backbone share one adapter. `targets` are the groups attention, mlp, experts, router or single
    projection names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, router.proj,
    experts.gate_up_proj, experts.down_proj); a target that matches no weight is an error.
  }];
  let options = [
    Option<"rank", "rank", "int64_t", /*default=*/"8", "adapter rank r">,
    Option<"alpha", "alpha", "double", /*default=*/"8.0", "scaling numerator: the update is (alpha / r) B A">,
    ListOption<"targets", "targets", "std::string", "target groups or projection names">,
    Option<"dropout", "dropout", "double", /*default=*/"0.0", "dropout probability on the adapter's input">,
    Option<"dropoutKeys", "dropout-keys", "std::string", /*default=*/"\"\"",
           "the [batch, 2] i64 key input that draws the dropout masks">,
    ListOption<"dropoutEntries", "dropout-entries", "std::string", "the entry points that train with dropout">,
  ];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

def DgBaseDtype : Pass<"dg-base-dtype", "::mlir::ModuleOp"> {
  let summary = "Stores the frozen base weights (dg.frozen_base) in bf16, int8 or NF4";
  let description = [{
    Runs after dg-lora and before autodiff, on exactly the parameters marked `dg.frozen_base`.
    `bf16`: each becomes a bf16 parameter (no f32 copy); a cast of it to bf16 folds away, any other
    reader gets a widening cast. `int8` / `nf4`: an f32 weight of rank >= 2 read only by matmul and
    moe_experts (through casts, reshapes and transposes) becomes two parameters, `NAME` (the codes:
    i8, or ui8 with the last dimension halved) and `NAME.scale` (int8, one per row) or `NAME.absmax`
    (nf4, one per 64 elements of a row), both frozen with the weight's `dg.role`, and each reader gets
    a dg.dequantize into the type it read (a cast to the activation dtype becomes the dequantize
    itself), placed at the reader so the decoded weight lives only as long as the use. Their `init`
    says how the runtime fills them (`{kind = "quantized", ...}`, docs/plan-format.md, "Header").
    Every other frozen parameter (norm weights, scales, the embedding table, which gather reads by
    row and the tied head by matmul) becomes bf16. An NF4 weight whose last dimension is not a
    multiple of 64 is an error naming it (docs/training.md, "Frozen low-precision base").
  }];
  let options = [
    Option<"dtype", "dtype", "std::string", /*default=*/"\"bf16\"", "bf16 | int8 | nf4">,
  ];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

def DgF32GradientAccumulation : Pass<"dg-f32-gradient-accumulation", "::mlir::func::FuncOp"> {
  let summary = "Sums a bf16 step's weight gradients, and computes their last ops, in f32";
  let description = [{
    Walks back from every f32 `grad/...` output through sums: where a 16-bit value is widened to
    f32 and has no other use, an add or sub is redone in f32 on widened operands, a transpose or
    reshape on its widened input, and a matmul, reduce_sum, scatter_add or the weight gradients of
    moe_experts_backward produce f32 directly (Megatron's fp32 gradient accumulation, training.md
    docs/training.md, "Mixed precision"). Each rewrite removes a rounding; none adds one. Nothing outside a gradient's tail changes.
  }];
}

def DgBackwardSchedule : Pass<"dg-backward-schedule", "::mlir::func::FuncOp"> {
  let summary = "Reorders the backward so the contributions to a shared weight's gradient meet early";
  let description = [{
    In each entry point with the output `loss`, the ops after it (the backward) are list-scheduled;
    the forward keeps its order. An op that reads nothing the backward computed, or a dg-recompute
    clone, runs just before its first user; every other op runs once the ops it depends on have run, least depth first (the
    longest chain of such ops from the backward's start, in bands of `depth-band`), then in the old
    order. So the encoder
    pass's backward of a layer runs beside the decoder pass's backward of the layer below, and a
    stack weight's two gradient contributions meet one layer at a time. An op whose results hold
    more than twice the elements it reads from the backward (a weight gradient) also runs just
    before its first user, and among ready ops one that reads the last use of a value of its result's
    type goes first. Collectives move like other ops (each rank schedules its program alike;
    dgemma-compile checks that the ranks' plans agree); other ops with effects keep their relative
    order, so do the outputs, and so do the readers and writers of each parameter the entry assigns.
    The parameter updates stay at the end (dg-memory-plan moves them up). Every reader of a cast
    of a parameter after the first gets a copy of the cast of its own, made just before it, so no
    copy lives from the encoder's read of a weight to the decoder's or the backward's. Every value is computed as before,
    from the same operands (docs/performance.md, "Scheduling the backward").
  }];
  let options = [
    Option<"lossName", "loss", "std::string", /*default=*/"\"loss\"", "Name of the dg.output the backward differentiates">,
    Option<"depthBand", "depth-band", "int64_t", /*default=*/"16",
           "Depths within one band of this many count as equal (then the old order decides)">,
  ];
}

def DgMemoryPlan : Pass<"dg-memory-plan", "::mlir::func::FuncOp"> {
  let summary = "Assigns scratch offsets per pool from value lifetimes";
  let description = [{
    Per entry point: a value is live from its definition (entry inputs: from the start) to its last
    use (entry outputs: to the end); a reshape is a view that shares its input's bytes and extends its
    lifetime, and so is an in-place collective (all_reduce, broadcast, reduce_to_root) whose input has
    no other use, and an AdamW update assigned straight back is written into its parameter. First,
    each parameter update `%v = op(%p, ...); dg.assign %v to %p` whose parameter nothing else in the
    entry touches (the gradient buffers' sums) moves up, with its param op, to just after its last
    other operand, so a weight gradient dies where it is added into its buffer.
    Parameters and constants live in the persistent arenas and get no offset. The scratch storage
    falls into two pools with an arena each: communication buffers (the results of the collectives
    that do not work in place) and activations (everything else). Each pool is packed twice, largest
    first at the lowest aligned offset clear of every placed value with an intersecting lifetime, and
    best-fit in program order over the free blocks; the smaller arena wins
    (compiler/Transforms/MemoryPlan.h). Writes `dg.offsets` (within the result's pool) on each op with
    a scratch result, and `dg.scratch_bytes` (activations) and `dg.comm_buffer_bytes` on the entry
    point; the plan lowering requires them. With `stats`, a remark per entry point gives both
    packings, the most bytes live at one op and the fragmentation (arena / max live) per pool.
  }];
  let options = [
    Option<"alignment", "alignment", "int64_t", /*default=*/"64", "Byte alignment of every scratch buffer">,
    Option<"stats", "stats", "bool", /*default=*/"false", "Remark the packings and the fragmentation per entry point">,
  ];
}

def DgOptimizerStep : Pass<"dg-optimizer-step", "::mlir::ModuleOp"> {
  let summary = "Adds the AdamW update of every trainable parameter as the entry point optimizer_step";
  let description = [{
    The update of docs/training.md, "AdamW and clipping" as dg ops, so that the sharding passes (the
    distributed optimizer) and the memory planner see it. Inputs: `lr`, `bias_correction1` (1 − β1^n),
    `bias_correction2` (1 − β2^n), `gradient_scale` (1 / micro-batches; the gradients arrive summed)
    and `grad/<name>` per trainable parameter. It outputs `grad_norm` (the global L2 norm of the
    scaled gradients), clips them to `max-grad-norm` as Megatron does (scale by
    max / (‖g‖ + 1e-6) when that is below 1), updates the moments `optimizer/exp_avg/<name>` and
    `optimizer/exp_avg_sq/<name>` (non-trainable parameters, zeros at first) and the parameter with
    decoupled weight decay in one dg.adamw per parameter, and writes all three back with dg.assign.
  }];
  let options = [
    Option<"beta1", "beta1", "double", /*default=*/"0.9", "Adam β1">,
    Option<"beta2", "beta2", "double", /*default=*/"0.999", "Adam β2">,
    Option<"epsilon", "epsilon", "double", /*default=*/"1e-8", "Adam ε">,
    Option<"weightDecay", "weight-decay", "double", /*default=*/"0.0", "decoupled weight decay">,
    Option<"maxGradNorm", "max-grad-norm", "double", /*default=*/"1.0", "global-norm clip">,
  ];
  let dependentDialects = ["::mlir::dg::DgDialect", "::mlir::func::FuncDialect"];
}

def DgGradientBuffers : Pass<"dg-gradient-buffers", "::mlir::ModuleOp"> {
  let summary = "Accumulates gradients on the device, in persistent f32 buffers that optimizer_step reads";
  let description = [{
    Runs after dg-optimizer-step. Every `grad/<name>` output of an entry point becomes
    `dg.assign` of `add(buffer, gradient)` into the zero-initialised, non-trainable f32 parameter
    `grad/<name>`, so the micro-batches of one optimizer step sum on the device in their order.
    optimizer_step reads the buffers in place of its `grad/<name>` inputs and zeroes them after the
    update. It adds the entry points `gradient_check` (output `nonfinite/grad/<name>`: 0 when that
    buffer is finite, NaN otherwise; the NaN/Inf guard runs it before an update) and
    `zero_gradients` (discards the sums of a skipped step or an evaluation).
  }];
  let dependentDialects = ["::mlir::dg::DgDialect", "::mlir::func::FuncDialect"];
}

def DgCostReport : Pass<"dg-cost-report", "::mlir::func::FuncOp"> {
  let summary = "Reports FLOPs, parameter bytes, scratch bytes and communication bytes of each entry point as remarks";
  let description = [{
    Sums CostOpInterface over each entry point and the bytes of its distinct parameters; after
    dg-memory-plan it adds the planned scratch arena size, and when the entry point has collectives
    the bytes one rank receives (CommunicationOpInterface), and after dg-recompute the FLOPs of its
    clones (`recompute_flops`, part of `flops`). Used by `dgemma-compile --report`.
  }];
}

def DgShardAnnotate : Pass<"dg-shard-annotate", "::mlir::ModuleOp"> {
  let summary = "Sets the module's dg.mesh for a parallel layout and the shardings of parameters and inputs";
  let description = [{
    The first sharding pass (docs/parallelism.md, "Annotation and propagation"). The mesh is the
    layout's base axes (`dp`, `ep`, `tp`; DgMesh.h, layoutGroups). Each dg.param gets its role's split
    (`dg.role`: vocab and column split dim 0 over the tensor group, row dim 1, experts dim 0 over the
    expert group; replicated parameters and non-trainable buffers stay whole). `grad/<name>` has its
    parameter's split and is partial over the data group (experts: the expert-data group), plus the
    tensor group for a replicated parameter; `optimizer/<state>/<name>` has its parameter's split,
    and under `zero1` also the data group (experts: expert-data) on the first dimension it divides.
    A dg.input whose dim 0 is the bucket's micro_batch splits it over the data group. With `cp` the
    mesh has a `cp` axis (role context) over which every gradient is a pending sum too; it takes no
    part in the inputs' batch split nor in ZeRO-1.
  }];
  let options = [
    Option<"tensorParallel", "tp", "int64_t", /*default=*/"1", "tensor-parallel size">,
    Option<"dataParallel", "dp", "int64_t", /*default=*/"1", "data-parallel size">,
    Option<"expertParallel", "ep", "int64_t", /*default=*/"1", "expert-parallel size (divides dp)">,
    Option<"sequenceParallel", "sp", "bool", /*default=*/"false", "sequence parallelism (checked: needs tp > 1)">,
    Option<"zero1", "zero1", "bool", /*default=*/"false", "shard the optimizer state over the data group">,
    Option<"contextParallel", "cp", "int64_t", /*default=*/"1", "context-parallel size (the encoder's sequence)">,
  ];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

def DgShardPropagate : Pass<"dg-shard-propagate", "::mlir::ModuleOp"> {
  let summary = "Gives every op result shardings (dg.shardings) and operand shardings (dg.operand_shardings)";
  let description = [{
    One pass in program order over each entry point, from the sources dg-shard-annotate fixed,
    through each op's sharding rule (docs/parallelism.md, "Annotation and propagation"): weights'
    splits win over activations', a pending sum passes through the ops linear in it and is resolved
    where an op is not (a gradient buffer into its Adam moments' layout; with `sp` a
    [batch, sequence, hidden] activation summed over the tensor group into a sequence split; an
    activation summed over data axes into its batch split; anything else into a whole value).
    The result satisfies dg-shard-verify.
  }];
  let options = [
    Option<"sequenceParallel", "sp", "bool", /*default=*/"false",
           "resolve tensor-group sums of [batch, sequence, hidden] activations into sequence splits">,
  ];
}

def DgShardVerify : Pass<"dg-shard-verify", "::mlir::ModuleOp"> {
  let summary = "Checks that every op's shardings agree with its sharding rule";
  let description = [{
    Every op has dg.shardings (results) and dg.operand_shardings (operands); a factor is split alike
    wherever it appears, major factors before minor ones, never a need-replication factor; a result is
    partial exactly over the axes of the reduction factors it lacks and the pending sums of its linear
    operands; pending sums reach only operands the op is linear in (add, sub, concat: alike; mul,
    matmul: one operand; div: the numerator; neg, reshape, transpose, slice, reduce_sum, widening
    casts); dg.gather's table rows and dg.scatter_add's result rows may be split (row offsets);
    dg.assign consumes its value in the target's sharding; dg.output is never partial; a parameter
    name has one sharding.
  }];
}

def DgShardPartition : Pass<"dg-shard-partition", "::mlir::ModuleOp"> {
  let summary = "Turns a sharding-annotated module into one rank's program";
  let description = [{
    Runs after dg-shard-propagate: every op with results carries `dg.shardings` and every op with
    operands `dg.operand_shardings`. Each value gets the type of this rank's block; each operand
    whose producer's sharding differs from the one its user consumes is resharded with collectives
    over single mesh axes, local slices or zeros (docs/parallelism.md, "Partitioning"), once per
    value and layout. Constants are cut at compile time, dg.gather and dg.scatter_add get the first
    table row the rank holds (`row_offset`), dg.moe_experts(_backward) its first expert
    (`expert_offset`), and dg.param, dg.input and dg.output record the global shape and this rank's
    box (`dg.global_shape`, `dg.shard_offset`). The sharding attributes are removed.
  }];
  let options = [
    Option<"rank", "rank", "int64_t", /*default=*/"0", "the rank whose program to build (row-major over dg.mesh)">,
  ];
  let dependentDialects = ["::mlir::dg::DgDialect", "::mlir::func::FuncDialect"];
}

def DgExpertDispatch : Pass<"dg-expert-dispatch", "::mlir::func::FuncOp"> {
  let summary = "Rewrites expert parallelism's all-gather form into the ragged all-to-all dispatch";
  let description = [{
    On per-rank IR after partitioning (and after autodiff). The all-gather form of a
    `dg.moe_experts {expert_offset = o}` gathers x, the routing weights and the indices over one mesh
    axis A and reduce-scatters the partial result over A; its backward gathers the output gradient
    too and reduce-scatters grad_input and grad_weights. Each becomes docs/parallelism.md's dispatch
    on the rank's own tokens: dg.moe_dispatch (slots by destination rank and expert, counts), the
    per-expert counts exchanged and the permuted rows sent with dg.all_to_all over A, dg.moe_local_experts
    (or its backward) on the received rows, the reverse dg.all_to_all, and dg.moe_combine (in f32).
    The backward reuses the forward's received rows when the forward of the same tokens was rewritten
    earlier in the entry point. The receive capacity is the worst case of a dropless exchange: every
    route of the axis' G ranks, G·N·k rows for N local tokens. A weights or indices operand that is
    not gathered over A is cut to the rank's rows (block o / E_local of dim 0). Ops that do not match
    the pattern stay as they are.
  }];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

def DgRecompute : Pass<"dg-recompute", "::mlir::func::FuncOp"> {
  let summary = "Recomputes layer activations before the backward instead of keeping them (none, full[:N], selective)";
  let description = [{
    On one rank's program after autodiff, sharding and the expert dispatch, before dg-memory-plan
    (docs/training.md, "Recomputation"). The model marks each layer's forward with
    `dg.layer_begin` / `dg.layer_end` (its first and last op); a train entry's backward is what
    follows its `loss` output. For each region of the policy, the region's values that the backward
    reads are cloned (marked `dg.recomputed`) right before their first backward reader, which reads
    the clones; the forward's values then die with their last forward reader. `full`: chunks of N
    consecutive layers of one stack (`full` is `full:1`), all recomputed from the chunk's input except
    the chunk's output; `selective`: per layer, the attention core and the MoE intermediates (the
    experts' outputs and, under expert parallelism, the exchanged rows) and their reshapes. Every op
    is a pure function of its operands (random ops of their key and stream), so the clones compute
    the same bits; collectives are cloned in the same order on every rank. Parameters, constants and
    inputs are read, never cloned. Entry points without the loss are left alone.
  }];
  let options = [
    Option<"policy", "policy", "std::string", /*default=*/"\"none\"", "none | full | full:N | selective">,
    Option<"lossName", "loss", "std::string", /*default=*/"\"loss\"", "the dg.output the backward follows">,
  ];
}

def DgKeepExpertActivations : Pass<"dg-keep-expert-activations", "::mlir::func::FuncOp"> {
  let summary = "Hands each dg.moe_experts_backward its forward's gate/up pre-activations instead of recomputing them";
  let description = [{
    On one rank's program after dg-recompute, before dg-backward-schedule (docs/training.md, "Expert
    activations"). Each dg.moe_experts_backward without `gate_up_rows` is paired with the last
    dg.moe_experts before it in its block that has the same operands and expert_offset (a
    recomputed clone where dg-recompute made one); when that op holds every expert its routing
    chooses among (its indices are a dg.moe_route over as many experts as its gate_up holds), the
    forward gets the `gate_up_rows` result and the backward reads it. The backward's results are
    the same bytes; it runs four products per expert instead of five.
  }];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

def DgFuseElementwise : Pass<"dg-fuse-elementwise", "::mlir::func::FuncOp"> {
  let summary = "Groups chains of elementwise ops into one dg.fused_elementwise (one plan step, one kernel)";
  let description = [{
    On one rank's program after autodiff, sharding, the expert dispatch and dg-recompute, before
    dg-memory-plan. From each elementwise op (add sub mul div maximum minimum, neg exp log tanh sqrt
    rsqrt gelu_tanh, float-to-float cast, select of floats) backwards, its operands' producers join
    its group when they are elementwise ops whose result has the group root's shape, whose every use
    is in the group (the intermediate values have no other reader, so no tensor of theirs is needed)
    and which the group follows without a gap: the group is a contiguous run of ops ending at the
    root, so the fused op keeps no input alive longer than the chain did, and nothing moves past a
    collective or a dg.assign. A group of two or more ops becomes one dg.fused_elementwise at the
    root's place, its program listing the members in block order (docs/kernels.md, "Fused
    elementwise chains"). f64 and 32/16-bit chains are not mixed; a select written in place into a
    parameter and ops with a different `dg.recomputed` mark than the root stay as they are. The
    fused kernel computes each member exactly as its own kernel does, so results are bit-identical
    to the unfused program.
  }];
  let dependentDialects = ["::mlir::dg::DgDialect"];
}

#endif // DGEMMA_COMPILER_PASSES_TD
