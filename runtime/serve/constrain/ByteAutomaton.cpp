#include "runtime/serve/constrain/ByteAutomaton.h"

#include <algorithm>

#include "support/Error.h"

namespace dgemma::serve {

struct ByteExpr::Node {
  enum Kind { Class, Sequence, Alternation, Star, Repetition, SeparatedList, SeparatedSubsequence };
  Kind kind = Sequence;
  ByteSet bytes;                  // Class
  std::vector<ByteExpr> children;  // the parts; SeparatedList: item, separator; SeparatedSubsequence: items, separator
  std::vector<bool> required;  // SeparatedSubsequence
  int64_t min = 0;  // Repetition
  std::optional<int64_t> max;  // Repetition
};

namespace {

std::shared_ptr<ByteExpr::Node> makeNode(ByteExpr::Node::Kind kind, std::vector<ByteExpr> children = {}) {
  auto node = std::make_shared<ByteExpr::Node>();
  node->kind = kind;
  node->children = std::move(children);
  return node;
}

}  // namespace

ByteExpr ByteExpr::empty() { return ByteExpr(makeNode(Node::Sequence)); }

ByteExpr ByteExpr::literal(std::string_view bytes) {
  std::vector<ByteExpr> parts;
  for (char c : bytes) {
    ByteSet one;
    one.set(static_cast<uint8_t>(c));
    parts.push_back(byteClass(one));
  }
  return sequence(std::move(parts));
}

ByteExpr ByteExpr::byteClass(const ByteSet& bytes) {
  auto node = makeNode(Node::Class);
  node->bytes = bytes;
  return ByteExpr(node);
}

ByteExpr ByteExpr::byteRange(uint8_t first, uint8_t last) {
  ByteSet bytes;
  for (int b = first; b <= last; ++b) bytes.set(b);
  return byteClass(bytes);
}

ByteExpr ByteExpr::sequence(std::vector<ByteExpr> parts) {
  if (parts.size() == 1) return parts[0];
  return ByteExpr(makeNode(Node::Sequence, std::move(parts)));
}

ByteExpr ByteExpr::alternation(std::vector<ByteExpr> choices) {
  if (choices.size() == 1) return choices[0];
  return ByteExpr(makeNode(Node::Alternation, std::move(choices)));
}

ByteExpr ByteExpr::optional(ByteExpr inner) { return alternation({std::move(inner), empty()}); }

ByteExpr ByteExpr::star(ByteExpr inner) { return ByteExpr(makeNode(Node::Star, {std::move(inner)})); }

ByteExpr ByteExpr::repetition(ByteExpr inner, int64_t min, std::optional<int64_t> max) {
  auto node = makeNode(Node::Repetition, {std::move(inner)});
  node->min = min;
  node->max = max;
  return ByteExpr(node);
}

ByteExpr ByteExpr::separatedList(ByteExpr item, ByteExpr separator) {
  return ByteExpr(makeNode(Node::SeparatedList, {std::move(item), std::move(separator)}));
}

ByteExpr ByteExpr::separatedSubsequence(std::vector<ByteExpr> items, std::vector<bool> required, ByteExpr separator) {
  required.resize(items.size(), false);
  items.push_back(std::move(separator));
  auto node = makeNode(Node::SeparatedSubsequence, std::move(items));
  node->required = std::move(required);
  return ByteExpr(node);
}

ByteExpr ByteExpr::utf8Char(const ByteSet& ascii, bool multiByte) {
  ByteSet asciiOnly = ascii;
  for (int b = 0x80; b < 256; ++b) asciiOnly.reset(b);
  std::vector<ByteExpr> choices{byteClass(asciiOnly)};
  if (multiByte) {
    const ByteExpr tail = byteRange(0x80, 0xBF);
    choices.push_back(sequence({byteRange(0xC2, 0xDF), tail}));
    choices.push_back(sequence({literal("\xE0"), byteRange(0xA0, 0xBF), tail}));
    choices.push_back(sequence({byteRange(0xE1, 0xEC), tail, tail}));
    choices.push_back(sequence({literal("\xED"), byteRange(0x80, 0x9F), tail}));
    choices.push_back(sequence({byteRange(0xEE, 0xEF), tail, tail}));
    choices.push_back(sequence({literal("\xF0"), byteRange(0x90, 0xBF), tail, tail}));
    choices.push_back(sequence({byteRange(0xF1, 0xF3), tail, tail, tail}));
    choices.push_back(sequence({literal("\xF4"), byteRange(0x80, 0x8F), tail, tail}));
  }
  return alternation(std::move(choices));
}

// Thompson's construction: build(expr, from, to) adds states and edges so that the paths from `from`
// to `to` spell the members of expr. It only adds edges leaving `from` and entering `to`, so
// siblings can share both ends.
struct ByteAutomaton::Nfa {
  struct State {
    std::vector<std::pair<ByteSet, int32_t>> byteEdges;
    std::vector<int32_t> epsilon;
  };
  std::vector<State> states;
  int32_t start = 0, accept = 1;
  int64_t maxStates = 0;
  std::string where;

  int32_t add() {
    if (static_cast<int64_t>(states.size()) >= maxStates)
      throw InputError(where + ": the constraint needs more than " + std::to_string(maxStates) + " automaton states");
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
  void epsilonEdge(int32_t from, int32_t to) { states[from].epsilon.push_back(to); }

  void build(const ByteExpr& expr, int32_t from, int32_t to) {
    const ByteExpr::Node& node = expr.node();
    using Kind = ByteExpr::Node::Kind;
    switch (node.kind) {
      case Kind::Class:
        if (node.bytes.any()) states[from].byteEdges.emplace_back(node.bytes, to);
        return;
      case Kind::Sequence: {
        int32_t at = from;
        for (size_t i = 0; i < node.children.size(); ++i) {
          const int32_t next = i + 1 == node.children.size() ? to : add();
          build(node.children[i], at, next);
          at = next;
        }
        if (node.children.empty()) epsilonEdge(from, to);
        return;
      }
      case Kind::Alternation:
        for (const ByteExpr& child : node.children) build(child, from, to);
        return;
      case Kind::Star: {
        const int32_t loop = add(), back = add();
        epsilonEdge(from, loop);
        epsilonEdge(loop, to);
        build(node.children[0], loop, back);
        epsilonEdge(back, loop);
        return;
      }
      case Kind::Repetition: {
        int32_t at = add();
        epsilonEdge(from, at);
        for (int64_t i = 0; i < node.min; ++i) {
          const int32_t next = add();
          build(node.children[0], at, next);
          at = next;
        }
        if (!node.max) {
          build(ByteExpr::star(node.children[0]), at, to);
          return;
        }
        for (int64_t i = node.min; i < *node.max; ++i) {
          epsilonEdge(at, to);
          const int32_t next = add();
          build(node.children[0], at, next);
          at = next;
        }
        epsilonEdge(at, to);
        return;
      }
      case Kind::SeparatedList: {
        const int32_t itemStart = add(), itemEnd = add();
        epsilonEdge(from, itemStart);
        build(node.children[0], itemStart, itemEnd);
        epsilonEdge(itemEnd, to);
        build(node.children[1], itemEnd, itemStart);
        return;
      }
      case Kind::SeparatedSubsequence: {
        // noneYet: before item i with no item emitted; someEmitted: before item i after one.
        const size_t count = node.children.size() - 1;
        const ByteExpr& separator = node.children.back();
        int32_t noneYet = add(), someEmitted = add();
        epsilonEdge(from, noneYet);
        for (size_t i = 0; i < count; ++i) {
          const int32_t itemStart = add(), itemEnd = add();
          const int32_t nextNoneYet = add(), nextSomeEmitted = add();
          epsilonEdge(noneYet, itemStart);
          build(separator, someEmitted, itemStart);
          build(node.children[i], itemStart, itemEnd);
          epsilonEdge(itemEnd, nextSomeEmitted);
          if (!node.required[i]) {
            epsilonEdge(noneYet, nextNoneYet);
            epsilonEdge(someEmitted, nextSomeEmitted);
          }
          noneYet = nextNoneYet;
          someEmitted = nextSomeEmitted;
        }
        epsilonEdge(noneYet, to);
        epsilonEdge(someEmitted, to);
        return;
      }
    }
  }

  // The NFA states that can reach `accept`; the others are dropped from every DFA state.
  std::vector<bool> live() const {
    std::vector<std::vector<int32_t>> reverse(states.size());
    for (size_t s = 0; s < states.size(); ++s) {
      for (const auto& [bytes, target] : states[s].byteEdges) reverse[target].push_back(static_cast<int32_t>(s));
      for (int32_t target : states[s].epsilon) reverse[target].push_back(static_cast<int32_t>(s));
    }
    std::vector<bool> reached(states.size(), false);
    std::vector<int32_t> stack{accept};
    reached[accept] = true;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (int32_t source : reverse[s])
        if (!reached[source]) {
          reached[source] = true;
          stack.push_back(source);
        }
    }
    return reached;
  }

  std::vector<bool> isLive;

  // The epsilon closure of `seeds`, live states only, sorted.
  std::vector<int32_t> closure(std::vector<int32_t> seeds) const {
    std::vector<bool> seen(states.size(), false);
    std::vector<int32_t> result;
    while (!seeds.empty()) {
      const int32_t s = seeds.back();
      seeds.pop_back();
      if (seen[s] || !isLive[s]) continue;
      seen[s] = true;
      result.push_back(s);
      for (int32_t target : states[s].epsilon) seeds.push_back(target);
    }
    std::sort(result.begin(), result.end());
    return result;
  }
};

ByteAutomaton::ByteAutomaton(const ByteExpr& expr, std::string where, int64_t maxStates)
    : nfa_(std::make_unique<Nfa>()), where_(std::move(where)), maxStates_(maxStates) {
  nfa_->where = where_;
  nfa_->maxStates = maxStates;
  nfa_->start = nfa_->add();
  nfa_->accept = nfa_->add();
  nfa_->build(expr, nfa_->start, nfa_->accept);
  nfa_->isLive = nfa_->live();
  std::lock_guard lock(mutex_);
  internLocked({});  // kDeadState
  startState_ = internLocked(nfa_->closure({nfa_->start}));
}

ByteAutomaton::~ByteAutomaton() = default;

int32_t ByteAutomaton::internLocked(std::vector<int32_t> nfaStates) const {
  auto it = stateIds_.find(nfaStates);
  if (it != stateIds_.end()) return it->second;
  if (static_cast<int64_t>(stateSets_.size()) >= maxStates_)
    throw InputError(where_ + ": the constraint needs more than " + std::to_string(maxStates_) + " automaton states");
  const auto id = static_cast<int32_t>(stateSets_.size());
  accepting_.push_back(std::binary_search(nfaStates.begin(), nfaStates.end(), nfa_->accept));
  std::array<int32_t, 256> unknown;
  unknown.fill(-1);
  transitions_.push_back(unknown);
  stateIds_.emplace(nfaStates, id);
  stateSets_.push_back(std::move(nfaStates));
  return id;
}

int32_t ByteAutomaton::stepLocked(int32_t state, uint8_t byte) const {
  int32_t& cached = transitions_[state][byte];
  if (cached >= 0) return cached;
  std::vector<int32_t> targets;
  for (int32_t s : stateSets_[state])
    for (const auto& [bytes, target] : nfa_->states[s].byteEdges)
      if (bytes.test(byte)) targets.push_back(target);
  const int32_t next = internLocked(nfa_->closure(std::move(targets)));
  transitions_[state][byte] = next;  // internLocked may have moved the table
  return next;
}

int32_t ByteAutomaton::step(int32_t state, uint8_t byte) const {
  std::lock_guard lock(mutex_);
  return stepLocked(state, byte);
}

int32_t ByteAutomaton::run(int32_t state, std::string_view bytes) const {
  std::lock_guard lock(mutex_);
  for (char c : bytes) {
    if (state == kDeadState) break;
    state = stepLocked(state, static_cast<uint8_t>(c));
  }
  return state;
}

SortedStrings::SortedStrings(std::vector<std::string> given) : strings(std::move(given)) {
  order.resize(strings.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return strings[a] < strings[b]; });
  sharedPrefix.assign(order.size(), 0);
  for (size_t i = 1; i < order.size(); ++i) {
    const std::string& previous = strings[order[i - 1]];
    const std::string& current = strings[order[i]];
    size_t shared = 0;
    while (shared < previous.size() && shared < current.size() && previous[shared] == current[shared]) ++shared;
    sharedPrefix[i] = static_cast<int32_t>(shared);
  }
}

std::vector<int32_t> ByteAutomaton::runAll(int32_t state, const SortedStrings& strings) const {
  std::vector<int32_t> result(strings.strings.size(), kDeadState);
  // path[d]: the state after the first d bytes of the current string; alive: how many of them
  // exist (the state after byte `alive` is dead, or the string ends).
  std::vector<int32_t> path{state};
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < strings.order.size(); ++i) {
    const std::string& text = strings.strings[strings.order[i]];
    const auto shared = static_cast<size_t>(strings.sharedPrefix[i]);
    if (path.size() > shared + 1) path.resize(shared + 1);
    // path.size() - 1 <= shared: the prefix computed so far; it ends in the dead state when a
    // shorter shared prefix already died.
    if (path.back() == kDeadState) continue;
    while (path.size() <= text.size() && path.back() != kDeadState)
      path.push_back(stepLocked(path.back(), static_cast<uint8_t>(text[path.size() - 1])));
    if (path.size() == text.size() + 1) result[strings.order[i]] = path.back();
  }
  return result;
}

bool ByteAutomaton::isAccepting(int32_t state) const {
  std::lock_guard lock(mutex_);
  return accepting_[state];
}

bool ByteAutomaton::matches(std::string_view text) const { return isAccepting(run(startState_, text)); }

int64_t ByteAutomaton::stateCount() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(stateSets_.size());
}

}  // namespace dgemma::serve
