// JSON schemas (a subset) and "any JSON object" as byte automata, for response_format json_schema
// and json_object (docs/serving.md, "Structured output").
//
// The output is compact JSON: no whitespace anywhere between tokens. Strings hold printable ASCII
// other than `"` and `\`, the escapes \" \\ \/ \n \t, and well-formed UTF-8 multi-byte characters
// (no other escapes, no control characters). Numbers are JSON numbers with at most 18 digits before
// and after the decimal point and at most 2 exponent digits, so that integers fit a signed 64-bit
// integer and every number a finite double.
//
// The schema subset:
//   - `type`: "object", "string", "integer", "number", "boolean", "null", "array", or a list of these
//     (any one of them);
//   - object: `properties` (each a schema) and `required` (names among them). The properties come
//     out in the schema's order when it is given as nlohmann::ordered_json (parse the request with
//     ordered_json to keep it), in sorted order from nlohmann::json; an optional property may be left out; no other property appears
//     (`additionalProperties` is accepted and read as false). Without `properties`, any object
//     (nesting depth at most kAnyValueDepth);
//   - string: `minLength` and `maxLength` (in characters, at most 256), `enum`;
//   - array: `items` (a schema; without it any value), `minItems` and `maxItems` (at most 256);
//   - `enum` (a list of JSON values), `const` (a JSON value), `anyOf` (a list of schemas);
//   - a schema with no `type`, `enum`, `const` or `anyOf` is any JSON value (nesting depth at most
//     kAnyValueDepth);
//   - schemas nest at most 32 deep;
//   - the annotations `title`, `description`, `$schema`, `$id`, `default`, `examples` are ignored.
// Anything else (`pattern`, `format`, `$ref`, `minimum`, `oneOf`, ...) throws InputError naming the
// keyword's JSON path: "WHERE.properties.age: unsupported keyword \"minimum\"".
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/serve/constrain/ByteAutomaton.h"

namespace dgemma::serve {

// How deep objects and arrays nest in "any JSON value" (so that the language stays regular).
inline constexpr int kAnyValueDepth = 5;

// `where` is the JSON path of `schema` in the request ("response_format.json_schema.schema").
std::shared_ptr<const ByteAutomaton> compileJsonSchema(const nlohmann::json& schema, const std::string& where);
std::shared_ptr<const ByteAutomaton> compileJsonSchema(const nlohmann::ordered_json& schema, const std::string& where);
// Any JSON object, nested at most kAnyValueDepth deep.
std::shared_ptr<const ByteAutomaton> compileJsonObject(const std::string& where);

// The expressions themselves, for composing them into larger languages.
ByteExpr jsonSchemaExpr(const nlohmann::json& schema, const std::string& where);
ByteExpr jsonSchemaExpr(const nlohmann::ordered_json& schema, const std::string& where);
ByteExpr jsonValueExpr(int depth);  // any JSON value nested at most `depth` deep (0: scalars only)
ByteExpr jsonStringExpr();

}  // namespace dgemma::serve
