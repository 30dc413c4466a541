// torchrun's failure report: when a worker fails, torchrun reads the JSON file its agent named in
// the worker's TORCHELASTIC_ERROR_FILE and prints its message in the "Root Cause" section of its
// summary (without one it prints "To enable traceback see: ..."). dgemma-run writes it for every
// error it reports (docs/cli.md, "Several ranks").
#pragma once

#include <string>

namespace dgemma {

// The file's text: {"message": {"message": MESSAGE, "extraInfo": {"py_callstack": MESSAGE,
// "timestamp": "<unix seconds>"}}}, the form torch.distributed.elastic writes for a Python worker
// (torchrun shows py_callstack as the failure's traceback).
std::string elasticErrorJson(const std::string& message, long long unixSeconds);

// Writes the file atomically (support/AtomicFile.h), so torchrun never reads half a report. Best effort: the error that is being reported matters more than the report,
// so a failure to write is returned as false, not thrown.
bool writeElasticErrorFile(const std::string& path, const std::string& message);

// With TORCHELASTIC_ERROR_FILE set, writes `message` there; otherwise does nothing.
void reportToElasticAgent(const std::string& message);

}  // namespace dgemma
