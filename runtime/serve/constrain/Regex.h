// Regular expressions (a subset of ECMAScript / Python syntax) as byte automata, for constrained
// output with a pattern (docs/serving.md, "Structured output"). The pattern must match the whole
// output.
//
// The subset:
//   - literal characters (UTF-8 text is taken as is), and escaped punctuation (\. \* \\ \/ ...);
//   - \n \t \r \f \v \0, \xHH (HH < 80: an ASCII character);
//   - \d [0-9], \w [A-Za-z0-9_], \s [ \t\n\r\f\v] (ASCII only) and their negations \D \W \S;
//   - `.`: any one UTF-8 character except newline;
//   - classes [a-z0-9_] of ASCII characters, ranges and the escapes above; negated classes [^...]
//     match any UTF-8 character (multi-byte ones included) not listed;
//   - groups ( ) and (?: ) (neither captures anything here), nested at most 64 deep; alternation |;
//   - quantifiers * + ? {m} {m,} {m,n} with m, n at most 256; a lazy `?` after one is accepted and
//     changes nothing (the whole output must match either way);
//   - ^ at the very start and $ at the very end (they change nothing either).
// The output is always well-formed UTF-8: no construct matches a broken sequence. Anything else
// (backreferences, lookaround, \b, named groups, non-ASCII in a class, ^ or $ elsewhere) throws
// InputError "WHERE: at offset N: ...".
#pragma once

#include <memory>
#include <string>

#include "runtime/serve/constrain/ByteAutomaton.h"

namespace dgemma::serve {

inline constexpr int64_t kMaxRegexRepetition = 256;

// `where` names the pattern in the request ("response_format.regex").
ByteExpr regexExpr(const std::string& pattern, const std::string& where);
std::shared_ptr<const ByteAutomaton> compileRegex(const std::string& pattern, const std::string& where);

}  // namespace dgemma::serve
