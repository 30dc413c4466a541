#include "runtime/rl/reward/Reward.h"

#include <locale.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string_view>

#include "runtime/serve/constrain/Regex.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {
namespace {

constexpr std::string_view kSpace = " \t\n\r\f\v";
constexpr double kRelativeTolerance = 1e-9;
constexpr double kAbsoluteTolerance = 1e-12;

std::string_view trimmed(std::string_view text) {
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isAsciiLetterOrDigit(char c) { return isDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool isSign(char c) { return c == '+' || c == '-'; }

// A number read at some position of a text: where it ends, and its value.
struct ScannedNumber {
  size_t end = 0;
  double value = 0;
};

// The value of "[+-]digits[.digits][e[+-]digits]": strtod in the C locale whatever the process's
// locale, so "." is always the decimal point; out of range it gives ±HUGE_VAL or a value near 0.
double parseDecimal(const std::string& number) {
  static const locale_t cLocale = ::newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(0));
  return ::strtod_l(number.c_str(), nullptr, cLocale);
}

// The number starting at text[start] (a digit, or a sign right before one): digits with commas
// between groups of three ("1,234,567"), a decimal part (a point followed by a digit, so the full
// stop in "is 5." is not one), an exponent ("e-3", digits required).
ScannedNumber scanNumber(std::string_view text, size_t start) {
  std::string number;
  size_t pos = start;
  if (isSign(text[pos])) number += text[pos++];
  const auto appendDigits = [&] {
    while (pos < text.size() && isDigit(text[pos])) number += text[pos++];
  };
  const size_t leadingStart = pos;
  appendDigits();
  // Thousands separators: after a leading group of one to three digits, each comma followed by
  // exactly three digits ("1,2,3" is a list of three numbers, not 123).
  if (pos - leadingStart <= 3) {
    while (pos + 3 < text.size() && text[pos] == ',' && isDigit(text[pos + 1]) && isDigit(text[pos + 2]) &&
           isDigit(text[pos + 3]) && (pos + 4 == text.size() || !isDigit(text[pos + 4]))) {
      number.append(text.substr(pos + 1, 3));
      pos += 4;
    }
  }
  if (pos + 1 < text.size() && text[pos] == '.' && isDigit(text[pos + 1])) {
    number += text[pos++];
    appendDigits();
  }
  if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
    size_t digits = pos + 1;
    if (digits < text.size() && isSign(text[digits])) ++digits;
    if (digits < text.size() && isDigit(text[digits])) {
      number.append(text.substr(pos, digits - pos));
      pos = digits;
      appendDigits();
    }
  }
  return {pos, parseDecimal(number)};
}

// Whether a number starts at text[pos]: a digit, or a sign before a digit that does not follow a
// letter or digit (so "2-3" reads as 2 and 3, and "x = -3" as -3).
bool numberStartsAt(std::string_view text, size_t pos) {
  if (isDigit(text[pos])) return true;
  return isSign(text[pos]) && pos + 1 < text.size() && isDigit(text[pos + 1]) &&
         (pos == 0 || !isAsciiLetterOrDigit(text[pos - 1]));
}

std::optional<double> lastNumber(std::string_view text) {
  std::optional<double> last;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!numberStartsAt(text, pos)) {
      ++pos;
      continue;
    }
    const ScannedNumber number = scanNumber(text, pos);
    last = number.value;
    pos = number.end;
  }
  return last;
}

bool numbersEqual(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  return std::abs(a - b) <= std::max(kRelativeTolerance * std::max(std::abs(a), std::abs(b)), kAbsoluteTolerance);
}

[[noreturn]] void badReference(const std::string& where, const std::string& expected, const nlohmann::json& reference) {
  throw InputError(where + ": reference: expected " + expected + ", got " + describeJsonValue(reference));
}

std::string exactReference(const nlohmann::json& reference, const std::string& where) {
  if (reference.is_string()) return std::string(trimmed(reference.get_ref<const std::string&>()));
  if (reference.is_number()) return reference.dump();
  badReference(where, "a string or a number", reference);
}

double numericReference(const nlohmann::json& reference, const std::string& where) {
  if (reference.is_number()) {
    const double value = reference.get<double>();
    if (!std::isfinite(value)) badReference(where, "a finite number", reference);
    return value;
  }
  if (reference.is_string()) {
    const std::string_view text = trimmed(reference.get_ref<const std::string&>());
    if (!text.empty() && numberStartsAt(text, 0)) {
      const ScannedNumber number = scanNumber(text, 0);
      if (number.end == text.size() && std::isfinite(number.value)) return number.value;
    }
  }
  badReference(where, "a number or a numeric string (\"-1,234.5e3\")", reference);
}

const std::string& regexPattern(const nlohmann::json& reference, const std::string& where) {
  if (!reference.is_string()) badReference(where, "a regular expression (a string)", reference);
  return reference.get_ref<const std::string&>();
}

std::shared_ptr<const serve::ByteAutomaton> regexReference(const nlohmann::json& reference, const std::string& where) {
  return serve::compileRegex(regexPattern(reference, where), where + ": reference");
}

class ExactReward : public RewardFunction {
 public:
  std::vector<double> score(const std::vector<RewardItem>& items) override {
    std::vector<double> rewards;
    rewards.reserve(items.size());
    for (const RewardItem& item : items)
      rewards.push_back(trimmed(item.completion) == exactReference(item.reference, item.where) ? 1.0 : 0.0);
    return rewards;
  }
  std::string name() const override { return "exact"; }
};

class NumericReward : public RewardFunction {
 public:
  std::vector<double> score(const std::vector<RewardItem>& items) override {
    std::vector<double> rewards;
    rewards.reserve(items.size());
    for (const RewardItem& item : items) {
      const double reference = numericReference(item.reference, item.where);
      const std::optional<double> answer = lastNumber(item.completion);
      rewards.push_back(answer && numbersEqual(*answer, reference) ? 1.0 : 0.0);
    }
    return rewards;
  }
  std::string name() const override { return "numeric"; }
};

// The patterns are dgemma's own regular expressions, those of structured output (docs/serving.md,
// "Structured output"), not std::regex: they match in time linear in the completion with no
// recursion, where libstdc++'s std::regex recurses once per character and overflows the stack on
// a completion of some ten thousand characters; and a pattern means the same here as in a
// `regex` response format.
class RegexReward : public RewardFunction {
 public:
  std::vector<double> score(const std::vector<RewardItem>& items) override {
    // The completions of one prompt share its pattern: each compiles once per call.
    std::map<std::string, std::shared_ptr<const serve::ByteAutomaton>> compiled;
    std::vector<double> rewards;
    rewards.reserve(items.size());
    for (const RewardItem& item : items) {
      std::shared_ptr<const serve::ByteAutomaton>& automaton = compiled[regexPattern(item.reference, item.where)];
      if (!automaton) automaton = regexReference(item.reference, item.where);
      rewards.push_back(automaton->matches(trimmed(item.completion)) ? 1.0 : 0.0);
    }
    return rewards;
  }
  std::string name() const override { return "regex"; }
};

[[noreturn]] void unknownReward(const std::string& name) {
  throw InputError("--reward: expected exact, numeric or regex, got " + quoteForMessage(name));
}

}  // namespace

std::unique_ptr<RewardFunction> makeBuiltinReward(const std::string& name) {
  if (name == "exact") return std::make_unique<ExactReward>();
  if (name == "numeric") return std::make_unique<NumericReward>();
  if (name == "regex") return std::make_unique<RegexReward>();
  unknownReward(name);
}

void checkReference(const std::string& rewardName, const nlohmann::json& reference, const std::string& where) {
  if (rewardName == "exact") exactReference(reference, where);
  else if (rewardName == "numeric") numericReference(reference, where);
  else if (rewardName == "regex") regexReference(reference, where);
  else if (rewardName != "command") unknownReward(rewardName);
}

}  // namespace dgemma
