#include "runtime/serve/constrain/ConstraintState.h"

#include <algorithm>
#include <optional>
#include <string>

#include "support/Error.h"

namespace dgemma::serve {

ConstraintState::ConstraintState(std::shared_ptr<const TokenConstraint> constraint, int64_t budgetTokens)
    : constraint_(std::move(constraint)), budget_(budgetTokens), state_(constraint_->startState()) {
  const int64_t needed = constraint_->minimumTokens();
  if (needed == TokenConstraint::kUnreachable)
    throw InputError("no text of the tokenizer's tokens satisfies the constraint");
  if (needed > budget_)
    throw InputError("the constraint needs at least " + std::to_string(needed) + " tokens, but the budget is " +
                     std::to_string(budget_));
}

void ConstraintState::beginCanvas(int64_t length) {
  if (length < 1) throw RuntimeError("constraint: a canvas needs at least one position, got " + std::to_string(length));
  canvasLength_ = length;
  keptTokens_.assign(length, -1);
}

void ConstraintState::checkLength(size_t size, const char* what) const {
  if (static_cast<int64_t>(size) != canvasLength_)
    throw RuntimeError(std::string("constraint: ") + what + " has " + std::to_string(size) +
                       " positions, but the canvas has " + std::to_string(canvasLength_));
}

std::vector<int32_t> ConstraintState::advance(const std::vector<int32_t>& before, int64_t l, int64_t fixed) const {
  const TokenConstraint& c = *constraint_;
  const int64_t position = committed_ + l;
  const bool free = fixed < 0;
  const bool ends = free || c.isEos(fixed);  // may place EOS here
  std::vector<int32_t> after;
  for (int32_t state : before) {
    if (state == kEnded) {
      if (free || c.isEos(fixed) || c.isPad(fixed)) after.push_back(kEnded);
      continue;
    }
    if (ends && c.isAccepting(state)) after.push_back(kEnded);
    if (position >= budget_) continue;  // no text past the budget
    const int64_t left = budget_ - position - 1;  // text positions after this one
    if (free) {
      for (const TokenConstraint::Successor& next : *c.successors(state)) {
        if (next.distance > left) break;
        after.push_back(next.state);
      }
    } else if (const int32_t next = c.step(state, fixed);
               next != ByteAutomaton::kDeadState && c.distanceToAccept(next) <= left) {
      after.push_back(next);
    }
  }
  std::sort(after.begin(), after.end());
  after.erase(std::unique(after.begin(), after.end()), after.end());
  return after;
}

std::vector<int64_t> ConstraintState::filterAccepted(std::span<const int64_t> tokens,
                                                     std::span<const int64_t> candidates) {
  checkLength(tokens.size(), "the sampled canvas");
  const int64_t length = canvasLength_;
  std::vector<int64_t>& fixed = keptTokens_;
  // reachable[l]: the states before position l with the kept positions fixed.
  std::vector<std::vector<int32_t>> reachable(length + 1);
  reachable[0] = {ended_ ? kEnded : state_};
  for (int64_t l = 0; l < length; ++l) reachable[l + 1] = advance(reachable[l], l, fixed[l]);

  std::vector<int64_t> kept;
  std::vector<std::vector<int32_t>> trial;
  for (int64_t p : candidates) {
    if (p < 0 || p >= length)
      throw RuntimeError("constraint: candidate position " + std::to_string(p) + " is outside the canvas of " +
                         std::to_string(length));
    if (fixed[p] >= 0) {
      if (fixed[p] == tokens[p] && std::find(kept.begin(), kept.end(), p) == kept.end()) kept.push_back(p);
      continue;
    }
    // A token id below 0 would read as a wildcard; no such id is completable.
    if (tokens[p] < 0) continue;
    fixed[p] = tokens[p];
    // Only the sets after p change; stop once one equals the old set.
    trial.assign(1, reachable[p]);
    bool feasible = true;
    int64_t l = p;
    for (; l < length; ++l) {
      std::vector<int32_t> next = advance(trial.back(), l, fixed[l]);
      if (next.empty()) {
        feasible = false;
        break;
      }
      const bool unchanged = next == reachable[l + 1];
      trial.push_back(std::move(next));
      if (unchanged) break;
    }
    if (!feasible) {
      fixed[p] = -1;
      continue;
    }
    for (size_t i = 1; i < trial.size(); ++i) reachable[p + i] = std::move(trial[i]);
    kept.push_back(p);
  }
  return kept;
}

bool ConstraintState::commitCanvas(std::span<int64_t> tokens, std::span<const int64_t> alternative) {
  checkLength(tokens.size(), "the committed canvas");
  if (!alternative.empty()) checkLength(alternative.size(), "the alternative canvas");
  const TokenConstraint& c = *constraint_;
  for (int64_t l = 0; l < canvasLength_; ++l) {
    const int64_t position = committed_ + l;
    if (ended_) {
      tokens[l] = c.padId();
      continue;
    }
    const bool accepting = c.isAccepting(state_);
    if (position >= budget_) {  // the budget is used; the text is complete here (see advance)
      tokens[l] = c.eosId();
      ended_ = true;
      continue;
    }
    const int64_t left = budget_ - position - 1;
    // The state after `id` (kEnded for EOS where the text is complete); nothing when `id` would break
    // the text or leave it uncompletable within the budget.
    auto tryToken = [&](int64_t id) -> std::optional<int32_t> {
      if (c.isEos(id)) return accepting ? std::optional<int32_t>(kEnded) : std::nullopt;
      const int32_t next = c.step(state_, id);
      if (next == ByteAutomaton::kDeadState || c.distanceToAccept(next) > left) return std::nullopt;
      return next;
    };
    std::optional<int32_t> next = tryToken(tokens[l]);
    if (!next && !alternative.empty()) {
      next = tryToken(alternative[l]);
      if (next) tokens[l] = alternative[l];
    }
    if (!next) {
      if (accepting) {
        tokens[l] = c.eosId();
        next = kEnded;
      } else {
        tokens[l] = c.shortestToken(state_);
        next = c.step(state_, tokens[l]);
      }
    }
    if (*next == kEnded) {
      tokens[l] = c.eosId();
      ended_ = true;
    } else {
      state_ = *next;
    }
  }
  committed_ += canvasLength_;
  finished_ = ended_ || committed_ >= budget_;
  return finished_;
}

bool ConstraintState::complete() const { return ended_ || constraint_->isAccepting(state_); }

}  // namespace dgemma::serve
