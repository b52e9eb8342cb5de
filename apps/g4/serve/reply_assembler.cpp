#include "serve/reply_assembler.h"

#include <cstdio>
#include <optional>
#include <random>
#include <span>

namespace g4::serve {

namespace {

// "call_" and 16 random hex digits.
std::string tool_call_id() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  char id[32];
  std::snprintf(id, sizeof id, "call_%016llx", static_cast<unsigned long long>(random()));
  return id;
}

}  // namespace

ReplyAssembler::ReplyAssembler(const Tokenizer& tokenizer, const CompletionRequest& request)
    : tokenizer_(tokenizer),
      text_(tokenizer, request.stop,
            request.endpoint == Endpoint::kChat
                ? std::optional<OutputParserOptions>(OutputParserOptions{.parse_tool_calls = request.parse_tool_calls})
                : std::nullopt) {}

ReplyPart ReplyAssembler::push(const SequenceEvent& event) {
  ReplyPart part = convert(text_.push(event.drawn.token));
  if (event.logprobs) part.logprobs.push_back(token_logprob(event.drawn.token, *event.logprobs));
  return part;
}

ReplyPart ReplyAssembler::finish() { return convert(text_.finish()); }

ReplyPart ReplyAssembler::convert(ParsedOutput parsed) {
  ReplyPart part;
  part.content = std::move(parsed.content);
  part.reasoning = std::move(parsed.reasoning);
  for (const ParsedToolCall& call : parsed.tool_calls)
    part.tool_calls.push_back({calls_++, tool_call_id(), call.name,
                               call.arguments.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
  return part;
}

std::string ReplyAssembler::text_of(int32_t id, std::vector<uint8_t>& bytes) const {
  std::string raw;
  tokenizer_.append_token_bytes(id, /*skip_special=*/false, raw);
  bytes.assign(raw.begin(), raw.end());
  return tokenizer_.decode(std::span(&id, 1));
}

TokenLogprob ReplyAssembler::token_logprob(int32_t token, const TokenLogprobs& logprobs) {
  TokenLogprob out;
  out.token = text_of(token, out.bytes);
  out.logprob = logprobs.logprob;
  out.text_offset = text_offset_;
  text_offset_ += out.token.size();
  for (const auto& [id, logprob] : logprobs.top) {
    out.top_bytes.emplace_back();
    out.top.emplace_back(text_of(id, out.top_bytes.back()), logprob);
  }
  return out;
}

}  // namespace g4::serve
