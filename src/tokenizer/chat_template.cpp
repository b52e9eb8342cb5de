#include "tokenizer/chat_template.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace g4 {
namespace {

// Python's str.isspace() set: the template's `| trim` is Python's str.strip() under transformers.
bool is_trimmed_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The length of the whitespace character at text[pos], or 0 when what starts there is not one
// (malformed UTF-8 included, so trimming never cuts into it).
size_t space_length_at(std::string_view text, size_t pos) {
  const int length = utf8::sequence_length(text, pos);
  if (length <= 0) return 0;
  static constexpr uint8_t kLeadBits[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t c = static_cast<uint8_t>(text[pos]) & kLeadBits[length];
  for (int i = 1; i < length; ++i) c = (c << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  return is_trimmed_space(c) ? static_cast<size_t>(length) : 0;
}

// The template's `| trim`: leading and trailing whitespace in Python's (Unicode) sense removed.
std::string_view strip(std::string_view text) {
  while (const size_t length = text.empty() ? 0 : space_length_at(text, 0)) text.remove_prefix(length);
  for (size_t last = 1; last <= std::min<size_t>(4, text.size());) {
    // The last character is the one sequence that ends exactly at the end.
    const size_t start = text.size() - last;
    if (utf8::sequence_length(text, start) != static_cast<int>(last)) {
      ++last;
      continue;
    }
    if (space_length_at(text, start) == 0) break;
    text.remove_suffix(last);
    last = 1;
  }
  return text;
}

// The template's strip_thinking for model turns: every "<|channel>…<channel|>" thought is dropped
// (a part's text from "<|channel>" up to the next "<channel|>", and every "<channel|>"), then trimmed.
std::string strip_thinking(std::string_view text) {
  constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
  std::string kept;
  for (size_t start = 0;;) {
    const size_t close = text.find(kClose, start);
    const std::string_view part = text.substr(start, close == std::string_view::npos ? close : close - start);
    kept.append(part.substr(0, part.find(kOpen)));
    if (close == std::string_view::npos) break;
    start = close + kClose.size();
  }
  return std::string(strip(kept));
}

void append_turn(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|turn>").append(role).append("\n").append(content).append("<turn|>\n");
}

// The model's turn opened with thinking off (an empty thought channel).
constexpr std::string_view kGenerationPrompt = "<|turn>model\n<|channel>thought\n<channel|>";

// (Jinja2's) sorting, truthiness and printing of values, as the template's macros use them.
using nlohmann::json;

// Jinja's truth: none, false, 0, "" and empty lists and objects are false; a missing key is none.
bool truthy(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number_unsigned()) return v.get<uint64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

// value[key], or none when value is not an object or has no such key (Jinja's undefined).
const json& member(const json& value, std::string_view key) {
  static const json kNone;
  if (!value.is_object()) return kNone;
  const auto it = value.find(key);
  return it == value.end() ? kNone : *it;
}

// Python's repr of a float (what Jinja2 prints): the shortest digits that read back the same, in
// fixed notation for exponents in [-4, 16), else d.ddde±XX; integral values end in ".0".
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::scientific).ptr;
  std::string text(buffer, end);  // [-]d[.ddd]e±XX
  std::string sign;
  if (text[0] == '-') sign = "-", text.erase(0, 1);
  const size_t e = text.find('e');
  const int exponent = std::stoi(text.substr(e + 1));
  std::string digits;
  for (char c : text.substr(0, e))
    if (c != '.') digits += c;
  if (exponent < -4 || exponent >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const std::string power = std::to_string(std::abs(exponent));
    return out + (exponent < 0 ? "e-" : "e+") + (power.size() < 2 ? "0" : "") + power;
  }
  if (exponent < 0) return sign + "0." + std::string(size_t(-exponent - 1), '0') + digits;
  const size_t whole = size_t(exponent) + 1;
  if (digits.size() <= whole) return sign + digits + std::string(whole - digits.size(), '0') + ".0";
  return sign + digits.substr(0, whole) + "." + digits.substr(whole);
}

// What `{{ value }}` prints under Python's Jinja2 for a scalar (a list or object is printed as JSON:
// the template prints those only through format_argument).
std::string python_str(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return python_float(v.get<double>());
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string python_str_or_empty(const json& v) { return v.is_null() ? std::string() : python_str(v); }

std::string upper(std::string text) {
  for (char& c : text)
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  return text;
}

std::string lower(std::string text) {
  for (char& c : text)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return text;
}

// `| dictsort`: an object's entries by key, ignoring case (ASCII); equal keys keep their order.
std::vector<std::pair<std::string, const json*>> dictsort(const json& object) {
  std::vector<std::pair<std::string, const json*>> entries;
  if (!object.is_object()) return entries;
  for (auto it = object.begin(); it != object.end(); ++it) entries.emplace_back(it.key(), &it.value());
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
  return entries;
}

std::string quoted(const std::string& text) {
  return std::string(kGemma4Quote) + text + std::string(kGemma4Quote);
}

// The items of a `required` list, each between <|"|>, comma-separated.
std::string quoted_list(const json& items) {
  std::string out;
  if (!items.is_array()) return out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + quoted(python_str(items[i]));
  return out;
}

// The template's `key:value,…` of an object (keys sorted), as in tool calls and responses.
std::string key_values(const json& object) {
  std::string out;
  for (const auto& [key, value] : dictsort(object))
    out += (out.empty() ? "" : ",") + key + ":" + format_gemma4_value(*value, /*quote_keys=*/false);
  return out;
}

// The template's format_parameters macro: each property (keys sorted; the schema's own keywords
// skipped) as NAME:{description,nullable,enum|properties|items,type} — with the template's
// punctuation exactly, including its "," before properties/items whether or not anything precedes.
std::string format_parameters(const json& properties) {
  static const std::array<std::string_view, 5> kStandardKeys = {"description", "type", "properties", "required",
                                                                "nullable"};
  std::string out;
  bool found_first = false;
  for (const auto& [key, value_pointer] : dictsort(properties)) {
    if (std::find(kStandardKeys.begin(), kStandardKeys.end(), key) != kStandardKeys.end()) continue;
    const json& value = *value_pointer;
    if (found_first) out += ",";
    found_first = true;
    out += key + ":{";
    bool add_comma = false;
    // The template's "{% if add_comma %},{% else %}{% set add_comma = true %}{% endif %}".
    auto separate = [&] {
      if (add_comma) out += ",";
      add_comma = true;
    };
    if (truthy(member(value, "description"))) {
      out += "description:" + quoted(python_str(member(value, "description")));
      add_comma = true;
    }
    if (truthy(member(value, "nullable"))) {
      separate();
      out += "nullable:true";
    }
    const std::string type = upper(python_str_or_empty(member(value, "type")));
    if (type == "STRING") {
      if (truthy(member(value, "enum"))) {
        separate();
        out += "enum:" + format_gemma4_value(member(value, "enum"), /*quote_keys=*/true);
      }
    } else if (type == "OBJECT") {
      out += ",properties:{";
      const json& nested = member(value, "properties");
      out += format_parameters(nested.is_object() ? nested : value);
      out += "}";
      if (truthy(member(value, "required"))) out += ",required:[" + quoted_list(member(value, "required")) + "]";
    } else if (type == "ARRAY") {
      const json& items = member(value, "items");
      if (items.is_object() && !items.empty()) {
        out += ",items:{";
        bool first_item = true;
        for (const auto& [item_key, item_value_pointer] : dictsort(items)) {
          const json& item_value = *item_value_pointer;
          if (item_value.is_null()) continue;
          if (!first_item) out += ",";
          first_item = false;
          if (item_key == "properties") {
            out += "properties:{" + (item_value.is_object() ? format_parameters(item_value) : "") + "}";
          } else if (item_key == "required") {
            out += "required:[" + quoted_list(item_value) + "]";
          } else if (item_key == "type") {
            json types = item_value;
            if (types.is_string()) types = upper(types.get<std::string>());
            else if (types.is_array())
              for (json& t : types) t = upper(python_str(t));
            out += "type:" + format_gemma4_value(types, /*quote_keys=*/true);
          } else {
            out += item_key + ":" + format_gemma4_value(item_value, /*quote_keys=*/true);
          }
        }
        out += "}";
      }
    }
    separate();
    out += "type:" + quoted(type) + "}";
  }
  return out;
}

// The template's format_function_declaration macro for one OpenAI tool definition.
std::string format_tool_declaration(const json& tool) {
  const json& function = member(tool, "function");
  std::string out = "declaration:" + python_str_or_empty(member(function, "name")) + "{description:" +
                    quoted(python_str_or_empty(member(function, "description")));
  const json& params = member(function, "parameters");
  if (truthy(params)) {
    out += ",parameters:{";
    if (truthy(member(params, "properties"))) out += "properties:{" + format_parameters(member(params, "properties")) + "},";
    if (truthy(member(params, "required"))) out += "required:[" + quoted_list(member(params, "required")) + "],";
    if (truthy(member(params, "type"))) out += "type:" + quoted(upper(python_str(member(params, "type")))) + "}";
  }
  if (function.is_object() && function.contains("response")) {
    const json& response = function["response"];
    out += ",response:{";
    if (truthy(member(response, "description")))
      out += "description:" + quoted(python_str(member(response, "description"))) + ",";
    if (upper(python_str_or_empty(member(response, "type"))) == "OBJECT") out += "type:" + quoted("OBJECT") + "}";
  }
  return out + "}";
}

std::string render_content(const ChatMessage& message, bool model_turn) {
  auto one = [&](std::string_view text) { return model_turn ? strip_thinking(text) : std::string(strip(text)); };
  if (!message.text_parts) return one(message.content);
  std::string out;
  for (const std::string& part : *message.text_parts) out += one(part);
  return out;
}

bool has_content(const ChatMessage& message) {
  return message.text_parts ? !message.text_parts->empty() : !message.content.empty();
}

void append_tool_calls(std::string& out, const ChatMessage& message, bool keep_reasoning) {
  if (keep_reasoning && !message.reasoning_content.empty())
    out.append("<|channel>thought\n").append(message.reasoning_content).append("<channel|>");
  for (const ChatToolCall& call : message.tool_calls) {
    out.append("<|tool_call>call:").append(call.name).append("{");
    if (call.arguments.is_object()) out += key_values(call.arguments);
    else if (call.arguments.is_string()) out += call.arguments.get<std::string>();
    out.append("}<tool_call|>");
  }
}

void append_tool_responses(std::string& out, const ChatMessage& message) {
  for (const ChatToolResponse& r : message.tool_responses) {
    out.append("<|tool_response>response:").append(r.name).append("{");
    if (r.response.is_object()) out += key_values(r.response);
    else out.append("value:").append(format_gemma4_value(r.response, /*quote_keys=*/false));
    out.append("}<tool_response|>");
  }
}

// The system turn: thinking on, the first message's system/developer text, tool declarations.
// Returns how many messages it consumed (0 or 1).
size_t append_system_turn(std::string& out, std::span<const ChatMessage> messages, const ChatOptions& options) {
  const bool system_first = !messages.empty() && (messages[0].role == "system" || messages[0].role == "developer");
  const bool tools = truthy(options.tools);
  if (!options.enable_thinking && !tools && !system_first) return 0;
  out += "<|turn>system\n";
  if (options.enable_thinking) out += "<|think|>\n";
  if (system_first) out += strip(messages[0].content);
  if (tools)
    for (const json& tool : options.tools) out.append("<|tool>").append(strip(format_tool_declaration(tool))).append("<tool|>");
  out += "<turn|>\n";
  return system_first ? 1 : 0;
}

}  // namespace

std::string format_gemma4_value(const json& value, bool quote_keys) {
  if (value.is_string()) return quoted(value.get<std::string>());
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, item] : dictsort(value)) {
      out += std::string(first ? "" : ",") + (quote_keys ? quoted(key) : key) + ":" + format_gemma4_value(*item, quote_keys);
      first = false;
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? "," : "") + format_gemma4_value(value[i], quote_keys);
    return out + "]";
  }
  return python_str(value);
}

std::string format_gemma4_chat(std::span<const ChatMessage> all_messages, const ChatOptions& options) {
  std::string out = "<bos>";
  const std::span<const ChatMessage> messages = all_messages.subspan(append_system_turn(out, all_messages, options));
  // Thoughts before tool calls are kept only after the last user turn (a tool-call continuation).
  size_t last_user = SIZE_MAX;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = i;
  bool after_tool_response = false;  // the template's ns.prev_message_type == 'tool_response'
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const std::string_view role = message.role == "assistant" ? std::string_view("model") : message.role;
    // Calls that follow tool responses continue the model's open turn.
    if (!(after_tool_response && !message.tool_calls.empty())) out.append("<|turn>").append(role).append("\n");
    after_tool_response = false;
    if (!message.tool_calls.empty())
      append_tool_calls(out, message, /*keep_reasoning=*/last_user == SIZE_MAX || i > last_user);
    if (!message.tool_responses.empty()) {
      append_tool_responses(out, message);
      after_tool_response = true;
    }
    out += render_content(message, role == "model");
    if (message.tool_responses.empty() || has_content(message)) out += kGemma4TurnEnd;
  }
  if (options.add_generation_prompt) {
    if (!after_tool_response) out += "<|turn>model\n";
    if (!options.enable_thinking) out += "<|channel>thought\n<channel|>";
  }
  return out;
}

std::string format_gemma4_user_turn(std::string_view text) {
  std::string out;
  append_turn(out, "user", strip(text));
  out += kGenerationPrompt;
  return out;
}

std::string format_gemma4_prompt(std::string_view user_prompt) {
  ChatMessage message;
  message.role = "user";
  message.content = user_prompt;
  return format_gemma4_chat(std::span(&message, 1));
}

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, std::string_view prompt, bool raw_prompt,
                                   int32_t bos_id) {
  std::vector<int32_t> ids =
      tokenizer.encode(raw_prompt ? std::string(prompt) : format_gemma4_prompt(prompt), /*parse_special=*/true);
  if (ids.empty() || ids.front() != bos_id) ids.insert(ids.begin(), bos_id);
  return ids;
}

bool is_gemma4_stop_token(int32_t id) {
  return std::find(kGemma4StopTokenIds.begin(), kGemma4StopTokenIds.end(), id) != kGemma4StopTokenIds.end();
}

}  // namespace g4
