// The OpenAI-compatible request and response shapes of g4 serve (docs/DESIGN.md §8): a request
// body checked field by field (a bad field is an ApiError naming it, HTTP 400), and the JSON of
// completions, stream chunks and errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/logit_penalties.h"
#include "sampling/sampler.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace g4::serve {

// The HTTP status of each error kind: the one place that maps them (docs/DESIGN.md §8).
int http_status(ErrorKind kind);
// The OpenAI error type of each kind: "invalid_request_error", "rate_limit_error" or "server_error".
const char* openai_error_type(ErrorKind kind);

// An answer other than success: a g4::Error (its kind gives the HTTP status and OpenAI error
// type) with the offending field (or empty) and a machine-readable code (or empty).
struct ApiError : Error {
  ApiError(ErrorKind kind, const std::string& message, std::string param = {}, std::string code = {})
      : Error(kind, message), status(http_status(kind)), param(std::move(param)), code(std::move(code)) {}
  explicit ApiError(const Error& error) : ApiError(error.kind(), error.what()) {}
  int status;
  std::string param, code;
};
// {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_json(const ApiError& error);

enum class Endpoint { kChat, kCompletion };  // /v1/chat/completions, /v1/completions

// One prompt of /v1/completions: text (encoded with the server's BOS) or token ids (used as given).
struct CompletionPrompt {
  std::string text;
  std::optional<std::vector<int32_t>> ids;
};
// The most prompts one /v1/completions request holds, and the most choices (prompts × n) one
// request asks for: each choice is a sequence of its own.
inline constexpr size_t kMaxPrompts = 128;
inline constexpr int64_t kMaxChoices = 128;

// What the reply must be, enforced by constrained decoding (docs/DESIGN.md §4 "Constrained
// decoding", §8): JSON valid against a schema (response_format), or tool calls (tool_choice
// "required": of any declared function; a named function: of that one).
struct ReplyConstraint {
  enum class Kind { kNone, kJson, kToolCalls };
  Kind kind = Kind::kNone;
  std::string schema;    // kJson: the JSON Schema (json_object: {"type":"object"})
  std::string function;  // kToolCalls: the function tool_choice names; empty: any declared one
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::optional<std::string> model;   // the model asked for, when named
  // chat: the messages as the template takes them (OpenAI `tool` messages become the
  // tool_responses of the assistant message whose calls they answer), tools and thinking.
  std::vector<ChatMessage> messages;
  ChatOptions chat;
  bool parse_tool_calls = false;      // tools declared and tool_choice is not "none"
  ReplyConstraint constraint;         // response_format, or tool_choice "required" or named
  // completion: the prompts ("prompt": a string, a list of strings, token ids or lists of token
  // ids), one choice each, in order; with echo, each choice's text starts with its prompt's.
  std::vector<CompletionPrompt> prompts;
  bool echo = false;
  // Choices per prompt ("n"): prompt i's choice j is choice i · n + j. Choice 0 samples with the
  // request's seed, choice j > 0 with choice_seed(seed, j), so each choice is reproducible alone.
  int64_t n = 1;
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens, >= 1
  std::vector<std::string> stop;      // non-empty strings
  LogitPenalties penalties;           // logit_bias, presence/frequency/repetition_penalty
  bool stream = false, include_usage = false;
  // -1: no logprobs; else each token's log-probability and this many alternatives (chat:
  // logprobs + top_logprobs; completions: logprobs N).
  int32_t top_logprobs = -1;
};

// Parses and checks a request body; throws ApiError (400) naming the first bad field. Sampling
// values are checked by Sampler, the one place that knows their ranges.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint);

// The request's sampling: its own values, else `defaults` (the server's, from the model's
// generation config). Without a seed, `random_seed` draws a fresh one per request.
Sampler request_sampler(const CompletionRequest& request, const Sampler& defaults, bool random_seed);

// An OpenAI tool call of the reply: an id, the function's name and its arguments as a JSON string.
struct ReplyToolCall {
  size_t index = 0;  // its place among the reply's calls
  std::string id, name, arguments;
};
// One generated token's log-probabilities as the response shows them.
struct TokenLogprob {
  std::string token;            // its text (U+FFFD for a byte that is part of a character)
  std::vector<uint8_t> bytes;   // its bytes
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // (text, logprob), most likely first
  std::vector<std::vector<uint8_t>> top_bytes;
  size_t text_offset = 0;       // where its text starts in the reply's tokens' text (completions)
};
// A piece of the reply: what one chunk carries, or (summed) the whole answer.
struct ReplyPart {
  std::string content, reasoning;
  std::vector<ReplyToolCall> tool_calls;
  std::vector<TokenLogprob> logprobs;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty(); }
  void append(ReplyPart other);
};

// Where a response's fixed fields come from.
struct ResponseHeader {
  std::string id, model;
  int64_t created = 0;
  Endpoint endpoint = Endpoint::kChat;
};
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& usage);
// The whole answer: chat.completion (message with content, reasoning_content, tool_calls) or
// text_completion; logprobs when `with_logprobs`.
// One choice of a whole answer.
struct ChoiceReply {
  ReplyPart reply;
  std::string finish_reason;
};
nlohmann::json completion_json(const ResponseHeader& header, std::span<const ChoiceReply> choices, const Usage& usage,
                               bool with_logprobs);
// One stream chunk of choice `index`: the part as delta (chat) or text; finish_reason null when
// empty. The first chat chunk (role) and the usage chunk (no choices) have their own makers.
nlohmann::json chunk_json(const ResponseHeader& header, const ReplyPart& part, const std::string& finish_reason,
                          bool with_logprobs, size_t index = 0);
nlohmann::json role_chunk_json(const ResponseHeader& header, size_t index);
nlohmann::json usage_chunk_json(const ResponseHeader& header, const Usage& usage);

}  // namespace g4::serve
