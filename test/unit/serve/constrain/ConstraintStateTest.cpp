// The guarantee of ConstraintState: whatever the sampler proposes, the committed text is a whole
// member of the language, within the budget; and filterAccepted keeps exactly the candidates an
// independent search finds completable (greedy, in order). Property tests over many seeds on a byte
// vocabulary and on the bundled tokenizer, with canvases of 4 and 16 positions and several budgets.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <regex>
#include <tuple>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/serve/constrain/ConstraintState.h"
#include "runtime/serve/constrain/JsonSchema.h"
#include "runtime/serve/constrain/Regex.h"
#include "support/Error.h"
#include "test/unit/serve/constrain/SchemaValidator.h"

namespace dgemma::serve {
namespace {

using nlohmann::json;

// Ids 0-255 are the bytes; then EOS, pad and one forbidden special token.
constexpr int32_t kByteEos = 256, kBytePad = 257, kByteSpecial = 258;

TokenVocabulary byteVocabulary() {
  TokenVocabulary vocabulary;
  for (int b = 0; b < 256; ++b) vocabulary.tokenBytes.emplace_back(1, static_cast<char>(b));
  vocabulary.tokenBytes.insert(vocabulary.tokenBytes.end(), {"<eos>", "<pad>", "<special>"});
  vocabulary.eosIds = {kByteEos};
  vocabulary.padId = kBytePad;
  vocabulary.forbiddenIds = {kByteSpecial};
  return vocabulary;
}

const Tokenizer& bundledTokenizer() {
  static const Tokenizer tokenizer(DGEMMA_TOKENIZER_DIR);
  return tokenizer;
}

TokenVocabulary tokenizerVocabulary() {
  const Tokenizer& tokenizer = bundledTokenizer();
  TokenVocabulary vocabulary;
  vocabulary.tokenBytes = tokenizer.tokenBytes();
  for (int32_t id = 0; id < tokenizer.vocabSize(); ++id)
    if (tokenizer.isSpecial(id)) vocabulary.forbiddenIds.push_back(id);
  vocabulary.eosIds = {tokenizer.eosId()};
  vocabulary.padId = tokenizer.padId();
  return vocabulary;
}

// What the committed text must satisfy.
struct Language {
  std::string name;
  std::shared_ptr<const ByteAutomaton> automaton;
  std::function<bool(const std::string&)> accepts;
};

Language schemaLanguage(const std::string& name, const std::string& schemaText) {
  const json schema = json::parse(schemaText);
  return {name, compileJsonSchema(schema, name), [schema](const std::string& text) {
            const json value = json::parse(text, nullptr, false);
            return !value.is_discarded() && test::validates(value, schema);
          }};
}

Language regexLanguage(const std::string& pattern) {
  const std::regex oracle(pattern, std::regex::ECMAScript);
  return {pattern, compileRegex(pattern, pattern),
          [oracle](const std::string& text) { return std::regex_match(text, oracle); }};
}

std::vector<Language> languages() {
  return {
      schemaLanguage("person", R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
          "tags": {"type": "array", "items": {"enum": ["ab", "c"]}, "maxItems": 3}, "ok": {"type": "boolean"}},
          "required": ["name"]})"),
      schemaLanguage("nested", R"({"type": "object", "properties": {"p": {"type": "object", "properties": {
          "q": {"type": "array", "items": {"type": "number"}}, "r": {"type": ["string", "null"]}},
          "required": ["q"]}}, "required": ["p"]})"),
      schemaLanguage("choice", R"({"anyOf": [{"type": "number"}, {"type": "array", "items": {"type": "null"},
          "minItems": 1}]})"),
      {"json_object", compileJsonObject("json_object"),
       [](const std::string& text) {
         const json value = json::parse(text, nullptr, false);
         return !value.is_discarded() && value.is_object();
       }},
      regexLanguage("\\d{3}-[a-z]+"),
      regexLanguage("(ab|cd)*e"),
      regexLanguage("[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5})*"),
  };
}

// Whether positions [l, length) of the canvas can be filled validly, found by trying each allowed
// token in turn (memoized): an oracle independent of filterAccepted's reachable sets.
class CompletionSearch {
 public:
  CompletionSearch(const TokenConstraint& c, int64_t committed, int64_t budget, const std::vector<int64_t>& fixed)
      : c_(c), committed_(committed), budget_(budget), fixed_(fixed) {}

  bool completable(size_t l, int32_t state, bool ended) {
    if (l == fixed_.size()) {
      const int64_t left = budget_ - committed_ - static_cast<int64_t>(fixed_.size());
      return ended || c_.distanceToAccept(state) <= std::max<int64_t>(left, 0);
    }
    const auto key = std::make_tuple(l, state, ended);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const int64_t token = fixed_[l];
    bool result = false;
    if (ended) {
      result = (token < 0 || c_.isEos(token) || c_.isPad(token)) && completable(l + 1, state, true);
    } else {
      if (c_.isAccepting(state) && (token < 0 || c_.isEos(token))) result = completable(l + 1, state, true);
      if (!result && committed_ + static_cast<int64_t>(l) < budget_) {
        if (token >= 0) {
          const int32_t next = c_.step(state, token);
          result = next != ByteAutomaton::kDeadState && completable(l + 1, next, false);
        } else {
          for (int32_t id : *c_.allowedTokens(state))
            if (completable(l + 1, c_.step(state, id), false)) {
              result = true;
              break;
            }
        }
      }
    }
    memo_[key] = result;
    return result;
  }

 private:
  const TokenConstraint& c_;
  int64_t committed_, budget_;
  const std::vector<int64_t>& fixed_;
  std::map<std::tuple<size_t, int32_t, bool>, bool> memo_;
};

enum class Proposer { Uniform, MostlyEos, Structural, Continuation, Count };

// The sampler's proposals for one canvas.
class Proposals {
 public:
  Proposals(const TokenConstraint& c, const std::vector<std::string>& tokenBytes, std::mt19937& rng, Proposer kind)
      : c_(c), rng_(rng), kind_(kind) {
    for (int32_t id = 0; id < c.vocabSize(); ++id) {
      const std::string& bytes = tokenBytes[id];
      if (!bytes.empty() && bytes.find_first_of("{}[]\":,0123456789-.etrunfalsabcdA ") != std::string::npos)
        structural_.push_back(id);
    }
  }

  std::vector<int64_t> canvas(int32_t state, int64_t length) {
    std::vector<int64_t> tokens(length);
    for (int64_t l = 0; l < length; ++l) {
      switch (kind_) {
        case Proposer::Uniform: tokens[l] = static_cast<int64_t>(rng_() % (c_.vocabSize() + 1)); break;
        case Proposer::MostlyEos: {
          const uint32_t r = rng_() % 10;
          tokens[l] = r < 6 ? c_.eosId() : r < 8 ? c_.padId() : static_cast<int64_t>(rng_() % c_.vocabSize());
          break;
        }
        case Proposer::Structural: tokens[l] = structural_[rng_() % structural_.size()]; break;
        default: {
          // A plausible left-to-right continuation that never stops: long text against the budget.
          const auto allowed = c_.allowedTokens(state);
          if (allowed->empty()) {
            tokens[l] = c_.eosId();
          } else {
            tokens[l] = (*allowed)[rng_() % allowed->size()];
            state = c_.step(state, tokens[l]);
          }
        }
      }
    }
    return tokens;
  }

 private:
  const TokenConstraint& c_;
  std::mt19937& rng_;
  Proposer kind_;
  std::vector<int32_t> structural_;
};

struct Outcome {
  std::vector<int64_t> ids;  // the committed text tokens, before EOS
  std::string text;
  int64_t kept = 0, refused = 0;  // candidates filterAccepted kept and refused
};

// One request: canvases of `length` positions, three denoising passes each with random candidates,
// every filterAccepted checked against CompletionSearch, then a commit of an adversarial canvas.
Outcome runRequest(const std::shared_ptr<const TokenConstraint>& constraint, const std::vector<std::string>& bytes,
                   int64_t budget, int64_t length, std::mt19937& rng, Proposer kind) {
  const TokenConstraint& c = *constraint;
  ConstraintState state(constraint, budget);
  Proposals proposals(c, bytes, rng, kind);
  Outcome outcome;
  bool ended = false;
  int32_t walk = c.startState();
  const int64_t canvases = (budget + length - 1) / length;
  for (int64_t canvas = 0; canvas < canvases; ++canvas) {
    EXPECT_FALSE(state.finished());
    state.beginCanvas(length);
    std::vector<int64_t> accepted(length, -1);
    for (int pass = 0; pass < 3; ++pass) {
      std::vector<int64_t> sampled = proposals.canvas(state.automatonState(), length);
      std::vector<int64_t> open;
      for (int64_t l = 0; l < length; ++l) {
        if (accepted[l] >= 0) sampled[l] = accepted[l];
        else open.push_back(l);
      }
      std::shuffle(open.begin(), open.end(), rng);
      open.resize(open.size() - rng() % (open.size() + 1) / 2);
      const std::vector<int64_t> kept = state.filterAccepted(sampled, open);
      // Replay the greedy rule with the independent search.
      std::vector<int64_t> fixed = accepted;
      std::vector<int64_t> expected;
      for (int64_t p : open) {
        fixed[p] = sampled[p];
        CompletionSearch search(c, state.committedPositions(), budget, fixed);
        if (search.completable(0, state.automatonState(), state.ended())) expected.push_back(p);
        else fixed[p] = -1;
      }
      EXPECT_EQ(kept, expected);
      outcome.kept += static_cast<int64_t>(kept.size());
      outcome.refused += static_cast<int64_t>(open.size() - kept.size());
      for (int64_t p : kept) accepted[p] = sampled[p];
    }
    // The canvas to commit: accepted positions hold their tokens, the rest the model's guesses.
    std::vector<int64_t> committed = proposals.canvas(state.automatonState(), length);
    for (int64_t l = 0; l < length; ++l)
      if (accepted[l] >= 0) committed[l] = accepted[l];
    const std::vector<int64_t> alternative = proposals.canvas(state.automatonState(), length);
    const bool last = state.commitCanvas(committed, alternative);
    for (int64_t id : committed) {
      if (ended) {
        EXPECT_TRUE(c.isPad(id)) << "id " << id << " after EOS";
      } else if (c.isEos(id)) {
        ended = true;
      } else {
        walk = c.step(walk, id);
        EXPECT_NE(walk, ByteAutomaton::kDeadState) << "id " << id << " breaks the text";
        outcome.ids.push_back(id);
        outcome.text += bytes[id];
      }
    }
    if (last) break;
  }
  EXPECT_TRUE(state.finished());
  EXPECT_TRUE(state.complete());
  EXPECT_TRUE(c.isAccepting(walk));
  EXPECT_LE(static_cast<int64_t>(outcome.ids.size()), budget);
  return outcome;
}

void checkLanguages(const TokenVocabulary& vocabulary, const std::vector<int64_t>& extraBudgets, int seeds,
                    const Tokenizer* tokenizer) {
  for (const Language& language : languages()) {
    auto constraint = std::make_shared<const TokenConstraint>(language.automaton, vocabulary);
    const int64_t minimum = constraint->minimumTokens();
    int64_t kept = 0, refused = 0;
    ASSERT_NE(minimum, TokenConstraint::kUnreachable) << language.name;
    for (int64_t length : {4, 16}) {
      for (int64_t extra : extraBudgets) {
        const int64_t budget = minimum + extra;
        for (int seed = 0; seed < seeds; ++seed) {
          std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + length * 31 + extra));
          const auto kind = static_cast<Proposer>(seed % static_cast<int>(Proposer::Count));
          const Outcome outcome = runRequest(constraint, vocabulary.tokenBytes, budget, length, rng, kind);
          kept += outcome.kept;
          refused += outcome.refused;
          EXPECT_TRUE(language.accepts(outcome.text)) << language.name << ", canvas " << length << ", budget " << budget
                                                      << ", seed " << seed << ": \"" << outcome.text << "\"";
          if (std::getenv("DGEMMA_SHOW_OUTPUT")) std::cerr << language.name << ": " << outcome.text << "\n";
          if (tokenizer) EXPECT_EQ(tokenizer->decode(outcome.ids), outcome.text) << language.name << ", seed " << seed;
        }
      }
    }
    // Both outcomes of the filter occur, so the checks above are not vacuous.
    EXPECT_GT(kept, 0) << language.name;
    EXPECT_GT(refused, 0) << language.name;
  }
}

TEST(ConstraintState, ByteVocabularyOutputAlwaysValidates) {
  checkLanguages(byteVocabulary(), {0, 3, 40}, 24, nullptr);
}

TEST(ConstraintState, BundledTokenizerOutputAlwaysValidates) {
  checkLanguages(tokenizerVocabulary(), {0, 5, 40}, 16, &bundledTokenizer());
}

TEST(ConstraintState, TooSmallBudgetIsRefused) {
  const auto automaton = compileJsonSchema(json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}}, "required": ["name"]})"),
                                           "schema");
  auto constraint = std::make_shared<const TokenConstraint>(automaton, byteVocabulary());
  EXPECT_EQ(constraint->minimumTokens(), 11);  // {"name":""}
  EXPECT_NO_THROW(ConstraintState(constraint, 11));
  try {
    ConstraintState(constraint, 10);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "the constraint needs at least 11 tokens, but the budget is 10");
  }
}

TEST(ConstraintState, LanguageTheVocabularyCannotWriteIsRefused) {
  TokenVocabulary vocabulary = byteVocabulary();
  vocabulary.forbiddenIds.push_back('x');
  auto constraint = std::make_shared<const TokenConstraint>(compileRegex("ax", "regex"), vocabulary);
  EXPECT_EQ(constraint->minimumTokens(), TokenConstraint::kUnreachable);
  EXPECT_THROW(ConstraintState(constraint, 100), InputError);
}

// The commit keeps proposals that stay completable, takes the alternative next, then the shortest.
TEST(ConstraintState, CommitRepairsLeftToRight) {
  auto constraint = std::make_shared<const TokenConstraint>(compileRegex("ab|cde", "regex"), byteVocabulary());
  ConstraintState state(constraint, 8);
  state.beginCanvas(4);
  std::vector<int64_t> tokens{'c', 'x', 'q', 'q'};
  const std::vector<int64_t> alternative{'a', 'd', 'q', kByteEos};
  EXPECT_TRUE(state.commitCanvas(tokens, alternative));
  EXPECT_EQ(tokens, (std::vector<int64_t>{'c', 'd', 'e', kByteEos}));
  EXPECT_TRUE(state.complete());
}

TEST(ConstraintState, FilterRefusesATokenThatLeavesNoCompletion) {
  auto constraint = std::make_shared<const TokenConstraint>(compileRegex("a{2}b", "regex"), byteVocabulary());
  ConstraintState state(constraint, 3);
  state.beginCanvas(4);
  // Position 3 is past the budget: only EOS or pad. 'b' at position 1 cannot be completed.
  const std::vector<int64_t> tokens{'a', 'b', 'b', 'z'};
  EXPECT_EQ(state.filterAccepted(tokens, std::vector<int64_t>{1, 3, 2, 0}), (std::vector<int64_t>{2, 0}));
  // Kept positions stay fixed in later passes: 'a' at 1 is kept, a different token at 2 is not.
  const std::vector<int64_t> next{'a', 'a', 'a', kByteEos};
  EXPECT_EQ(state.filterAccepted(next, std::vector<int64_t>{2, 1, 3}), (std::vector<int64_t>{1, 3}));
}

}  // namespace
}  // namespace dgemma::serve
