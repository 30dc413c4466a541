// No output may destroy an input (docs/cli.md, "Outputs and inputs"): before any work, every output
// path of a command is compared with every input path of the run. Paths are compared as files, by
// device and inode after following symlinks, so a symlink or a hard link to an input is that input;
// an output that does not exist yet is placed by its nearest existing parent directory.
#pragma once

#include <string>
#include <vector>

namespace dgemma {

struct NamedPath {
  std::string flag;  // "--metrics", "--train", ... as the message names it
  std::string path;  // empty: the flag was not given (skipped)
};

// InputError (exit 2) naming both flags and paths when
//  - an output is the same file or directory as an input or as another output, or
//  - an output is, or lies inside, an input directory in `inputDirectories` (the plan directory,
//    the weights directory, ...: a file written there would change what the run reads), or is a
//    hard link to a file directly inside one.
// Whether `inner` is the file or directory `outer`, or lies below it (by device and inode, through
// symlinks); false when `outer` does not exist.
bool liesWithin(const std::string& inner, const std::string& outer);

void checkOutputsAgainstInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                               const std::vector<NamedPath>& inputDirectories = {});

}  // namespace dgemma
