#include "runtime/data/text/BpeMerges.h"

#include <functional>
#include <queue>
#include <tuple>

namespace dgemma {
namespace {

uint64_t pairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

void BpeMerges::add(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  merges_[pairKey(left, right)] = Merge{rank, merged};
}

const BpeMerges::Merge* BpeMerges::find(int32_t left, int32_t right) const {
  auto it = merges_.find(pairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeMerges::apply(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    symbols.push_back({ids[i], static_cast<int>(i) - 1, i + 1 < ids.size() ? static_cast<int>(i) + 1 : -1, true});

  // A queue entry may be stale once a neighbour has merged: it is checked against the symbols when
  // popped, as HF does.
  using Entry = std::tuple<int32_t, int, int32_t>;  // rank, position of the left symbol, merged id
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i)
    if (const Merge* m = find(symbols[i].id, symbols[i + 1].id)) queue.emplace(m->rank, i, m->merged);
  while (!queue.empty()) {
    const auto [rank, pos, merged] = queue.top();
    queue.pop();
    Symbol& left = symbols[pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* m = find(left.id, right.id);
    if (m == nullptr || m->merged != merged) continue;
    left.id = merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pos;
    if (left.prev >= 0)
      if (const Merge* p = find(symbols[left.prev].id, left.id)) queue.emplace(p->rank, left.prev, p->merged);
    if (left.next >= 0)
      if (const Merge* n = find(left.id, symbols[left.next].id)) queue.emplace(n->rank, pos, n->merged);
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace dgemma
