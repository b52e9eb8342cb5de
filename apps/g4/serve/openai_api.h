// The OpenAI-compatible request and response shapes of g4 serve (docs/DESIGN.md §8): a request
// body checked field by field (a bad field is an ApiError naming it, HTTP 400), and the JSON of
// completions, stream chunks and errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/sampler.h"
#include "tokenizer/chat_template.h"

namespace g4::serve {

// An answer other than success: HTTP status, OpenAI error type, the offending field (or empty).
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;
  std::string param, type;
};
// {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_json(const ApiError& error);

enum class Endpoint { kChat, kCompletion };  // /v1/chat/completions, /v1/completions

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<ChatMessage> messages;  // chat: system/developer → "system", assistant → "model"
  std::string prompt;                 // completion: raw text
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens, >= 1
  std::vector<std::string> stop;      // non-empty strings
  bool stream = false, include_usage = false;
};

// Parses and checks a request body; throws ApiError (400) naming the first bad field. Sampling
// values are checked by Sampler, the one place that knows their ranges.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint);

// The request's sampling: its own values, else `defaults` (the server's, from the model's
// generation config). Without a seed, `random_seed` draws a fresh one per request.
Sampler request_sampler(const CompletionRequest& request, const Sampler& defaults, bool random_seed);

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
// The whole answer: chat.completion or text_completion.
nlohmann::json completion_json(const ResponseHeader& header, const std::string& text, const std::string& finish_reason,
                               const Usage& usage);
// One stream chunk: `text` as delta.content (chat) or text; finish_reason null when empty. The
// first chat chunk (role) and the usage chunk (no choices) have their own makers.
nlohmann::json chunk_json(const ResponseHeader& header, const std::string& text, const std::string& finish_reason);
nlohmann::json role_chunk_json(const ResponseHeader& header);
nlohmann::json usage_chunk_json(const ResponseHeader& header, const Usage& usage);

}  // namespace g4::serve
