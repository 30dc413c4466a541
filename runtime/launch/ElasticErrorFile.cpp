#include "runtime/launch/ElasticErrorFile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "support/AtomicFile.h"
#include "support/Error.h"

namespace dgemma {

std::string elasticErrorJson(const std::string& message, long long unixSeconds) {
  nlohmann::json report;
  report["message"]["message"] = message;
  report["message"]["extraInfo"]["py_callstack"] = message;
  report["message"]["extraInfo"]["timestamp"] = std::to_string(unixSeconds);
  // A message is not always valid UTF-8 (a path from the command line): replace what is not.
  return report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

bool writeElasticErrorFile(const std::string& path, const std::string& message) {
  const long long now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  try {
    writeFileAtomically(path, elasticErrorJson(message, now));
    return true;
  } catch (const Error&) {
    return false;
  }
}

void reportToElasticAgent(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  if (!writeElasticErrorFile(path, message))
    std::fprintf(stderr, "dgemma-run: could not write torchrun's error file %s\n", path);
}

}  // namespace dgemma
