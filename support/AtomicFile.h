// Whole-file reads and crash-safe writes. A reader never sees a half-written file: writes go to a
// temporary file in the same directory, are fsync'd, renamed over the target, and the directory is
// fsync'd so the rename itself survives a crash.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dgemma {

// Throws InputError "PATH: cannot read: <reason>".
std::string readWholeFile(const std::string& path);
// Throws RuntimeError "PATH: cannot write: <reason>"; on failure the target is untouched and the
// temporary file removed.
void writeFileAtomically(const std::string& path, std::string_view bytes);
// The same for `pieces` written back to back, without first concatenating them (a checkpoint shard
// can be as large as memory).
void writePiecesAtomically(const std::string& path, const std::vector<std::string_view>& pieces);
// fsync a directory (after renames into it). Throws RuntimeError.
void syncDirectory(const std::string& directory);

}  // namespace dgemma
