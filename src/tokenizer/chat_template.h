// Gemma 4's instruction chat template (docs/DESIGN.md §5) and the prompt → ids step of `g4 run`.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace g4 {

// A call the model made, as the template takes it: `arguments` an object (written key:value, keys
// sorted, strings between <|"|>) or a string (written as it is).
struct ChatToolCall {
  std::string name;
  nlohmann::json arguments = nlohmann::json::object();
};

// What a tool answered: `response` an object (written key:value) or any other value ({value:…}).
struct ChatToolResponse {
  std::string name;
  nlohmann::json response;
};

// One message as the template reads it (its field names are the template's).
struct ChatMessage {
  std::string role;     // "system", "developer", "user", "assistant" (written "model"), "model", or any other
  std::string content;  // "" = none
  // Content given as text parts instead: each part is trimmed on its own (the template's loop).
  std::optional<std::vector<std::string>> text_parts;
  std::vector<ChatToolCall> tool_calls;
  std::string reasoning_content;  // written only before tool calls made after the last user turn
  std::vector<ChatToolResponse> tool_responses;
};

struct ChatOptions {
  // OpenAI tool definitions ({"type": "function", "function": {name, description, parameters}}),
  // declared in the system turn; an empty array declares none.
  nlohmann::json tools = nlohmann::json::array();
  bool enable_thinking = false;        // "<|think|>" in the system turn, no empty thought channel
  bool add_generation_prompt = true;   // open the model's turn
};

// The official 31B-IT template (tests/fixtures/chat-templates/gemma-4-31B-it.jinja), rendered
// natively: test_chat_template_jinja proves it byte-equal to the template under a Jinja engine.
// "<bos>"; a system turn when thinking is on, tools are declared or the first message is a system
// or developer message; then per message "<|turn>{role}\n…<turn|>\n" with tool calls, tool
// responses (which leave the turn open for the model to continue) and content; then the model's
// turn. Content is `| trim`med (Python's str.strip: Unicode whitespace); a model turn's content also
// drops its thoughts first ("<|channel>…<channel|>", the template's strip_thinking). Where Python's
// Jinja2 (transformers) and JavaScript differ, g4 writes what Python does (docs/DESIGN.md §5).
std::string format_gemma4_chat(std::span<const ChatMessage> messages, const ChatOptions& options = {});
// One user turn: "<bos><|turn>user\n{prompt stripped}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>".
std::string format_gemma4_prompt(std::string_view user_prompt);

// What a conversation appends for its next user turn: "<|turn>user\n{text stripped}<turn|>\n"
// and the model's turn opened as above (no "<bos>": the conversation already starts with it).
std::string format_gemma4_user_turn(std::string_view text);
// What closes the model's reply in the history, so the next turn follows it as the template would.
inline constexpr std::string_view kGemma4TurnEnd = "<turn|>\n";

// Gemma 4's string delimiter in tool declarations, calls and responses.
inline constexpr std::string_view kGemma4Quote = "<|\"|>";

// A value in the template's tool syntax (its format_argument macro): strings between <|"|>, keys
// of objects sorted case-insensitively (quoted with <|"|> when quote_keys), numbers, true/false.
std::string format_gemma4_value(const nlohmann::json& value, bool quote_keys);

// The ids `g4 run` feeds the model for a prompt: the Gemma 4 template applied (unless raw)
// and encoded with special tokens parsed; bos_id is put first unless the ids already start
// with it (the template's "<bos>" is 2, Gemma's --bos_id default), so BOS is never doubled.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, std::string_view prompt, bool raw_prompt,
                                   int32_t bos_id);

// Generation ends on <eos> (1), <turn|> (106) or <|tool_response> (50).
inline constexpr std::array<int32_t, 3> kGemma4StopTokenIds = {1, 106, 50};
bool is_gemma4_stop_token(int32_t id);

}  // namespace g4
