// libFuzzer target: the structured-output parsers (runtime/serve/constrain): a regular expression
// (Regex.h) or a JSON schema (JsonSchema.h), compiled to an automaton that then reads the input.
// The first byte picks the parser: even a regex, odd a schema; the rest is the pattern or schema.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz/FuzzSupport.h"
#include "runtime/serve/constrain/JsonSchema.h"
#include "runtime/serve/constrain/Regex.h"

namespace {

// The parsers under test.
void compileConstraint(std::string_view bytes) {
  if (bytes.empty()) return;
  const std::string text(bytes.substr(1));
  std::shared_ptr<const dgemma::serve::ByteAutomaton> automaton;
  if (bytes[0] % 2 == 0) {
    automaton = dgemma::serve::compileRegex(text, "regex");
  } else {
    // Not JSON at all is the request parser's business, not the schema compiler's.
    const nlohmann::json schema = nlohmann::json::parse(text, nullptr, false);
    if (schema.is_discarded()) return;
    automaton = dgemma::serve::compileJsonSchema(schema, "schema");
  }
  (void)automaton->matches(text.substr(0, 64));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), compileConstraint);
  return 0;
}
