// A byte-level automaton for structured output (docs/serving.md, "Structured output"): a regular
// language described by ByteExpr combinators, compiled to an NFA over bytes and determinized lazily.
//
// A DFA state is the set of NFA states reachable after the bytes read so far, keeping only NFA
// states from which the accepting state can still be reached; the empty set is the dead state
// (kDeadState). So every state other than the dead one can still complete to a member of the
// language. DFA states are created on first use, memoized, and bounded in number: a step that would
// create more than the bound throws InputError. A ByteAutomaton may be read from any thread at once
// (one mutex guards the states built so far).
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dgemma::serve {

using ByteSet = std::bitset<256>;

// An immutable regular expression over bytes. Copies share their subtrees.
class ByteExpr {
 public:
  struct Node;

  static ByteExpr empty();  // matches the empty string
  static ByteExpr literal(std::string_view bytes);
  static ByteExpr byteClass(const ByteSet& bytes);
  static ByteExpr byteRange(uint8_t first, uint8_t last);
  static ByteExpr sequence(std::vector<ByteExpr> parts);
  static ByteExpr alternation(std::vector<ByteExpr> choices);  // none: matches nothing
  static ByteExpr optional(ByteExpr inner);
  static ByteExpr star(ByteExpr inner);
  // `inner` repeated at least `min` and at most `max` times (unbounded without `max`). The automaton
  // holds one copy of `inner` per counted repetition.
  static ByteExpr repetition(ByteExpr inner, int64_t min, std::optional<int64_t> max);
  // item (separator item)*, holding one copy of the item (so nested JSON stays linear in size).
  static ByteExpr separatedList(ByteExpr item, ByteExpr separator);
  // The items in order, separated by `separator`, each optional one possibly left out (the
  // properties of a JSON object); one copy of each item.
  static ByteExpr separatedSubsequence(std::vector<ByteExpr> items, std::vector<bool> required, ByteExpr separator);
  // One well-formed UTF-8 character: an ASCII byte of `ascii`, or any multi-byte sequence when
  // `multiByte` is set.
  static ByteExpr utf8Char(const ByteSet& ascii, bool multiByte);

  const Node& node() const { return *node_; }

 private:
  explicit ByteExpr(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  std::shared_ptr<const Node> node_;
};

// Strings sorted bytewise, each with the length of the prefix it shares with the one before it:
// running them all from one state reuses the states of shared prefixes and skips every string below
// a prefix that is already dead (ByteAutomaton::runAll).
struct SortedStrings {
  explicit SortedStrings(std::vector<std::string> strings);
  std::vector<std::string> strings;    // as given
  std::vector<int32_t> order;          // indices of `strings`, sorted by their bytes
  std::vector<int32_t> sharedPrefix;   // per position of `order`
};

class ByteAutomaton {
 public:
  static constexpr int32_t kDeadState = 0;
  static constexpr int64_t kDefaultMaxStates = 100000;

  // Compiles `expr`. `where` prefixes the InputError thrown when the NFA or, later, the DFA grows
  // past its bound ("WHERE: the constraint needs more than N automaton states").
  ByteAutomaton(const ByteExpr& expr, std::string where, int64_t maxStates = kDefaultMaxStates);
  ~ByteAutomaton();

  int32_t startState() const { return startState_; }
  // The state after `byte`; kDeadState when no member of the language continues this way.
  int32_t step(int32_t state, uint8_t byte) const;
  // The state after every byte of `bytes`; kDeadState as soon as one step leads there.
  int32_t run(int32_t state, std::string_view bytes) const;
  // The state after each string of `strings` (by its index), as run() gives, under one lock.
  std::vector<int32_t> runAll(int32_t state, const SortedStrings& strings) const;
  bool isAccepting(int32_t state) const;
  // Whether the whole of `text` is a member of the language.
  bool matches(std::string_view text) const;
  // DFA states created so far, the dead state included.
  int64_t stateCount() const;

 private:
  struct Nfa;
  int32_t stepLocked(int32_t state, uint8_t byte) const;
  int32_t internLocked(std::vector<int32_t> nfaStates) const;

  std::unique_ptr<Nfa> nfa_;
  std::string where_;
  int64_t maxStates_;
  int32_t startState_ = kDeadState;

  mutable std::mutex mutex_;
  mutable std::vector<std::vector<int32_t>> stateSets_;  // per DFA state, its sorted NFA states
  mutable std::vector<bool> accepting_;
  mutable std::vector<std::array<int32_t, 256>> transitions_;  // -1: not computed yet
  mutable std::map<std::vector<int32_t>, int32_t> stateIds_;
};

}  // namespace dgemma::serve
