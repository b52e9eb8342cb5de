// One request's generated tokens turned into the parts of an OpenAI reply (docs/DESIGN.md §8):
// text through ReplyText (whole UTF-8, the output parser for chat, stop strings), parsed calls with
// ids and their arguments as a JSON string, log-probabilities with each token's text and bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "serve/openai_api.h"
#include "serve/reply_text.h"
#include "tokenizer/tokenizer.h"

namespace g4::serve {

class ReplyAssembler {
 public:
  // `tokenizer` must outlive the assembler.
  ReplyAssembler(const Tokenizer& tokenizer, const CompletionRequest& request);

  // A generated token (not a stop token): what became safe to send, with its log-probabilities.
  ReplyPart push(const SequenceEvent& event);
  // The generation ended: whatever was held back.
  ReplyPart finish();
  bool stopped() const { return text_.stopped(); }  // a stop string ended the content
  bool made_tool_calls() const { return calls_ > 0; }

 private:
  ReplyPart convert(ParsedOutput parsed);
  TokenLogprob token_logprob(int32_t token, const TokenLogprobs& logprobs);
  std::string text_of(int32_t id, std::vector<uint8_t>& bytes) const;

  const Tokenizer& tokenizer_;
  ReplyText text_;
  size_t calls_ = 0, text_offset_ = 0;
};

}  // namespace g4::serve
