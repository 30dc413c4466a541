#include "runtime/data/batch/Blocks.h"

#include <algorithm>

#include "support/Error.h"

namespace dgemma {

std::vector<BlockItem> splitIntoBlocks(const TokenizedRow& row, int64_t canvasLength, int64_t maxEncoderLength) {
  if (canvasLength < 1) throw InputError("canvas_length: expected a positive integer, got " + std::to_string(canvasLength));
  if (row.promptIds.size() != row.promptTokenTypes.size())
    throw InputError(row.where + ": mm_token_type_ids: expected one type per prompt token");
  if (row.completionIds.empty())
    throw InputError(row.where + ": completion: expected at least the EOS token after tokenization");
  const int64_t completion = static_cast<int64_t>(row.completionIds.size());
  const int64_t prompt = static_cast<int64_t>(row.promptIds.size());
  std::vector<BlockItem> items;
  for (int64_t k = 0; k * canvasLength < completion; ++k) {
    const int64_t start = k * canvasLength, end = std::min(completion, start + canvasLength);
    const int64_t context = prompt + start;
    if (context > maxEncoderLength)
      throw InputError(row.where + ": completion: block " + std::to_string(k) + " needs an encoder context of " +
                       std::to_string(context) + " tokens, more than max_encoder_length " + std::to_string(maxEncoderLength) +
                       " (dgemma never truncates)");
    BlockItem item;
    item.where = row.where;
    item.block = k;
    item.inputIds = row.promptIds;
    item.inputIds.insert(item.inputIds.end(), row.completionIds.begin(), row.completionIds.begin() + start);
    item.tokenTypes = row.promptTokenTypes;
    item.tokenTypes.resize(context, 0);
    item.canvasIds.assign(row.completionIds.begin() + start, row.completionIds.begin() + end);
    items.push_back(std::move(item));
  }
  return items;
}

std::map<std::string, HostTensor> collate(const std::vector<const BlockItem*>& items, const CollateOptions& options,
                                          const CollatedFieldNames& names) {
  if (items.empty()) throw InputError("collate: expected at least one item");
  const int64_t canvas = options.canvasLength, multiple = options.padToMultipleOf;
  if (multiple < 1 || canvas % multiple != 0)
    throw InputError("pad_to_multiple_of: expected a positive divisor of canvas_length " + std::to_string(canvas) + ", got " +
                     std::to_string(multiple));
  int64_t longest = 0;
  for (const BlockItem* item : items) {
    const int64_t length = static_cast<int64_t>(item->canvasIds.size());
    if (length < 1 || length > canvas)
      throw InputError(item->where + ": block " + std::to_string(item->block) + ": expected a canvas of 1.." +
                       std::to_string(canvas) + " tokens, got " + std::to_string(length));
    longest = std::max<int64_t>(longest, item->inputIds.size());
  }
  const int64_t batch = static_cast<int64_t>(items.size());
  const int64_t width = (longest + multiple - 1) / multiple * multiple;

  std::map<std::string, HostTensor> fields;
  HostTensor& inputIds = fields[names.inputIds] = HostTensor(DType::I64, {batch, width});
  HostTensor& attentionMask = fields[names.attentionMask] = HostTensor(DType::I64, {batch, width});
  HostTensor& positionIds = fields[names.positionIds] = HostTensor(DType::I64, {batch, width});
  HostTensor& tokenTypes = fields[names.tokenTypeIds] = HostTensor(DType::I64, {batch, width});
  HostTensor& canvasIds = fields[names.canvasIds] = HostTensor(DType::I64, {batch, canvas});
  HostTensor& canvasMask = fields[names.canvasMask] = HostTensor(DType::F32, {batch, canvas});
  const int64_t canvasFill = options.scoredCanvasFill.value_or(options.padId);
  for (int64_t b = 0; b < batch; ++b) {
    const BlockItem& item = *items[b];
    const int64_t length = static_cast<int64_t>(item.inputIds.size()), padding = width - length;
    for (int64_t p = 0; p < width; ++p) {
      const bool real = p >= padding;  // left padding: the prompt is right-aligned
      inputIds.as<int64_t>()[b * width + p] = real ? item.inputIds[p - padding] : options.padId;
      attentionMask.as<int64_t>()[b * width + p] = real;
      positionIds.as<int64_t>()[b * width + p] = p;  // padding occupies positions
      tokenTypes.as<int64_t>()[b * width + p] = real ? item.tokenTypes[p - padding] : 0;
    }
    const int64_t targets = static_cast<int64_t>(item.canvasIds.size());
    for (int64_t c = 0; c < canvas; ++c) {
      const bool real = c < targets;
      canvasIds.as<int64_t>()[b * canvas + c] = real ? item.canvasIds[c] : canvasFill;
      canvasMask.as<float>()[b * canvas + c] = real || options.scoredCanvasFill ? 1.0f : 0.0f;
    }
  }
  return fields;
}

}  // namespace dgemma
