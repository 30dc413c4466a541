// One run saves into a --save-dir at a time (docs/training.md, "Checkpoints": one run per save directory).
//  - A lock: rank 0 holds an exclusive advisory lock (flock) on SAVE_DIR/dgemma-run.lock for the
//    run's life. The kernel releases it when the process ends however it ends, so a crash never
//    leaves a stale lock; a second live run is refused at once, naming the holder the lock file
//    describes (pid, host, start time, run).
//  - An identity: SAVE_DIR/dgemma-run.json records which run the checkpoints belong to. A fresh run
//    (no --resume or --resume-from) into a directory that holds checkpoints (step-* or an
//    interrupted save's .tmp-*) of another run is refused, unless --overwrite deletes them first.
//    A group that torchrun restarted has the identity of the group before it, so it takes the
//    directory over (and resumes from it: dgemma-run's --elastic-resume).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dgemma {

struct SaveDirectoryRequest {
  std::string saveDir;
  std::string runIdentity;  // this run, as recorded in the directory (see newRunIdentity)
  bool resuming = false;    // --resume or --resume-from: continues the checkpoints there
  bool overwrite = false;   // --overwrite: a fresh run deletes the checkpoints there first
};

class SaveDirectoryClaim {
 public:
  // Creates the directory if needed and claims it. InputError (exit 2) naming --save-dir for a
  // directory another live run holds, or one with another run's checkpoints; RuntimeError when the
  // directory cannot be created or locked.
  explicit SaveDirectoryClaim(const SaveDirectoryRequest& request);
  ~SaveDirectoryClaim();  // releases the lock
  SaveDirectoryClaim(const SaveDirectoryClaim&) = delete;
  SaveDirectoryClaim& operator=(const SaveDirectoryClaim&) = delete;

 private:
  int lock_ = -1;
};

// The entries of `saveDir` that belong to a run (sorted names): committed saves (step-*) and
// interrupted ones (.tmp-*). What a fresh run refuses and --overwrite deletes; none for a missing
// directory.
std::vector<std::string> checkpointEntries(const std::string& saveDir);

// A fresh identity: "run <16 hex digits>" from the system's random source.
std::string newRunIdentity();

// The identity SAVE_DIR/dgemma-run.json records; nothing when there is none (or it is unreadable).
std::optional<std::string> recordedRunIdentity(const std::string& saveDir);

}  // namespace dgemma
