// A byte automaton lifted to a tokenizer's vocabulary (docs/serving.md, "Structured output"): which
// tokens keep the output completable from an automaton state, and how many tokens the shortest
// completion takes. Built once per constrained request, then shared and read by any thread.
//
// A token moves an automaton state by running its bytes (Tokenizer::tokenBytes()) through the
// automaton. Special tokens (forbidden), EOS and pad never move it: EOS ends the output and is
// allowed only in an accepting state, pad only follows EOS. Everything is computed lazily per
// state and memoized: one run of the vocabulary's sorted bytes per state gives its token transitions
// (tokens below a dead prefix are skipped, so most of a large vocabulary costs nothing from a state
// inside JSON punctuation); the distance of a state (fewest tokens to an accepting state) is a
// breadth-first search over those.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/serve/constrain/ByteAutomaton.h"

namespace dgemma::serve {

struct TokenVocabulary {
  std::vector<std::string> tokenBytes;  // per id, what it adds to the decoded text
  std::vector<int32_t> forbiddenIds;    // special tokens: never part of constrained text
  std::vector<int32_t> eosIds;          // non-empty; the first is the one the output is ended with
  int32_t padId = -1;                   // what follows EOS; -1: the first EOS id again
};

class TokenConstraint {
 public:
  static constexpr int64_t kUnreachable = std::numeric_limits<int64_t>::max();

  // Throws InputError when `vocabulary` has no EOS id.
  TokenConstraint(std::shared_ptr<const ByteAutomaton> automaton, TokenVocabulary vocabulary);
  ~TokenConstraint();

  const ByteAutomaton& automaton() const { return *automaton_; }
  int32_t startState() const { return automaton_->startState(); }
  bool isAccepting(int32_t state) const { return automaton_->isAccepting(state); }
  int64_t vocabSize() const { return static_cast<int64_t>(vocabulary_.tokenBytes.size()); }
  bool isEos(int64_t id) const;
  bool isPad(int64_t id) const { return id == padId(); }
  int32_t eosId() const { return vocabulary_.eosIds.front(); }
  int32_t padId() const { return vocabulary_.padId >= 0 ? vocabulary_.padId : eosId(); }

  // The state after text token `id`: kDeadState for a forbidden, EOS, pad or out-of-range id, or
  // when the text cannot be completed any more with the vocabulary's tokens.
  int32_t step(int32_t state, int64_t id) const;
  // The fewest text tokens from `state` to an accepting state (0 in one); kUnreachable if none.
  int64_t distanceToAccept(int32_t state) const;
  // minimumTokens() = distanceToAccept(startState()): the least budget a request needs.
  int64_t minimumTokens() const { return distanceToAccept(startState()); }
  struct Successor {
    int32_t state;
    int64_t distance;  // distanceToAccept(state)
    bool operator==(const Successor&) const = default;
  };
  // The distinct states one allowed token leads to from `state`, nearest to acceptance first.
  std::shared_ptr<const std::vector<Successor>> successors(int32_t state) const;
  // The text tokens allowed from `state` (those that keep it completable), sorted.
  std::shared_ptr<const std::vector<int32_t>> allowedTokens(int32_t state) const;
  // The allowed token on a shortest path to acceptance (lowest id on ties); -1 if none.
  int32_t shortestToken(int32_t state) const;

 private:
  struct StateInfo;
  StateInfo& infoLocked(int32_t state) const;
  int64_t distanceLocked(int32_t state) const;
  void deriveLocked(int32_t state) const;

  std::shared_ptr<const ByteAutomaton> automaton_;
  TokenVocabulary vocabulary_;
  std::vector<bool> isText_;  // per id: not forbidden, EOS or pad, and not empty
  std::vector<int32_t> textIds_;                  // the text tokens
  std::unique_ptr<const SortedStrings> textBytes_;  // their bytes, in the order of textIds_

  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<StateInfo>> states_;  // by automaton state id
};

}  // namespace dgemma::serve
