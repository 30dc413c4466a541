#include "runtime/serve/constrain/TokenConstraint.h"

#include <algorithm>
#include <deque>
#include <tuple>
#include <unordered_map>

#include "support/Error.h"

namespace dgemma::serve {

struct TokenConstraint::StateInfo {
  std::vector<std::pair<int32_t, int32_t>> edges;  // (token, state) for every text token not leading to kDeadState
  std::vector<int32_t> targets;                    // the distinct states of `edges`
  int64_t distance = -1;                           // -1: not computed yet
  bool derived = false;                            // the fields below are set
  std::shared_ptr<const std::vector<int32_t>> allowed;
  std::shared_ptr<const std::vector<Successor>> successors;
  int32_t shortest = -1;
};

TokenConstraint::TokenConstraint(std::shared_ptr<const ByteAutomaton> automaton, TokenVocabulary vocabulary)
    : automaton_(std::move(automaton)), vocabulary_(std::move(vocabulary)) {
  if (vocabulary_.eosIds.empty()) throw InputError("constraint: the vocabulary has no EOS id");
  isText_.assign(vocabulary_.tokenBytes.size(), true);
  auto exclude = [&](int64_t id) {
    if (id >= 0 && id < vocabSize()) isText_[id] = false;
  };
  for (int32_t id : vocabulary_.forbiddenIds) exclude(id);
  for (int32_t id : vocabulary_.eosIds) exclude(id);
  exclude(vocabulary_.padId);
  for (size_t id = 0; id < isText_.size(); ++id)
    if (vocabulary_.tokenBytes[id].empty()) isText_[id] = false;
  std::vector<std::string> textBytes;
  for (int32_t id = 0; id < static_cast<int32_t>(isText_.size()); ++id) {
    if (!isText_[id]) continue;
    textIds_.push_back(id);
    textBytes.push_back(vocabulary_.tokenBytes[id]);
  }
  textBytes_ = std::make_unique<const SortedStrings>(std::move(textBytes));
}

TokenConstraint::~TokenConstraint() = default;

bool TokenConstraint::isEos(int64_t id) const {
  return std::find(vocabulary_.eosIds.begin(), vocabulary_.eosIds.end(), id) != vocabulary_.eosIds.end();
}

TokenConstraint::StateInfo& TokenConstraint::infoLocked(int32_t state) const {
  if (state >= static_cast<int32_t>(states_.size())) states_.resize(state + 1);
  std::unique_ptr<StateInfo>& info = states_[state];
  if (info) return *info;
  info = std::make_unique<StateInfo>();
  if (state != ByteAutomaton::kDeadState) {
    const std::vector<int32_t> targets = automaton_->runAll(state, *textBytes_);
    for (size_t i = 0; i < targets.size(); ++i)
      if (targets[i] != ByteAutomaton::kDeadState) info->edges.emplace_back(textIds_[i], targets[i]);
  }
  for (const auto& [id, target] : info->edges) info->targets.push_back(target);
  std::sort(info->targets.begin(), info->targets.end());
  info->targets.erase(std::unique(info->targets.begin(), info->targets.end()), info->targets.end());
  return *info;
}

int64_t TokenConstraint::distanceLocked(int32_t state) const {
  if (const int64_t known = infoLocked(state).distance; known >= 0) return known;
  // Breadth-first over token transitions; a state whose distance is already known is not expanded
  // (its known distance covers every path through it).
  int64_t best = kUnreachable;
  std::unordered_map<int32_t, int64_t> depth{{state, 0}};
  std::deque<int32_t> queue{state};
  while (!queue.empty()) {
    const int32_t at = queue.front();
    queue.pop_front();
    const int64_t d = depth[at];
    if (d >= best) break;
    if (automaton_->isAccepting(at)) {
      best = d;
      break;
    }
    StateInfo& info = infoLocked(at);
    if (at != state && info.distance >= 0) {
      if (info.distance != kUnreachable) best = std::min(best, d + info.distance);
      continue;
    }
    for (int32_t next : info.targets)
      if (depth.emplace(next, d + 1).second) queue.push_back(next);
  }
  infoLocked(state).distance = best;
  return best;
}

void TokenConstraint::deriveLocked(int32_t state) const {
  if (infoLocked(state).derived) return;
  auto allowed = std::make_shared<std::vector<int32_t>>();
  auto successors = std::make_shared<std::vector<Successor>>();
  int32_t shortest = -1;
  int64_t shortestDistance = kUnreachable;
  // StateInfo objects stay where they are while the table grows, so this reference holds.
  const StateInfo& info = infoLocked(state);
  for (const auto& [id, target] : info.edges) {
    const int64_t distance = distanceLocked(target);
    if (distance == kUnreachable) continue;
    allowed->push_back(id);
    successors->push_back({target, distance});
    if (distance < shortestDistance) {
      shortestDistance = distance;
      shortest = id;
    }
  }
  std::sort(successors->begin(), successors->end(), [](const Successor& a, const Successor& b) {
    return std::tie(a.distance, a.state) < std::tie(b.distance, b.state);
  });
  successors->erase(std::unique(successors->begin(), successors->end()), successors->end());
  StateInfo& derived = infoLocked(state);
  derived.allowed = std::move(allowed);
  derived.successors = std::move(successors);
  derived.shortest = shortest;
  derived.derived = true;
}

int32_t TokenConstraint::step(int32_t state, int64_t id) const {
  if (id < 0 || id >= vocabSize() || !isText_[id] || state == ByteAutomaton::kDeadState)
    return ByteAutomaton::kDeadState;
  const int32_t target = automaton_->run(state, vocabulary_.tokenBytes[id]);
  if (target == ByteAutomaton::kDeadState || distanceToAccept(target) == kUnreachable) return ByteAutomaton::kDeadState;
  return target;
}

int64_t TokenConstraint::distanceToAccept(int32_t state) const {
  std::lock_guard lock(mutex_);
  return distanceLocked(state);
}

std::shared_ptr<const std::vector<TokenConstraint::Successor>> TokenConstraint::successors(int32_t state) const {
  std::lock_guard lock(mutex_);
  deriveLocked(state);
  return infoLocked(state).successors;
}

std::shared_ptr<const std::vector<int32_t>> TokenConstraint::allowedTokens(int32_t state) const {
  std::lock_guard lock(mutex_);
  deriveLocked(state);
  return infoLocked(state).allowed;
}

int32_t TokenConstraint::shortestToken(int32_t state) const {
  std::lock_guard lock(mutex_);
  deriveLocked(state);
  return infoLocked(state).shortest;
}

}  // namespace dgemma::serve
