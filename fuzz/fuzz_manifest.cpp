// libFuzzer target: a training checkpoint's manifest.json (runtime/train/CheckpointReader.h;
// docs/training.md, "Checkpoints"). Once per process a small real checkpoint is saved in the scratch
// directory (two groups, a bf16 and an f32 tensor); each input replaces its manifest, and the
// checkpoint is listed, loaded against the saved model identity, and every tensor it lists is read.
// The seed corpus holds that checkpoint's own manifest, so mutations start from one that loads.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz/FuzzSupport.h"
#include "runtime/train/CheckpointListing.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/CheckpointWriter.h"

namespace {

struct SavedCheckpoint {
  std::string saveDir, directory;
  nlohmann::json model;
};

const SavedCheckpoint& savedCheckpoint() {
  static const SavedCheckpoint saved = [] {
    SavedCheckpoint result;
    result.saveDir = dgemma::fuzz::scratchDirectory() + "/save";
    result.model = {{"model_type", "fuzz"}, {"hidden_size", 4}};
    dgemma::HostTensor weight(dgemma::DType::BF16, {2, 3});
    dgemma::HostTensor moment(dgemma::DType::F32, {3});
    dgemma::CheckpointState state;
    state.model = result.model;
    state.step = 2;
    state.consumedSamples = 8;
    state.dataOrderState = {{"epoch", 0}, {"position", 8}};
    state.rng = {{"seed", 1}};
    state.config = {{"global_batch", 4}};
    result.directory = dgemma::CheckpointWriter::save(result.saveDir, state,
                                                      {{"model", "w", &weight}, {"optimizer", "w.exp_avg", &moment}})
                           .directory;
    return result;
  }();
  return saved;
}

// The parser under test.
void loadCheckpointManifest(std::string_view bytes) {
  const SavedCheckpoint& saved = savedCheckpoint();
  dgemma::fuzz::writeScratchFile("save/" + saved.directory.substr(saved.saveDir.size() + 1) + "/manifest.json", bytes);
  (void)dgemma::listCheckpoints(saved.saveDir);
  dgemma::CheckpointReader checkpoint = dgemma::CheckpointReader::load(saved.directory, saved.model);
  for (const std::string& group : checkpoint.groups()) {
    for (const std::string& name : checkpoint.names(group)) {
      (void)checkpoint.read(group, name);  // may still refuse, e.g. boxes that leave a gap: InputError
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const SavedCheckpoint& saved = savedCheckpoint();
  // DGEMMA_FUZZ_PRINT_SEED: print the saved manifest, which fuzz/corpus/manifest/ keeps as its seed.
  if (std::getenv("DGEMMA_FUZZ_PRINT_SEED")) {
    std::FILE* manifest = std::fopen((saved.directory + "/manifest.json").c_str(), "rb");
    for (int c; manifest && (c = std::fgetc(manifest)) != EOF;) std::fputc(c, stdout);
    if (manifest) std::fclose(manifest);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), loadCheckpointManifest);
  return 0;
}
