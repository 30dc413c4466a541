// libFuzzer target: dgemma-serve's request parser (runtime/serve/api/Request.h): one input is an HTTP
// request body for POST /v1/chat/completions (first byte even) or /v1/completions (odd). Its verdict
// is a request or an ApiError (the 4xx the server answers); anything else aborts.
#include <cstdint>

#include "fuzz/FuzzSupport.h"
#include "runtime/serve/api/ApiError.h"
#include "runtime/serve/api/Request.h"
#include "support/Error.h"

namespace {

// The parser under test. An ApiError is the parser's clean refusal; it becomes the InputError that
// expectCleanVerdict accepts.
void parseRequest(std::string_view bytes) {
  if (bytes.empty()) return;
  const dgemma::serve::Endpoint endpoint =
      bytes[0] % 2 == 0 ? dgemma::serve::Endpoint::ChatCompletions : dgemma::serve::Endpoint::Completions;
  try {
    (void)dgemma::serve::parseCompletionRequest(bytes.substr(1), endpoint, dgemma::serve::MediaPolicy{});
  } catch (const dgemma::serve::ApiError& error) {
    if (error.status < 400 || error.status >= 500) throw;
    throw dgemma::InputError(error.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), parseRequest);
  return 0;
}
