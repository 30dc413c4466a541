// The image twins of the DiffusionGemma entries (Builder.h, Inference.h): which entries
// --images-per-example adds, their buckets and inputs, and the configs that cannot have them.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/ir/Inference.h"
#include "support/Error.h"

namespace mlir::dg {
namespace {

const std::string kVisionConfig = DGEMMA_SOURCE_DIR "/test/fixtures/diffusion_gemma_vision/one_image/config.json";
const std::string kTextConfig = DGEMMA_SOURCE_DIR "/models/diffusion_gemma/configs/tiny-cpu.json";

// Per function symbol: its entry name and bucket.
std::map<std::string, std::pair<std::string, std::map<std::string, int64_t>>> entriesOf(ModuleOp module) {
  std::map<std::string, std::pair<std::string, std::map<std::string, int64_t>>> entries;
  module.walk([&](func::FuncOp function) {
    std::map<std::string, int64_t> bucket;
    for (NamedAttribute dimension : function->getAttrOfType<DictionaryAttr>(kBucketAttr))
      bucket[dimension.getName().str()] = cast<IntegerAttr>(dimension.getValue()).getInt();
    entries[function.getSymName().str()] = {function->getAttrOfType<StringAttr>(kEntryAttr).str(), bucket};
  });
  return entries;
}

std::set<std::string> inputsOf(ModuleOp module, const std::string& symbol) {
  std::set<std::string> names;
  module.lookupSymbol<func::FuncOp>(symbol).walk([&](InputOp input) { names.insert(input.getName().str()); });
  return names;
}

TEST(ImageTwins, ForwardTrainAndPrefillGetTwinsPerPromptBucket) {
  MLIRContext context;
  const dgemma::DiffusionGemmaConfig config = dgemma::loadDiffusionGemmaConfig(kVisionConfig);
  DiffusionGemmaInferenceOptions inference;
  inference.microBatch = 2;
  inference.promptLengths = {72, 80};
  inference.cacheLength = 80;
  inference.imagesPerExample = 2;
  OwningOpRef<ModuleOp> infer = buildDiffusionGemmaInference(context, config, inference);
  ASSERT_TRUE(succeeded(verify(*infer)));
  auto entries = entriesOf(*infer);
  for (const char* symbol : {"forward_p72", "forward_images_p72", "forward_images_p80", "prefill_images_p72",
                             "prefill_images_p80", "prefill_p80", "denoise", "commit"})
    EXPECT_TRUE(entries.count(symbol)) << symbol;
  EXPECT_EQ(entries.at("forward_images_p80").first, "forward_images");
  EXPECT_EQ(entries.at("prefill_images_p72").first, "prefill_images");
  // T = 70, k = 2: N_p = 280.
  EXPECT_EQ(entries.at("forward_images_p80").second,
            (std::map<std::string, int64_t>{{"micro_batch", 2}, {"prompt_len", 80}, {"canvas_len", 16},
                                            {"images_per_example", 2}, {"image_patches", 280}}));
  EXPECT_EQ(entries.at("prefill_images_p72").second,
            (std::map<std::string, int64_t>{{"micro_batch", 2}, {"prompt_len", 72}, {"images_per_example", 2},
                                            {"image_patches", 280}}));
  const std::set<std::string> prefillInputs = inputsOf(*infer, "prefill_images_p72");
  EXPECT_EQ(prefillInputs,
            (std::set<std::string>{"input_ids", "attention_mask", "positions", "pixel_values", "image_position_ids",
                                   "image_pool_slot", "image_token_index", "image_segment_ids", "write_rows"}));
  // The text entries read no image input and no vision parameter.
  bool textReadsVision = false;
  infer->lookupSymbol<func::FuncOp>("forward_p72").walk([&](ParamOp param) {
    textReadsVision |= param.getName().contains("vision");
  });
  EXPECT_FALSE(textReadsVision);

  DiffusionGemmaTrainOptions train;
  train.microBatch = 2;
  train.promptLengths = {72};
  train.imagesPerExample = 1;
  OwningOpRef<ModuleOp> trainModule = buildDiffusionGemmaTrain(context, config, train);
  ASSERT_TRUE(succeeded(verify(*trainModule)));
  entries = entriesOf(*trainModule);
  EXPECT_EQ(entries.size(), 3u);  // corrupt, train_step_p72, train_step_images_p72
  EXPECT_EQ(entries.at("train_step_images_p72").second.at("images_per_example"), 1);
  EXPECT_TRUE(inputsOf(*trainModule, "train_step_images_p72").count("image_segment_ids"));
}

TEST(ImageTwins, NoImagesPerExampleBuildsNoTwin) {
  MLIRContext context;
  const dgemma::DiffusionGemmaConfig config = dgemma::loadDiffusionGemmaConfig(kVisionConfig);
  DiffusionGemmaForwardOptions options;
  options.promptLengths = {8};
  OwningOpRef<ModuleOp> module = buildDiffusionGemmaForward(context, config, options);
  EXPECT_EQ(entriesOf(*module).size(), 1u);
}

TEST(ImageTwins, ConfigsThatCannotReadImagesAreInputErrors) {
  MLIRContext context;
  DiffusionGemmaForwardOptions options;
  options.promptLengths = {8};
  options.imagesPerExample = 1;
  const dgemma::DiffusionGemmaConfig text = dgemma::loadDiffusionGemmaConfig(kTextConfig);
  try {
    buildDiffusionGemmaForward(context, text, options);
    ADD_FAILURE() << "no error";
  } catch (const dgemma::InputError& error) {
    EXPECT_STREQ(error.what(), "images per example 1: the model config has no vision_config, so it cannot read images");
  }
  DiffusionGemmaTrainOptions train;
  train.promptLengths = {8};
  train.imagesPerExample = -1;
  try {
    buildDiffusionGemmaTrain(context, text, train);
    ADD_FAILURE() << "no error";
  } catch (const dgemma::InputError& error) {
    EXPECT_STREQ(error.what(), "images per example: expected an integer >= 0, got -1");
  }
}

}  // namespace
}  // namespace mlir::dg
