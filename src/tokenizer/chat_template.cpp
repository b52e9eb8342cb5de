#include "tokenizer/chat_template.h"

#include <algorithm>

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

}  // namespace

std::string format_gemma4_chat(std::span<const ChatMessage> messages) {
  std::string out = "<bos>";
  for (const ChatMessage& message : messages) {
    const std::string_view role = message.role == "assistant" ? std::string_view("model") : message.role;
    append_turn(out, role, role == "model" ? strip_thinking(message.content) : std::string(strip(message.content)));
  }
  out += kGenerationPrompt;
  return out;
}

std::string format_gemma4_user_turn(std::string_view text) {
  std::string out;
  append_turn(out, "user", strip(text));
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
