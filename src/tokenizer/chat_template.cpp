#include "tokenizer/chat_template.h"

#include <algorithm>

namespace g4 {
namespace {

constexpr std::string_view kAsciiWhitespace = " \t\n\r\f\v";

std::string_view strip(std::string_view text) {
  const size_t first = text.find_first_not_of(kAsciiWhitespace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kAsciiWhitespace) + 1 - first);
}

void append_turn(std::string& out, std::string_view role, std::string_view content) {
  out.append("<|turn>").append(role).append("\n").append(strip(content)).append("<turn|>\n");
}

// The model's turn opened with thinking off (an empty thought channel).
constexpr std::string_view kGenerationPrompt = "<|turn>model\n<|channel>thought\n<channel|>";

}  // namespace

std::string format_gemma4_chat(std::span<const ChatMessage> messages) {
  std::string out = "<bos>";
  for (const ChatMessage& message : messages) {
    append_turn(out, message.role == "assistant" ? std::string_view("model") : message.role, message.content);
  }
  out += kGenerationPrompt;
  return out;
}

std::string format_gemma4_user_turn(std::string_view text) {
  std::string out;
  append_turn(out, "user", text);
  out += kGenerationPrompt;
  return out;
}

std::string format_gemma4_prompt(std::string_view user_prompt) {
  const ChatMessage message{"user", std::string(user_prompt)};
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
