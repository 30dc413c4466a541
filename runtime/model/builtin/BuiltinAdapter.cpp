#include "runtime/model/builtin/BuiltinAdapter.h"

#include "runtime/exec/WeightLoader.h"
#include "support/Error.h"

namespace dgemma {

namespace {

class BuiltinAdapter final : public ModelAdapter {
 public:
  BuiltinAdapter() {
    // The entry names models/builtin/RmsNormMatmulSoftmax.cpp gives its functions.
    contract_.forwardEntry = "forward";
    contract_.trainStepEntry = "train_step";
    contract_.loss = "loss";
  }

  const ModelContract& contract() const override { return contract_; }

  void loadWeights(Executor& executor, const std::string& weightsPath, const std::string&) const override {
    dgemma::loadWeights(executor, weightsPath);
  }

  ModelTokens tokens(const Plan&, const std::string& planPath) const override {
    throw InputError(planPath + ": the built-in graph has no tokenizer config");
  }
  Gemma4ImageOptions imageOptions(const Plan&, const std::string& planPath) const override {
    throw InputError(planPath + ": the built-in graph reads no images");
  }
  void addEntryDefaults(std::map<std::string, HostTensor>&, const EntryPoint&, const Plan&) const override {}
  void checkBatch(const std::map<std::string, HostTensor>&, const Plan&, const std::string&) const override {}
  std::vector<std::pair<std::string, std::string>> checkpointSideFiles(const Plan&, const std::string&) const override {
    return {};
  }
  std::optional<std::string> secondCopyName(const std::string&) const override { return std::nullopt; }
  bool isAdapterParameter(const std::string&) const override { return false; }
  std::vector<std::pair<std::string, std::string>> adapterFiles(const Plan&, const std::map<std::string, HostTensor>&,
                                                                const std::string&) const override {
    throw InputError("the builtin model has no LoRA adapters");
  }
  std::map<std::string, HostTensor> readAdapter(const Plan&, const std::string& directory) const override {
    throw InputError("--adapter: " + directory + ": the builtin model has no LoRA adapters");
  }
  AdapterSettings adapterSettings(const std::string& directory) const override {
    throw InputError("--adapter: " + directory + ": the builtin model has no LoRA adapters");
  }

 private:
  ModelContract contract_;
};

}  // namespace

const ModelAdapter& builtinAdapter() {
  static const BuiltinAdapter adapter;
  return adapter;
}

}  // namespace dgemma
