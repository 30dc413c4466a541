// A collective that failed because a peer went away or fell silent (Gloo's I/O errors and
// timeouts): the consequence of another rank's failure more often than a failure of its own. The
// rank reports it like any RuntimeError (exit 1); dgemma-run lets a launcher see the peer's exit
// first (docs/cli.md, "Several ranks").
#pragma once

#include <string>

#include "support/Error.h"

namespace dgemma {

class PeerLostError : public RuntimeError {
 public:
  explicit PeerLostError(std::string message) : RuntimeError(std::move(message)) {}
};

}  // namespace dgemma
