#include "tools/dgemma-run/PromptRows.h"

#include <optional>
#include <variant>

#include "support/Error.h"

namespace dgemma::tool {

namespace {

// Why a prompt cannot run: the plan cannot take it, or it is malformed (an image that does not decode).
struct Unrunnable {
  std::string reason;
  bool malformed = false;
};

// Tokenizes `messages` into `prompt` (where: "FILE:LINE"), its images decoded and processed; the
// reason it cannot run, or nothing.
std::optional<Unrunnable> tokenizePrompt(const std::vector<Message>& messages, const Tokenizer& tokenizer,
                                         const PromptLimits& limits, const std::string& where, PromptRow& prompt) {
  std::vector<std::string> imagePaths;
  for (const Message& message : messages)
    for (const ContentPart& part : message.content)
      if (part.kind == ContentPart::Image) imagePaths.push_back(part.imagePath);
  const int64_t images = static_cast<int64_t>(imagePaths.size());
  if (images > 0 && limits.imagesPerExample == 0)
    return Unrunnable{where + ": images: the plan is text-only; a prompt with " + std::to_string(images) +
                      " image(s) needs a plan compiled with dgemma-compile --images-per-example " + std::to_string(images)};
  if (images > 0 && images != limits.imagesPerExample)
    return Unrunnable{where + ": images: expected " + std::to_string(limits.imagesPerExample) +
                      " images per prompt (the plan's images_per_example) or none, got " + std::to_string(images)};
  std::vector<int64_t> softTokens;
  for (const std::string& path : imagePaths) {
    ProcessedImage image;
    try {
      image = processGemma4Image(decodeImage(path), limits.image);
    } catch (const InputError& error) {
      return Unrunnable{where + ": images: expected a decodable image: " + error.what(), true};
    }
    softTokens.push_back(image.numSoftTokens);
    prompt.images.push_back(std::move(image));
  }
  const TokenizedPrompt tokenized = renderGemma4Prompt(tokenizer, messages, softTokens);
  checkTokenIds(tokenized.inputIds, limits.vocabSize, where + ": messages");
  prompt.promptIds.assign(tokenized.inputIds.begin(), tokenized.inputIds.end());
  prompt.promptTokenTypes.assign(tokenized.mmTokenTypeIds.begin(), tokenized.mmTokenTypeIds.end());
  if (images == 0) prompt.promptTokenTypes.clear();  // a text prompt carries none
  if (static_cast<int64_t>(prompt.promptIds.size()) > limits.maxPromptLength)
    return Unrunnable{where + ": messages: the prompt has " + std::to_string(prompt.promptIds.size()) +
                      " tokens; the plan's largest prefill bucket holds " + std::to_string(limits.maxPromptLength) +
                      " (dgemma-compile --prompt-len)"};
  return std::nullopt;
}

}  // namespace

PromptRows readPromptRows(const std::string& path, const Tokenizer& tokenizer, const PromptLimits& limits,
                          bool requireCompletion, bool skipMalformed, bool skipUnrunnable) {
  JsonlReaderOptions options;
  options.requireCompletion = requireCompletion;
  JsonlRowReader reader(options);
  reader.open(path);
  PromptRows prompts;
  while (std::optional<JsonlRowReader::Result> result = reader.next()) {
    const int64_t id = prompts.total++;
    if (const RowError* error = std::get_if<RowError>(&*result)) {
      if (!skipMalformed) throw InputError(error->text() + " (--skip-bad-rows skips such rows)");
      prompts.skipped.push_back(error->text());
      continue;
    }
    const Row& row = std::get<Row>(*result);
    PromptRow prompt;
    prompt.id = id;
    prompt.where = path + ":" + std::to_string(row.line);
    prompt.completion = row.completion;
    prompt.hasCompletion = row.hasCompletion;
    prompt.reference = row.reference;
    for (const Message& message : row.messages)
      for (const ContentPart& part : message.content)
        if (part.kind == ContentPart::Text) prompt.text += (prompt.text.empty() ? "" : "\n") + part.text;
    if (std::optional<Unrunnable> problem = tokenizePrompt(row.messages, tokenizer, limits, prompt.where, prompt)) {
      if (!(problem->malformed ? skipMalformed : skipUnrunnable))
        throw InputError(problem->reason + " (--skip-bad-rows skips such rows)");
      prompts.skipped.push_back(problem->reason);
      continue;
    }
    prompts.rows.push_back(std::move(prompt));
  }
  return prompts;
}

PromptRow promptFromText(const std::string& text, const std::vector<std::string>& imagePaths, const Tokenizer& tokenizer,
                         const PromptLimits& limits) {
  Message message;
  message.role = Message::User;
  for (const std::string& path : imagePaths) message.content.push_back(ContentPart{ContentPart::Image, "", path});
  message.content.push_back(ContentPart{ContentPart::Text, text, ""});
  message.contentIsList = !imagePaths.empty();
  PromptRow prompt;
  prompt.where = imagePaths.empty() ? "--prompt" : "--prompt/--image";
  if (std::optional<Unrunnable> problem = tokenizePrompt({message}, tokenizer, limits, prompt.where, prompt)) throw InputError(problem->reason);
  return prompt;
}

}  // namespace dgemma::tool
