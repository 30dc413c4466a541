// dgemma-compile: model config + parallel layout -> executable plan (one file per rank). The flags
// fill a CompileOptions; the compiler driver (compiler/Driver) does the rest.
#include <string>

#include "compiler/Driver/CostModel.h"
#include "compiler/Driver/Driver.h"
#include "compiler/Transforms/RecomputePolicy.h"
#include "support/Error.h"
#include "support/Json.h"
#include "tools/common/CliSupport.h"
#include "tools/common/FlagRanges.h"

namespace {

using dgemma::InputError;

// A preset's values fill the flags the command line left unset (explicit flags win), through
// CLI11 so that they pass the same checks as typed ones.
void applyPreset(CLI::App& app, const std::string& name) {
  for (const auto& [flag, value] : dgemma::presetCompileFlags(name)) {
    CLI::Option* option = app.get_option("--" + flag);
    if (option->count() > 0) continue;
    option->add_result(value);
    try {
      option->run_callback();
    } catch (const CLI::ParseError& error) {
      throw InputError("--preset " + name + ": --" + flag + ": " + error.what());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  dgemma::CompileOptions options;
  CLI::App app{"dgemma-compile: model config + parallel layout -> executable plan (one file per rank)",
               "dgemma-compile"};
  app.add_option("--model", options.model, "HF checkpoint dir or config.json, or " + dgemma::builtinModelName())
      ->required();
  app.add_option("--mode", options.mode, "train | infer")->required()->check(CLI::IsMember({"train", "infer"}));
  app.add_option("--preset", options.preset, "named recipe defaults: dg26b-sft, tiny-cpu, demo (explicit flags win)");
  app.add_option("--objective", options.objective,
                 "base-sft | reweighted-ce | loo-ce | reweighted-loo-ce (SFT), or the pre-training objectives "
                 "autoregressive | masked-diffusion | block-diffusion (docs/pretraining.md, \"Objectives\")")
      ->check(CLI::IsMember({"base-sft", "reweighted-ce", "loo-ce", "reweighted-loo-ce", "autoregressive",
                             "masked-diffusion", "block-diffusion"}));
  app.add_option("--seq-len", options.sequenceLengths,
                 "pre-training: packed sequence-length buckets, e.g. 512,1024 (one train_step each; --mode infer: one "
                 "logits entry each)");
  app.add_option("--mask-token-id", options.maskTokenId,
                 "masked-diffusion: the absorbing mask token's id (default: the config's mask_token_id)")
      ->check(dgemma::integerIn(0, dgemma::kMaxBuiltinSize * 65536));
  app.add_option("--mask-epsilon", options.maskEpsilon,
                 "masked-diffusion: the floor of p_mask = (1 - eps) t + eps (default 1e-3)")
      ->check(dgemma::numberIn(0, 1, false, false));
  app.add_option("--self-cond-prob", options.selfCondProb, "self-conditioning probability")
      ->check(dgemma::numberIn(0, 1));
  app.add_option("--encoder-loss-weight", options.encoderLossWeight,
                 "clean-target encoder loss weight (default 1; 0 and nothing else with --policy-loss grpo)")
      ->check(dgemma::numberIn(0, dgemma::kMaxWeight));
  app.add_option("--weight-clip", options.weightClip, "clip of the reweighted objectives' weight (default: none)")
      ->check(dgemma::numberIn(0, dgemma::kMaxWeight, false));
  app.add_option("--decoder-loss-weight", options.decoderLossWeight, "denoising decoder loss weight")
      ->check(dgemma::numberIn(0, dgemma::kMaxWeight));
  app.add_option("--aux-loss-coeff", options.auxLossCoeff, "router load-balancing loss coefficient")
      ->check(dgemma::numberIn(0, dgemma::kMaxWeight));
  app.add_option(
         "--policy-loss", options.policyLoss,
         "none (default: the SFT objective) | grpo (the clipped GRPO policy loss and a logps entry; docs/rl.md)")
      ->check(CLI::IsMember({"none", "grpo"}));
  app.add_option("--clip-epsilon", options.clipEpsilon, "grpo: the ratio's clip range [1 - E, 1 + E] (default 0.2)")
      ->check(dgemma::numberIn(0, 1, false, false));
  app.add_option("--clip-delta", options.clipDelta,
                 "grpo: the two-sided clip, a bound D > 1 + E on the ratio of a negative advantage (default: none)")
      ->check(dgemma::numberIn(1, dgemma::kMaxWeight, false, true));
  app.add_option("--kl-coeff", options.klCoeff,
                 "grpo: the k3 KL penalty's coefficient against ref_logps (default 0: none)")
      ->check(dgemma::numberIn(0, dgemma::kMaxWeight));
  app.add_option("--noise-min", options.noiseMin, "lower end of the diffusion time t (SFT and block-diffusion)")
      ->check(dgemma::numberIn(0, 1));
  app.add_option("--noise-max", options.noiseMax, "upper end of the diffusion time t (SFT and block-diffusion)")
      ->check(dgemma::numberIn(0, 1));
  app.add_option("--adam-beta1", options.adam.beta1, "AdamW beta1 (docs/training.md, 'AdamW and clipping')")
      ->check(dgemma::numberIn(0, 1, true, false));
  app.add_option("--adam-beta2", options.adam.beta2, "AdamW beta2")->check(dgemma::numberIn(0, 1, true, false));
  app.add_option("--adam-eps", options.adam.epsilon, "AdamW epsilon")->check(dgemma::numberIn(0, 1, false));
  app.add_option("--weight-decay", options.adam.weightDecay, "decoupled weight decay")
      ->check(dgemma::numberIn(0, dgemma::kMaxWeight));
  app.add_option("--clip-grad", options.adam.maxGradNorm, "global gradient-norm bound")
      ->check(dgemma::numberIn(0, dgemma::kMaxGradNorm, false));
  app.add_option("--micro-batch", options.microBatch, "examples per micro-batch")
      ->check(dgemma::integerIn(1, dgemma::kMaxMicroBatch));
  app.add_option("--images-per-example", options.imagesPerExample,
                 "images in every example of an image micro-batch; >= 1 builds the image twins of the prompt entries "
                 "(needs a vision_config; default 0: a text-only plan)")
      ->check(dgemma::integerIn(0, dgemma::kMaxImagesPerExample));
  app.add_option("--prompt-len", options.promptLengths, "prompt-length buckets, e.g. 128,256,512");
  app.add_option("--canvas-len", options.canvasLength,
                 "decoder canvas length (default: the config's canvas_length); block-diffusion: the block length L, "
                 "dividing every --seq-len")
      ->check(dgemma::integerIn(1, dgemma::kMaxLength));
  app.add_option(
         "--max-new-tokens", options.maxNewTokens,
         "infer: the most tokens a generation may ask for; sizes the K/V cache (default: generation_config.json's "
         "max_new_tokens, else 256)")
      ->check(dgemma::integerIn(1, dgemma::kMaxLength));
  app.add_option("--hidden-size", options.hiddenSize, "hidden size of the built-in graph")
      ->check(dgemma::integerIn(1, dgemma::kMaxBuiltinSize));
  app.add_option("--vocab-size", options.vocabSize, "output size of the built-in graph")
      ->check(dgemma::integerIn(1, dgemma::kMaxBuiltinSize));
  app.add_option("--tp", options.tp, "tensor-parallel size")->check(dgemma::integerIn(1, dgemma::kMaxParallel));
  app.add_option("--ep", options.ep, "expert-parallel size")->check(dgemma::integerIn(1, dgemma::kMaxParallel));
  app.add_option("--dp", options.dp, "data-parallel size")->check(dgemma::integerIn(1, dgemma::kMaxParallel));
  app.add_flag("--sp", options.sequenceParallel, "sequence parallelism");
  // Range-checked by the compiler (an InputError naming the flag), not by CLI11.
  app.add_option("--vocab-alignment", options.vocabAlignment,
                 "pad the vocabulary to a multiple of lcm(--tp, N) rows (docs/parallelism.md, \"Vocabulary padding\")");
  app.add_option("--cp", options.cp,
                 "context-parallel size: the encoder's sequence split over this many ranks (train mode, SFT "
                 "objective, text only; docs/parallelism.md, 'Context parallelism')")
      ->check(dgemma::integerIn(1, dgemma::kMaxParallel));
  app.add_flag("--distributed-optimizer,!--no-distributed-optimizer", options.distributedOptimizer,
               "ZeRO-1: optimizer state sharded over the data-parallel ranks (default on)");
  app.add_option("--expert-exchange", options.expertExchange,
                 "how expert parallelism moves tokens: all-gather (default: every token to every EP rank) | all-to-all "
                 "(dropless dispatch; docs/parallelism.md, 'Expert parallelism')")
      ->check(CLI::IsMember({"all-gather", "all-to-all"}));
  app.add_option("--optimizer-offload", options.optimizerOffload,
                 "none (default) | experts | all: keep those parameters' AdamW moments in host memory and run their "
                 "update on the host (docs/parallelism.md, 'Optimizer-state offload')")
      ->check(CLI::IsMember({"none", "experts", "all"}));
  app.add_option("--base-dtype", options.baseDtype,
                 "how the frozen base weights are stored: f32 (default) | bf16 | int8 (per-row scales) | nf4 "
                 "(QLoRA's NormalFloat4, blocks of 64); docs/training.md, 'Frozen low-precision base'")
      ->check(CLI::IsMember({"f32", "bf16", "int8", "nf4"}));
  app.add_option("--fusion", options.fusion,
                 "on (default) | off: fuse chains of elementwise ops into one step each (dg-fuse-elementwise; "
                 "docs/kernels.md, 'Fused elementwise chains')")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option(
         "--recompute", options.recompute,
         "what the backward recomputes: none | full[:N] (every layer, or chunks of N, from its input) | selective "
         "(attention core and MoE intermediates); docs/training.md, 'Recomputation'")
      ->check(CLI::Validator(
          [](std::string& text) {
            return mlir::dg::parseRecomputePolicy(text)
                       ? std::string()
                       : std::string("expected ") + mlir::dg::kRecomputePolicyExpected + ", got " +
                             dgemma::quoteForMessage(text, 40);
          },
          "POLICY"));
  app.add_option(
         "--backward-order", options.backwardOrder,
         "scheduled (default: dg-backward-schedule, docs/performance.md) | autodiff (the order autodiff wrote); "
         "the same values either way")
      ->check(CLI::IsMember({"scheduled", "autodiff"}));
  app.add_option("--precision", options.precision,
                 "fp32 | bf16 (mixed: bf16 compute, f32 masters, docs/training.md, 'Mixed precision')")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--lora", options.lora,
                 "RANK[:ALPHA]: freeze the model and train low-rank adapters on --lora-targets, scaled by ALPHA/RANK "
                 "(ALPHA defaults to RANK; docs/training.md, 'LoRA adapters')");
  app.add_option("--lora-targets", options.loraTargets,
                 "comma-separated groups attention, mlp, experts, router or projection names (q_proj, ..., "
                 "experts.down_proj); default attention,mlp");
  app.add_option("--lora-dropout", options.loraDropout, "dropout probability on the adapters' input while training")
      ->check(dgemma::numberIn(0, 1, true, false));
  app.add_option("--backend", options.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--emit", options.emit, "print a stage to stdout: dg | autodiff | sharded | recompute | plan-json")
      ->check(CLI::IsMember({"dg", "autodiff", "sharded", "recompute", "plan-json"}));
  app.add_flag("--report", options.report,
               "print per-entry FLOPs; per rank the peak memory by pool, FLOPs, recompute and communication per step; "
               "the time per compiler pass");
  app.add_option("-o,--output", options.output, "plan directory to write");
  app.add_flag("--auto-layout", options.autoLayout,
               "search the TP/SP/EP/DP layout and recompute policy of --gpus ranks by the cost model, print the ranked "
               "table and compile the chosen one (without -o: the table only)");
  app.add_option("--gpus", options.gpus, "--auto-layout: the number of ranks")
      ->check(dgemma::integerIn(1, dgemma::kMaxParallel));
  app.add_option("--gpu-memory", options.gpuMemory,
                 "--auto-layout: memory per rank, e.g. 141GiB (default: the --gpu's)");
  app.add_option("--gpu", options.gpu,
                 "--auto-layout: the accelerator of the cost model: " + dgemma::acceleratorNames() + " (default h200)");

  int exitCode = 0;
  if (!dgemma::parseCommandLine(app, argc, argv, exitCode)) return exitCode;
  return dgemma::runReportingErrors("dgemma-compile", [&] {
    dgemma::checkOutputAgainstModel(options);
    // Before the preset fills its flags: only what the command line gives is judged against the objective.
    for (const std::vector<std::string>* flags : {&dgemma::sftObjectiveFlags(), &dgemma::pretrainingObjectiveFlags()})
      for (const std::string& name : *flags)
        if (app.get_option(name)->count() > 0) options.explicitObjectiveFlags.push_back(name);
    if (!options.preset.empty()) applyPreset(app, options.preset);
    for (const char* name : {"--tp", "--dp", "--ep", "--sp", "--cp", "--recompute"})
      if (app.get_option(name)->count() > 0) options.explicitLayoutFlags.push_back(name);
    dgemma::compile(options);
    return 0;
  });
}
