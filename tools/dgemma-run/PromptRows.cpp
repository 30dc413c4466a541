#include "tools/dgemma-run/PromptRows.h"

#include <optional>
#include <variant>

#include "support/Error.h"

namespace dgemma::tool {

namespace {

// The reason the plan cannot run the messages (where: "FILE:LINE"), or nothing; fills `ids`.
std::optional<std::string> tokenizePrompt(const std::vector<Message>& messages, const Tokenizer& tokenizer,
                                          const PromptLimits& limits, const std::string& where, std::vector<int64_t>& ids) {
  for (const Message& message : messages)
    for (const ContentPart& part : message.content)
      if (part.kind == ContentPart::Image)
        return where + ": images: the plan is text-only until the vision tower is built";
  const TokenizedPrompt prompt = renderGemma4Prompt(tokenizer, messages, {});
  checkTokenIds(prompt.inputIds, limits.vocabSize, where + ": messages");
  ids.assign(prompt.inputIds.begin(), prompt.inputIds.end());
  if (static_cast<int64_t>(ids.size()) > limits.maxPromptLength)
    return where + ": messages: the prompt has " + std::to_string(ids.size()) + " tokens; the plan's largest prefill bucket holds " +
           std::to_string(limits.maxPromptLength) + " (dgemma-compile --prompt-len)";
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
    if (std::optional<std::string> problem = tokenizePrompt(row.messages, tokenizer, limits, prompt.where, prompt.promptIds)) {
      if (!skipUnrunnable) throw InputError(*problem + " (--skip-bad-rows skips such rows)");
      prompts.skipped.push_back(*problem);
      continue;
    }
    prompts.rows.push_back(std::move(prompt));
  }
  return prompts;
}

PromptRow promptFromText(const std::string& text, const Tokenizer& tokenizer, const PromptLimits& limits) {
  Message message;
  message.role = Message::User;
  message.content.push_back(ContentPart{ContentPart::Text, text, ""});
  PromptRow prompt;
  prompt.where = "--prompt";
  if (std::optional<std::string> problem = tokenizePrompt({message}, tokenizer, limits, prompt.where, prompt.promptIds))
    throw InputError(*problem);
  return prompt;
}

}  // namespace dgemma::tool
