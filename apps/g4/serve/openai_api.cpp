#include "serve/openai_api.h"

#include <limits>
#include <random>

#include "util/error.h"

namespace g4::serve {

using nlohmann::json;

namespace {

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

float number_field(const json& body, const char* name) {
  const json& v = body.at(name);
  if (!v.is_number()) throw bad(name, std::string("'") + name + "' must be a number");
  return v.get<float>();
}

int64_t integer_field(const json& body, const char* name) {
  const json& v = body.at(name);
  if (!v.is_number_integer()) throw bad(name, std::string("'") + name + "' must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw bad(name, std::string("'") + name + "' is too large");
  return v.get<int64_t>();
}

bool bool_field(const json& body, const char* name) {
  const json& v = body.at(name);
  if (!v.is_boolean()) throw bad(name, std::string("'") + name + "' must be true or false");
  return v.get<bool>();
}

// Checks one sampling value on its own with Sampler (the others at their valid defaults), so that
// its error names this field.
void check_sampling(const char* name, const SamplingParams& params) {
  try {
    Sampler{params};
  } catch (const Error& e) {
    throw bad(name, e.what());
  }
}

std::vector<ChatMessage> parse_messages(const json& body) {
  if (!body.contains("messages")) throw bad("messages", "'messages' is required");
  const json& list = body["messages"];
  if (!list.is_array() || list.empty()) throw bad("messages", "'messages' must be a non-empty array of messages");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const json& m = list[i];
    if (!m.is_object()) throw bad(at, at + " must be an object with 'role' and 'content'");
    if (!m.contains("role") || !m["role"].is_string()) throw bad(at + ".role", at + ".role must be a string");
    const std::string role = m["role"].get<std::string>();
    std::string gemma_role;
    if (role == "system" || role == "developer") gemma_role = "system";
    else if (role == "user") gemma_role = "user";
    else if (role == "assistant") gemma_role = "model";
    else
      throw bad(at + ".role", at + ".role '" + role + "' is not supported (system, developer, user or assistant)");
    if (!m.contains("content") || !m["content"].is_string())
      throw bad(at + ".content", at + ".content must be a string");
    messages.push_back({gemma_role, m["content"].get<std::string>()});
  }
  return messages;
}

std::vector<std::string> parse_stop(const json& v) {
  std::vector<std::string> stops;
  if (v.is_null()) return stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& s : v) {
      if (!s.is_string()) throw bad("stop", "'stop' must be a string or an array of strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    throw bad("stop", "'stop' must be a string or an array of strings");
  }
  for (const std::string& s : stops)
    if (s.empty()) throw bad("stop", "'stop' strings must not be empty");
  return stops;
}

}  // namespace

json error_json(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", nullptr}}}};
}

CompletionRequest parse_completion_request(std::string_view body_text, Endpoint endpoint) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {
    throw bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw bad("", "the request body must be a JSON object");
  auto given = [&](const char* name) { return body.contains(name) && !body[name].is_null(); };

  CompletionRequest r;
  r.endpoint = endpoint;
  if (endpoint == Endpoint::kChat) {
    r.messages = parse_messages(body);
  } else {
    if (!given("prompt") || !body["prompt"].is_string()) throw bad("prompt", "'prompt' must be a string");
    r.prompt = body["prompt"].get<std::string>();
    if (r.prompt.empty()) throw bad("prompt", "'prompt' must not be empty");
  }
  if (given("temperature")) {
    r.temperature = number_field(body, "temperature");
    check_sampling("temperature", {.temperature = *r.temperature});
  }
  if (given("top_p")) {
    r.top_p = number_field(body, "top_p");
    check_sampling("top_p", {.top_p = *r.top_p});
  }
  if (given("min_p")) {
    r.min_p = number_field(body, "min_p");
    check_sampling("min_p", {.min_p = *r.min_p});
  }
  if (given("top_k")) {
    const int64_t k = integer_field(body, "top_k");
    if (k > std::numeric_limits<int32_t>::max()) throw bad("top_k", "'top_k' is too large");
    r.top_k = int32_t(std::max<int64_t>(k, std::numeric_limits<int32_t>::min()));
    check_sampling("top_k", {.top_k = *r.top_k});
  }
  if (given("seed")) {
    const json& v = body["seed"];
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      throw bad("seed", "'seed' must be an integer in [0, 2^64)");
    r.seed = v.get<uint64_t>();
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (!given(name)) continue;
    r.max_tokens = integer_field(body, name);
    if (*r.max_tokens < 1) throw bad(name, std::string("'") + name + "' must be >= 1");
  }
  if (given("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1))
    throw bad("n", "'n' must be 1 (one choice per request)");
  if (body.contains("stop")) r.stop = parse_stop(body["stop"]);
  if (given("stream")) r.stream = bool_field(body, "stream");
  if (given("stream_options")) {
    const json& o = body["stream_options"];
    if (!o.is_object()) throw bad("stream_options", "'stream_options' must be an object");
    if (o.contains("include_usage") && !o["include_usage"].is_null()) {
      if (!o["include_usage"].is_boolean())
        throw bad("stream_options.include_usage", "'stream_options.include_usage' must be true or false");
      r.include_usage = o["include_usage"].get<bool>();
    }
  }
  return r;
}

Sampler request_sampler(const CompletionRequest& r, const Sampler& defaults, bool random_seed) {
  SamplingParams p = defaults.params();
  if (r.temperature) p.temperature = *r.temperature;
  if (r.top_p) p.top_p = *r.top_p;
  if (r.min_p) p.min_p = *r.min_p;
  if (r.top_k) p.top_k = *r.top_k;
  if (r.seed) {
    p.seed = *r.seed;
  } else if (random_seed) {
    thread_local std::mt19937_64 random{std::random_device{}()};
    p.seed = random();
  }
  try {
    return Sampler(p);
  } catch (const Error& e) {
    throw bad("", e.what());  // each value passed alone; only a combination can fail here
  }
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {

json envelope(const ResponseHeader& h, bool chunk) {
  const char* object = h.endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                     : "text_completion";
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

json finish(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

}  // namespace

json completion_json(const ResponseHeader& h, const std::string& text, const std::string& finish_reason,
                     const Usage& usage) {
  json out = envelope(h, false);
  json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (h.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(usage);
  return out;
}

json chunk_json(const ResponseHeader& h, const std::string& text, const std::string& finish_reason) {
  json out = envelope(h, true);
  json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}};
  if (h.endpoint == Endpoint::kChat) {
    choice["delta"] = finish_reason.empty() || !text.empty() ? json{{"content", text}} : json::object();
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  out["choices"] = json::array({choice});
  return out;
}

json role_chunk_json(const ResponseHeader& h) {
  json out = envelope(h, true);
  out["choices"] = json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}});
  return out;
}

json usage_chunk_json(const ResponseHeader& h, const Usage& usage) {
  json out = envelope(h, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace g4::serve
