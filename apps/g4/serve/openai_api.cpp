#include "serve/openai_api.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "sampling/logprobs.h"
#include "sampling/sampling_settings.h"
#include "util/error.h"

namespace g4::serve {

using nlohmann::json;

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError(ErrorKind::kInvalidArgument, message, param);
}

// Request JSON nests at most this deep. Values are copied and rendered recursively, so a body of a
// few megabytes of '[' (within the body limit) could otherwise exhaust a handler thread's stack.
constexpr int kMaxJsonDepth = 64;
// Objects and arrays in one request body. A parsed container costs ~100 bytes, so a body of the
// size limit made of "{}," (2.8 million of them) would take a few hundred MB and a second to hold.
constexpr size_t kMaxJsonContainers = size_t(1) << 18;

// Counts a request may hold (each a 400 naming it beyond): far above any conversation that fits a
// context, low enough that a request's own bookkeeping stays small.
constexpr size_t kMaxMessages = 8192, kMaxTools = 512, kMaxContentParts = 1024;

// Why `text` is refused before it is parsed, or "" when it is not: it nests deeper than
// kMaxJsonDepth or holds more than kMaxJsonContainers objects and arrays. One pass over the bytes,
// brackets inside strings skipped; text that is not JSON may pass (the parser then refuses it).
std::string shape_refusal(std::string_view text) {
  int depth = 0;
  size_t containers = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      if (++containers > kMaxJsonContainers)
        return "holds more than " + std::to_string(kMaxJsonContainers) + " objects and arrays";
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return "";
}

// `text` as JSON, or a discarded value with *refused saying why (shape_refusal). The shape is
// checked in one pass before one plain parse: nlohmann's parser is iterative and linear, while its
// callback form (the other way to bound depth) rescans a container each time a child ends, which is
// quadratic in the values of an array. Throws json::exception on invalid JSON when allow_exceptions,
// else returns a discarded value.
json parse_bounded(std::string_view text, bool allow_exceptions, std::string* refused) {
  *refused = shape_refusal(text);
  if (!refused->empty()) return json(json::value_t::discarded);
  return json::parse(text, nullptr, allow_exceptions);
}

// JSON text inside a request (tool arguments, a tool's response): the value it encodes, or
// discarded when it is not JSON or is refused by its shape (the caller then keeps it as text).
json decode_embedded_json(const std::string& text) {
  std::string refused;
  return parse_bounded(text, /*allow_exceptions=*/false, &refused);
}

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

// body[object][member] when given (null is absent): the object must be an object, the member a bool.
std::optional<bool> nested_bool(const json& body, const char* object, const char* member) {
  if (!body.contains(object) || body[object].is_null()) return std::nullopt;
  const json& o = body[object];
  if (!o.is_object()) throw bad(object, std::string("'") + object + "' must be an object");
  if (!o.contains(member) || o[member].is_null()) return std::nullopt;
  const std::string name = std::string(object) + "." + member;
  if (!o[member].is_boolean()) throw bad(name, "'" + name + "' must be true or false");
  return o[member].get<bool>();
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

// Content as a string, as text parts ([{"type": "text", "text": …}]) or absent/null (none).
void parse_content(const json& m, const std::string& at, ChatMessage& out) {
  if (!m.contains("content") || m["content"].is_null()) return;
  const json& content = m["content"];
  if (content.is_string()) {
    out.content = content.get<std::string>();
    return;
  }
  const std::string field = at + ".content";
  if (!content.is_array()) throw bad(field, field + " must be a string or an array of text parts");
  if (content.size() > kMaxContentParts)
    throw bad(field, field + " has " + std::to_string(content.size()) + " parts; at most " +
                         std::to_string(kMaxContentParts) + " are accepted");
  std::vector<std::string> parts;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
      throw bad(field, field + " parts must be {\"type\": \"text\", \"text\": string} (only text is supported)");
    parts.push_back(part["text"].get<std::string>());
  }
  out.text_parts = std::move(parts);
}

const json& string_member(const json& object, const char* name, const std::string& at) {
  if (!object.is_object() || !object.contains(name) || !object[name].is_string())
    throw bad(at + "." + name, at + "." + name + " must be a string");
  return object[name];
}

// An assistant's calls; arguments (a JSON string in OpenAI's protocol) are given to the template
// as the object they encode, else as the string they are (docs/DESIGN.md §8).
void parse_tool_calls(const json& m, const std::string& at, ChatMessage& out,
                      std::map<std::string, std::string>& names_by_id) {
  if (!m.contains("tool_calls") || m["tool_calls"].is_null()) return;
  if (!m["tool_calls"].is_array()) throw bad(at + ".tool_calls", at + ".tool_calls must be an array");
  for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
    const std::string call_at = at + ".tool_calls[" + std::to_string(k) + "]";
    const json& call = m["tool_calls"][k];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      throw bad(call_at + ".function", call_at + ".function must be an object with 'name' and 'arguments'");
    const json& function = call["function"];
    ChatToolCall parsed{string_member(function, "name", call_at + ".function").get<std::string>(), json::object()};
    if (function.contains("arguments") && !function["arguments"].is_null()) {
      const json& arguments = function["arguments"];
      if (arguments.is_object()) parsed.arguments = arguments;
      else if (arguments.is_string()) {
        json decoded = decode_embedded_json(arguments.get<std::string>());
        parsed.arguments = decoded.is_object() ? std::move(decoded) : arguments;
      } else {
        throw bad(call_at + ".function.arguments", call_at + ".function.arguments must be a JSON string");
      }
    }
    if (call.contains("id") && call["id"].is_string()) names_by_id[call["id"].get<std::string>()] = parsed.name;
    out.tool_calls.push_back(std::move(parsed));
  }
}

// An OpenAI `tool` message: the response of the call it names, given to the template as a
// tool_response of the assistant message that made the call (content that is JSON as the value it
// encodes, else as text).
ChatToolResponse parse_tool_result(const json& m, const std::string& at,
                                   const std::map<std::string, std::string>& names_by_id) {
  ChatMessage content;
  parse_content(m, at, content);
  std::string text = content.content;
  if (content.text_parts)
    for (const std::string& part : *content.text_parts) text += part;
  ChatToolResponse response{"unknown", json()};
  if (m.contains("tool_call_id") && m["tool_call_id"].is_string())
    if (auto it = names_by_id.find(m["tool_call_id"].get<std::string>()); it != names_by_id.end())
      response.name = it->second;
  if (m.contains("name") && m["name"].is_string()) response.name = m["name"].get<std::string>();
  json decoded = decode_embedded_json(text);
  response.response = decoded.is_discarded() ? json(text) : std::move(decoded);
  return response;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  if (!body.contains("messages")) throw bad("messages", "'messages' is required");
  const json& list = body["messages"];
  if (!list.is_array() || list.empty()) throw bad("messages", "'messages' must be a non-empty array of messages");
  if (list.size() > kMaxMessages)
    throw bad("messages", "'messages' has " + std::to_string(list.size()) + " messages; at most " +
                              std::to_string(kMaxMessages) + " are accepted");
  std::vector<ChatMessage> messages;
  std::map<std::string, std::string> names_by_id;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const json& m = list[i];
    if (!m.is_object()) throw bad(at, at + " must be an object with 'role' and 'content'");
    const std::string role = string_member(m, "role", at).get<std::string>();
    if (role == "tool") {
      if (messages.empty() || messages.back().tool_calls.empty())
        throw bad(at + ".role", at + " is a tool result, but no assistant message with tool_calls comes before it");
      messages.back().tool_responses.push_back(parse_tool_result(m, at, names_by_id));
      continue;
    }
    if (role != "system" && role != "developer" && role != "user" && role != "assistant")
      throw bad(at + ".role", at + ".role '" + role + "' is not supported (system, developer, user, assistant or tool)");
    ChatMessage message;
    message.role = role;
    parse_content(m, at, message);
    if (role == "system" || role == "developer") {  // the template trims a system text whole
      if (message.text_parts)
        for (const std::string& part : *message.text_parts) message.content += part;
      message.text_parts.reset();
    }
    if (role == "assistant") {
      parse_tool_calls(m, at, message, names_by_id);
      if (m.contains("reasoning_content") && !m["reasoning_content"].is_null())
        message.reasoning_content = string_member(m, "reasoning_content", at).get<std::string>();
    }
    if (role != "assistant" && !m.contains("content"))
      throw bad(at + ".content", at + ".content is required");
    messages.push_back(std::move(message));
  }
  return messages;
}

// OpenAI tool definitions: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
json parse_tools(const json& tools) {
  if (!tools.is_array()) throw bad("tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
  if (tools.size() > kMaxTools)
    throw bad("tools", "'tools' has " + std::to_string(tools.size()) + " tools; at most " + std::to_string(kMaxTools) +
                           " are accepted");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const json& tool = tools[i];
    if (!tool.is_object() || tool.value("type", json()) != "function" || !tool.contains("function") ||
        !tool["function"].is_object())
      throw bad(at, at + " must be {\"type\": \"function\", \"function\": {...}}");
    string_member(tool["function"], "name", at + ".function");
    if (tool["function"].contains("parameters") && !tool["function"]["parameters"].is_object() &&
        !tool["function"]["parameters"].is_null())
      throw bad(at + ".function.parameters", at + ".function.parameters must be a JSON Schema object");
  }
  return tools;
}

// "none" keeps calls as text (the call marker banned), "auto" parses them, "required" forces a call
// of a declared function and a named function forces a call of that one (constrained decoding).
// Returns whether calls are parsed.
bool parse_tool_choice(const json& choice, CompletionRequest& r) {
  const char* const shapes =
      "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}";
  if (choice == "none") return false;
  if (choice == "auto") return true;
  std::string name;
  if (choice.is_object()) {
    if (choice.size() != 2 || choice.value("type", json()) != "function" || !choice.contains("function") ||
        !choice["function"].is_object() || choice["function"].size() != 1)
      throw bad("tool_choice", shapes);
    name = string_member(choice["function"], "name", "tool_choice.function").get<std::string>();
  } else if (choice != "required") {
    throw bad("tool_choice", shapes);
  }
  if (r.chat.tools.empty())
    throw bad("tool_choice", "'tool_choice' " + (name.empty() ? std::string("\"required\"") : "naming '" + name + "'") +
                                 " needs 'tools' to choose from");
  if (!name.empty() && std::none_of(r.chat.tools.begin(), r.chat.tools.end(),
                                    [&](const json& tool) { return tool["function"]["name"] == name; }))
    throw bad("tool_choice", "'tool_choice' names the function '" + name + "', which 'tools' does not declare");
  r.constraint = ReplyConstraint{ReplyConstraint::Kind::kToolCalls, {}, name};
  return true;
}

// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema":
// {"name", "schema", "strict", "description"}} (the schema is enforced whether or not strict is set).
ReplyConstraint parse_response_format(const json& format) {
  auto only = [](const json& object, std::initializer_list<const char*> keys, const std::string& at) {
    for (const auto& [key, value] : object.items())
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; }))
        throw ApiError(ErrorKind::kUnsupported, "'" + at + "." + key + "' is not supported by g4 serve", at + "." + key,
                       "unsupported_parameter");
  };
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    throw bad("response_format", "'response_format' must be an object with a 'type': \"text\", \"json_object\" or \"json_schema\"");
  const std::string type = format["type"].get<std::string>();
  if (type == "text" || type == "json_object") {
    only(format, {"type"}, "response_format");
    return type == "text" ? ReplyConstraint{} : ReplyConstraint{ReplyConstraint::Kind::kJson, R"({"type":"object"})", {}};
  }
  if (type != "json_schema")
    throw bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"");
  only(format, {"type", "json_schema"}, "response_format");
  if (!format.contains("json_schema") || !format["json_schema"].is_object())
    throw bad("response_format.json_schema", "'response_format.json_schema' must be an object with 'name' and 'schema'");
  const json& spec = format["json_schema"];
  only(spec, {"name", "schema", "strict", "description"}, "response_format.json_schema");
  string_member(spec, "name", "response_format.json_schema");
  if (spec.contains("strict") && !spec["strict"].is_boolean() && !spec["strict"].is_null())
    throw bad("response_format.json_schema.strict", "'response_format.json_schema.strict' must be true or false");
  if (!spec.contains("schema") || !spec["schema"].is_object())
    throw bad("response_format.json_schema.schema", "'response_format.json_schema.schema' must be a JSON Schema object");
  return ReplyConstraint{ReplyConstraint::Kind::kJson, spec["schema"].dump(), {}};
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

// tools, tool_choice and chat_template_kwargs.enable_thinking (vLLM's convention).
void parse_chat_options(const json& body, CompletionRequest& r) {
  auto given = [&](const char* name) { return body.contains(name) && !body[name].is_null(); };
  if (given("tools")) r.chat.tools = parse_tools(body["tools"]);
  const bool choice_parses = !given("tool_choice") || parse_tool_choice(body["tool_choice"], r);
  r.parse_tool_calls = !r.chat.tools.empty() && choice_parses;
  r.chat.enable_thinking = nested_bool(body, "chat_template_kwargs", "enable_thinking").value_or(false);
}

// Chat: logprobs (bool) and top_logprobs (0..20, needs logprobs); completions: logprobs (0..20).
void parse_logprobs(const json& body, CompletionRequest& r) {
  auto given = [&](const char* name) { return body.contains(name) && !body[name].is_null(); };
  const std::string bound = "[0, " + std::to_string(kMaxTopLogprobs) + "]";
  auto in_range = [&](const char* name) {
    const int64_t n = integer_field(body, name);
    if (n < 0 || n > kMaxTopLogprobs) throw bad(name, std::string("'") + name + "' must be in " + bound);
    return int32_t(n);
  };
  if (r.endpoint == Endpoint::kCompletion) {
    if (given("logprobs")) r.top_logprobs = in_range("logprobs");
    return;
  }
  const bool wanted = given("logprobs") && bool_field(body, "logprobs");
  if (given("top_logprobs")) {
    if (!wanted) throw bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = in_range("top_logprobs");
  } else if (wanted) {
    r.top_logprobs = 0;
  }
}

// logit_bias ({"token id": bias in [-100, 100]}, at most kMaxLogitBias) and the penalties, each
// checked in its range (presence and frequency [-2, 2], repetition (0, 2]) with a 400 naming it.
LogitPenalties parse_penalties(const json& body) {
  LogitPenalties p;
  auto number = [&](const char* name, int lo, int hi, bool lo_open, float fallback) {
    if (!body.contains(name) || body[name].is_null()) return fallback;
    const json& v = body[name];
    if (!v.is_number()) throw bad(name, std::string("'") + name + "' must be a number");
    const double x = v.get<double>();
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
      throw bad(name, std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + v.dump());
    return float(x);
  };
  p.presence = number("presence_penalty", -2, 2, false, 0.0f);
  p.frequency = number("frequency_penalty", -2, 2, false, 0.0f);
  p.repetition = number("repetition_penalty", 0, 2, true, 1.0f);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const json& bias = body["logit_bias"];
    if (!bias.is_object()) throw bad("logit_bias", "'logit_bias' must be an object of token ids to numbers");
    if (bias.size() > kMaxLogitBias)
      throw bad("logit_bias", "'logit_bias' holds " + std::to_string(bias.size()) + " tokens; the most is " +
                                  std::to_string(kMaxLogitBias));
    for (const auto& [key, value] : bias.items()) {
      const bool digits = !key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), ::isdigit);
      if (!digits) throw bad("logit_bias", "'logit_bias' keys must be token ids (decimal integers), got '" + key + "'");
      if (!value.is_number() || value.get<double>() < -100.0 || value.get<double>() > 100.0)
        throw bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " + value.dump() + " for " + key);
      p.bias.emplace_back(int32_t(std::stol(key)), value.get<float>());
    }
  }
  return p;
}

// "prompt": a non-empty string, a list of them, a list of token ids, or a list of such lists.
std::vector<CompletionPrompt> parse_prompts(const json& body) {
  const char* const shapes = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids";
  if (!body.contains("prompt") || body["prompt"].is_null()) throw bad("prompt", "'prompt' is required");
  const json& p = body["prompt"];
  auto ids_of = [&](const json& list) {
    std::vector<int32_t> ids;
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        throw bad("prompt", "'prompt' token ids must be integers >= 0");
      ids.push_back(int32_t(id.get<int64_t>()));
    }
    if (ids.empty()) throw bad("prompt", "'prompt' must not be empty");
    return ids;
  };
  auto text_of = [&](const json& text) {
    if (text.get_ref<const std::string&>().empty()) throw bad("prompt", "'prompt' must not be empty");
    return CompletionPrompt{text.get<std::string>(), std::nullopt};
  };
  if (p.is_string()) return {text_of(p)};
  if (!p.is_array() || p.empty()) throw bad("prompt", shapes);
  if (p.size() > kMaxPrompts)
    throw bad("prompt", "'prompt' holds " + std::to_string(p.size()) + " prompts; the most is " + std::to_string(kMaxPrompts));
  std::vector<CompletionPrompt> prompts;
  if (p[0].is_number_integer()) return {CompletionPrompt{{}, ids_of(p)}};
  for (const json& item : p) {
    if (item.is_string() && p[0].is_string()) {
      prompts.push_back(text_of(item));
    } else if (item.is_array() && p[0].is_array()) {
      prompts.push_back(CompletionPrompt{{}, ids_of(item)});
    } else {
      throw bad("prompt", shapes);
    }
  }
  return prompts;
}

// A field g4 does not read, with a value that asks for nothing beyond what g4 does (a zero
// value: one candidate, an end user's id): clients often send these explicitly.
bool asks_nothing(const std::string& name, const json& value) {
  if (name == "best_of") return value.is_number_integer() && value.get<int64_t>() == 1;
  if (name == "user") return value.is_string();  // an end user's id, for the operator's records
  return false;
}

// Every field of the body is one g4 reads for this endpoint, or asks for nothing (asks_nothing);
// any other is a 400 naming it, never silently ignored.
void check_fields(const json& body, Endpoint endpoint) {
  static const std::set<std::string> common{"model", "temperature", "top_p", "min_p", "top_k", "seed", "max_tokens",
                                            "max_completion_tokens", "logprobs", "top_logprobs", "n", "stop",
                                            "stream", "stream_options", "logit_bias", "presence_penalty",
                                            "frequency_penalty", "repetition_penalty", "response_format"};
  static const std::set<std::string> chat{"messages", "tools", "tool_choice", "chat_template_kwargs"}, completion{"prompt", "echo", "suffix"};
  const bool is_chat = endpoint == Endpoint::kChat;
  const std::set<std::string>&own = is_chat ? chat : completion, &other = is_chat ? completion : chat;
  for (const auto& [name, value] : body.items()) {
    if (common.count(name) || own.count(name) || value.is_null() || asks_nothing(name, value)) continue;
    throw ApiError(ErrorKind::kUnsupported, "'" + name + "' is not supported by g4 serve" + (other.count(name) ? " on this endpoint" : ""),
                   name, "unsupported_parameter");
  }
}

}  // namespace

int http_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return 400;
    case ErrorKind::kUnsupported: return 400;  // OpenAI's answer to a parameter it does not take
    case ErrorKind::kUnauthenticated: return 401;
    case ErrorKind::kNotFound: return 404;
    case ErrorKind::kMethodNotAllowed: return 405;
    case ErrorKind::kTooLarge: return 413;
    case ErrorKind::kBusy: return 429;
    case ErrorKind::kCancelled: return 499;  // the client went away (nginx's code; nobody reads it)
    case ErrorKind::kInternal: return 500;
    case ErrorKind::kResourceExhausted: return 503;
    case ErrorKind::kUnavailable: return 503;
    case ErrorKind::kPeerFailure: return 503;
  }
  return 500;
}

const char* openai_error_type(ErrorKind kind) {
  if (kind == ErrorKind::kBusy) return "rate_limit_error";
  return http_status(kind) >= 500 ? "server_error" : "invalid_request_error";
}

json error_json(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", openai_error_type(error.kind())},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

CompletionRequest parse_completion_request(std::string_view body_text, Endpoint endpoint) {
  json body;
  std::string refused;
  try {
    body = parse_bounded(body_text, /*allow_exceptions=*/true, &refused);
  } catch (const json::exception& e) {
    throw bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!refused.empty()) throw bad("", "the request body " + refused);
  if (!body.is_object()) throw bad("", "the request body must be a JSON object");
  check_fields(body, endpoint);
  auto given = [&](const char* name) { return body.contains(name) && !body[name].is_null(); };

  CompletionRequest r;
  r.endpoint = endpoint;
  if (given("model")) {
    if (!body["model"].is_string()) throw bad("model", "'model' must be a string");
    r.model = body["model"].get<std::string>();
  }
  if (endpoint == Endpoint::kChat) {
    r.messages = parse_messages(body);
    parse_chat_options(body, r);
  } else {
    r.prompts = parse_prompts(body);
    if (given("echo")) {
      if (!body["echo"].is_boolean()) throw bad("echo", "'echo' must be true or false");
      r.echo = body["echo"].get<bool>();
    }
    if (given("suffix") && !(body["suffix"].is_string() && body["suffix"].get<std::string>().empty()))
      throw ApiError(ErrorKind::kUnsupported,
                     "'suffix' asks for fill-in-the-middle, and Gemma 4 has no fill-in-the-middle prompt format",
                     "suffix", "unsupported_parameter");
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
  parse_logprobs(body, r);
  if (given("n")) {
    r.n = integer_field(body, "n");
    if (r.n < 1 || r.n > kMaxChoices)
      throw bad("n", "'n' must be in [1, " + std::to_string(kMaxChoices) + "] (choices per prompt)");
  }
  const size_t prompts = endpoint == Endpoint::kChat ? 1 : r.prompts.size();
  if (int64_t(prompts) * r.n > kMaxChoices)
    throw bad("n", std::to_string(prompts) + " prompts × n " + std::to_string(r.n) + " asks for " +
                       std::to_string(int64_t(prompts) * r.n) + " choices; the most is " + std::to_string(kMaxChoices));
  if (body.contains("stop")) r.stop = parse_stop(body["stop"]);
  if (given("stream")) r.stream = bool_field(body, "stream");
  r.include_usage = nested_bool(body, "stream_options", "include_usage").value_or(false);
  r.penalties = parse_penalties(body);
  if (given("response_format")) {
    const ReplyConstraint format = parse_response_format(body["response_format"]);
    if (format.kind != ReplyConstraint::Kind::kNone && r.constraint.kind != ReplyConstraint::Kind::kNone)
      throw bad("response_format", "'response_format' and a 'tool_choice' that forces a call cannot both shape the reply");
    if (format.kind != ReplyConstraint::Kind::kNone) r.constraint = format;
  }
  if (r.echo && r.top_logprobs >= 0)
    throw ApiError(ErrorKind::kUnsupported,
                   "'echo' with 'logprobs' asks for the prompt's log-probabilities, which g4 serve does not compute",
                   "echo", "unsupported_parameter");
  return r;
}

Sampler request_sampler(const CompletionRequest& r, const Sampler& defaults, bool random_seed) {
  const SamplingChoices given{r.temperature, r.top_p, r.min_p, r.top_k};
  const std::optional<uint64_t> seed = r.seed ? r.seed : random_seed ? std::nullopt : std::optional(defaults.params().seed);
  try {
    return resolve_sampling(given, seed, {}, defaults.params()).sampler;
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

void ReplyPart::append(ReplyPart other) {
  content += other.content;
  reasoning += other.reasoning;
  for (ReplyToolCall& call : other.tool_calls) tool_calls.push_back(std::move(call));
  for (TokenLogprob& l : other.logprobs) logprobs.push_back(std::move(l));
}

namespace {

json tool_calls_json(const std::vector<ReplyToolCall>& calls, bool with_index) {
  json out = json::array();
  for (const ReplyToolCall& c : calls) {
    json call = {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (with_index) call["index"] = c.index;
    out.push_back(std::move(call));
  }
  return out;
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs_json(const std::vector<TokenLogprob>& logprobs) {
  json content = json::array();
  for (const TokenLogprob& l : logprobs) {
    json top = json::array();
    for (size_t i = 0; i < l.top.size(); ++i)
      top.push_back({{"token", l.top[i].first}, {"logprob", l.top[i].second}, {"bytes", l.top_bytes[i]}});
    content.push_back({{"token", l.token}, {"logprob", l.logprob}, {"bytes", l.bytes}, {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}.
json completion_logprobs_json(const std::vector<TokenLogprob>& logprobs) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& l : logprobs) {
    tokens.push_back(l.token);
    values.push_back(l.logprob);
    json top = json::object();
    for (const auto& [text, logprob] : l.top)
      if (!top.contains(text)) top[text] = logprob;  // two ids of one text: the likelier one
    tops.push_back(std::move(top));
    offsets.push_back(l.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& logprobs, bool with_logprobs) {
  if (!with_logprobs) return nullptr;
  return endpoint == Endpoint::kChat ? chat_logprobs_json(logprobs) : completion_logprobs_json(logprobs);
}

}  // namespace

json completion_json(const ResponseHeader& h, std::span<const ChoiceReply> choices, const Usage& usage,
                     bool with_logprobs) {
  json out = envelope(h, false);
  out["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ReplyPart& reply = choices[i].reply;
    json choice = {{"index", i}, {"finish_reason", finish(choices[i].finish_reason)},
                   {"logprobs", logprobs_json(h.endpoint, reply.logprobs, with_logprobs)}};
    if (h.endpoint == Endpoint::kChat) {
      json message = {{"role", "assistant"}, {"content", reply.content}};
      if (!reply.tool_calls.empty()) {
        message["tool_calls"] = tool_calls_json(reply.tool_calls, false);
        if (reply.content.empty()) message["content"] = nullptr;
      }
      if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
      choice["message"] = std::move(message);
    } else {
      choice["text"] = reply.content;
    }
    out["choices"].push_back(std::move(choice));
  }
  out["usage"] = usage_json(usage);
  return out;
}

json chunk_json(const ResponseHeader& h, const ReplyPart& part, const std::string& finish_reason, bool with_logprobs,
                size_t index) {
  json out = envelope(h, true);
  json choice = {{"index", index}, {"finish_reason", finish(finish_reason)},
                 {"logprobs", logprobs_json(h.endpoint, part.logprobs, with_logprobs)}};
  if (h.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (!part.content.empty() || (finish_reason.empty() && part.reasoning.empty() && part.tool_calls.empty()))
      delta["content"] = part.content;
    if (!part.reasoning.empty()) delta["reasoning_content"] = part.reasoning;
    if (!part.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(part.tool_calls, true);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = part.content;
  }
  out["choices"] = json::array({choice});
  return out;
}

json role_chunk_json(const ResponseHeader& h, size_t index) {
  json out = envelope(h, true);
  out["choices"] = json::array({{{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}});
  return out;
}

json usage_chunk_json(const ResponseHeader& h, const Usage& usage) {
  json out = envelope(h, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace g4::serve
