// The checkpoints in a save directory (docs/training.md, "Checkpoints"): what the step directories
// are called, which of them are complete, and the newest. A complete checkpoint is a
// SAVE_DIR/step-<digits> directory whose manifest.json is present, passes parseCheckpointManifest and
// names the same step; .tmp-* directories (saves in progress or interrupted, CheckpointWriter.h) and
// other entries are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/train/CheckpointManifest.h"

namespace dgemma {

// A complete checkpoint found in a save directory.
struct CheckpointEntry {
  int64_t step = 0;
  std::string directory;
};

// step-<8-digit step>: the name of the directory a save of `step` commits to.
std::string checkpointDirectoryName(int64_t step);
// SAVE_DIR/step-<8-digit step>.
std::string checkpointStepDirectory(const std::string& saveDir, int64_t step);
// The step of a "step-<digits>" directory name; nothing for any other name.
std::optional<int64_t> stepOfCheckpointDirectoryName(const std::string& name);

// The manifest at `path`, read (a regular file of a bounded size: a device or a FIFO would never
// end) and parsed by parseCheckpointManifest. Throws InputError naming the file and the fault.
CheckpointManifest readCheckpointManifest(const std::string& path);

// The complete checkpoints in `saveDir`, oldest first (what CheckpointSaveOptions::keep counts and
// deletes). A missing saveDir has none; one that cannot be listed throws RuntimeError.
std::vector<CheckpointEntry> listCheckpoints(const std::string& saveDir);
// The step-<digits> directory of the highest step, complete or not: what --resume loads, so that
// a damaged newest checkpoint is reported rather than skipped for an older one. Nothing when
// there is no such directory.
std::optional<CheckpointEntry> newestCheckpoint(const std::string& saveDir);
std::optional<std::string> newestCheckpointDirectory(const std::string& saveDir);  // newestCheckpoint()'s directory

}  // namespace dgemma
