#include "models/diffusion_gemma/spec/Presets.h"

#include "support/Error.h"

namespace dgemma {

namespace {

// The objective and optimizer every recipe shares (Megatron Bridge's, docs/training.md, "The 26B recipe").
nlohmann::json recipeCompileFlags() {
  return {{"objective", "base-sft"},  {"self-cond-prob", 0.5}, {"encoder-loss-weight", 1.0},
          {"decoder-loss-weight", 1.0}, {"aux-loss-coeff", 0.0}, {"noise-min", 1e-3},
          {"noise-max", 0.999},       {"adam-beta1", 0.9},     {"adam-beta2", 0.999},
          {"adam-eps", 1e-8},         {"weight-decay", 0.0},   {"clip-grad", 1.0}};
}

nlohmann::json with(nlohmann::json base, const nlohmann::json& overrides) {
  base.update(overrides);
  return base;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"dg26b-sft",
       "Megatron Bridge's 26B recipe (docs/training.md, 'The 26B recipe'): bf16 mixed precision, micro-batch 1, global batch 8, "
       "lr 5e-5 -> 5e-6 cosine, warmup 20, 1000 steps",
       with(recipeCompileFlags(), {{"micro-batch", 1}, {"prompt-len", "512,1024,2048,4096,8192"}, {"precision", "bf16"}}),
       {{"lr", 5e-5},
        {"min-lr", 5e-6},
        {"warmup", 20},
        {"decay-steps", 1000},
        {"steps", 1000},
        {"accumulation", 8},
        {"eval-every", 100},
        {"eval-batches", 16},
        {"save-every", 100}}},
      {"tiny-cpu",
       "the tiny test config of docs/model.md, 'Tiny configs', on CPU: micro-batch 2, short prompts, lr 1e-3",
       with(recipeCompileFlags(), {{"micro-batch", 2}, {"prompt-len", "16,32,64"}}),
       {{"lr", 1e-3},
        {"min-lr", 1e-4},
        {"warmup", 5},
        {"decay-steps", 50},
        {"steps", 50},
        {"accumulation", 1},
        {"eval-every", 10},
        {"eval-batches", 4},
        {"save-every", 25}}},
      // Without the encoder loss a step costs about half as much. The additions alone need 8000
      // steps; with the picture rows (about 44% of the micro-batches) the captions are read only after
      // about 10000 steps at a still high rate, so the cosine runs over 24000 (docs/training.md, "The demo").
      {"demo",
       "the bundled demo task (additions and picture captions) from scratch on CPU in minutes: micro-batch 16, "
       "no encoder loss, lr 3e-3 -> 3e-4, 24000 steps",
       with(recipeCompileFlags(), {{"micro-batch", 16}, {"prompt-len", "32,48,64"}, {"encoder-loss-weight", 0.0}}),
       {{"lr", 3e-3},
        {"min-lr", 3e-4},
        {"warmup", 20},
        {"decay-steps", 24000},
        {"steps", 24000},
        {"accumulation", 1},
        {"eval-every", 500},
        {"eval-batches", 8},
        {"save-every", 500}}},
  };
  return all;
}

const Preset& findPreset(const std::string& name) {
  std::string known;
  for (const Preset& preset : presets()) {
    if (preset.name == name) return preset;
    known += (known.empty() ? "" : ", ") + preset.name;
  }
  throw InputError("--preset: unknown preset \"" + name + "\" (known: " + known + ")");
}

}  // namespace dgemma
