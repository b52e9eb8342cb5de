// Gemma 4's instruction chat template (docs/DESIGN.md §5) and the prompt → ids step of `g4 run`.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace g4 {

struct ChatMessage {
  std::string role;  // "user", "system", "model"; "assistant" is written as "model"
  std::string content;
};

// The official 31B-IT template (tests/fixtures/chat-templates/gemma-4-31B-it.jinja) with
// add_generation_prompt and thinking off, for text-only messages (tests/test_chat_template_jinja.cpp
// proves it equal): "<bos>" then, per message, "<|turn>{role}\n{content stripped}<turn|>\n"; then
// the model's turn: "<|turn>model\n<|channel>thought\n<channel|>". "Stripped" is the template's
// `| trim` (Python's str.strip: Unicode whitespace); a model turn also drops its thoughts first
// ("<|channel>…<channel|>", the template's strip_thinking).
std::string format_gemma4_chat(std::span<const ChatMessage> messages);
// One user turn: "<bos><|turn>user\n{prompt stripped}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>".
std::string format_gemma4_prompt(std::string_view user_prompt);

// What a conversation appends for its next user turn: "<|turn>user\n{text stripped}<turn|>\n"
// and the model's turn opened as above (no "<bos>": the conversation already starts with it).
std::string format_gemma4_user_turn(std::string_view text);
// What closes the model's reply in the history, so the next turn follows it as the template would.
inline constexpr std::string_view kGemma4TurnEnd = "<turn|>\n";

// The ids `g4 run` feeds the model for a prompt: the Gemma 4 template applied (unless raw)
// and encoded with special tokens parsed; bos_id is put first unless the ids already start
// with it (the template's "<bos>" is 2, Gemma's --bos_id default), so BOS is never doubled.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, std::string_view prompt, bool raw_prompt,
                                   int32_t bos_id);

// Generation ends on <eos> (1), <turn|> (106) or <|tool_response> (50).
inline constexpr std::array<int32_t, 3> kGemma4StopTokenIds = {1, 106, 50};
bool is_gemma4_stop_token(int32_t id);

}  // namespace g4
