// Error classes carry the exit code the CLI contract assigns (docs/cli.md):
// 2 for bad usage or bad input (a plan, a checkpoint, a batch file, a flag), 1 for a failure at run time.
#pragma once

#include <stdexcept>
#include <string>

namespace dgemma {

class Error : public std::runtime_error {
 public:
  Error(std::string message, int exitCode) : std::runtime_error(std::move(message)), exitCode_(exitCode) {}
  int exitCode() const { return exitCode_; }

 private:
  int exitCode_;
};

// Bad input: the message names the file and the field ("plan.dgp: buffers[3].offset: ...").
class InputError : public Error {
 public:
  explicit InputError(std::string message) : Error(std::move(message), 2) {}
};

// A failure while running a valid input (I/O error, out-of-range token id at run time, ...).
class RuntimeError : public Error {
 public:
  explicit RuntimeError(std::string message) : Error(std::move(message), 1) {}
};

}  // namespace dgemma
