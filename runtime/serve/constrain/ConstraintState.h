// Structured output for the block-diffusion sampler (docs/serving.md, "Structured output").
//
// A constrained request's committed text must parse and validate against a JSON schema, or match a
// regular expression, whatever the model proposes. The language is a byte automaton (JsonSchema.h,
// Regex.h) lifted to the tokenizer's vocabulary (TokenConstraint.h); ConstraintState follows one
// request through its canvases.
//
// Why not left-to-right masking. A left-to-right decoder masks the logits of the next position to
// the tokens that keep the text completable. The diffusion sampler fills a canvas of L positions in
// any order: per denoising pass every position gets a sampled token, and positions are accepted
// lowest-entropy-first, wherever they are. Masking left to right would force it to fill the canvas
// in order, which is exactly the freedom it is built around. Instead:
//
// The acceptance rule (filterAccepted). A position may be accepted when the canvas, with the tokens
// of the positions accepted so far fixed and every other position a wildcard (any text token, EOS
// where the text is complete, EOS or pad after EOS), still has a completion that the language accepts
// within the request's budget. The candidates are taken greedily in the sampler's order (lowest
// entropy first); a candidate that would leave no valid completion is not accepted and is renoised
// with the rejected positions. Checking it runs the set of automaton states reachable at each
// position across the canvas (a fixed position moves each state by its token, a wildcard by every
// allowed token) and keeps only states whose distance to acceptance fits in the positions left, so a
// non-empty set after the last position means a valid completion exists. The sampler keeps its
// order; only its choices that would make the canvas impossible are refused.
//
// The commit repair (commitCanvas). The canvas the sampler commits (its argmax canvas) need not be
// one of those completions: positions it never accepted hold whatever the model predicts. The commit
// rewrites it left to right: a position keeps its token when the text so far plus it can still be
// completed within the budget; else it takes the alternative canvas's token (the sampled one) if
// that can; else the allowed token on a shortest path to acceptance (lowest id on ties; EOS when the
// text is already complete). Once the text is complete and nothing can follow, or the budget is
// used, the rest is EOS then pad. Because every kept state is within reach of acceptance in the
// positions left, the committed text of the last canvas is always a whole member of the language.
//
// The budget: at most budgetTokens text tokens, then EOS (unless the budget is used up). A language
// whose shortest member needs more tokens than the budget is refused up front.
//
// The automaton is determinized as the request goes, so filterAccepted and commitCanvas may throw
// the InputError of ByteAutomaton's state bound; the request then fails as a bad constraint.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/serve/constrain/TokenConstraint.h"

namespace dgemma::serve {

class ConstraintState {
 public:
  // Throws InputError "the constraint needs at least N tokens, but the budget is B" when no member
  // fits the budget, or "no text of the tokenizer's tokens satisfies the constraint".
  ConstraintState(std::shared_ptr<const TokenConstraint> constraint, int64_t budgetTokens);

  // Before a canvas of `length` positions starts.
  void beginCanvas(int64_t length);
  // Denoising-pass filter: `candidates` are the positions the entropy rule accepted, lowest entropy
  // first, `tokens` the sampled canvas. Returns the candidates kept, in the same order: each keeps
  // the canvas completable with the kept ones fixed and all other positions free. Positions kept by
  // an earlier pass of this canvas stay fixed to the tokens they were kept with (a candidate that
  // repeats one is kept again when its token is the same). Positions not kept are to be renoised
  // by the caller.
  std::vector<int64_t> filterAccepted(std::span<const int64_t> tokens, std::span<const int64_t> candidates);
  // Rewrites `tokens` into a canvas that keeps the text valid (see the commit repair above), taking
  // `alternative[l]` (may be empty) as the second choice at each position. Advances past the canvas.
  // Returns true when the canvas ends the request (EOS placed or budget used).
  bool commitCanvas(std::span<int64_t> tokens, std::span<const int64_t> alternative);
  // The committed text is a whole member of the language.
  bool complete() const;

  bool finished() const { return finished_; }
  bool ended() const { return ended_; }  // EOS committed
  int32_t automatonState() const { return state_; }  // after the committed text
  int64_t committedPositions() const { return committed_; }
  int64_t budgetTokens() const { return budget_; }
  const TokenConstraint& constraint() const { return *constraint_; }

 private:
  static constexpr int32_t kEnded = -1;  // in a reachable set: EOS placed

  // The reachable set after canvas position `l` from the set before it; `fixed` is the position's
  // token, or -1 for a wildcard.
  std::vector<int32_t> advance(const std::vector<int32_t>& before, int64_t l, int64_t fixed) const;
  void checkLength(size_t size, const char* what) const;

  std::shared_ptr<const TokenConstraint> constraint_;
  int64_t budget_ = 0;
  int64_t committed_ = 0;  // canvas positions committed so far
  int64_t canvasLength_ = 0;
  std::vector<int64_t> keptTokens_;  // per position of the current canvas: its kept token, or -1
  int32_t state_ = 0;
  bool ended_ = false;     // EOS committed
  bool finished_ = false;  // the request is over
};

}  // namespace dgemma::serve
