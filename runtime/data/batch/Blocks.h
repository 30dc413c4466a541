// Multi-block splitting and collation (docs/data.md, "Blocks", "Collated batch"): a tokenized row
// becomes one training item per 256-token block of its completion, with only the earlier, clean
// blocks appended to the encoder context; items collate into the batch tensors of the forward/train
// contract (left-padded prompts, right-padded canvases). Nothing is ever truncated.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/HostTensor.h"

namespace dgemma {

// One row after tokenization: the rendered prompt and the EOS-terminated completion.
struct TokenizedRow {
  std::string where;  // "FILE:LINE" for messages
  std::vector<int64_t> promptIds;
  std::vector<int64_t> promptTokenTypes;  // mm_token_type_ids: 1 on image soft tokens
  std::vector<int64_t> completionIds;     // ends with EOS
};

struct BlockItem {
  std::string where;
  int64_t block = 0;                     // k: this item's block of the completion
  std::vector<int64_t> inputIds;         // prompt ⊕ completion[0 : k·C]
  std::vector<int64_t> tokenTypes;       // prompt types ⊕ zeros(k·C)
  std::vector<int64_t> canvasIds;        // completion[k·C : (k+1)·C], 1..C tokens
};

// ceil(|completion| / C) items, k = 0, 1, .... Throws InputError "WHERE: completion: block K needs
// an encoder context of N tokens, more than max_encoder_length M (dgemma never truncates)" when
// any item's encoder context is too long, and for an empty completion (no EOS).
std::vector<BlockItem> splitIntoBlocks(const TokenizedRow& row, int64_t canvasLength, int64_t maxEncoderLength);

struct CollateOptions {
  int64_t canvasLength = 256;
  int64_t padToMultipleOf = 1;  // P rounds up to it; must divide canvasLength
  int64_t padId = 0;
  // Megatron Bridge pads the canvas with the pad id and does not score it (default). Google's
  // recipe fills it with EOS and scores the fill: set this to the EOS id.
  std::optional<int64_t> scoredCanvasFill;
};

// The names of the collated batch's fields: the model's (its adapter's ModelContract,
// runtime/model/ModelAdapter.h).
struct CollatedFieldNames {
  std::string inputIds, attentionMask, positionIds, tokenTypeIds, canvasIds, canvasMask;
};

// The batch fields of docs/data.md, "Collated batch", under `names`: the prompt's ids, attention
// mask, position ids and token types [B, P] i64; the canvas ids [B, C] i64 and canvas mask [B, C]
// f32. Throws InputError for a violated precondition (naming the item).
std::map<std::string, HostTensor> collate(const std::vector<const BlockItem*>& items, const CollateOptions& options,
                                          const CollatedFieldNames& names);

}  // namespace dgemma
